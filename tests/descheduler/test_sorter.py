"""Koordinator's pod order and usage scores, from upstream's ``pkg/descheduler/utils/sorter/
pod_test.go`` (``TestSortPods``, ``TestSortPods2``) and ``scorer.go``."""

from __future__ import annotations

from typing import Any

import pytest

from apis.priority import (
    PRIORITY_BATCH_VALUE_MAX,
    PRIORITY_BATCH_VALUE_MIN,
    PRIORITY_PROD_VALUE_MAX,
    PRIORITY_PROD_VALUE_MIN,
)
from descheduler.cluster import build_cluster
from descheduler.sorter import node_usage_score, pod_sort_key, usage_score
from tests.descheduler.builders import NOW, ts

GI = 1024**3


def make_pod(
    name: str, priority: int, koord_qos: str, kube_qos: str, created: float, **costs: int
) -> dict[str, Any]:
    annotations = {}
    if "deletion" in costs:
        annotations["controller.kubernetes.io/pod-deletion-cost"] = str(costs["deletion"])
    if "eviction" in costs:
        annotations["scheduling.koordinator.sh/eviction-cost"] = str(costs["eviction"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": name,
            "labels": {"koordinator.sh/qosClass": koord_qos},
            "annotations": annotations,
            "creationTimestamp": ts(created),
        },
        "spec": {"nodeName": "test-node", "priority": priority, "containers": []},
        "status": {"qosClass": kube_qos},
    }


def order(
    objects: list[dict[str, Any]],
    metrics: dict[str, dict[str, int]],
    excess: dict[str, int],
    weights: dict[str, int],
) -> list[str]:
    node = {
        "kind": "Node",
        "metadata": {"name": "test-node"},
        "status": {"allocatable": {"cpu": "96", "memory": "512Gi", "pods": "110"}},
    }
    cluster = build_cluster([node, *objects])
    pods = list(cluster.sched.nodes["test-node"].pods.values())
    pods.sort(
        key=lambda p: pod_sort_key(
            cluster.facts(p),
            usage_score(metrics[p.name], excess, weights) if p.name in metrics else None,
        )
    )
    return [p.name for p in pods]


def test_sort_pods_by_class_priority_qos_costs_usage_and_age() -> None:
    t = NOW
    later = NOW + 60
    be, bur, gua = "BestEffort", "Burstable", "Guaranteed"
    pods = [
        make_pod("test-1", 0, "", be, t),
        make_pod("test-10", 0, "", gua, t),
        make_pod("test-11", 0, "", bur, t),
        make_pod("test-12", 8, "", be, t),
        make_pod("test-13", 9, "", gua, t),
        make_pod("test-14", 10, "", bur, t),
        make_pod("test-5", PRIORITY_PROD_VALUE_MAX, "LSE", gua, t),
        make_pod("test-6", PRIORITY_PROD_VALUE_MAX - 1, "LSE", gua, t),
        make_pod("test-3", PRIORITY_PROD_VALUE_MAX - 100, "LS", bur, t),
        make_pod("test-9", PRIORITY_BATCH_VALUE_MIN, "BE", bur, t),
        make_pod("test-2", PRIORITY_PROD_VALUE_MIN, "LS", bur, t),
        make_pod("test-8", PRIORITY_BATCH_VALUE_MAX, "BE", bur, t),
        make_pod("test-15", PRIORITY_BATCH_VALUE_MIN, "BE", be, t),
        make_pod("test-16", PRIORITY_BATCH_VALUE_MIN, "BE", be, later),
        make_pod("test-17", PRIORITY_BATCH_VALUE_MIN, "BE", be, t),
        make_pod("test-18", PRIORITY_BATCH_VALUE_MIN, "BE", be, later),
        make_pod("test-19", PRIORITY_BATCH_VALUE_MIN, "BE", be, t),
        make_pod("test-20", PRIORITY_BATCH_VALUE_MIN, "BE", be, t, deletion=200),
        make_pod("test-21", PRIORITY_BATCH_VALUE_MIN, "BE", be, t, deletion=100),
        make_pod("test-22", PRIORITY_BATCH_VALUE_MIN, "BE", be, t, deletion=200, eviction=200),
        make_pod("test-23", PRIORITY_BATCH_VALUE_MIN, "BE", be, t, deletion=200, eviction=100),
        make_pod("test-4", PRIORITY_PROD_VALUE_MAX - 80, "LSR", gua, t),
        make_pod("test-7", PRIORITY_PROD_VALUE_MAX - 100, "LS", gua, t),
    ]
    metrics = {
        "test-16": {"cpu": 2000, "memory": 4 * GI},
        "test-17": {"cpu": 3000, "memory": 4 * GI},
        "test-18": {"cpu": 3000, "memory": 5 * GI},
        "test-19": {"cpu": 3000, "memory": 5 * GI},
    }
    got = order(pods, metrics, {}, {"cpu": 1, "memory": 1, "pods": 1})
    # upstream's expectation; its sort is unstable, and within {18, 16} and {19, 17} every key
    # ties (no excess, so every usage score is 0), so those pairs are compared as sets
    want = [
        "test-1",
        "test-12",
        "test-18",
        "test-16",
        "test-19",
        "test-17",
        "test-15",
        "test-21",
        "test-20",
        "test-23",
        "test-22",
        "test-9",
        "test-8",
        "test-11",
        "test-10",
        "test-13",
        "test-14",
        "test-2",
        "test-3",
        "test-7",
        "test-4",
        "test-6",
        "test-5",
    ]
    assert set(got[2:4]) == {"test-18", "test-16"}
    assert set(got[4:6]) == {"test-19", "test-17"}
    assert got[:2] == want[:2]
    assert got[6:] == want[6:]


def test_usage_score_prefers_the_pod_that_just_clears_the_excess() -> None:
    t = NOW
    pods = [
        make_pod(f"test-{i}", PRIORITY_BATCH_VALUE_MIN, "BE", "BestEffort", t) for i in (1, 2, 3, 4)
    ]
    metrics = {
        "test-1": {"cpu": 2000, "memory": 5 * GI},
        "test-2": {"cpu": 3000, "memory": 4 * GI},
        "test-3": {"cpu": 4000, "memory": 3 * GI},
        "test-4": {"cpu": 5000, "memory": 2 * GI},
    }
    got = order(pods, metrics, {"cpu": 4000, "memory": 4 * GI}, {"cpu": 1, "memory": 2, "pods": 1})
    assert got == ["test-2", "test-1", "test-3", "test-4"]


@pytest.mark.parametrize(
    ("usage", "excess", "weights", "want"),
    [
        ({"cpu": 2000}, {"cpu": 4000}, {"cpu": 1}, 0.5),
        ({"cpu": 4000}, {"cpu": 4000}, {"cpu": 1}, 2.0),
        ({"cpu": 5000}, {"cpu": 4000}, {"cpu": 1}, 1.8),
        ({"cpu": 2000, "memory": 1}, {"cpu": 4000}, {"cpu": 1}, 0.5),  # memory not over: weight 0
        ({"cpu": 0}, {}, {"cpu": 1}, 0.0),
    ],
)
def test_usage_score_is_the_piecewise_ratio(usage, excess, weights, want) -> None:
    assert usage_score(usage, excess, weights) == pytest.approx(want)


def test_node_usage_score_is_a_weighted_permille_mean() -> None:
    # ResourceUsageScorer: min(used, cap) * 1000 // cap, weighted integer mean
    assert (
        node_usage_score(
            {"cpu": 3000, "memory": 50}, {"cpu": 4000, "memory": 100}, {"cpu": 1, "memory": 1}
        )
        == (750 + 500) // 2
    )
    assert node_usage_score({"cpu": 5000}, {"cpu": 4000}, {"cpu": 2}) == 1000
    assert node_usage_score({"pods": 5}, {"pods": 10}, {"cpu": 1}) == 0
