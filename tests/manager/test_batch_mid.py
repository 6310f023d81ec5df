"""Batch and mid resources against Koordinator's documented semantics, one case per rule.

Expected values are written as the formula's terms (milli-cores, bytes) so each case reads as
the rule it checks. Node: 32 cores, 128 GiB unless a case says otherwise; now is ``NOW``.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from apis.manager_keys import (
    ANNOTATION_CPU_BASIC_INFO,
    ANNOTATION_NODE_COLOCATION_STRATEGY,
    ANNOTATION_NODE_RESERVATION,
    BATCH_CPU,
    BATCH_MEMORY,
    LABEL_CPU_RECLAIM_RATIO,
    MID_CPU,
    MID_MEMORY,
)
from apis.sloconfig import parse_slo_controller_config
from manager.noderesource.calculator import NodeResourceResult, calculate
from manager.noderesource.inputs import parse_node, parse_node_metric, parse_pod_list
from tests.manager.builders import NOW, config_map, node, node_metric, pod, pod_list

GI = 1 << 30
CAP_CPU = 32_000
CAP_MEM = 128 * GI


def run(
    *,
    colocation: dict[str, Any] | None = None,
    node_obj: dict[str, Any] | None = None,
    metric: dict[str, Any] | None = None,
    pods: list[dict[str, Any]] | None = None,
    **other_keys: Any,
) -> NodeResourceResult:
    cfg = config_map(colocation_config={"enable": True, **(colocation or {})}, **other_keys)
    return calculate(
        parse_slo_controller_config(cfg, "cfg"),
        parse_node(node_obj or node(), "node"),
        parse_node_metric(metric or node_metric(), "nm"),
        parse_pod_list(pod_list(*(pods or [])), "pods"),
        NOW,
    )


def margin(cap: int, reclaim_percent: int) -> int:
    return int(cap * ((100 - reclaim_percent) / 100))


PROD = 9500
BATCH = 5500
MID = 7500
FREE = 3500


def test_usage_policy_subtracts_margin_system_usage_and_hp_usage() -> None:
    r = run(
        metric=node_metric(
            system_usage=("2", "8Gi"),
            pods=[
                ("default/web", "koord-prod", "4", "16Gi"),
                ("default/job", "koord-batch", "6", "10Gi"),
            ],
        ),
        pods=[
            pod("web", cpu="8", memory="32Gi", priority=PROD),
            pod("job", cpu="2", memory="4Gi", priority=BATCH),
        ],
    )
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60) - 2_000 - 4_000
    assert r.values[BATCH_MEMORY] == CAP_MEM - margin(CAP_MEM, 65) - 8 * GI - 16 * GI


def test_request_policy_for_memory_subtracts_hp_requests_and_reservation_only() -> None:
    r = run(
        colocation={"memoryCalculatePolicy": "request"},
        node_obj=node(alloc_memory="120Gi"),
        metric=node_metric(system_usage=("2", "20Gi"), pods=[("default/web", "", "4", "16Gi")]),
        pods=[pod("web", cpu="8", memory="32Gi", priority=PROD)],
    )
    # system usage (20Gi) is not subtracted; the kubelet reservation (8Gi) is
    assert r.values[BATCH_MEMORY] == CAP_MEM - margin(CAP_MEM, 65) - 8 * GI - 32 * GI
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60) - 2_000 - 4_000


def test_cpu_request_policy_is_not_supported_and_counts_usage() -> None:
    r = run(
        colocation={"cpuCalculatePolicy": "request"},
        metric=node_metric(pods=[("default/web", "", "4", "16Gi")]),
        pods=[pod("web", cpu="8", memory="32Gi", priority=PROD)],
    )
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60) - 4_000
    assert r.batch is not None
    assert any("not supported" in n for n in r.batch.notes)


def test_max_usage_request_policy_counts_the_larger_of_usage_and_request_per_pod() -> None:
    r = run(
        colocation={
            "cpuCalculatePolicy": "maxUsageRequest",
            "memoryCalculatePolicy": "maxUsageRequest",
        },
        metric=node_metric(
            pods=[("default/a", "", "4", "8Gi"), ("default/b", "", "1", "20Gi")],
        ),
        pods=[
            pod("a", cpu="2", memory="16Gi", priority=PROD),  # usage above request on CPU
            pod("b", cpu="3", memory="4Gi", priority=PROD),  # usage above request on memory
        ],
    )
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60) - (4_000 + 3_000)
    assert r.values[BATCH_MEMORY] == CAP_MEM - margin(CAP_MEM, 65) - (16 * GI + 20 * GI)


def test_hp_pods_without_metrics_count_by_request_under_every_policy() -> None:
    pods = [pod("new", cpu="6", memory="24Gi", priority=PROD)]
    for policy in ("usage", "maxUsageRequest"):
        r = run(
            colocation={"cpuCalculatePolicy": policy, "memoryCalculatePolicy": policy}, pods=pods
        )
        assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60) - 6_000, policy
        assert r.values[BATCH_MEMORY] == CAP_MEM - margin(CAP_MEM, 65) - 24 * GI, policy


def test_lse_pods_count_cpu_by_request_and_memory_by_usage() -> None:
    r = run(
        metric=node_metric(pods=[("default/lse", "koord-prod", "1", "2Gi")]),
        pods=[pod("lse", cpu="8", memory="16Gi", priority=PROD, qos="LSE")],
    )
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60) - 8_000
    assert r.values[BATCH_MEMORY] == CAP_MEM - margin(CAP_MEM, 65) - 2 * GI


def test_batch_free_terminated_and_foreign_pods_are_not_counted() -> None:
    r = run(
        pods=[
            pod("batch", cpu="4", memory="4Gi", priority=BATCH),
            pod("free", cpu="4", memory="4Gi", priority=FREE),
            pod("be", cpu="4", memory="4Gi", qos="BE"),
            pod("done", cpu="4", memory="4Gi", priority=PROD, phase="Succeeded"),
            pod("failed", cpu="4", memory="4Gi", priority=PROD, phase="Failed"),
            pod("elsewhere", cpu="4", memory="4Gi", priority=PROD, node_name="node-2"),
        ]
    )
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60)
    assert r.batch is not None
    reasons = {t.pod: t.reason for t in r.batch.hp.pods}
    assert reasons["default/done"] == "not running (Succeeded)"
    assert reasons["default/elsewhere"] == "on another node (node-2)"
    assert reasons["default/be"] == "low priority (koord-batch)"


def test_mid_pods_are_high_priority_for_batch() -> None:
    r = run(pods=[pod("mid", cpu="4", memory="4Gi", priority=MID)])
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60) - 4_000


def test_pending_pods_count_like_running_ones() -> None:
    r = run(pods=[pod("pending", cpu="3", memory="3Gi", priority=PROD, phase="Pending")])
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60) - 3_000


def test_dangling_metrics_count_by_reported_priority() -> None:
    r = run(
        metric=node_metric(
            pods=[
                ("default/gone", "koord-prod", "2", "2Gi"),
                ("default/gone-batch", "koord-batch", "5", "5Gi"),
            ]
        )
    )
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60) - 2_000
    assert r.batch is not None
    assert r.batch.hp.dangling_used.cpu == 2_000


def test_system_usage_and_node_reservation_take_the_larger() -> None:
    reserved = node(alloc_cpu="29", alloc_memory="120Gi")  # kubelet keeps 3 cores, 8 GiB
    small = run(node_obj=reserved, metric=node_metric(system_usage=("1", "2Gi")))
    large = run(node_obj=reserved, metric=node_metric(system_usage=("5", "10Gi")))
    assert small.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60) - 3_000
    assert small.values[BATCH_MEMORY] == CAP_MEM - margin(CAP_MEM, 65) - 8 * GI
    assert large.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60) - 5_000
    assert large.values[BATCH_MEMORY] == CAP_MEM - margin(CAP_MEM, 65) - 10 * GI


def test_reservation_annotation_counts_reserved_cpus() -> None:
    anno = {
        ANNOTATION_NODE_RESERVATION: json.dumps(
            {"reservedCPUs": "0-3", "resources": {"memory": "6Gi"}}
        )
    }
    r = run(node_obj=node(annotations=anno))
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60) - 4_000
    assert r.values[BATCH_MEMORY] == CAP_MEM - margin(CAP_MEM, 65) - 6 * GI


def test_unreadable_reservation_annotation_is_ignored_with_a_note() -> None:
    r = run(node_obj=node(annotations={ANNOTATION_NODE_RESERVATION: "{not json"}))
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60)
    assert r.batch is not None
    assert any(ANNOTATION_NODE_RESERVATION in n for n in r.batch.notes)


def test_host_applications_above_batch_count_as_system_usage() -> None:
    r = run(
        metric=node_metric(
            system_usage=("1", "1Gi"),
            host_apps=[("nginx", "koord-prod", "2", "2Gi"), ("yarn", "koord-batch", "7", "7Gi")],
        )
    )
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60) - (1_000 + 2_000)


def test_batch_is_floored_at_zero() -> None:
    r = run(pods=[pod("huge", cpu="30", memory="120Gi", priority=PROD)])
    assert r.values[BATCH_CPU] == 0
    assert r.values[BATCH_MEMORY] == 0


def test_threshold_percent_caps_batch_at_a_share_of_capacity() -> None:
    r = run(colocation={"batchCPUThresholdPercent": 20, "batchMemoryThresholdPercent": 100})
    assert r.values[BATCH_CPU] == CAP_CPU * 20 // 100
    assert r.values[BATCH_MEMORY] == CAP_MEM - margin(CAP_MEM, 65)  # cap above the formula


def test_reclaim_threshold_sets_the_safety_margin() -> None:
    r = run(colocation={"cpuReclaimThresholdPercent": 80, "memoryReclaimThresholdPercent": 50})
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 80)
    assert r.values[BATCH_MEMORY] == CAP_MEM - margin(CAP_MEM, 50)


def test_stale_node_metric_resets_every_resource() -> None:
    r = run(metric=node_metric(age=timedelta(minutes=16)))
    assert r.values == dict.fromkeys((BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY))
    assert "degradeTimeMinutes" in r.reset_reason
    fresh = run(metric=node_metric(age=timedelta(minutes=15)))
    assert fresh.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60)


def test_degrade_time_comes_from_the_strategy() -> None:
    r = run(colocation={"degradeTimeMinutes": 30}, metric=node_metric(age=timedelta(minutes=20)))
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60)


def test_node_metric_without_update_time_resets() -> None:
    r = run(metric=node_metric(age=None))
    assert r.values[BATCH_CPU] is None
    assert "updateTime" in r.reset_reason


def test_colocation_disabled_resets_every_resource() -> None:
    off = run(colocation={"enable": False})
    assert off.values[BATCH_CPU] is None
    assert off.values[MID_MEMORY] is None
    node_off = run(
        colocation={
            "nodeConfigs": [
                {"name": "off", "nodeSelector": {"matchLabels": {"pool": "a"}}, "enable": False}
            ]
        },
        node_obj=node(labels={"pool": "a"}),
    )
    assert node_off.values[BATCH_CPU] is None


def test_first_matching_node_config_wins() -> None:
    cfgs = [
        {
            "name": "first",
            "nodeSelector": {"matchLabels": {"pool": "a"}},
            "cpuReclaimThresholdPercent": 50,
        },
        {
            "name": "second",
            "nodeSelector": {"matchLabels": {"pool": "a"}},
            "cpuReclaimThresholdPercent": 90,
        },
    ]
    r = run(colocation={"nodeConfigs": cfgs}, node_obj=node(labels={"pool": "a"}))
    assert r.strategy.node_config == "first"
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 50)
    other = run(colocation={"nodeConfigs": cfgs}, node_obj=node(labels={"pool": "b"}))
    assert other.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60)


def test_node_annotation_and_reclaim_label_override_the_config() -> None:
    anno = {ANNOTATION_NODE_COLOCATION_STRATEGY: json.dumps({"memoryReclaimThresholdPercent": 80})}
    r = run(node_obj=node(annotations=anno, labels={LABEL_CPU_RECLAIM_RATIO: "0.7"}))
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 70)
    assert r.values[BATCH_MEMORY] == CAP_MEM - margin(CAP_MEM, 80)


def test_cpu_normalization_amplifies_batch_cpu_only() -> None:
    info = {"cpuModel": "Xeon X", "hyperThreadEnabled": True, "turboEnabled": False}
    norm = {
        "enable": True,
        "ratioModel": {"Xeon X": {"baseRatio": 1.5, "hyperThreadEnabledRatio": 1.25}},
    }
    r = run(
        node_obj=node(annotations={ANNOTATION_CPU_BASIC_INFO: json.dumps(info)}),
        cpu_normalization_config=norm,
    )
    raw = CAP_CPU - margin(CAP_CPU, 60)
    assert r.values[BATCH_CPU] == int(raw * 1.25)
    assert r.values[BATCH_MEMORY] == CAP_MEM - margin(CAP_MEM, 65)
    assert r.normalization.annotation == "1.25"


# Mid ---------------------------------------------------------------------------------------
def test_mid_is_prod_reclaimable_capped_by_threshold_and_unused() -> None:
    r = run(
        colocation={"midCPUThresholdPercent": 10},
        metric=node_metric(node_usage=("20", "100Gi"), prod_reclaimable=("6", "40Gi")),
    )
    assert r.values[MID_CPU] == min(6_000, CAP_CPU * 10 // 100, CAP_CPU - 20_000)
    assert r.values[MID_MEMORY] == min(40 * GI, CAP_MEM, CAP_MEM - 100 * GI)


def test_mid_adds_a_share_of_prod_unallocated_resources() -> None:
    r = run(
        colocation={"midUnallocatedPercent": 50},
        node_obj=node(alloc_cpu="30"),  # kubelet keeps 2 cores
        metric=node_metric(system_usage=("1", "1Gi"), prod_reclaimable=("2", "2Gi")),
        pods=[
            pod("prod", cpu="10", memory="10Gi", priority=PROD),
            pod("mid", cpu="5", memory="5Gi", priority=MID),
            pod("batch", cpu="5", memory="5Gi", priority=BATCH),
        ],
    )
    unallocated_cpu = CAP_CPU - max(1_000, 2_000) - 10_000
    assert r.values[MID_CPU] == 2_000 + unallocated_cpu // 2
    unallocated_mem = CAP_MEM - 1 * GI - 10 * GI
    assert r.values[MID_MEMORY] == 2 * GI + unallocated_mem // 2


def test_mid_without_prod_reclaimable_is_zero_not_degraded() -> None:
    r = run(metric=node_metric(prod_reclaimable=None))
    assert r.values[MID_CPU] == 0
    assert r.values[MID_MEMORY] == 0
    assert r.values[BATCH_CPU] == CAP_CPU - margin(CAP_CPU, 60)


def test_mid_without_node_usage_takes_unused_as_zero() -> None:
    r = run(metric=node_metric(node_usage=None, prod_reclaimable=("6", "6Gi")))
    assert r.values[MID_CPU] == 0


def test_static_mid_mode_takes_a_fixed_share_capped_by_threshold() -> None:
    r = run(
        colocation={
            "midReclaimMode": "static",
            "midStaticCPUReservedPercent": 30,
            "midStaticMemoryReservedPercent": 30,
            "midCPUThresholdPercent": 20,
        }
    )
    assert r.values[MID_CPU] == CAP_CPU * 20 // 100
    assert r.values[MID_MEMORY] == int(CAP_MEM * 0.3)


@pytest.mark.parametrize("record", [True, False])
def test_recording_terms_does_not_change_the_result(record: bool) -> None:
    cfg = parse_slo_controller_config(config_map(colocation_config={"enable": True}), "cfg")
    nm = node_metric(pods=[("default/a", "", "1", "1Gi")])
    pods = pod_list(pod("a", cpu="2", memory="2Gi", priority=PROD), pod("b", cpu="1", memory="1Gi"))
    args = (
        cfg,
        parse_node(node(), "n"),
        parse_node_metric(nm, "m"),
        parse_pod_list(pods, "p"),
        NOW,
    )
    assert calculate(*args, record=record).values == calculate(*args).values
    assert bool(calculate(*args, record=record).batch.hp.pods) is record  # type: ignore[union-attr]


def test_a_nodes_batch_resources_in_the_api_servers_canonical_form_read_as_written() -> None:
    # The API server stores a Node's quantities in canonical form: the manager's 1000 milli-cores
    # come back as "1k" and 2 GiB as "2Gi" (seen against a real kube-apiserver); the next round
    # reads them as the values it wrote.
    view = parse_node(node(extended={BATCH_CPU: "1k", BATCH_MEMORY: "2Gi", MID_CPU: "0"}), "n")

    assert view.extended[BATCH_CPU] == 1000
    assert view.extended[BATCH_MEMORY] == 2 << 30
    assert view.extended[MID_CPU] == 0
