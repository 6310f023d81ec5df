"""kube-scheduler's in-tree filters, as table tests built from its documented semantics
(kubernetes.io/docs/concepts/scheduling-eviction: assign-pod-node, taint-and-toleration,
and the plugins under kubernetes/kubernetes ``pkg/scheduler/framework/plugins``)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugins.errors import InputError
from scheduler_plugins.framework import Framework
from scheduler_plugins.plugins.nodeaffinity import ERR_NODE_AFFINITY, NodeAffinity
from scheduler_plugins.plugins.nodename import ERR_NODE_NAME, NodeName
from scheduler_plugins.plugins.nodeports import ERR_PORTS, NodePorts
from scheduler_plugins.plugins.nodeunschedulable import ERR_UNSCHEDULABLE, NodeUnschedulable
from scheduler_plugins.plugins.tainttoleration import TaintToleration
from scheduler_plugins.plugins.volumebinding import VolumeBinding
from scheduler_plugins.snapshot import parse_node, parse_pod
from scheduler_plugins.table import build_framework
from tests.scheduler.builders import NOW, node, pod
from tests.scheduler.helpers import evaluate, snapshot_of

ZONE = "topology.kubernetes.io/zone"


def term(*exprs: tuple[str, str, list[str]], fields: list[tuple[str, str, list[str]]] = ()):
    out: dict[str, Any] = {}
    if exprs:
        out["matchExpressions"] = [{"key": k, "operator": o, "values": v} for k, o, v in exprs]
    if fields:
        out["matchFields"] = [{"key": k, "operator": o, "values": v} for k, o, v in fields]
    return out


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
    }


LABELS = {"disk": "ssd", "gen": "5", ZONE: "a"}


@pytest.mark.parametrize(
    ("spec", "fits"),
    [
        ({"nodeSelector": {"disk": "ssd"}}, True),
        ({"nodeSelector": {"disk": "hdd"}}, False),
        ({"nodeSelector": {"disk": "ssd", "gpu": "yes"}}, False),  # every label must match
        (required(term(("disk", "In", ["hdd", "ssd"]))), True),
        (required(term(("disk", "In", ["hdd"]))), False),
        (required(term(("disk", "NotIn", ["hdd"]))), True),
        (required(term(("disk", "NotIn", ["ssd"]))), False),
        (required(term(("absent", "NotIn", ["x"]))), True),  # NotIn holds without the label
        (required(term(("disk", "Exists", []))), True),
        (required(term(("absent", "Exists", []))), False),
        (required(term(("absent", "DoesNotExist", []))), True),
        (required(term(("disk", "DoesNotExist", []))), False),
        (required(term(("gen", "Gt", ["4"]))), True),
        (required(term(("gen", "Gt", ["5"]))), False),
        (required(term(("gen", "Lt", ["6"]))), True),
        (required(term(("disk", "Gt", ["1"]))), False),  # not an integer: no match
        (required(term(("absent", "Lt", ["9"]))), False),
        # expressions of a term are ANDed, terms ORed
        (required(term(("disk", "In", ["ssd"]), ("gen", "In", ["4"]))), False),
        (required(term(("disk", "In", ["hdd"])), term(("gen", "In", ["5"]))), True),
        (required(term(fields=[("metadata.name", "In", ["n1"])])), True),
        (required(term(fields=[("metadata.name", "NotIn", ["n1"])])), False),
        (required(term(("disk", "In", ["ssd"]), fields=[("metadata.name", "In", ["n2"])])), False),
        (required(term()), False),  # an empty term matches nothing
        (required(), False),  # no terms: nothing matches
        # nodeSelector and required affinity must both hold
        ({**required(term(("disk", "In", ["ssd"]))), "nodeSelector": {"gen": "4"}}, False),
    ],
)
def test_node_affinity_follows_the_operators_and_matchfields(spec, fits):
    result = evaluate(
        [node("n1", labels=LABELS)], pod("p", spec=spec), plugins=[NodeAffinity()]
    ).nodes["n1"]
    assert result.reasons == ([] if fits else [ERR_NODE_AFFINITY])


@pytest.mark.parametrize(
    ("expr", "field"),
    [
        ({"key": "gen", "operator": "Gt", "values": ["1", "2"]}, "values"),
        ({"key": "gen", "operator": "Gt", "values": ["x"]}, "values"),
        ({"key": "disk", "operator": "In", "values": []}, "values"),
        ({"key": "disk", "operator": "Exists", "values": ["a"]}, "values"),
        ({"key": "disk", "operator": "Near", "values": ["a"]}, "operator"),
    ],
)
def test_an_invalid_node_selector_requirement_is_refused_naming_the_field(expr, field):
    spec = required({"matchExpressions": [expr]})
    with pytest.raises(InputError, match=rf"matchExpressions\[0\]\.{field}"):
        parse_pod(pod("p", spec=spec), "pod.yaml")


def taint(key: str, value: str = "", effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": key, "value": value, "effect": effect}


def tol(key: str = "", op: str = "Equal", value: str = "", effect: str = "") -> dict[str, str]:
    out = {"operator": op}
    if key:
        out["key"] = key
    if value:
        out["value"] = value
    if effect:
        out["effect"] = effect
    return out


@pytest.mark.parametrize(
    ("taints", "tolerations", "reason"),
    [
        ([taint("dedicated", "gpu")], [], "node(s) had untolerated taint {dedicated: gpu}"),
        (
            [taint("dedicated", "gpu", "NoExecute")],
            [],
            "node(s) had untolerated taint {dedicated: gpu}",
        ),
        ([taint("dedicated", "gpu", "PreferNoSchedule")], [], None),  # only scored
        ([taint("dedicated", "gpu")], [tol("dedicated", "Equal", "gpu", "NoSchedule")], None),
        (
            [taint("dedicated", "gpu")],
            [tol("dedicated", "Equal", "cpu")],
            "node(s) had untolerated taint {dedicated: gpu}",
        ),
        ([taint("dedicated", "gpu")], [tol("dedicated", "Exists")], None),  # any value
        ([taint("dedicated", "gpu")], [tol(op="Exists")], None),  # empty key + Exists: all
        ([taint("dedicated", "gpu")], [tol("dedicated", "Equal", "gpu")], None),  # empty effect
        (
            [taint("dedicated", "gpu")],
            [tol("dedicated", "Exists", effect="NoExecute")],
            "node(s) had untolerated taint {dedicated: gpu}",
        ),
        (
            [taint("a"), taint("b", "2")],
            [tol("a", "Exists")],
            "node(s) had untolerated taint {b: 2}",
        ),
        ([taint("a"), taint("b", "2")], [tol("b", "Exists"), tol("a", "Exists")], None),
    ],
)
def test_taints_must_be_tolerated_by_key_value_and_effect(taints, tolerations, reason):
    result = evaluate(
        [node("n1", taints=taints)],
        pod("p", spec={"tolerations": tolerations}),
        plugins=[TaintToleration()],
    ).nodes["n1"]
    assert result.reasons == ([reason] if reason else [])


def test_a_cordoned_node_is_refused_unless_the_pod_tolerates_the_unschedulable_taint():
    nodes = [node("n1", unschedulable=True), node("n2")]
    plain = evaluate(nodes, pod("p"), plugins=[NodeUnschedulable()])
    assert plain.nodes["n1"].reasons == [ERR_UNSCHEDULABLE]
    assert plain.nodes["n2"].feasible
    tolerating = pod(
        "q",
        spec={
            "tolerations": [tol("node.kubernetes.io/unschedulable", "Exists", effect="NoSchedule")]
        },
    )
    assert evaluate(nodes, tolerating, plugins=[NodeUnschedulable()]).nodes["n1"].feasible


def test_a_reservation_pinned_to_a_node_goes_nowhere_else():
    p = pod("r", annotations={"scheduling.koordinator.sh/reservation-node": "n2"})
    result = evaluate([node("n1"), node("n2")], p, plugins=[NodeName()])
    assert result.nodes["n1"].reasons == [ERR_NODE_NAME]
    assert result.nodes["n2"].feasible


def ports(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"containers": [{"name": "c", "image": "x", "ports": list(entries)}]}


@pytest.mark.parametrize(
    ("used", "wanted", "fits"),
    [
        ({"containerPort": 80, "hostPort": 8080}, {"containerPort": 80, "hostPort": 8080}, False),
        ({"containerPort": 80, "hostPort": 8080}, {"containerPort": 80, "hostPort": 8081}, True),
        ({"containerPort": 80}, {"containerPort": 80}, True),  # no hostPort: nothing bound
        (
            {"containerPort": 53, "hostPort": 53, "protocol": "UDP"},
            {"containerPort": 53, "hostPort": 53},  # TCP by default
            True,
        ),
        (
            {"containerPort": 80, "hostPort": 8080, "hostIP": "10.0.0.1"},
            {"containerPort": 80, "hostPort": 8080, "hostIP": "10.0.0.2"},
            True,
        ),
        (
            {"containerPort": 80, "hostPort": 8080, "hostIP": "10.0.0.1"},
            {"containerPort": 80, "hostPort": 8080},  # 0.0.0.0 takes every address
            False,
        ),
        (
            {"containerPort": 80, "hostPort": 8080},
            {"containerPort": 80, "hostPort": 8080, "hostIP": "10.0.0.2"},
            False,
        ),
    ],
)
def test_host_ports_conflict_by_protocol_port_and_address(used, wanted, fits):
    running = pod("running", node_name="n1", spec=ports(used))
    result = evaluate([node("n1"), running], pod("p", spec=ports(wanted)), plugins=[NodePorts()])
    assert result.nodes["n1"].reasons == ([] if fits else [ERR_PORTS])


def claim(name: str, volume: str = "", phase: str = "Pending") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"volumeName": volume},
        "status": {"phase": phase},
    }


def volume(name: str, zone: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if zone:
        spec["nodeAffinity"] = {
            "required": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": ZONE, "operator": "In", "values": [zone]}]}
                ]
            }
        }
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": spec,
    }


def with_claim(name: str = "data") -> dict[str, Any]:
    return pod("p", spec={"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": name}}]})


NODES = [node("n1", labels={ZONE: "a"}), node("n2", labels={ZONE: "b"})]


@pytest.mark.parametrize(
    ("objects", "reason"),
    [
        ([], 'persistentvolumeclaim "data" not found'),
        (
            [claim("data")],
            "pod has unbound PersistentVolumeClaims (koord-scheduler does not bind volumes): data",
        ),
    ],
)
def test_pods_with_missing_or_unbound_claims_are_refused_on_every_node(objects, reason):
    result = evaluate([*NODES, *objects], with_claim(), plugins=[VolumeBinding()])
    assert [r.reasons for r in result.nodes.values()] == [[reason], [reason]]


def test_a_bound_claim_keeps_the_pod_where_its_volume_is_reachable():
    objects = [*NODES, claim("data", "pv-a", "Bound"), volume("pv-a", zone="a")]
    result = evaluate(objects, with_claim(), plugins=[VolumeBinding()])
    assert result.nodes["n1"].feasible
    assert result.nodes["n2"].reasons == ["node(s) had volume node affinity conflict"]
    missing = evaluate(
        [*NODES, claim("data", "pv-x", "Bound")], with_claim(), plugins=[VolumeBinding()]
    )
    assert not missing.nodes["n1"].feasible


def test_generic_ephemeral_volumes_wait_for_their_claim():
    p = pod(
        "web", spec={"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}]}
    )
    result = evaluate(NODES, p, plugins=[VolumeBinding()])
    assert result.nodes["n1"].reasons == ['persistentvolumeclaim "web-scratch" not found']


def test_every_in_tree_filter_runs_in_the_default_table_with_its_reason():
    objects = [
        node("tainted", taints=[taint("team", "a")]),
        node("cordoned", unschedulable=True),
        node("elsewhere", labels={"disk": "hdd"}),
        node("ok", labels={"disk": "ssd"}),
    ]
    p = pod("p", spec={"nodeSelector": {"disk": "ssd"}})
    fw = build_framework()
    result = fw.evaluate(snapshot_of(*objects), parse_pod(p, "pod"), all_verdicts=True)
    assert result.nodes["tainted"].rejected_by["TaintToleration"] == (
        "node(s) had untolerated taint {team: a}"
    )
    assert result.nodes["cordoned"].rejected_by["NodeUnschedulable"] == ERR_UNSCHEDULABLE
    assert result.nodes["elsewhere"].rejected_by == {"NodeAffinity": ERR_NODE_AFFINITY}
    assert result.best() == "ok"


def test_taint_and_cordon_verdicts_follow_node_updates_on_one_snapshot():
    # the plugins keep the tainted and cordoned nodes from the snapshot's change log: a Node
    # update must reach them, and a check of a few nodes must agree with one over all of them
    fw = Framework([NodeUnschedulable(), TaintToleration()])
    snap = snapshot_of(node("n1"), node("n2"))
    p = parse_pod(pod("p"), "pod")

    def verdicts(names: list[str] | None = None) -> dict[str, list[str]]:
        result = fw.evaluate(snap, p, node_names=names, now=NOW, all_verdicts=True)
        return {n: r.reasons for n, r in result.nodes.items()}

    def scores() -> dict[str, int]:
        result = fw.evaluate(snap, p, now=NOW)
        return {n: r.scores.get("TaintToleration", -1) for n, r in result.nodes.items()}

    assert verdicts() == {"n1": [], "n2": []}
    assert scores() == {"n1": 100, "n2": 100}
    snap.upsert_node(parse_node(node("n1", taints=[{"key": "k", "effect": "NoExecute"}]), "t", "n"))
    snap.upsert_node(parse_node(node("n2", unschedulable=True), "t", "n"))
    want = {"n1": ["node(s) had untolerated taint {k: }"], "n2": [ERR_UNSCHEDULABLE]}
    assert verdicts() == want
    assert verdicts(["n2"]) == {"n2": want["n2"]}
    snap.upsert_node(parse_node(node("n1"), "t", "n"))
    snap.upsert_node(
        parse_node(node("n2", taints=[{"key": "k", "effect": "PreferNoSchedule"}]), "t", "n")
    )
    assert verdicts() == {"n1": [], "n2": []}
    assert scores() == {"n1": 100, "n2": 0}
    snap.upsert_node(parse_node(node("n2"), "t", "n"))
    assert scores() == {"n1": 100, "n2": 100}
