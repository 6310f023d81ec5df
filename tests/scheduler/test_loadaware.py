"""LoadAwareScheduling against Koordinator's documented behaviour."""

from __future__ import annotations

import pytest

from scheduler_plugins.errors import PluginArgsError
from scheduler_plugins.plugins.loadargs import (
    DEFAULT_MEMORY_REQUEST,
    DEFAULT_MILLI_CPU_REQUEST,
    LoadAwareArgs,
    estimate_pod,
    parse_args,
)
from scheduler_plugins.plugins.loadaware import LoadAwareScheduling
from scheduler_plugins.snapshot import parse_pod
from tests.scheduler.builders import NOW, node, node_metric, pod
from tests.scheduler.helpers import evaluate

GI = 1024**3
LA = "LoadAwareScheduling"


def run(objects, p, args=None):
    return evaluate(objects, p, plugins=[LoadAwareScheduling(parse_args(args, "test"))])


@pytest.mark.parametrize(
    ("cpu_used", "mem_used", "request_cpu", "reason"),
    [
        # 70 % + 85m estimated
        (
            "22400m",
            "10Gi",
            "100m",
            "node(s) cpu usage exceed threshold, cpu usage 70% > threshold 65%",
        ),
        ("19200m", "10Gi", "2", None),  # 60 % + 1.7 cores estimated = 65.3 % rounds to 65
        # 60 % + 3.4 cores
        (
            "19200m",
            "10Gi",
            "4",
            "node(s) cpu usage exceed threshold, cpu usage 71% > threshold 65%",
        ),
        # 96.9 % + 45 MiB
        (
            "1",
            "62Gi",
            "100m",
            "node(s) memory usage exceed threshold, memory usage 97% > threshold 95%",
        ),
    ],
)
def test_a_node_is_rejected_when_usage_plus_the_estimate_exceeds_the_default_threshold(
    cpu_used, mem_used, request_cpu, reason
):
    objects = [node("n1"), node_metric("n1", cpu=cpu_used, memory=mem_used)]
    result = run(objects, pod("p", requests={"cpu": request_cpu, "memory": "64Mi"}))
    n1 = result.nodes["n1"]
    assert n1.feasible is (reason is None)
    assert n1.reasons == ([reason] if reason else [])


def test_an_expired_node_metric_rejects_the_node_unless_scheduling_anyway_is_enabled():
    objects = [node("n1"), node_metric("n1", cpu="1", age=181)]
    p = pod("p", requests={"cpu": "1"})
    assert run(objects, p).nodes["n1"].reasons == ["node(s) nodeMetric expired"]
    anyway = run(objects, p, {"enableScheduleWhenNodeMetricsExpired": True}).nodes["n1"]
    assert anyway.feasible
    assert anyway.scores[LA] == 0
    fresh = run([node("n1"), node_metric("n1", cpu="1", age=179)], p).nodes["n1"]
    assert fresh.feasible
    assert fresh.scores[LA] > 0


def test_a_node_without_node_metric_passes_and_scores_zero():
    result = run([node("n1")], pod("p", requests={"cpu": "1"}))
    assert result.nodes["n1"].feasible
    assert result.nodes["n1"].scores == {LA: 0}


def test_a_hot_node_admits_daemonset_pods():
    objects = [node("n1"), node_metric("n1", cpu="31")]
    assert (
        run(objects, pod("ds", requests={"cpu": "1"}, owner_kind="DaemonSet")).nodes["n1"].feasible
    )


def test_pods_assigned_after_the_last_report_are_counted_by_their_estimate():
    # node reports 50 % cpu; a pod of 8 cores bound 10 s ago is not in the report yet:
    # 16 + 8 * 0.85 = 22.8 cores = 71 % > 65 %
    recent = pod("recent", node_name="n1", requests={"cpu": "8"}, scheduled_at=NOW - 10)
    objects = [node("n1"), node_metric("n1", cpu="16"), recent]
    assert run(objects, pod("p", requests={"cpu": "100m"})).nodes["n1"].reasons == [
        "node(s) cpu usage exceed threshold, cpu usage 72% > threshold 65%"
    ]
    # bound long before the report and reported at 1 core: the reported usage stands
    old = pod("recent", node_name="n1", requests={"cpu": "8"}, scheduled_at=NOW - 3600)
    objects = [node("n1"), node_metric("n1", cpu="16", pods=[("recent", "1", "1Gi")]), old]
    assert run(objects, pod("p", requests={"cpu": "100m"})).nodes["n1"].feasible


def test_score_is_the_weighted_least_used_share_after_the_estimate():
    objects = [node("n1"), node_metric("n1", cpu="8", memory="16Gi")]
    result = run(objects, pod("p", requests={"cpu": "4", "memory": "8Gi"}))
    cpu_used = 8000 + 4000 * 85 // 100
    mem_used = 16 * GI + round(8 * GI * 0.70)
    cpu_score = (32000 - cpu_used) * 100 // 32000
    mem_score = (64 * GI - mem_used) * 100 // (64 * GI)
    assert result.nodes["n1"].scores[LA] == (cpu_score + mem_score) // 2


def test_resource_weights_change_the_score():
    objects = [node("n1"), node_metric("n1", cpu="16", memory="0")]
    p = pod("p", requests={"cpu": "0", "memory": "0"})
    cpu_only = run(objects, p, {"resourceWeights": {"cpu": 1}}).nodes["n1"].scores[LA]
    assert cpu_only == (32000 - 16000 - DEFAULT_MILLI_CPU_REQUEST) * 100 // 32000


@pytest.mark.parametrize(
    ("spec", "expected_cpu", "expected_mem"),
    [
        ({"requests": {"cpu": "2", "memory": "1Gi"}}, 1700, round(GI * 0.7)),
        ({}, DEFAULT_MILLI_CPU_REQUEST, DEFAULT_MEMORY_REQUEST),
        (  # Burstable: the limit times the factor (not the whole limit)
            {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "4", "memory": "1Gi"}},
            3400,
            round(GI * 0.7),
        ),
        (
            {
                "requests": {
                    "kubernetes.io/batch-cpu": "2000",
                    "kubernetes.io/batch-memory": "4Gi",
                },
                "priority": 5500,
            },
            1700,
            round(4 * GI * 0.7),
        ),
    ],
    ids=["requests", "no-requests-defaults", "limit-above-request", "batch-resources"],
)
def test_estimator_uses_scaling_factors_defaults_limits_and_batch_resources(
    spec, expected_cpu, expected_mem
):
    p = parse_pod(pod("p", **spec), "pod")
    assert estimate_pod(p, ["cpu", "memory"], LoadAwareArgs().factors) == [
        expected_cpu,
        expected_mem,
    ]


def test_aggregated_thresholds_filter_on_the_percentile_usage():
    objects = [
        node("n1"),
        node_metric("n1", cpu="3", aggregated={"p95": {"cpu": "25600m", "memory": "1Gi"}}),
    ]
    args = {"aggregated": {"usageThresholds": {"cpu": 70}, "usageAggregationType": "p95"}}
    assert run(objects, pod("p"), args).nodes["n1"].reasons == [
        "node(s) cpu aggregated usage exceed threshold, cpu p95 usage 81% > threshold 70%"
    ]
    assert run(objects, pod("p")).nodes["n1"].feasible  # instant usage 9 %


def test_prod_usage_thresholds_apply_to_prod_pods_only():
    prod_pod = pod(
        "busy", node_name="n1", requests={"cpu": "12"}, priority=9500, scheduled_at=NOW - 3600
    )
    objects = [node("n1"), node_metric("n1", cpu="12", pods=[("busy", "12", "1Gi")]), prod_pod]
    args = {"prodUsageThresholds": {"cpu": 30}}
    assert run(objects, pod("p", priority=9500, requests={"cpu": "1"}), args).nodes[
        "n1"
    ].reasons == ["node(s) cpu usage exceed threshold, cpu prod usage 40% > threshold 30%"]
    assert run(objects, pod("b", priority=5500, requests={"cpu": "1"}), args).nodes["n1"].feasible


def test_node_annotation_overrides_thresholds():
    custom = {"scheduling.koordinator.sh/usage-thresholds": '{"usageThresholds": {"cpu": 40}}'}
    objects = [node("n1", annotations=custom), node_metric("n1", cpu="16")]
    assert run(objects, pod("p")).nodes["n1"].reasons == [
        "node(s) cpu usage exceed threshold, cpu usage 51% > threshold 40%"
    ]


def test_invalid_args_name_the_field():
    with pytest.raises(PluginArgsError, match=r"usageThresholds\.cpu.*\[0, 100\]"):
        parse_args({"usageThresholds": {"cpu": 150}}, "cfg.yaml")
