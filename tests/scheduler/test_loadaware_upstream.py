"""LoadAwareScheduling against the cases of Koordinator's own tests, re-implemented as data:
``pkg/scheduler/plugins/loadaware/estimator/default_estimator_test.go`` (TestDefaultEstimator*),
``pkg/scheduler/plugins/loadaware/load_aware_test.go`` (TestFilterUsage, TestScore) and the
``dominantResourceWeight`` scorer (``loadAwareSchedulingScorer``, Koordinator v1.7).

Upstream's node is 96 cores and 512 GiB; its test pod for the filter requests nothing (so 250m
and 200 MiB are estimated); pods the NodeMetric reports are on the node, bound an hour ago."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler_plugins.plugins.loadargs import (
    DEFAULT_MEMORY_REQUEST,
    DEFAULT_MILLI_CPU_REQUEST,
    LoadAwareArgs,
    estimate_pod,
    node_allocatable,
    parse_args,
)
from scheduler_plugins.plugins.loadaware import LoadAwareScheduling
from scheduler_plugins.snapshot import parse_node, parse_pod
from tests.scheduler.builders import NOW, node, node_metric, pod
from tests.scheduler.helpers import evaluate

GI = 1024**3
LA = "LoadAwareScheduling"
FILTER_NODE = {"cpu": "96", "memory": "512Gi"}


def custom(**fields: Any) -> dict[str, str]:
    return {"scheduling.koordinator.sh/usage-thresholds": json.dumps(fields)}


# -- the estimator (default_estimator_test.go) ---------------------------------------------------

ESTIMATES = [
    # name, resources, limits, labels/annotations/priority, factors args, allow, want cpu, want mem
    ("empty pod", None, None, {}, None, False, DEFAULT_MILLI_CPU_REQUEST, DEFAULT_MEMORY_REQUEST),
    (
        "guaranteed pod",
        {"cpu": "4", "memory": "8Gi"},
        {"cpu": "4", "memory": "8Gi"},
        {},
        None,
        False,
        3400,
        6012954214,
    ),
    (
        "burstable pod",
        {"cpu": "4", "memory": "8Gi"},
        {"cpu": "8", "memory": "8Gi"},
        {},
        None,
        False,
        6800,
        6012954214,
    ),
    (
        "guaranteed pod and zoomed cpu factors",
        {"cpu": "4", "memory": "8Gi"},
        {"cpu": "4", "memory": "8Gi"},
        {},
        {"cpu": 110},
        False,
        4000,  # 4400 capped at the limit
        6012954214,
    ),
    (
        "guaranteed pod and zoomed memory factors",
        {"cpu": "4", "memory": "8Gi"},
        {"cpu": "4", "memory": "8Gi"},
        {},
        {"memory": 110},
        False,
        3400,
        8589934592,
    ),
    (
        "batch pod",
        {"kubernetes.io/batch-cpu": "4000", "kubernetes.io/batch-memory": "8Gi"},
        {"kubernetes.io/batch-cpu": "4000", "kubernetes.io/batch-memory": "8Gi"},
        {"labels": {"koordinator.sh/qosClass": "BE"}, "priority": 5000},
        None,
        False,
        3400,
        6012954214,
    ),
    (
        "pod only has request",
        {"cpu": "4", "memory": "8Gi"},
        None,
        {"labels": {"koordinator.sh/qosClass": "LS"}, "priority": 9999},
        {"cpu": 80, "memory": 80},
        False,
        3200,
        6871947674,
    ),
    (
        "pod with customized factors",
        {"cpu": "4", "memory": "8Gi"},
        None,
        {
            "labels": {"koordinator.sh/qosClass": "LS"},
            "priority": 9999,
            "annotations": {
                "scheduling.koordinator.sh/load-estimated-scaling-factors": '{"cpu":100}'
            },
        },
        {"cpu": 80, "memory": 80},
        True,
        4000,
        6871947674,
    ),
]


@pytest.mark.parametrize(
    ("requests", "limits", "meta", "factors", "allow", "want_cpu", "want_mem"),
    [e[1:] for e in ESTIMATES],
    ids=[e[0] for e in ESTIMATES],
)
def test_estimate_pod(requests, limits, meta, factors, allow, want_cpu, want_mem):
    # upstream's estimator test builds the estimator from unvalidated args (a factor of 110 %,
    # which the args' validation refuses), so the factors go to the estimator directly
    p = parse_pod(pod("p", requests=requests, limits=limits, **meta), "pod")
    merged = {**LoadAwareArgs().factors, **(factors or {})}
    got = estimate_pod(p, ["cpu", "memory"], merged, allow_customize=allow)
    assert got == [want_cpu, want_mem]


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (None, {"cpu": 32000, "memory": 42 * GI}),
        ('{"cpu":28,"memory":"32Gi"}', {"cpu": 28000, "memory": 32 * GI}),
        ('{"cpu":32,"memory":"42Gi"}', {"cpu": 32000, "memory": 42 * GI}),
        ("not json", {"cpu": 32000, "memory": 42 * GI}),
    ],
    ids=["no annotation", "raw allocatable", "raw equal", "bad annotation"],
)
def test_estimate_node_takes_the_raw_allocatable(raw, want):
    obj = node("n", cpu="32", memory="42Gi", pods="110")
    if raw is not None:
        obj["metadata"]["annotations"]["node.koordinator.sh/raw-allocatable"] = raw
    got = node_allocatable(parse_node(obj, "t", "node"))
    assert {k: got[k] for k in ("cpu", "memory")} == want


# -- the filter (TestFilterUsage) --------------------------------------------------------------

PROD_PODS = [("prod-pod-1", "30", "200Gi"), ("prod-pod-2", "33", "300Gi")]

FILTER_CASES: list[tuple[str, dict[str, Any]]] = [
    ("filter normal usage", {"cpu": "60", "memory": "256Gi", "want": None}),
    ("filter node missing NodeMetrics", {"no_metric": True, "want": None}),
    (
        "filter exceed cpu usage",
        {"cpu": "70", "memory": "256Gi", "want": "node(s) cpu usage exceed threshold"},
    ),
    (
        "filter exceed p95 cpu usage",
        {
            "cpu": "30",
            "memory": "100Gi",
            "aggregated": {"cpu": "70", "memory": "256Gi"},
            "args": {
                "aggregated": {
                    "usageThresholds": {"cpu": 60},
                    "usageAggregationType": "p95",
                    "usageAggregatedDuration": "5m",
                }
            },
            "want": "node(s) cpu aggregated usage exceed threshold",
        },
    ),
    (
        "filter exceed memory usage",
        {"cpu": "30", "memory": "500Gi", "want": "node(s) memory usage exceed threshold"},
    ),
    (
        "filter exceed memory usage by custom usage thresholds",
        {
            "cpu": "30",
            "memory": "316Gi",
            "annotations": custom(usageThresholds={"memory": 60}),
            "want": "node(s) memory usage exceed threshold",
        },
    ),
    (
        "filter exceed p95 cpu usage by custom usage",
        {
            "cpu": "30",
            "memory": "100Gi",
            "aggregated": {"cpu": "70", "memory": "256Gi"},
            "annotations": custom(
                aggregatedUsage={
                    "usageThresholds": {"cpu": 60},
                    "usageAggregationType": "p95",
                    "usageAggregatedDuration": "5m0s",
                }
            ),
            "want": "node(s) cpu aggregated usage exceed threshold",
        },
    ),
    (
        "disable filter exceed memory usage",
        {"cpu": "30", "memory": "500Gi", "args": {"usageThresholds": {"memory": 0}}, "want": None},
    ),
    (
        "prod usage filter is not enabled by default",
        {
            "cpu": "63",
            "memory": "500Gi",
            "args": {"usageThresholds": {"cpu": 100, "memory": 100}},
            "prod_pods": True,
            "prod_pod": True,
            "want": None,
        },
    ),
    (
        "filter prod cpu usage",
        {
            "cpu": "63",
            "memory": "500Gi",
            "args": {
                "usageThresholds": {"cpu": 100, "memory": 100},
                "prodUsageThresholds": {"cpu": 50, "memory": 100},
            },
            "prod_pods": True,
            "prod_pod": True,
            "want": "node(s) cpu usage exceed threshold",
        },
    ),
    (
        "filter prod memory usage",
        {
            "cpu": "63",
            "memory": "500Gi",
            "args": {
                "usageThresholds": {"cpu": 100, "memory": 100},
                "prodUsageThresholds": {"cpu": 100, "memory": 50},
            },
            "prod_pods": True,
            "prod_pod": True,
            "want": "node(s) memory usage exceed threshold",
        },
    ),
    (
        "filter prod memory usage with custom usage configuration",
        {
            "cpu": "63",
            "memory": "500Gi",
            "args": {
                "usageThresholds": {"cpu": 100, "memory": 100},
                "prodUsageThresholds": {"cpu": 100, "memory": 100},
            },
            "annotations": custom(prodUsageThresholds={"cpu": 100, "memory": 50}),
            "prod_pods": True,
            "prod_pod": True,
            "want": "node(s) memory usage exceed threshold",
        },
    ),
    (
        "filter daemonset pod exceed cpu usage",
        {"cpu": "70", "memory": "256Gi", "daemonset": True, "want": None},
    ),
]


@pytest.mark.parametrize("case", [c for _, c in FILTER_CASES], ids=[n for n, _ in FILTER_CASES])
def test_filter_usage(case):
    objects: list[dict[str, Any]] = [node("n1", annotations=case.get("annotations"), **FILTER_NODE)]
    if not case.get("no_metric"):
        metric = node_metric(
            "n1",
            cpu=case["cpu"],
            memory=case["memory"],
            aggregated={"p95": case["aggregated"]} if "aggregated" in case else None,
            pods=PROD_PODS if case.get("prod_pods") else None,
        )
        objects.append(metric)
    if case.get("prod_pods"):
        objects += [
            pod(name, node_name="n1", priority=9999, scheduled_at=NOW - 3600)
            for name, _, _ in PROD_PODS
        ]
    test_pod = pod(
        "test-pod",
        priority=9999 if case.get("prod_pod") else None,
        owner_kind="DaemonSet" if case.get("daemonset") else None,
    )
    args = {"filterExpiredNodeMetrics": False, **case.get("args", {})}
    result = evaluate(objects, test_pod, plugins=[LoadAwareScheduling(parse_args(args, "t"))])
    reasons = result.nodes["n1"].reasons
    if case["want"] is None:
        assert reasons == []
    else:
        assert len(reasons) == 1
        assert reasons[0].startswith(case["want"] + ", ")  # then the numbers


# -- the score (TestScore) ---------------------------------------------------------------------

SCORE_POD = {"requests": {"cpu": "16", "memory": "32Gi"}, "limits": {"cpu": "16", "memory": "32Gi"}}
SCORE_CASES: list[tuple[str, dict[str, Any]]] = [
    ("score node with expired nodeMetric", {"age": 180, "cpu": "0", "memory": "0", "want": 0}),
    ("score node missing NodeMetrics", {"no_metric": True, "want": 0}),
    ("score load node", {"cpu": "32", "memory": "10Gi", "want": 72}),
    (
        "score load node with p95",
        {
            "cpu": "0",
            "memory": "0",
            "aggregated": {
                "p95": {"cpu": "32", "memory": "10Gi"},
                "p99": {"cpu": "50", "memory": "70Gi"},
            },
            "args": {
                "aggregated": {"scoreAggregationType": "p95", "scoreAggregatedDuration": "5m"}
            },
            "want": 72,
        },
    ),
    (
        "score load node with p95 but have not reported usage",
        {
            "cpu": "0",
            "memory": "0",
            "args": {
                "aggregated": {"scoreAggregationType": "p95", "scoreAggregatedDuration": "5m"}
            },
            "want": 90,
        },
    ),
    (
        "score load node with p95 but have not reported usage and have assigned pods",
        {
            "cpu": "0",
            "memory": "0",
            "assigned_at": NOW - 600,
            "reported": [("assigned-pod-1", "1", "1Gi")],
            "args": {
                "aggregated": {"scoreAggregationType": "p95", "scoreAggregatedDuration": "5m"}
            },
            "want": 81,
        },
    ),
    (
        "score load node with just assigned pod",
        {"cpu": "32", "memory": "10Gi", "assigned_at": NOW, "want": 63},
    ),
    (
        "score load node with just assigned pod where after updateTime",
        {"cpu": "32", "memory": "10Gi", "age": 10, "assigned_at": NOW, "want": 63},
    ),
    (
        "score load node with dominant resource weight",
        {"cpu": "32", "memory": "10Gi", "args": {"dominantResourceWeight": 1}, "want": 65},
    ),
]


@pytest.mark.parametrize("case", [c for _, c in SCORE_CASES], ids=[n for n, _ in SCORE_CASES])
def test_score(case):
    objects: list[dict[str, Any]] = [node("n1", **FILTER_NODE)]
    if not case.get("no_metric"):
        objects.append(
            node_metric(
                "n1",
                cpu=case["cpu"],
                memory=case["memory"],
                age=case.get("age", 0),
                aggregated=case.get("aggregated"),
                pods=case.get("reported"),
            )
        )
    if "assigned_at" in case:
        objects.append(
            pod("assigned-pod-1", node_name="n1", scheduled_at=case["assigned_at"], **SCORE_POD)
        )
    args = parse_args({"filterExpiredNodeMetrics": False, **case.get("args", {})}, "t")
    result = evaluate(objects, pod("test-pod-1", **SCORE_POD), plugins=[LoadAwareScheduling(args)])
    assert result.nodes["n1"].scores[LA] == case["want"]


def test_dominant_resource_weight_is_validated():
    with pytest.raises(Exception, match=r"dominantResourceWeight"):
        parse_args({"dominantResourceWeight": 101}, "t")
    with pytest.raises(Exception, match=r"dominantResourceWeight"):
        parse_args({"dominantResourceWeight": -1}, "t")


def test_a_custom_aggregated_usage_without_a_type_falls_back_to_the_args():
    # the annotation's aggregatedUsage lacks usageAggregationType: the args' aggregated filter
    # (p95 at 60 %) applies, not the annotation's 10 %
    annotations = custom(aggregatedUsage={"usageThresholds": {"cpu": 10}})
    objects = [
        node("n1", annotations=annotations, **FILTER_NODE),
        node_metric(
            "n1", cpu="1", memory="1Gi", aggregated={"p95": {"cpu": "50", "memory": "1Gi"}}
        ),
    ]
    args = {"aggregated": {"usageThresholds": {"cpu": 60}, "usageAggregationType": "p95"}}
    p = pod("p")
    plugin = LoadAwareScheduling(parse_args(args, "t"))
    assert evaluate(objects, p, plugins=[plugin]).nodes["n1"].feasible  # 52 % <= 60 %
