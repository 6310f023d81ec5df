"""Reservation: resources held for owners, matched and consumed, expiring."""

from __future__ import annotations

import json

from scheduler_plugins.framework import Framework
from scheduler_plugins.plugins.noderesourcesfit import NodeResourcesFit
from scheduler_plugins.plugins.reservation import Reservation
from scheduler_plugins.snapshot import parse_node, parse_pod
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


AFFINITY = "scheduling.koordinator.sh/reservation-affinity"


def labelled(r, labels=None, *, policy=None, restricted_to=None):
    r["metadata"]["labels"] = labels or {}
    if policy:
        r["spec"]["allocatePolicy"] = policy
    if restricted_to is not None:
        r["metadata"]["annotations"] = {
            "scheduling.koordinator.sh/reservation-restricted-options": json.dumps(
                {"resources": restricted_to}
            )
        }
    return r


def web(name, cpu, affinity=None):
    annotations = {AFFINITY: json.dumps(affinity)} if affinity is not None else None
    return pod(name, labels=WEB, requests={"cpu": str(cpu)}, annotations=annotations)


def test_default_and_aligned_let_an_owner_take_the_reservation_plus_free_node_resources():
    # node 8 cores, reservation 4; the owner asks 6: 4 from the reservation, 2 from the node
    for policy in (None, "Aligned"):
        objects = [node("n1", cpu="8"), labelled(reservation("r1", "n1", 4), policy=policy)]
        result = run(objects, web("w", 6))
        assert result.nodes["n1"].feasible, policy
        assert result.nodes["n1"].scores["Reservation"] == 100
    # the same pod next to a reservation it does not own: 8 - 4 held = 4 free, not 6
    objects = [node("n1", cpu="8"), reservation("r1", "n1", 4, owners=[{"object": {"name": "x"}}])]
    assert run(objects, web("w", 6)).nodes["n1"].reasons == ["Insufficient cpu"]


def test_restricted_confines_the_owner_to_what_the_reservation_holds():
    objects = [node("n1", cpu="8"), labelled(reservation("r1", "n1", 4), policy="Restricted")]
    fits = run(objects, web("w", 4))
    assert fits.nodes["n1"].feasible
    assert fits.nodes["n1"].scores["Reservation"] == 100
    # too big for the reservation: it gets no reservation and the node alone has 8 - 4 held
    assert run(objects, web("w", 5)).nodes["n1"].reasons == ["Insufficient cpu"]
    # with affinity the reservation is required: the Restricted reason is reported
    required = run(objects, web("w", 5, {"reservationSelector": {}}))
    assert required.nodes["n1"].reasons[0] == "Reservation(s) Insufficient cpu"


def test_restricted_options_limit_which_resources_are_confined():
    r = reservation("r1", "n1", 4)
    r["status"]["allocatable"]["memory"] = "1Gi"
    objects = [node("n1", cpu="8"), labelled(r, policy="Restricted", restricted_to=["memory"])]
    # cpu is not restricted: 6 cores (4 reserved + 2 free) pass while memory fits the 1Gi
    p = pod("w", labels=WEB, requests={"cpu": "6", "memory": "512Mi"})
    assert run(objects, p).nodes["n1"].feasible


def test_reservation_affinity_requires_a_matching_reservation_on_the_node():
    objects = [
        node("n1", cpu="8"),
        node("n2", cpu="8"),
        node("n3", cpu="8"),
        labelled(reservation("gold", "n1", 4), {"tier": "gold"}),
        labelled(reservation("plain", "n2", 4), {"tier": "plain"}),
    ]
    by_selector = run(objects, web("w", 2, {"reservationSelector": {"tier": "gold"}}))
    assert by_selector.nodes["n1"].feasible
    assert by_selector.nodes["n2"].reasons == ["node(s) no reservations match reservation affinity"]
    assert by_selector.nodes["n3"].reasons == ["node(s) no reservations match reservation affinity"]
    terms = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "reservationSelectorTerms": [
                {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["plain"]}]}
            ]
        }
    }
    by_terms = run(objects, web("w", 2, terms))
    assert [n for n, r in by_terms.nodes.items() if r.feasible] == ["n2"]
    by_name = run(objects, web("w", 2, {"name": "gold"}))
    assert [n for n, r in by_name.nodes.items() if r.feasible] == ["n1"]
    # no reservation at all matches: rejected everywhere
    nowhere = run(objects, web("w", 2, {"reservationSelector": {"tier": "silver"}}))
    assert {tuple(r.reasons) for r in nowhere.nodes.values()} == {
        ("node(s) no reservations match reservation affinity",)
    }


def test_affinity_still_needs_the_pod_to_be_an_owner():
    objects = [node("n1", cpu="8"), labelled(reservation("gold", "n1", 4), {"tier": "gold"})]
    stranger = pod(
        "s",
        requests={"cpu": "1"},
        annotations={AFFINITY: json.dumps({"reservationSelector": {"tier": "gold"}})},
    )
    assert not run(objects, stranger).nodes["n1"].feasible


def test_pending_and_unschedulable_reservations_are_never_matched_nor_hold_anything():
    pending = reservation("r1", "n1", 4, phase="Pending")
    pending["status"].pop("nodeName")
    closed = reservation("r2", "n1", 4)
    closed["spec"]["unschedulable"] = True
    for r in (pending, reservation("r1", "n1", 4, phase="Pending")):
        result = run([node("n1", cpu="4"), r], web("w", 4, {"reservationSelector": {}}))
        assert result.nodes["n1"].reasons == ["node(s) no reservations match reservation affinity"]
        assert run([node("n1", cpu="4"), r], pod("s", requests={"cpu": "4"})).nodes["n1"].feasible
    owner = run([node("n1", cpu="8"), closed], web("w", 4))
    assert "Reservation" not in owner.nodes["n1"].scores


def test_a_malformed_affinity_annotation_rejects_the_pod_naming_the_annotation():
    p = pod("w", labels=WEB, requests={"cpu": "1"}, annotations={AFFINITY: "{not json"})
    result = run([node("n1", cpu="8"), reservation("r1", "n1", 4)], p)
    assert AFFINITY in result.nodes["n1"].reasons[0]


def test_the_plugins_cache_agrees_with_a_fresh_count_as_owners_come_and_go():
    from scheduler_plugins.plugins.reservation import ReservationCache, active_reservations

    snap = snapshot_of(
        node("n1", cpu="8"),
        node("n2", cpu="8"),
        reservation("r1", "n1", 4),
        reservation("r2", "n2", 4, owners=[{"object": {"name": "solo"}}]),
        pod("other", node_name="n2", requests={"cpu": "1"}),
    )
    cache = ReservationCache()

    def remaining():
        return {
            n: {r.name: (r.remaining, r.has_owner) for r in rs}
            for n, rs in cache.active(snap, NOW).items()
        }

    def fresh():
        return {
            n: {r.name: (r.remaining, r.has_owner) for r in rs}
            for n, rs in active_reservations(snap, NOW).items()
        }

    assert (
        remaining()
        == fresh()
        == {
            "n1": {"r1": ({"cpu": 4000}, False)},
            "n2": {"r2": ({"cpu": 4000}, False)},
        }
    )
    owners = []
    for i, (name, target) in enumerate([("r1", "n1"), ("r1", "n1"), ("r2", "n2")]):
        owner = parse_pod(
            pod(
                f"o{i}", requests={"cpu": "1"}, annotations={ALLOCATED: json.dumps({"name": name})}
            ),
            "pod",
        )
        snap.assume(owner, target)
        owners.append(owner)
        assert remaining() == fresh()
    assert remaining()["n1"]["r1"] == ({"cpu": 2000}, True)
    snap.forget(owners[0])
    assert remaining() == fresh()
    assert remaining()["n1"]["r1"] == ({"cpu": 3000}, True)
    snap.forget(owners[1])
    assert remaining() == fresh()
    assert remaining()["n1"]["r1"] == ({"cpu": 4000}, False)
    snap.remove_node("n2")
    assert remaining() == fresh() == {"n1": {"r1": ({"cpu": 4000}, False)}}
    # a replaced Reservation object is read again
    snap.reservations["r1"] = reservation("r1", "n1", 6)
    snap.touch("n1")
    assert remaining() == fresh() == {"n1": {"r1": ({"cpu": 6000}, False)}}
    assert cache.active(snap, NOW + 25 * 3600) == {}  # past the 24 h default ttl
    # a Reservation the scheduler places on a node that held none is seen at once
    snap.upsert_node(parse_node(node("n3", cpu="8"), "test", "n3"))
    assert remaining() == fresh()
    snap.assume_reservation(reservation("r3", "n3", 2))
    assert remaining() == fresh()
    assert remaining()["n3"] == {"r3": ({"cpu": 2000}, False)}
