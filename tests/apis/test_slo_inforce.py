"""The NodeSLO in force: each section parsed once over the defaults, the last good value kept
per section (``apis.slo_inforce``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from apis.slo import SchemaError
from apis.slo_inforce import (
    CPU_BURST_STRATEGY,
    DEFAULTS,
    HOST_APPLICATIONS,
    RESOURCE_USED_THRESHOLD_WITH_BE,
    NodeSLOInForce,
    node_slo_in_force,
    read_node_slo_file,
)
from apis.slo_strategies import CPUBurstPolicy, CPUSuppressPolicy


def read(
    spec: dict[str, object], previous: NodeSLOInForce | None = None, now: float = 1.0
) -> NodeSLOInForce:
    return node_slo_in_force(
        {"spec": spec}, source="NodeSLO n1", strict=False, now=now, previous=previous
    )


GOOD = {
    "resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 50},
    "cpuBurstStrategy": {"policy": "auto"},
}


def test_nothing_read_is_koordinators_defaults() -> None:
    empty = NodeSLOInForce()
    threshold = empty.resource_used_threshold_with_be
    assert (threshold.enable, threshold.cpu_suppress_threshold_percent) == (False, 65)
    assert threshold.cpu_suppress_policy is CPUSuppressPolicy.CPUSET
    assert empty.strategies == DEFAULTS
    assert read({}).strategies == DEFAULTS  # an empty NodeSLO is the same defaults
    assert not empty.rejected


def test_each_section_is_read_over_the_defaults() -> None:
    in_force = read(GOOD)
    threshold = in_force.resource_used_threshold_with_be
    assert (threshold.enable, threshold.cpu_suppress_threshold_percent) == (True, 50)
    assert threshold.memory_evict_threshold_percent == 70  # the default, kept
    assert in_force.cpu_burst_strategy.policy is CPUBurstPolicy.AUTO
    assert in_force.present == {RESOURCE_USED_THRESHOLD_WITH_BE, CPU_BURST_STRATEGY}
    assert in_force.generation == 1


def test_a_bad_cpu_burst_section_keeps_a_good_threshold_and_its_own_last_good_value() -> None:
    good = read(GOOD)
    bad = read(
        {
            "resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 40},
            "cpuBurstStrategy": {"policy": "sometimes"},
        },
        previous=good,
        now=2.0,
    )

    assert bad.resource_used_threshold_with_be.cpu_suppress_threshold_percent == 40  # applied
    assert bad.cpu_burst_strategy == good.cpu_burst_strategy  # the last good one
    (section,) = bad.rejected
    assert section == CPU_BURST_STRATEGY
    rejection = bad.rejected[section]
    assert rejection.error.field == "spec.cpuBurstStrategy.policy"
    assert rejection.error.source == "NodeSLO n1"
    assert "sometimes" in str(rejection.error)
    assert rejection.since == 2.0
    assert bad.status(CPU_BURST_STRATEGY)["status"] == "rejected"
    assert bad.status(RESOURCE_USED_THRESHOLD_WITH_BE) == {"status": "ok"}
    assert bad.newly_rejected(good) == dict(bad.rejected)


def test_the_same_bad_section_again_is_no_news_and_keeps_its_first_time() -> None:
    bad_spec = {**GOOD, "cpuBurstStrategy": {"cpuBurstPercent": "lots"}}
    first = read(bad_spec, previous=read(GOOD), now=2.0)
    again = read(bad_spec, previous=first, now=3.0)

    assert again.newly_rejected(first) == {}
    assert again.rejected[CPU_BURST_STRATEGY].since == 2.0
    assert again.generation == first.generation  # nothing changed


def test_fixing_the_section_recovers_it() -> None:
    bad = read({**GOOD, "cpuBurstStrategy": {"policy": "sometimes"}}, previous=read(GOOD))
    fixed = read({**GOOD, "cpuBurstStrategy": {"policy": "cpuBurstOnly"}}, previous=bad)

    assert not fixed.rejected
    assert fixed.cpu_burst_strategy.policy is CPUBurstPolicy.CPU_BURST_ONLY
    assert fixed.generation == bad.generation + 1


def test_a_bad_section_with_no_good_value_yet_is_the_default() -> None:
    bad = read({"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 150}})
    assert bad.resource_used_threshold_with_be == DEFAULTS.resource_used_threshold_with_be
    assert "must be an integer 0..100, got 150" in str(
        bad.rejected[RESOURCE_USED_THRESHOLD_WITH_BE].error
    )


def test_bad_host_applications_keep_the_last_good_ones_and_the_strategies_apply() -> None:
    good = read({"hostApplications": [{"name": "nginx", "qos": "LS"}]})
    bad = read(
        {
            "hostApplications": [{"name": "nginx", "qos": "GOLD"}],
            "resourceUsedThresholdWithBE": {"enable": True},
        },
        previous=good,
    )
    assert [a.name for a in bad.host_applications] == ["nginx"]
    assert bad.resource_used_threshold_with_be.enable is True
    assert set(bad.rejected) == {HOST_APPLICATIONS}


def test_a_document_that_is_not_a_nodeslo_raises() -> None:
    with pytest.raises(SchemaError, match="kind: must be 'NodeSLO'"):
        node_slo_in_force({"kind": "Pod", "spec": {}}, source="x", strict=False, now=0)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("resourceUsedThresholdWithBE:\n  cpuSuppressThresholdPercent: -5\n",
         "resourceUsedThresholdWithBE.cpuSuppressThresholdPercent"),
        ("cpuBurstStrategy:\n  policy: always\n", "cpuBurstStrategy.policy"),
        ("resourceUsedThresholdWithBE:\n  cpuSuppressThresholdPercent: typo\n",
         "resourceUsedThresholdWithBE.cpuSuppressThresholdPercent"),
    ],
)  # fmt: skip
def test_a_file_names_itself_and_the_field_of_a_rejected_section(
    tmp_path: Path, text: str, field: str
) -> None:
    path = tmp_path / "nodeslo.yaml"
    path.write_text(text)
    in_force = read_node_slo_file(str(path), now=0.0)
    (rejection,) = in_force.rejected.values()
    assert (rejection.error.source, rejection.error.field) == (str(path), field)  # a bare spec
