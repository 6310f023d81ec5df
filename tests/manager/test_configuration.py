"""slo-controller-config parsing: Koordinator's defaults, node selectors, and errors that name the
key and the field."""

from __future__ import annotations

import json
import logging

import pytest

from apis.configuration import (
    CalculatePolicy,
    ColocationStrategy,
    LabelSelector,
    SelectorRequirement,
)
from apis.slo import SchemaError
from apis.sloconfig import parse_slo_controller_config
from tests.manager.builders import config_map


def test_missing_keys_take_koordinators_defaults() -> None:
    cfg = parse_slo_controller_config(config_map(), "cm")
    s = cfg.colocation.cluster
    assert s == ColocationStrategy()
    assert (s.enable, s.cpu_reclaim_threshold_percent, s.memory_reclaim_threshold_percent) == (
        False,
        60,
        65,
    )
    assert (s.degrade_time_minutes, s.update_time_threshold_seconds) == (15, 300)
    assert s.resource_diff_threshold == 0.1
    assert s.metric_aggregate_durations == ("5m", "10m", "30m")
    assert s.batch_cpu_threshold_percent is None


def test_cluster_fields_override_defaults_and_keep_the_rest() -> None:
    cfg = parse_slo_controller_config(
        config_map(
            colocation_config={
                "enable": True,
                "cpuReclaimThresholdPercent": 70,
                "memoryCalculatePolicy": "request",
                "metricAggregatePolicy": {"durations": ["1m", "2m30s"]},
                "resourceDiffThreshold": 0.2,
            }
        ),
        "cm",
    )
    s = cfg.colocation.cluster
    assert s.enable is True
    assert s.cpu_reclaim_threshold_percent == 70
    assert s.memory_calculate_policy is CalculatePolicy.REQUEST
    assert s.metric_aggregate_durations == ("1m", "2m30s")
    assert s.memory_reclaim_threshold_percent == 65


def test_the_data_map_alone_is_accepted() -> None:
    data = config_map(colocation_config={"enable": True})["data"]
    assert parse_slo_controller_config(data, "cm").colocation.cluster.enable is True


@pytest.mark.parametrize(
    ("colocation", "field", "message"),
    [
        ({"cpuReclaimThresholdPercent": -1}, "cpuReclaimThresholdPercent", "must be >= 0"),
        ({"cpuReclaimThresholdPercent": 60.5}, "cpuReclaimThresholdPercent", "integer"),
        ({"degradeTimeMinutes": 0}, "degradeTimeMinutes", "must be >= 1"),
        ({"resourceDiffThreshold": 0}, "resourceDiffThreshold", "(0, 1]"),
        ({"resourceDiffThreshold": 1.5}, "resourceDiffThreshold", "(0, 1]"),
        ({"midUnallocatedPercent": 200}, "midUnallocatedPercent", "[0, 100]"),
        ({"batchCPUThresholdPercent": -1}, "batchCPUThresholdPercent", ">= 0"),
        ({"memoryCalculatePolicy": "peak"}, "memoryCalculatePolicy", "unknown policy"),
        ({"enable": "yes"}, "enable", "boolean"),
        ({"metricAggregatePolicy": {"durations": ["5 minutes"]}}, "durations[0]", "duration"),
        ({"cpuReclaimThresholdPrecent": 60}, "cpuReclaimThresholdPrecent", "unknown field"),
        (
            {
                "nodeConfigs": [
                    {
                        "name": "x",
                        "nodeSelector": {"matchLabels": {"a": "b"}},
                        "degradeTimeMinutes": -3,
                    }
                ]
            },
            "nodeConfigs[0].degradeTimeMinutes",
            ">= 1",
        ),
        (
            {
                "nodeConfigs": [
                    {"name": "x", "nodeSelector": {"matchExpressions": []}, "enable": True}
                ]
            },
            "nodeConfigs[0].nodeSelector.matchLabels",
            "required",
        ),
        (
            {"nodeConfigs": [{"name": "x", "nodeSelector": {"matchLabels": {"a": "b"}}}]},
            "nodeConfigs[0]",
            "sets no strategy field",
        ),
    ],
)
def test_bad_colocation_values_name_the_key_and_the_field(
    colocation: dict[str, object], field: str, message: str
) -> None:
    with pytest.raises(SchemaError) as info:
        parse_slo_controller_config(config_map(colocation_config=colocation), "cm.yaml")
    err = info.value
    assert err.source == "cm.yaml: colocation-config"
    assert err.field.endswith(field)
    assert message in str(err)


def test_invalid_json_names_the_key() -> None:
    with pytest.raises(SchemaError, match=r"cm: resource-qos-config: invalid JSON"):
        parse_slo_controller_config(config_map(resource_qos_config='{"clusterStrategy": '), "cm")


def test_duplicate_json_keys_are_errors() -> None:
    with pytest.raises(SchemaError, match="duplicate key 'enable'"):
        parse_slo_controller_config(
            config_map(colocation_config='{"enable": true, "enable": false}'), "cm"
        )


def test_unknown_fields_are_warnings_when_not_strict(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        cfg = parse_slo_controller_config(
            config_map(colocation_config={"enable": True, "futureField": 1}), "cm", strict=False
        )
    assert cfg.colocation.cluster.enable is True
    assert "futureField" in caplog.text


def test_raw_strategy_keys_are_kept_and_their_selectors_checked() -> None:
    good = {
        "clusterStrategy": {"enable": True, "cpuSuppressThresholdPercent": 65},
        "nodeStrategies": [
            {"name": "a", "nodeSelector": {"matchLabels": {"k": "v"}}, "enable": False}
        ],
    }
    cfg = parse_slo_controller_config(config_map(resource_threshold_config=good), "cm")
    assert (
        cfg.raw["resource-threshold-config"]["clusterStrategy"]["cpuSuppressThresholdPercent"] == 65
    )
    bad = {
        "nodeStrategies": [
            {"name": "a", "nodeSelector": {"matchExpressions": [{"key": "k", "operator": "Near"}]}}
        ]
    }
    with pytest.raises(SchemaError) as info:
        parse_slo_controller_config(config_map(cpu_burst_config=bad), "cm")
    assert info.value.field == "nodeStrategies[0].nodeSelector.matchExpressions[0].operator"


def test_host_application_config_is_checked_as_nodeslo_host_applications() -> None:
    good = {"applications": [{"name": "nginx", "qos": "LS", "priority": "koord-prod"}]}
    parse_slo_controller_config(config_map(host_application_config=good), "cm")
    bad = {
        "nodeConfigs": [
            {"name": "p", "nodeSelector": {}, "applications": [{"name": "x", "qos": "XX"}]}
        ]
    }
    with pytest.raises(SchemaError) as info:
        parse_slo_controller_config(config_map(host_application_config=bad), "cm")
    assert info.value.field == "nodeConfigs[0].applications[0].qos"


def test_ratios_are_taken_as_upstream_declares_them_without_a_range() -> None:
    """Upstream's ``ModelRatioCfg``, ``defaultRatio`` and ``resourceAmplificationRatio`` are plain
    ``float64`` without validation tags (``apis/configuration/slo_controller_config.go``): the
    range is checked on the ratio a node ends up with, so the key is not refused."""
    doc = {"enable": True, "ratioModel": {"Xeon": {"turboEnabledRatio": 5.5, "baseRatio": 0.9}}}
    cfg = parse_slo_controller_config(config_map(cpu_normalization_config=doc), "cm")
    assert cfg.cpu_normalization.cluster.ratio_model["Xeon"].turbo_enabled_ratio == 5.5
    amp = {"enable": True, "resourceAmplificationRatio": {"cpu": 0.8}}
    cfg = parse_slo_controller_config(config_map(resource_amplification_config=amp), "cm")
    assert cfg.resource_amplification.cluster.ratios["cpu"] == 0.8


def test_a_ratio_that_is_not_a_number_still_refuses_the_key() -> None:
    doc = {"enable": True, "resourceAmplificationRatio": {"cpu": "lots"}}
    with pytest.raises(SchemaError) as info:
        parse_slo_controller_config(config_map(resource_amplification_config=doc), "cm")
    assert info.value.field == "resourceAmplificationRatio.cpu"
    doc = {"enable": True, "defaultRatio": True}
    with pytest.raises(SchemaError) as info:
        parse_slo_controller_config(config_map(cpu_normalization_config=doc), "cm")
    assert info.value.field == "defaultRatio"


def test_node_scoped_normalization_merges_ratio_models_over_the_clusters() -> None:
    doc = {
        "enable": False,
        "ratioModel": {"A": {"baseRatio": 1.1}, "B": {"baseRatio": 1.2}},
        "nodeConfigs": [
            {
                "name": "n",
                "nodeSelector": {"matchLabels": {"x": "y"}},
                "enable": True,
                "ratioModel": {"B": {"baseRatio": 2.0}},
            }
        ],
    }
    cfg = parse_slo_controller_config(
        config_map(cpu_normalization_config=doc), "cm"
    ).cpu_normalization
    merged = cfg.for_node({"x": "y"})
    assert merged.enable is True
    assert merged.ratio_model["A"].base_ratio == 1.1
    assert merged.ratio_model["B"].base_ratio == 2.0
    assert cfg.for_node({}).enable is False


@pytest.mark.parametrize(
    ("requirement", "labels", "selected"),
    [
        (SelectorRequirement("zone", "In", ("a", "b")), {"zone": "a"}, True),
        (SelectorRequirement("zone", "In", ("a", "b")), {"zone": "c"}, False),
        (SelectorRequirement("zone", "NotIn", ("a",)), {}, True),
        (SelectorRequirement("zone", "NotIn", ("a",)), {"zone": "a"}, False),
        (SelectorRequirement("gpu", "Exists", ()), {"gpu": ""}, True),
        (SelectorRequirement("gpu", "DoesNotExist", ()), {"gpu": ""}, False),
    ],
)
def test_label_selectors_follow_kubernetes_set_semantics(
    requirement: SelectorRequirement, labels: dict[str, str], selected: bool
) -> None:
    assert LabelSelector({}, (requirement,)).matches(labels) is selected


def test_a_configmap_of_another_kind_is_rejected() -> None:
    with pytest.raises(SchemaError, match="must be a ConfigMap"):
        parse_slo_controller_config({"kind": "Secret", "data": {}}, "cm")


def test_upstreams_sample_values_parse() -> None:
    colocation = {
        "enable": False,
        "metricAggregateDurationSeconds": 300,
        "metricReportIntervalSeconds": 60,
        "metricAggregatePolicy": {"durations": ["5m", "10m", "15m"]},
        "metricMemoryCollectPolicy": "usageWithoutPageCache",
        "cpuReclaimThresholdPercent": 60,
        "memoryReclaimThresholdPercent": 65,
        "memoryCalculatePolicy": "usage",
        "degradeTimeMinutes": 15,
        "updateTimeThresholdSeconds": 300,
        "resourceDiffThreshold": 0.1,
        "nodeConfigs": [
            {
                "name": "alios",
                "nodeSelector": {"matchLabels": {"kubernetes.io/kernel": "alios"}},
                "updateTimeThresholdSeconds": 360,
                "resourceDiffThreshold": 0.2,
            }
        ],
    }
    cfg = parse_slo_controller_config(config_map(colocation_config=json.dumps(colocation)), "cm")
    strategy, name = cfg.colocation.for_node({"kubernetes.io/kernel": "alios"})
    assert name == "alios"
    assert (strategy.update_time_threshold_seconds, strategy.resource_diff_threshold) == (360, 0.2)


@pytest.mark.parametrize(
    ("key", "doc", "field"),
    [
        ("cpu-burst-config", {"clusterStrategy": {"policy": "bogus"}}, "clusterStrategy.policy"),
        (
            "resource-threshold-config",
            {
                "nodeStrategies": [
                    {"name": "n", "nodeSelector": {}, "cpuSuppressThresholdPercent": "x"}
                ]
            },
            "nodeStrategies[0].cpuSuppressThresholdPercent",
        ),
        (
            "system-config",
            {"clusterStrategy": {"minFreeKbytesFactr": 100}},
            "clusterStrategy.minFreeKbytesFactr",
        ),
    ],
)
def test_strategy_keys_are_checked_by_the_nodeslo_section_parsers(
    key: str, doc: dict[str, object], field: str
) -> None:
    with pytest.raises(SchemaError) as info:
        parse_slo_controller_config(config_map(**{key.replace("-", "_"): doc}), "cm")
    assert info.value.source == f"cm: {key}"
    assert info.value.field == field


def test_upstreams_sample_strategy_keys_parse() -> None:
    cfg = parse_slo_controller_config(
        config_map(
            cpu_burst_config={
                "clusterStrategy": {
                    "policy": "none",
                    "cpuBurstPercent": 1000,
                    "cfsQuotaBurstPercent": 300,
                },
                "nodeStrategies": [
                    {
                        "name": "alios",
                        "nodeSelector": {"matchLabels": {"kubernetes.io/kernel": "alios"}},
                        "policy": "cfsQuotaBurstOnly",
                        "cfsQuotaBurstPercent": 400,
                    }
                ],
            },
            resource_qos_config={"clusterStrategy": {"beClass": {"memoryQOS": {"wmarkRatio": 90}}}},
        ),
        "cm",
    )
    assert set(cfg.raw) == {"cpu-burst-config", "resource-qos-config"}
