"""LowNodeLoad against upstream's own test tables and documented behaviour.

The first table is ``TestLowNodeUtilization`` of ``pkg/descheduler/framework/plugins/loadaware/
low_node_load_test.go`` (koordinator-sh/koordinator), case by case: three 4-core nodes (``n3``
unschedulable), 400m pods, NodeMetrics whose pod entries are the pods' requests, and the expected
number of evictions. Upstream runs it with the DefaultEvictor (``NodeFit: true``) and no anomaly
condition; we run the MigrationController with its workload limits opened
(``helpers.PERMISSIVE_MIGRATION``) and ``consecutiveAbnormalities: 1``, which decide the same.
"""

from __future__ import annotations

from typing import Any

import pytest

from descheduler.cluster import build_cluster
from descheduler.config import parse_config
from descheduler.explain import as_json, explain_round
from descheduler.loadaware.args import parse_args
from descheduler.loadaware.utilization import (
    NodeUsage,
    new_thresholds,
    over_reason,
    set_thresholds,
)
from scheduler_plugins.table import PLUGINS as SCHEDULER_PLUGINS
from tests.descheduler.builders import (
    NOW,
    build_node,
    build_pod,
    low_node_load_config,
    node_metric,
    replica_set,
)
from tests.descheduler.helpers import PERMISSIVE_MIGRATION, migrated, run_round

LOW = {"cpu": 30, "pods": 30}
HIGH = {"cpu": 50, "pods": 50}
MIRROR = {"kubernetes.io/config.mirror": "mirror"}
LOCAL = [{"name": "sample", "hostPath": {"path": "somePath"}, "emptyDir": {"sizeLimit": "10"}}]
NORMAL_OWNER = ("ReplicationController", "rc", "uid-rc")
DS = ("DaemonSet", "ds", "uid-ds")
HIGH_PRIORITY = 10000
LOW_PRIORITY = 0


def three_nodes(n1_pods: int = 9) -> list[dict[str, Any]]:
    return [
        build_node("n1", 4000, 3000, n1_pods),
        build_node("n2", 4000, 3000, 10),
        build_node("n3", 4000, 3000, 10, unschedulable=True),
    ]


def unevictable(cpu: int = 400) -> list[dict[str, Any]]:
    """p6, p7, p8 of every case: a DaemonSet pod, a mirror pod with local storage, a critical
    pod."""
    return [
        build_pod("p6", cpu, 0, "n1", owner=DS),
        build_pod("p7", cpu, 0, "n1", owner=NORMAL_OWNER, annotations=MIRROR, volumes=LOCAL),
        build_pod("p8", cpu, 0, "n1", namespace="kube-system", priority=2_000_000_000, owner=None),
    ]


def test_no_evictable_pods_moves_nothing() -> None:
    pods = [build_pod(f"p{i}", 400, 0, "n1", owner=DS) for i in range(1, 5)]
    pods += [
        build_pod("p5", 400, 0, "n1", owner=NORMAL_OWNER, annotations=MIRROR, volumes=LOCAL),
        build_pod("p6", 400, 0, "n1", namespace="kube-system", priority=2_000_000_000, owner=None),
        build_pod("p9", 400, 0, "n2"),
    ]
    report = run_round(three_nodes(), pods, lowThresholds=LOW, highThresholds=HIGH)
    assert migrated(report) == []
    reasons = {v.pod: v.detail for v in report.verdicts}
    assert reasons["default/p1"] == "pod is a DaemonSet pod"
    assert "pod is a mirror pod" in reasons["default/p5"]
    assert "local storage" in reasons["default/p5"]
    assert "pod has system critical priority" in reasons["kube-system/p6"]


def test_without_priorities_four_pods_move_until_the_target_is_full() -> None:
    pods = [build_pod(f"p{i}", 400, 0, "n1") for i in range(1, 6)]
    pods += [*unevictable(), build_pod("p9", 400, 0, "n2")]
    report = run_round(three_nodes(), pods, lowThresholds=LOW, highThresholds=HIGH)
    assert migrated(report) == ["p1", "p2", "p3", "p4"]
    # p5 would lift n2 over its 50 % cpu threshold (2000m) once p1..p4 are counted there
    p5 = next(v for v in report.verdicts if v.pod == "default/p5")
    assert p5.outcome == "skip"
    assert "cpu would exceed its high threshold" in p5.detail


def test_excluded_namespace_moves_nothing() -> None:
    pods = [build_pod(f"p{i}", 400, 0, "n1", namespace="namespace1") for i in range(1, 6)]
    pods += [*unevictable(), build_pod("p9", 400, 0, "n2")]
    report = run_round(
        three_nodes(),
        pods,
        lowThresholds=LOW,
        highThresholds=HIGH,
        evictableNamespaces={"exclude": ["namespace1"]},
    )
    assert migrated(report) == []


def test_included_namespace_only_moves_its_pods() -> None:
    pods = [build_pod("p1", 400, 0, "n1"), build_pod("p2", 400, 0, "n1")]
    pods += [build_pod(f"p{i}", 400, 0, "n1", namespace=f"namespace{i}") for i in (3, 4, 5)]
    pods += [*unevictable(), build_pod("p9", 400, 0, "n2")]
    report = run_round(
        three_nodes(),
        pods,
        lowThresholds=LOW,
        highThresholds=HIGH,
        evictableNamespaces={"include": ["default"]},
    )
    assert migrated(report) == ["p1", "p2"]


def test_moves_stop_when_the_targets_cpu_room_is_spent() -> None:
    pods = [build_pod(f"p{i}", 400, 300, "n1") for i in range(1, 6)]
    pods += [*unevictable(), build_pod("p9", 400, 2100, "n2")]
    report = run_round(three_nodes(), pods, lowThresholds=LOW, highThresholds=HIGH)
    # 4 pods could go by the pods resource; 3 fit before n2's cpu room is gone
    assert len(migrated(report)) == 3


def test_lower_priority_pods_move_first() -> None:
    pods = [build_pod(f"p{i}", 400, 0, "n1", priority=HIGH_PRIORITY) for i in range(1, 5)]
    pods.append(build_pod("p5", 400, 0, "n1", priority=LOW_PRIORITY))
    pods += [
        build_pod("p6", 400, 0, "n1", owner=DS, priority=HIGH_PRIORITY),
        build_pod(
            "p7",
            400,
            0,
            "n1",
            owner=NORMAL_OWNER,
            annotations=MIRROR,
            volumes=LOCAL,
            priority=LOW_PRIORITY,
        ),
        build_pod("p8", 400, 0, "n1", namespace="kube-system", priority=2_000_000_000, owner=None),
        build_pod("p9", 400, 0, "n2"),
    ]
    report = run_round(three_nodes(), pods, lowThresholds=LOW, highThresholds=HIGH)
    # v1.6 reserves room on a target as each pod is checked, in the node's pod order, before
    # sorting: p1..p4 fill n2's 2000m, so p5 is never a candidate
    assert migrated(report) == ["p1", "p2", "p3", "p4"]
    # with room for every pod, the low-priority one goes first
    roomy = [build_node("n1", 4000, 3000, 9), build_node("n2", 8000, 3000, 10)]
    report = run_round(roomy, pods, lowThresholds=LOW, highThresholds=HIGH)
    assert migrated(report)[0] == "p5"


def test_best_effort_pods_move_first() -> None:
    pods = [
        build_pod("p1", 0, 0, "n1", qos_class="BestEffort"),
        build_pod("p2", 0, 0, "n1", qos_class="BestEffort"),
        build_pod("p3", 400, 0, "n1"),
        build_pod("p4", 0, 0, "n1", qos_class="BestEffort"),
        build_pod("p5", 0, 0, "n1", qos_class="BestEffort"),
        *unevictable(),
        build_pod("p9", 400, 0, "n2"),
    ]
    report = run_round(three_nodes(), pods, lowThresholds=LOW, highThresholds=HIGH)
    assert migrated(report) == ["p1", "p2", "p4", "p5"]


EXT = "example.com/foo"


def test_an_extended_resource_bounds_the_moves() -> None:
    nodes = [
        build_node("n1", 4000, 3000, 9, extra={EXT: 8}),
        build_node("n2", 4000, 3000, 10, extra={EXT: 8}),
        build_node("n3", 4000, 3000, 10, unschedulable=True),
    ]
    pods = [build_pod(f"p{i}", 0, 0, "n1", extra={EXT: 1}) for i in range(1, 6)]
    pods += [
        build_pod("p6", 0, 0, "n1", owner=NORMAL_OWNER, extra={EXT: 1}),
        build_pod(
            "p7", 0, 0, "n1", owner=NORMAL_OWNER, extra={EXT: 1}, annotations=MIRROR, volumes=LOCAL
        ),
        build_pod(
            "p8",
            0,
            0,
            "n1",
            namespace="kube-system",
            priority=2_000_000_000,
            owner=None,
            extra={EXT: 1},
        ),
        build_pod("p9", 0, 0, "n2", extra={EXT: 1}),
    ]
    report = run_round(
        nodes, pods, lowThresholds={"pods": 30, EXT: 30}, highThresholds={"pods": 50, EXT: 50}
    )
    # 4 pods could go by the pods resource; 3 before the extended resource's room is spent
    assert len(migrated(report)) == 3


def test_a_target_without_the_extended_resource_takes_nothing() -> None:
    nodes = [
        build_node("n1", 4000, 3000, 9, extra={EXT: 8}),
        build_node("n2", 4000, 3000, 10),
        build_node("n3", 4000, 3000, 10, unschedulable=True),
    ]
    pods = [build_pod("p1", 0, 0, "n1", extra={EXT: 1}), build_pod("p9", 0, 0, "n2")]
    report = run_round(
        nodes, pods, lowThresholds={"pods": 30, EXT: 30}, highThresholds={"pods": 50, EXT: 50}
    )
    assert migrated(report) == []


def test_an_unschedulable_node_is_no_target() -> None:
    nodes = [build_node("n1", 4000, 3000, 9), build_node("n2", 4000, 3000, 10, unschedulable=True)]
    pods = [build_pod(f"p{i}", 400, 0, "n1") for i in range(1, 6)] + unevictable()
    report = run_round(nodes, pods, lowThresholds=LOW, highThresholds=HIGH)
    assert migrated(report) == []
    assert as_json(report_cluster(nodes, pods), report)["nodes"]["n2"]["class"] == "normal"


def report_cluster(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Any:
    return build_cluster([*nodes, *pods])


def test_pods_whose_node_selector_no_target_matches_stay() -> None:
    # nodeFit asks the scheduler's own filters: NodeAffinity is one of them.
    assert "NodeAffinity" in SCHEDULER_PLUGINS
    nodes = [
        build_node("n1", 4000, 3000, 9),
        build_node("n2", 4000, 3000, 10, labels={"datacenter": "east"}),
    ]
    pods = [build_pod(f"p{i}", 400, 0, "n1") for i in range(1, 4)]
    pods += [
        build_pod(f"p{i}", 400, 0, "n1", owner=NORMAL_OWNER, node_selector={"datacenter": "west"})
        for i in (4, 5)
    ]
    pods += unevictable()
    report = run_round(nodes, pods, lowThresholds=LOW, highThresholds=HIGH)
    assert len(migrated(report)) == 3


def test_deviation_thresholds_are_around_the_mean() -> None:
    pods = [build_pod(f"p{i}", 400, 0, "n1") for i in range(1, 6)]
    pods += [*unevictable(), build_pod("p9", 400, 0, "n2")]
    report = run_round(
        three_nodes(),
        pods,
        lowThresholds={"cpu": 5, "pods": 5},
        highThresholds={"cpu": 5, "pods": 5},
        useDeviationThresholds=True,
    )
    # mean cpu 30 %, pods 32.96 %: n2 takes 35 % cpu (1000m more) and 3 pods (2 more)
    assert len(migrated(report)) == 2
    assert report.nodes["n1"].node_class == "high"
    assert report.nodes["n2"].node_class == "low"
    assert report.nodes["n2"].high["cpu"] == pytest.approx(35.0)


@pytest.mark.parametrize(
    ("usage", "want"),
    [
        (
            {"cpu": 64_000, "memory": 32 * 1024**3},
            "node is overutilized, node cpu usage(66.67%)>threshold(50.00%)",
        ),
        (
            {"cpu": 64_000, "memory": 400 * 1024**3},
            "node is overutilized, node cpu usage(66.67%)>threshold(50.00%), "
            "node memory usage(78.12%)>threshold(50.00%)",
        ),
    ],
)
def test_the_eviction_reason_names_the_hot_resources(usage: dict[str, int], want: str) -> None:
    """``TestOverUtilizedEvictionReason`` (v1.6 prefixes ``node``/``prod``)."""
    pool = parse_args(
        {"highThresholds": {"cpu": 50, "memory": 50}, "lowThresholds": {"cpu": 10, "memory": 10}},
        "t",
    ).node_pools[0]
    th = new_thresholds(pool)
    cluster = build_cluster([build_node("test-node", 96_000, 512 * 1024**3)])
    node = cluster.sched.nodes["test-node"]
    u = NodeUsage(node, node.allocatable, [], None, dict(usage), set())  # type: ignore[arg-type]
    set_thresholds({"test-node": u}, th, False)
    assert over_reason(u, th.high, False) == want


def _hot_cluster(metric_age: float = 30) -> list[dict[str, Any]]:
    nodes = [build_node("hot", 4000, 8000), build_node("cold", 4000, 8000)]
    pods = [build_pod(f"a{i}", 1000, 1000, "hot") for i in range(3)]
    pods.append(build_pod("b0", 200, 1000, "cold"))
    metrics = [
        node_metric("hot", pods, updated=NOW - metric_age),
        node_metric("cold", pods, updated=NOW - metric_age),
    ]
    return [*nodes, *pods, *metrics, replica_set(replicas=10)]


def test_usage_is_system_usage_plus_every_pod_entry_over_allocatable() -> None:
    objects = _hot_cluster()
    metric = next(
        o for o in objects if o["kind"] == "NodeMetric" and o["metadata"]["name"] == "hot"
    )
    metric["status"]["nodeMetric"]["systemUsage"] = {"resources": {"cpu": "200m", "memory": "800"}}
    metric["status"]["podsMetric"].append(
        {"namespace": "default", "name": "gone", "podUsage": {"resources": {"cpu": "100m"}}}
    )
    cfg = parse_config(
        low_node_load_config(lowThresholds={"cpu": 10}, highThresholds={"cpu": 60}), "c"
    )
    report = explain_round(cfg, build_cluster(objects), NOW, None)
    # 3000m of pods + 200m system + 100m of a pod no longer there = 3300m of 4000m
    assert report.nodes["hot"].usage["cpu"] == pytest.approx(82.5)
    assert report.nodes["hot"].usage["memory"] == pytest.approx(3800 / 8000 * 100)


def test_an_expired_node_metric_leaves_the_node_out() -> None:
    cfg = parse_config(
        low_node_load_config(lowThresholds={"cpu": 10}, highThresholds={"cpu": 60}), "c"
    )
    report = explain_round(cfg, build_cluster(_hot_cluster(metric_age=180)), NOW, None)
    assert report.nodes["hot"].note.startswith("NodeMetric expired")
    assert report.migrations == []


def test_raw_allocatable_is_the_denominator() -> None:
    objects = _hot_cluster()
    hot = objects[0]
    hot["metadata"]["annotations"]["node.koordinator.sh/raw-allocatable"] = (
        '{"cpu": "8", "memory": "8000"}'
    )
    cfg = parse_config(
        low_node_load_config(lowThresholds={"cpu": 10}, highThresholds={"cpu": 60}), "c"
    )
    report = explain_round(cfg, build_cluster(objects), NOW, None)
    assert report.nodes["hot"].usage["cpu"] == pytest.approx(37.5)
    assert report.nodes["hot"].node_class == "normal"


def test_a_hot_node_is_a_source_only_after_more_than_consecutive_abnormalities_rounds() -> None:
    """``filterRealAbnormalNodes``: the detector turns anomalous once the consecutive
    abnormalities exceed the configured count (5 by default, so the 6th round)."""
    objects = _hot_cluster()
    args = {"lowThresholds": {"cpu": 10}, "highThresholds": {"cpu": 60}}
    migration = {**PERMISSIVE_MIGRATION}
    cfg = parse_config(low_node_load_config(migration=migration, **args), "c")
    for rounds, expect in ((1, 0), (5, 0), (6, 1)):
        report = explain_round(cfg, build_cluster(objects), NOW, rounds)
        assert len(report.migrations) == expect, rounds
    cfg1 = parse_config(
        low_node_load_config(
            migration=migration, anomalyCondition={"consecutiveAbnormalities": 1}, **args
        ),
        "c",
    )
    assert len(explain_round(cfg1, build_cluster(objects), NOW, 1).migrations) == 1


def test_the_round_stops_once_the_source_is_under_its_high_threshold() -> None:
    objects = _hot_cluster()
    cfg = parse_config(
        low_node_load_config(
            migration=PERMISSIVE_MIGRATION, lowThresholds={"cpu": 10}, highThresholds={"cpu": 60}
        ),
        "c",
    )
    report = explain_round(cfg, build_cluster(objects), NOW, None)
    assert len(report.migrations) == 1  # 3000m -> 2000m = 50 % < 60 %
    stops = [v for v in report.verdicts if v.outcome == "stop"]
    assert stops
    assert all(v.detail == "the node is under its high thresholds now" for v in stops)


def test_number_of_nodes_holds_back_a_small_pool() -> None:
    objects = _hot_cluster()
    cfg = parse_config(
        low_node_load_config(
            migration=PERMISSIVE_MIGRATION,
            lowThresholds={"cpu": 10},
            highThresholds={"cpu": 60},
            numberOfNodes=1,
        ),
        "c",
    )
    report = explain_round(cfg, build_cluster(objects), NOW, None)
    assert report.migrations == []
    assert any("numberOfNodes" in n for n in report.notes)


def test_node_pools_apply_their_own_thresholds() -> None:
    nodes = [
        build_node("a1", 4000, 8000, labels={"pool": "a"}),
        build_node("a2", 4000, 8000, labels={"pool": "a"}),
        build_node("b1", 4000, 8000, labels={"pool": "b"}),
        build_node("b2", 4000, 8000, labels={"pool": "b"}),
    ]
    pods = [build_pod(f"x{i}", 1000, 100, "a1") for i in range(3)]
    pods += [build_pod(f"y{i}", 1000, 100, "b1") for i in range(3)]
    metrics = [node_metric(n["metadata"]["name"], pods) for n in nodes]
    doc = low_node_load_config(
        migration=PERMISSIVE_MIGRATION,
        nodeSelector={"matchLabels": {"pool": "none"}},
        nodePools=[
            {
                "name": "a",
                "nodeSelector": {"matchLabels": {"pool": "a"}},
                "lowThresholds": {"cpu": 10},
                "highThresholds": {"cpu": 60},
            },
            {
                "name": "b",
                "nodeSelector": {"matchLabels": {"pool": "b"}},
                "lowThresholds": {"cpu": 10},
                "highThresholds": {"cpu": 80},
            },
        ],
    )
    cluster = build_cluster([*nodes, *pods, *metrics, replica_set(replicas=10)])
    report = explain_round(parse_config(doc, "c"), cluster, NOW, None)
    assert report.nodes["a1"].node_class == "high"
    assert report.nodes["a1"].pool == "a"
    assert report.nodes["b1"].node_class == "normal"  # 75 % is under pool b's 80 %
    assert [m.node for m in report.migrations] == ["a1"]
