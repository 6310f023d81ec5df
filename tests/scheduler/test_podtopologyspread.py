"""PodTopologySpread from kube-scheduler's documented semantics
(kubernetes.io/docs/concepts/scheduling-eviction/topology-spread-constraints,
``pkg/scheduler/framework/plugins/podtopologyspread``)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugins.plugins.podtopologyspread import (
    ERR_CONSTRAINTS,
    ERR_MISSING_LABEL,
    PodTopologySpread,
)
from tests.scheduler.builders import node, pod
from tests.scheduler.helpers import evaluate

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def spread(
    max_skew: int = 1,
    key: str = ZONE,
    when: str = "DoNotSchedule",
    app: str = "web",
    **extra: Any,
) -> dict[str, Any]:
    return {
        "maxSkew": max_skew,
        "topologyKey": key,
        "whenUnsatisfiable": when,
        "labelSelector": {"matchLabels": {"app": app}},
        **extra,
    }


def zones(**counts: int) -> list[dict[str, Any]]:
    """One node per zone (``za``, ``zb``...) holding ``counts[zone]`` web pods."""
    objects: list[dict[str, Any]] = []
    for z, n in counts.items():
        objects.append(node(f"n-{z}", labels={ZONE: z, HOST: f"n-{z}"}))
        objects += [pod(f"{z}-{i}", node_name=f"n-{z}", labels={"app": "web"}) for i in range(n)]
    return objects


def web(*constraints: dict[str, Any], labels: dict[str, str] | None = None, **spec: Any):
    return pod(
        "new",
        labels={"app": "web"} if labels is None else labels,
        spec={"topologySpreadConstraints": list(constraints), **spec},
    )


def reasons(objects, p):
    result = evaluate(objects, p, plugins=[PodTopologySpread()])
    return {name: r.reasons for name, r in result.nodes.items()}


@pytest.mark.parametrize(
    ("counts", "max_skew", "rejected"),
    [
        ({"a": 2, "b": 0}, 1, {"n-a"}),  # a: 2 + 1 - 0 = 3 > 1
        ({"a": 1, "b": 0}, 1, {"n-a"}),  # a: 1 + 1 - 0 = 2 > 1
        ({"a": 1, "b": 0}, 2, set()),  # a: 2 <= 2
        ({"a": 1, "b": 1}, 1, set()),  # 1 + 1 - 1 = 1
        ({"a": 3, "b": 1, "c": 2}, 1, {"n-a", "n-c"}),  # min 1
    ],
)
def test_skew_is_matching_pods_plus_self_less_the_emptiest_domain(counts, max_skew, rejected):
    got = reasons(zones(**counts), web(spread(max_skew)))
    assert {n for n, r in got.items() if r} == rejected
    assert all(r == [ERR_CONSTRAINTS] for r in got.values() if r)


def test_a_pod_that_its_own_selector_does_not_match_adds_nothing_to_the_skew():
    got = reasons(zones(a=1, b=0), web(spread(1), labels={"app": "other"}))
    assert got == {"n-a": [], "n-b": []}  # a: 1 + 0 - 0


def test_a_node_without_the_topology_key_is_refused_for_the_missing_label():
    objects = [*zones(a=0), node("bare")]
    got = reasons(objects, web(spread(1)))
    assert got["bare"] == [ERR_MISSING_LABEL]
    assert PodTopologySpread().unresolvable(ERR_MISSING_LABEL)
    assert not PodTopologySpread().unresolvable(ERR_CONSTRAINTS)


def test_min_domains_counts_missing_domains_as_empty():
    # one zone holding one pod: min is 1, skew 1 + 1 - 1 = 1 fits; with minDomains 2 the
    # global minimum is 0 and the skew 2 does not
    assert reasons(zones(a=1), web(spread(1))) == {"n-a": []}
    assert reasons(zones(a=1), web(spread(1, minDomains=2))) == {"n-a": [ERR_CONSTRAINTS]}


def test_only_pods_of_the_namespace_and_not_terminating_are_counted():
    objects = zones(a=0, b=0)
    objects.append(pod("other-ns", node_name="n-a", labels={"app": "web"}, namespace="x"))
    leaving = pod("leaving", node_name="n-a", labels={"app": "web"})
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    objects.append(leaving)
    assert reasons(objects, web(spread(1))) == {"n-a": [], "n-b": []}


def test_nodes_the_pod_cannot_use_are_not_domains_by_default():
    # zone b's node is excluded by the pod's nodeSelector (nodeAffinityPolicy: Honor), so the
    # minimum is zone a's own count
    objects = zones(a=1, b=0)
    objects[0]["metadata"]["labels"]["pool"] = "x"
    p = web(spread(1), nodeSelector={"pool": "x"})
    assert reasons(objects, p)["n-a"] == []
    ignore = web(spread(1, nodeAffinityPolicy="Ignore"), nodeSelector={"pool": "x"})
    assert reasons(objects, ignore)["n-a"] == [ERR_CONSTRAINTS]


def test_node_taints_policy_honor_leaves_out_nodes_the_pod_does_not_tolerate():
    objects = zones(a=1, b=0)
    objects[2]["spec"]["taints"] = [{"key": "t", "effect": "NoSchedule"}]  # zone b's node
    assert reasons(objects, web(spread(1)))["n-a"] == [ERR_CONSTRAINTS]  # Ignore by default
    honor = web(spread(1, nodeTaintsPolicy="Honor"))
    assert reasons(objects, honor)["n-a"] == []


def test_match_label_keys_narrow_the_selector_to_the_pods_revision():
    objects = zones(a=0, b=0)
    objects += [
        pod(f"old-{i}", node_name="n-a", labels={"app": "web", "rev": "1"}) for i in range(2)
    ]
    p = web(spread(1, matchLabelKeys=["rev"]), labels={"app": "web", "rev": "2"})
    assert reasons(objects, p) == {"n-a": [], "n-b": []}
    assert reasons(objects, web(spread(1)))["n-a"] == [ERR_CONSTRAINTS]


def test_hostname_spreading_counts_per_node():
    objects = zones(a=2, b=1)
    assert reasons(objects, web(spread(1, key=HOST))) == {"n-a": [ERR_CONSTRAINTS], "n-b": []}


def test_schedule_anyway_only_scores_preferring_the_emptiest_domain():
    objects = zones(a=3, b=1, c=0)
    result = evaluate(objects, web(spread(1, when="ScheduleAnyway")), plugins=[PodTopologySpread()])
    assert all(r.feasible for r in result.nodes.values())
    got = {n: r.scores["PodTopologySpread"] for n, r in result.nodes.items()}
    # raw = round(count * ln(3 + 2)): a 5, b 2, c 0; 100 * (5 + 0 - raw) // 5
    assert got == {"n-a": 0, "n-b": 60, "n-c": 100}


def test_nodes_missing_a_soft_key_score_zero():
    objects = [*zones(a=0), node("bare")]
    result = evaluate(objects, web(spread(1, when="ScheduleAnyway")), plugins=[PodTopologySpread()])
    assert result.nodes["bare"].scores["PodTopologySpread"] == 0
    assert result.nodes["n-a"].scores["PodTopologySpread"] == 100


def test_a_pod_without_constraints_is_neither_filtered_nor_scored():
    result = evaluate(zones(a=5, b=0), pod("p"), plugins=[PodTopologySpread()])
    assert all(r.feasible and not r.scores for r in result.nodes.values())
