"""CPU normalization ratio choice, resource amplification, and the Node update decision."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from apis.manager_keys import (
    BATCH_CPU,
    BATCH_MEMORY,
    LABEL_CPU_NORMALIZATION_ENABLED,
    MID_CPU,
    MID_MEMORY,
)
from apis.nodetopo import CPUBasicInfo, parse_cpu_basic_info
from apis.sloconfig import parse_slo_controller_config
from manager.cpunormalization import (
    amplification_ratios,
    amplified,
    amplify_batch_cpu,
    normalization_ratio,
)
from manager.noderesource.calculator import calculate, decide_update, is_diff
from manager.noderesource.inputs import parse_node, parse_node_metric, parse_pod_list
from tests.manager.builders import NOW, config_map, node, node_metric, pod_list

MODEL = "Intel(R) Xeon(R) Platinum XXX CPU @ 2.50GHz"
RATIOS = {
    "baseRatio": 1.5,
    "hyperThreadEnabledRatio": 1.0,
    "turboEnabledRatio": 1.8,
    "hyperThreadTurboEnabledRatio": 1.2,
}


def norm_config(enable: bool = True, **extra: Any) -> Any:
    doc = {"enable": enable, "ratioModel": {MODEL: RATIOS}, **extra}
    return parse_slo_controller_config(
        config_map(cpu_normalization_config=doc), "cm"
    ).cpu_normalization


@pytest.mark.parametrize(
    ("ht", "turbo", "ratio"),
    [(False, False, 1.5), (True, False, 1.0), (False, True, 1.8), (True, True, 1.2)],
)
def test_ratio_follows_hyper_threading_and_turbo_state(ht: bool, turbo: bool, ratio: float) -> None:
    result = normalization_ratio(norm_config(), {}, CPUBasicInfo(MODEL, ht, turbo))
    assert result.ratio == ratio
    assert result.annotation == f"{ratio:.2f}"


def test_node_label_overrides_the_strategys_enable() -> None:
    info = CPUBasicInfo(MODEL, False, True)
    off = normalization_ratio(norm_config(), {LABEL_CPU_NORMALIZATION_ENABLED: "false"}, info)
    assert off.annotation == "1.00"
    on = normalization_ratio(norm_config(False), {LABEL_CPU_NORMALIZATION_ENABLED: "true"}, info)
    assert on.ratio == 1.8


def test_unknown_model_or_missing_info_gives_no_ratio() -> None:
    assert normalization_ratio(norm_config(), {}, CPUBasicInfo("Other", False, False)).ratio is None
    missing = normalization_ratio(norm_config(), {}, None)
    assert missing.ratio is None
    assert "cpu-basic-info" in missing.reason


def test_cpu_basic_info_annotation_parses() -> None:
    raw = json.dumps(
        {"cpuModel": MODEL, "hyperThreadEnabled": True, "turboEnabled": False, "vendorID": "x"}
    )
    assert parse_cpu_basic_info(raw) == CPUBasicInfo(MODEL, True, False, vendor_id="x")
    with pytest.raises(ValueError, match="turboEnabled: must be a bool"):
        parse_cpu_basic_info('{"cpuModel": "x", "turboEnabled": "yes"}')


def test_batch_cpu_amplification_rounds_up_to_an_integer() -> None:
    assert amplify_batch_cpu(10_001, 1.5) == 15_002  # 15001.5 rounded up
    assert amplify_batch_cpu(10_000, 1.0) == 10_000
    assert amplify_batch_cpu(10_000, None) == 10_000


def test_amplification_multiplies_the_cpu_ratio_by_normalization() -> None:
    doc = {"enable": True, "resourceAmplificationRatio": {"cpu": 1.5, "memory": 1.2}}
    cfg = parse_slo_controller_config(config_map(resource_amplification_config=doc), "cm")
    ratios, annotation = amplification_ratios(cfg.resource_amplification, {}, 2.0)
    assert ratios == {"cpu": 3.0, "memory": 1.2}
    assert annotation == '{"cpu":3.00,"memory":1.20}'
    assert amplified(32_000, ratios["cpu"]) == 96_000


def test_amplification_disabled_keeps_only_the_normalization_ratio() -> None:
    cfg = parse_slo_controller_config(config_map(), "cm")
    assert amplification_ratios(cfg.resource_amplification, {}, None) == ({}, None)
    assert amplification_ratios(cfg.resource_amplification, {}, 1.25)[1] == '{"cpu":1.25}'


# Update decision -------------------------------------------------------------------------------
def result_for(diff: float = 0.1, update_seconds: int = 300) -> Any:
    cfg = parse_slo_controller_config(
        config_map(
            colocation_config={
                "enable": True,
                "resourceDiffThreshold": diff,
                "updateTimeThresholdSeconds": update_seconds,
            }
        ),
        "cm",
    )
    return calculate(
        cfg,
        parse_node(node(), "n"),
        parse_node_metric(node_metric(prod_reclaimable=("4", "4Gi")), "m"),
        parse_pod_list(pod_list(), "p"),
        NOW,
    )


def current_of(result: Any, **scale: float) -> dict[str, int]:
    names = {
        "batch_cpu": BATCH_CPU,
        "batch_memory": BATCH_MEMORY,
        "mid_cpu": MID_CPU,
        "mid_memory": MID_MEMORY,
    }
    out = {name: int(result.values[name]) for name in names.values()}
    for key, factor in scale.items():
        out[names[key]] = int(out[names[key]] * factor)
    return out


def test_no_write_when_values_moved_less_than_the_threshold_recently() -> None:
    r = result_for()
    decision = decide_update(r, current_of(r, batch_cpu=0.95), NOW - timedelta(seconds=60), NOW)
    assert decision.needed is False
    assert decision.reasons == ()


def test_write_when_a_value_moved_more_than_the_threshold() -> None:
    r = result_for()
    decision = decide_update(r, current_of(r, batch_memory=0.8), NOW - timedelta(seconds=60), NOW)
    assert decision.needed is True
    assert BATCH_MEMORY in decision.reasons[0]


def test_write_when_update_time_threshold_passed() -> None:
    r = result_for(update_seconds=120)
    assert decide_update(r, current_of(r), NOW - timedelta(seconds=121), NOW).needed is True
    assert decide_update(r, current_of(r), NOW - timedelta(seconds=119), NOW).needed is False


def test_write_when_a_resource_appears_or_goes() -> None:
    r = result_for()
    current = current_of(r)
    del current[MID_CPU]
    assert decide_update(r, current, NOW, NOW).needed is True


def test_write_when_no_earlier_write_is_known() -> None:
    r = result_for()
    assert decide_update(r, current_of(r), None, NOW).reasons == ("no earlier write known",)


@pytest.mark.parametrize(
    ("old", "new", "threshold", "diff"),
    [
        (1000, 1100, 0.1, False),  # exactly 10%: not more than the threshold
        (1000, 1101, 0.1, True),
        (1000, 899, 0.1, True),
        (0, 0, 0.1, False),
        (0, 1, 0.1, True),
        (None, None, 0.1, False),
        (None, 0, 0.1, True),
        (5, None, 0.1, True),
    ],
)
def test_diff_rule_matches_upstream(
    old: int | None, new: int | None, threshold: float, diff: bool
) -> None:
    assert is_diff(old, new, threshold) is diff
