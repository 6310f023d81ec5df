"""Upstream's test tables for the CPU normalization and resource amplification plugins, ported.

Sources (koordinator-sh/koordinator):

- ``pkg/slo-controller/noderesource/plugins/cpunormalization/plugin_test.go``:
  ``Test_getCPUNormalizationRatioFromModel``, ``Test_getCPUNormalizationRatio`` (the
  ``defaultRatio`` fallback, upstream since 2024, PR #2128) and ``TestPluginCalculate``;
- ``pkg/slo-controller/noderesource/plugins/resourceamplification/plugin_test.go``:
  ``TestPluginCalculate`` (final ratios, two decimals);
- ``apis/extension/node_resource_amplification_test.go``: "keep precision 2".

Where upstream reads the normalization ratio from the node's annotation, the tables pass it as
the ``cpu_ratio`` argument, which is what the controller hands over.
"""

from __future__ import annotations

from typing import Any

import pytest

from apis.configuration import (
    CPUNormalizationStrategy,
    ModelRatio,
    ResourceAmplificationConfig,
    ResourceAmplificationStrategy,
)
from apis.manager_keys import ANNOTATION_CPU_NORMALIZATION_RATIO, LABEL_CPU_NORMALIZATION_ENABLED
from apis.nodetopo import CPUBasicInfo
from apis.sloconfig import parse_slo_controller_config
from manager.cpunormalization import (
    amplification_ratios,
    normalization_ratio,
    ratio_from_model,
    ratio_text,
)
from manager.noderesource.controller import current_ratio
from tests.manager.builders import config_map

FULL = ModelRatio(
    base_ratio=1.5,
    turbo_enabled_ratio=1.65,
    hyper_thread_enabled_ratio=1.0,
    hyper_thread_turbo_enabled_ratio=1.1,
)


def strategy(models: dict[str, ModelRatio], default: float | None = None) -> Any:
    return CPUNormalizationStrategy(enable=True, default_ratio=default, ratio_model=models)


@pytest.mark.parametrize(
    ("case", "info", "models", "want"),
    [
        ("nil model", CPUBasicInfo("CPU XXX", False, False), {}, None),
        (
            "no ratio for model",
            CPUBasicInfo("CPU XXX", False, False),
            {"CPU YYY": ModelRatio(base_ratio=1.0)},
            None,
        ),
        (
            "missing ratio for Turbo and HT on",
            CPUBasicInfo("CPU XXX", True, True),
            {"CPU XXX": ModelRatio(base_ratio=1.5)},
            None,
        ),
        (
            "got ratio for Turbo and HT on",
            CPUBasicInfo("CPU XXX", True, True),
            {"CPU XXX": FULL},
            1.1,
        ),
        ("got ratio for HT on", CPUBasicInfo("CPU XXX", True, False), {"CPU XXX": FULL}, 1.0),
        ("got ratio for Turbo on", CPUBasicInfo("CPU XXX", False, True), {"CPU XXX": FULL}, 1.65),
        (
            "got ratio for basic setting",
            CPUBasicInfo("CPU XXX", False, False),
            {"CPU XXX": FULL},
            1.5,
        ),
        (
            "missing ratio for basic setting",
            CPUBasicInfo("CPU XXX", False, False),
            {"CPU XXX": ModelRatio()},
            None,
        ),
    ],
)
def test_upstream_ratio_from_model_table(
    case: str, info: CPUBasicInfo, models: dict[str, ModelRatio], want: float | None
) -> None:
    ratio, how = ratio_from_model(strategy(models), info)
    assert ratio == want, case
    assert how  # says which field, or why there is none


@pytest.mark.parametrize(
    ("case", "models", "default", "want"),
    [
        ("nil model and nil default ratio", {}, None, None),
        ("nil model and valid default ratio", {}, 2.5, 2.5),
        (
            "model takes precedence over the default ratio",
            {"CPU XXX": ModelRatio(1.9, 1.0, 1.65, 1.1)},
            3.5,
            1.9,
        ),
        ("use the default ratio with invalid model", {"CPU XXX": ModelRatio()}, 2.2, 2.2),
    ],
)
def test_upstream_default_ratio_table(
    case: str, models: dict[str, ModelRatio], default: float | None, want: float | None
) -> None:
    cfg = parse_slo_controller_config(
        config_map(
            cpu_normalization_config={
                "enable": True,
                **({"defaultRatio": default} if default is not None else {}),
                "ratioModel": {
                    name: {
                        k: v
                        for k, v in {
                            "baseRatio": m.base_ratio,
                            "hyperThreadEnabledRatio": m.hyper_thread_enabled_ratio,
                            "turboEnabledRatio": m.turbo_enabled_ratio,
                            "hyperThreadTurboEnabledRatio": m.hyper_thread_turbo_enabled_ratio,
                        }.items()
                        if v is not None
                    }
                    for name, m in models.items()
                },
            }
        ),
        "cm",
    ).cpu_normalization
    result = normalization_ratio(cfg, {}, CPUBasicInfo("CPU XXX", False, False))
    assert result.ratio == want, case
    if want is not None:
        assert result.annotation == ratio_text(want)
    if default is not None and want == default:
        assert result.reason.startswith("defaultRatio")


def _cfg(doc: dict[str, Any]) -> Any:
    return parse_slo_controller_config(
        config_map(cpu_normalization_config=doc), "cm"
    ).cpu_normalization


HT_TURBO = CPUBasicInfo("XXX", True, True)
XXX_RATIOS = {
    "baseRatio": 1.5,
    "turboEnabledRatio": 1.65,
    "hyperThreadEnabledRatio": 1.0,
    "hyperThreadTurboEnabledRatio": 1.1,
}


@pytest.mark.parametrize(
    ("case", "doc", "labels", "info", "want"),
    [
        (
            "failed to get node config",
            {"enable": True},
            {LABEL_CPU_NORMALIZATION_ENABLED: "{]"},
            HT_TURBO,
            None,
        ),
        ("node strategy is disabled", {"enable": False, "ratioModel": {}}, {}, HT_TURBO, "1.00"),
        ("failed to get CPUBasicInfo", {"enable": True, "ratioModel": {}}, {}, None, None),
        (
            "failed to get ratio",
            {"enable": True, "ratioModel": {"XXX": {"baseRatio": 1.0}}},
            {},
            HT_TURBO,
            None,
        ),
        (
            "failed to validate ratio",
            {"enable": True, "ratioModel": {"XXX": {"hyperThreadTurboEnabledRatio": 10}}},
            {},
            HT_TURBO,
            None,
        ),
        (
            "get ratio correctly",
            {"enable": True, "ratioModel": {"XXX": XXX_RATIOS}},
            {},
            HT_TURBO,
            "1.10",
        ),
        (
            "get ratio correctly 1 (node config)",
            {
                "enable": False,
                "ratioModel": {"XXX": dict.fromkeys(XXX_RATIOS, 1.0)},
                "nodeConfigs": [
                    {
                        "name": "n",
                        "nodeSelector": {"matchLabels": {"xxx": "yyy"}},
                        "enable": True,
                        "ratioModel": {"XXX": XXX_RATIOS},
                    }
                ],
            },
            {"xxx": "yyy"},
            HT_TURBO,
            "1.10",
        ),
        (
            "get ratio when strategy disable but node label enabled",
            {"enable": False, "ratioModel": {"XXX": XXX_RATIOS}},
            {LABEL_CPU_NORMALIZATION_ENABLED: "true"},
            HT_TURBO,
            "1.10",
        ),
        (
            "strategy enabled but node disabled",
            {"enable": True, "ratioModel": {"XXX": XXX_RATIOS}},
            {LABEL_CPU_NORMALIZATION_ENABLED: "false"},
            HT_TURBO,
            "1.00",
        ),
        (
            "an out-of-range model ratio falls back to nothing, not to defaultRatio",
            {
                "enable": True,
                "defaultRatio": 1.3,
                "ratioModel": {"XXX": {"hyperThreadTurboEnabledRatio": 0.5}},
            },
            {},
            HT_TURBO,
            None,
        ),
        (
            "an out-of-range default ratio is rejected too",
            {"enable": True, "defaultRatio": 6.0},
            {},
            HT_TURBO,
            None,
        ),
    ],
)
def test_upstream_cpu_normalization_calculate_table(
    case: str,
    doc: dict[str, Any],
    labels: dict[str, str],
    info: CPUBasicInfo | None,
    want: str | None,
) -> None:
    result = normalization_ratio(_cfg(doc), labels, info)
    assert result.annotation == want, f"{case}: {result.reason}"


def amp(enable: bool | None, ratios: dict[str, float]) -> ResourceAmplificationConfig:
    return ResourceAmplificationConfig(ResourceAmplificationStrategy(enable, ratios))


@pytest.mark.parametrize(
    ("case", "config", "node_ratio", "want"),
    [
        ("calculate ratio correctly with cpu normalization", amp(None, {}), "1.22", '{"cpu":1.22}'),
        ("calculate ratio correctly without cpu normalization", amp(None, {}), None, None),
        (
            "calculate ratio with amplification ratio",
            amp(True, {"cpu": 1.1, "memory": 2.1}),
            None,
            '{"cpu":1.10,"memory":2.10}',
        ),
        (
            "calculate ratio with both cpu normalization ratio and amplification ratio",
            amp(True, {"cpu": 1.5, "memory": 2.5}),
            "1.20",
            '{"cpu":1.80,"memory":2.50}',
        ),
        (
            "calculate ratio with cpu normalization ratio and amplification memory ratio",
            amp(True, {"memory": 3.5}),
            "1.50",
            '{"cpu":1.50,"memory":3.50}',
        ),
        (
            "calculate ratio with cpu normalization ratio and other resource type ratio",
            amp(True, {"memory": 3.5, "storage": 1.8}),
            "1.50",
            '{"cpu":1.50,"memory":3.50,"storage":1.80}',
        ),
        (
            "calculate ratio with final cpu normalization ratio > 1 correctly",
            amp(True, {"cpu": 0.8, "memory": 3.5, "storage": 1.8}),
            "1.50",
            '{"cpu":1.20,"memory":3.50,"storage":1.80}',
        ),
    ],
)
def test_upstream_resource_amplification_calculate_table(
    case: str, config: ResourceAmplificationConfig, node_ratio: str | None, want: str | None
) -> None:
    _, annotation = amplification_ratios(config, {}, current_ratio(node_ratio))
    assert annotation == want, case


@pytest.mark.parametrize(
    ("case", "config"),
    [
        (
            "final cpu normalization ratio < 1 invalid",
            amp(True, {"cpu": 0.5, "memory": 3.5, "storage": 1.8}),
        ),
        ("one resource amplification ratio invalid", amp(True, {"memory": 3.5, "storage": 0.5})),
    ],
)
def test_upstream_invalid_final_ratios_raise_naming_the_resource(
    case: str, config: ResourceAmplificationConfig
) -> None:
    with pytest.raises(ValueError, match=r"final amplification ratio of (cpu|storage)"):
        amplification_ratios(config, {}, 1.5)


def test_an_unreadable_ratio_on_the_node_counts_as_none() -> None:
    """Upstream's ``GetCPUNormalizationRatio`` fails on ``"invalid"`` and a ratio <= 0; the
    controller then takes the configured ratios alone."""
    assert current_ratio("invalid") is None
    assert current_ratio("0") is None
    assert current_ratio("1.22") == 1.22
    _, annotation = amplification_ratios(amp(True, {"memory": 1.5}), {}, current_ratio("invalid"))
    assert annotation == '{"memory":1.50}'


def test_ratios_keep_precision_two_as_the_ratio_type_marshals() -> None:
    """``node_resource_amplification_test.go``: 1.222 is written 1.22; 1.5 x 1.2 (the float
    1.7999999999999998) is written 1.80, as Go's ``FormatFloat(f, 'f', 2, 64)`` writes it."""
    assert ratio_text(1.222) == "1.22"
    assert ratio_text(1.5 * 1.2) == "1.80"
    assert ANNOTATION_CPU_NORMALIZATION_RATIO == "node.koordinator.sh/cpu-normalization-ratio"
