"""InterPodAffinity from kube-scheduler's documented semantics
(kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#inter-pod-affinity-and-anti-affinity,
``pkg/scheduler/framework/plugins/interpodaffinity``)."""

from __future__ import annotations

from typing import Any

from scheduler_plugins.plugins.interpodaffinity import (
    ERR_AFFINITY,
    ERR_ANTI_AFFINITY,
    ERR_EXISTING_ANTI_AFFINITY,
    InterPodAffinity,
)
from tests.scheduler.builders import node, pod
from tests.scheduler.helpers import evaluate

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def term(app: str, key: str = ZONE, **extra: Any) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key, **extra}


def affinity(kind: str, *terms: dict[str, Any], preferred: list[tuple[int, dict]] = ()):
    section: dict[str, Any] = {}
    if terms:
        section["requiredDuringSchedulingIgnoredDuringExecution"] = list(terms)
    if preferred:
        section["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": w, "podAffinityTerm": t} for w, t in preferred
        ]
    return {"affinity": {kind: section}}


def cluster() -> list[dict[str, Any]]:
    """Zone a: n1 (db pod), n2; zone b: n3 (web pod); n4 has no zone label."""
    return [
        node("n1", labels={ZONE: "a", HOST: "n1"}),
        node("n2", labels={ZONE: "a", HOST: "n2"}),
        node("n3", labels={ZONE: "b", HOST: "n3"}),
        node("n4", labels={HOST: "n4"}),
        pod("db", node_name="n1", labels={"app": "db"}),
        pod("web", node_name="n3", labels={"app": "web"}),
    ]


def reasons(objects, p):
    result = evaluate(objects, p, plugins=[InterPodAffinity()])
    return {name: r.reasons for name, r in result.nodes.items()}


def test_required_affinity_needs_a_matching_pod_in_the_nodes_domain():
    got = reasons(cluster(), pod("p", spec=affinity("podAffinity", term("db"))))
    assert got == {"n1": [], "n2": [], "n3": [ERR_AFFINITY], "n4": [ERR_AFFINITY]}
    assert InterPodAffinity().unresolvable(ERR_AFFINITY)


def test_the_first_pod_of_a_self_affine_group_may_go_where_the_key_exists():
    p = pod("first", labels={"app": "cache"}, spec=affinity("podAffinity", term("cache")))
    got = reasons(cluster(), p)
    assert got == {"n1": [], "n2": [], "n3": [], "n4": [ERR_AFFINITY]}
    # a pod its own term does not match gets no such pass
    q = pod("q", spec=affinity("podAffinity", term("cache")))
    assert all(r == [ERR_AFFINITY] for r in reasons(cluster(), q).values())


def test_required_anti_affinity_keeps_the_pod_out_of_matching_domains():
    got = reasons(cluster(), pod("p", spec=affinity("podAntiAffinity", term("web", HOST))))
    assert got == {"n1": [], "n2": [], "n3": [ERR_ANTI_AFFINITY], "n4": []}
    zone = reasons(cluster(), pod("p", spec=affinity("podAntiAffinity", term("db"))))
    assert zone == {"n1": [ERR_ANTI_AFFINITY], "n2": [ERR_ANTI_AFFINITY], "n3": [], "n4": []}


def test_existing_pods_anti_affinity_is_symmetric():
    objects = cluster()
    objects.append(
        pod(
            "loner",
            node_name="n2",
            labels={"app": "loner"},
            spec=affinity("podAntiAffinity", term("web")),
        )
    )
    got = reasons(objects, pod("p", labels={"app": "web"}))
    assert got == {
        "n1": [ERR_EXISTING_ANTI_AFFINITY],
        "n2": [ERR_EXISTING_ANTI_AFFINITY],
        "n3": [],
        "n4": [],
    }
    assert reasons(objects, pod("p", labels={"app": "other"}))["n1"] == []


def test_terms_are_about_their_namespaces():
    objects = cluster()
    objects.append(pod("db-x", node_name="n3", labels={"app": "db"}, namespace="x"))
    own_ns = reasons(objects, pod("p", spec=affinity("podAffinity", term("db"))))
    assert own_ns["n3"] == [ERR_AFFINITY]  # db-x is in another namespace
    listed = pod("p", spec=affinity("podAffinity", term("db", namespaces=["x"])))
    assert reasons(objects, listed)["n3"] == []
    assert reasons(objects, listed)["n1"] == [ERR_AFFINITY]


def test_a_namespace_selector_matches_namespaces_by_their_labels():
    objects = cluster()
    objects.append(pod("db-x", node_name="n3", labels={"app": "db"}, namespace="x"))
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "x", "labels": {"team": "t"}},
        }
    )
    selected = pod(
        "p",
        spec=affinity("podAffinity", term("db", namespaceSelector={"matchLabels": {"team": "t"}})),
    )
    got = reasons(objects, selected)
    assert got["n3"] == []
    assert got["n1"] == [ERR_AFFINITY]  # the default namespace is not selected
    everywhere = pod("p", spec=affinity("podAffinity", term("db", namespaceSelector={})))
    assert reasons(objects, everywhere)["n1"] == []


def test_preferred_terms_score_domains_by_weight():
    p = pod(
        "p",
        spec=affinity("podAffinity", preferred=[(80, term("db")), (20, term("web"))]),
    )
    result = evaluate(cluster(), p, plugins=[InterPodAffinity()])
    got = {n: r.scores["InterPodAffinity"] for n, r in result.nodes.items()}
    # zone a 80, zone b 20, n4 (no zone) 0: (s - 0) * 100 // 80
    assert got == {"n1": 100, "n2": 100, "n3": 25, "n4": 0}


def test_preferred_anti_affinity_lowers_the_domain():
    p = pod("p", spec=affinity("podAntiAffinity", preferred=[(50, term("web"))]))
    result = evaluate(cluster(), p, plugins=[InterPodAffinity()])
    got = {n: r.scores["InterPodAffinity"] for n, r in result.nodes.items()}
    assert got == {"n1": 100, "n2": 100, "n3": 0, "n4": 100}


def test_an_existing_pods_required_affinity_draws_the_matching_pod():
    objects = cluster()
    objects.append(
        pod("fan", node_name="n3", labels={"app": "fan"}, spec=affinity("podAffinity", term("db")))
    )
    result = evaluate(objects, pod("p", labels={"app": "db"}), plugins=[InterPodAffinity()])
    got = {n: r.scores["InterPodAffinity"] for n, r in result.nodes.items()}
    assert got == {"n1": 0, "n2": 0, "n3": 100, "n4": 0}  # hardPodAffinityWeight 1 on zone b


def test_a_cluster_without_terms_takes_no_part():
    result = evaluate(cluster(), pod("p"), plugins=[InterPodAffinity()])
    assert all(r.feasible and not r.scores for r in result.nodes.values())
