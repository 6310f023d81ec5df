"""Reservation: resources held for owners, matched and consumed, expiring."""

from __future__ import annotations

import json

from scheduler_plugins.framework import Framework
from scheduler_plugins.plugins.noderesourcesfit import NodeResourcesFit
from scheduler_plugins.plugins.reservation import Reservation
from scheduler_plugins.snapshot import parse_pod
from tests.scheduler.builders import NOW, node, pod, ts
from tests.scheduler.helpers import evaluate, snapshot_of

ALLOCATED = "scheduling.koordinator.sh/reservation-allocated"


def reservation(
    name,
    node_name,
    cpu,
    *,
    owners=None,
    phase="Available",
    ttl=None,
    expires=None,
    created=NOW - 60,
):
    spec = {
        "template": {
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": str(cpu)}}}]}
        },
        "owners": owners or [{"labelSelector": {"matchLabels": {"app": "web"}}}],
    }
    if ttl is not None:
        spec["ttl"] = ttl
    if expires is not None:
        spec["expires"] = ts(expires)
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": ts(created)},
        "spec": spec,
        "status": {"phase": phase, "nodeName": node_name, "allocatable": {"cpu": str(cpu)}},
    }


def run(objects, p):
    return evaluate(objects, p, plugins=[Reservation(), NodeResourcesFit()])


WEB = {"app": "web"}


def test_reserved_resources_are_free_for_owners_and_held_from_others():
    objects = [
        node("n1", cpu="8"),
        reservation("r1", "n1", 6),
        pod("busy", node_name="n1", requests={"cpu": "1"}),
    ]
    owner = run(objects, pod("web-1", labels=WEB, requests={"cpu": "6"}))
    assert owner.nodes["n1"].feasible
    assert owner.nodes["n1"].scores["Reservation"] == 100
    other = run(objects, pod("batch", requests={"cpu": "2"}))
    assert other.nodes["n1"].reasons == ["Insufficient cpu"]  # 8 - 1 - 6 held = 1 free
    assert "Reservation" not in other.nodes["n1"].scores


def test_owners_match_by_object_controller_and_label_expressions():
    owners = [
        {"object": {"name": "exact", "namespace": "default"}},
        {"controller": {"name": "web-rs", "kind": "ReplicaSet"}},
        {
            "labelSelector": {
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold"]}]
            }
        },
    ]
    objects = [node("n1", cpu="4"), reservation("r1", "n1", 4, owners=owners)]
    controlled = pod("c1", requests={"cpu": "3"})
    controlled["metadata"]["ownerReferences"] = [
        {"kind": "ReplicaSet", "name": "web-rs", "controller": True}
    ]
    for p in (
        pod("exact", requests={"cpu": "3"}),
        controlled,
        pod("g", labels={"tier": "gold"}, requests={"cpu": "3"}),
    ):
        assert run(objects, p).nodes["n1"].feasible
    assert not run(objects, pod("stranger", requests={"cpu": "3"})).nodes["n1"].feasible


def test_expired_or_unavailable_reservations_hold_nothing():
    stranger = pod("s", requests={"cpu": "3"})
    for r in (
        reservation("r1", "n1", 4, ttl="30s"),
        reservation("r1", "n1", 4, expires=NOW - 1),
        reservation("r1", "n1", 4, phase="Succeeded"),
    ):
        assert run([node("n1", cpu="4"), r], stranger).nodes["n1"].feasible


def test_reserve_consumes_the_reservation_and_the_next_owner_sees_what_is_left():
    fw = Framework([Reservation(), NodeResourcesFit()])
    snap = snapshot_of(node("n1", cpu="8"), reservation("r1", "n1", 4))
    first = parse_pod(pod("web-1", labels=WEB, requests={"cpu": "3"}), "p")
    cycle = fw.new_cycle(snap, NOW)
    assert fw.evaluate(snap, first, cycle=cycle).nodes["n1"].feasible
    ann = fw.reserve(cycle, first, "n1")
    assert json.loads(ann[ALLOCATED]) == {"name": "r1", "uid": "uid-r1"}
    # allocateOnce (the default): the reservation has its owner now; a second owner gets no
    # reservation but still fits the node's own free cpu (8 - 3 used - 1 still held)
    second = parse_pod(pod("web-2", labels=WEB, requests={"cpu": "4"}), "p")
    result = fw.evaluate(snap, second, now=NOW)
    assert result.nodes["n1"].feasible
    assert "Reservation" not in result.nodes["n1"].scores
