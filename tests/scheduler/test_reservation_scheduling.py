"""Pending Reservations placed by the standalone scheduler: reserve pods, status, consumption.

End to end on the fake API server that the real client layer (kubeclient) talks to, plus
table tests of the reserve pod and the status written.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from apis.scheduling_keys import (
    ANNOTATION_RESERVATION_NAME,
    ANNOTATION_RESERVATION_NODE,
    ANNOTATION_RESERVE_POD,
)
from kubeclient.client import KubeClient
from scheduler_plugins.config import SchedulerConfig
from scheduler_plugins.extender import KubeBinder
from scheduler_plugins.framework import Framework
from scheduler_plugins.objectfields import parse_resource_list
from scheduler_plugins.plugins.noderesourcesfit import NodeResourcesFit
from scheduler_plugins.plugins.reservation import Reservation
from scheduler_plugins.reservations import (
    available_status,
    format_resources,
    is_pending,
    reserve_pod,
    scheduler_name_of_reservation,
    unschedulable_status,
)
from scheduler_plugins.snapshot import parse_pod
from scheduler_plugins.standalone import (
    EventRecorder,
    ReservationWriter,
    Scheduler,
    build_scheduler,
)
from scheduler_plugins.table import build_framework
from tests.kubefake.server import Fault
from tests.scheduler.bindingfake import BindingFakeApiServer
from tests.scheduler.builders import NOW, node, pod, ts
from tests.scheduler.helpers import snapshot_of
from tests.scheduler.test_standalone import events_for, eventually, node_of, ours

ALLOCATED = "scheduling.koordinator.sh/reservation-allocated"
WEB = {"app": "web"}


def reservation(
    name: str,
    cpu: str,
    *,
    scheduler: str | None = "koord-scheduler",
    owners: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    priority: int | None = None,
    status: dict[str, Any] | None = None,
    expires: float | None = None,
    created: float | None = None,
    node_name: str = "",
) -> dict[str, Any]:
    tspec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]
    }
    if scheduler is not None:
        tspec["schedulerName"] = scheduler
    if priority is not None:
        tspec["priority"] = priority
    if node_name:
        tspec["nodeName"] = node_name
    spec: dict[str, Any] = {
        "template": {"metadata": {"labels": labels or {}}, "spec": tspec},
        "owners": owners or [{"labelSelector": {"matchLabels": WEB}}],
        "ttl": "1h",
    }
    if expires is not None:
        spec["expires"] = ts(expires)
    meta: dict[str, Any] = {"name": name, "uid": f"uid-r-{name}"}
    meta["creationTimestamp"] = ts(created if created is not None else time.time())
    obj: dict[str, Any] = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": meta,
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def status_of(server: BindingFakeApiServer, name: str) -> dict[str, Any]:
    return dict((server.get("reservations", name) or {}).get("status") or {})


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions") or [] if c["type"] == kind)


class Running:
    """The informers and the scheduler loop over the fake API server, built as
    ``koord-scheduler run`` builds them."""

    def __init__(self, client: KubeClient) -> None:
        self.informed, self.sched = build_scheduler(client, SchedulerConfig())
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self, *, wait_for_reservations: int = 0) -> None:
        """Informers, then (once nodes, pods and ``wait_for_reservations`` Reservations are
        in the snapshot: the kinds list in no particular order) the loop."""
        self.tasks.append(asyncio.create_task(self.informed.run(), name="t-informers"))
        assert await self.informed.wait_synced(10)
        snap = self.informed.snapshot
        await eventually(lambda: len(snap.reservations) >= wait_for_reservations)
        self.tasks.append(asyncio.create_task(self.sched.run(), name="t-scheduler"))

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture
async def running(api) -> AsyncIterator[tuple[BindingFakeApiServer, Running]]:
    server, client = api
    run = Running(client)
    try:
        await run.start()
        yield server, run
    finally:
        await run.stop()


# -- end to end ------------------------------------------------------------------------------


async def test_a_placed_reservation_is_available_and_its_resources_go_to_owners_only(running):
    server, run = running
    server.put("nodes", node("small", cpu="1"))
    server.put("nodes", node("big", cpu="4"))
    await eventually(lambda: len(run.sched.snapshot.nodes) == 2)
    server.put("reservations", reservation("r1", "3"))
    await eventually(lambda: status_of(server, "r1").get("phase") == "Available")
    status = status_of(server, "r1")
    assert status["nodeName"] == "big"
    assert status["allocatable"] == {"cpu": "3", "memory": "1Gi"}
    assert status["currentOwners"] == []
    assert "allocated" not in status
    assert {(c["type"], c["status"], c["reason"]) for c in status["conditions"]} == {
        ("Scheduled", "True", "Scheduled"),
        ("Ready", "True", "Available"),
    }
    # a pod that is no owner finds 1 core on each node: the 3 reserved are not free for it
    server.put("pods", ours("batch", requests={"cpu": "2"}))
    await eventually(lambda: bool(events_for(server, "batch")))
    assert events_for(server, "batch")[0]["note"] == (
        "0/2 nodes are available: 2 Insufficient cpu. "
        "preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.."
    )
    assert node_of(server, "batch") == ""
    # an owner gets them
    server.put("pods", ours("web-1", requests={"cpu": "3"}, labels=WEB))
    await eventually(lambda: node_of(server, "web-1") != "")
    assert node_of(server, "web-1") == "big"
    bound = server.get("pods", "web-1", "default")
    assert json.loads(bound["metadata"]["annotations"][ALLOCATED]) == {
        "name": "r1",
        "uid": "uid-r-r1",
    }
    await asyncio.sleep(0.3)
    assert node_of(server, "batch") == ""


async def test_an_unschedulable_reservation_gets_a_condition_and_an_event_and_is_retried(running):
    server, run = running
    server.put("nodes", node("n1", cpu="2"))
    await eventually(lambda: "n1" in run.sched.snapshot.nodes)
    server.put("reservations", reservation("big", "8"))
    await eventually(lambda: "conditions" in status_of(server, "big"))
    status = status_of(server, "big")
    assert status["phase"] == "Pending"
    assert "nodeName" not in status
    scheduled = condition(status, "Scheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert scheduled["message"] == "0/1 nodes are available: 1 Insufficient cpu."
    events = events_for(server, "big")
    assert events[0]["regarding"]["kind"] == "Reservation"
    assert events[0]["reason"] == "FailedScheduling"
    assert events[0]["type"] == "Warning"
    assert events[0]["note"] == scheduled["message"]
    # room appears: the backoff retry places it
    server.put("nodes", node("n2", cpu="16"))
    await eventually(lambda: status_of(server, "big").get("phase") == "Available", within=30)
    assert status_of(server, "big")["nodeName"] == "n2"
    assert condition(status_of(server, "big"), "Scheduled")["status"] == "True"


async def test_reservations_not_pending_or_not_ours_are_left_alone(api):
    server, client = api
    server.put("nodes", node("n1", cpu="32"))
    past = time.time() - 60
    left_alone = {
        "other-scheduler": reservation("other-scheduler", "1", scheduler="other"),
        "no-scheduler-name": reservation("no-scheduler-name", "1", scheduler=None),
        "expired": reservation("expired", "1", expires=past),
        "ttl-over": reservation("ttl-over", "1", created=time.time() - 7200),
        "failed": reservation("failed", "1", status={"phase": "Failed"}),
        "succeeded": reservation("succeeded", "1", status={"phase": "Succeeded"}),
    }
    for obj in left_alone.values():
        server.put("reservations", obj)
    server.put("reservations", reservation("mine", "1"))
    run = Running(client)
    try:
        await run.start(wait_for_reservations=len(left_alone) + 1)
        await eventually(lambda: status_of(server, "mine").get("phase") == "Available")
        await asyncio.sleep(0.3)
        written = {r.path.rsplit("/", 2)[-2] for r in server.writes(path_contains="reservations")}
        assert written == {"mine"}
        assert run.sched.placed == 1
    finally:
        await run.stop()


async def test_a_reservation_of_higher_priority_takes_the_node_before_a_pod(api):
    server, client = api
    server.put("nodes", node("n1", cpu="4"))
    server.put("pods", ours("early", requests={"cpu": "3"}, priority=0))
    server.put("reservations", reservation("urgent", "3", priority=1000))
    run = Running(client)
    try:
        await run.start(wait_for_reservations=1)
        await eventually(lambda: status_of(server, "urgent").get("phase") == "Available")
        await eventually(lambda: bool(events_for(server, "early")))
        assert node_of(server, "early") == ""
    finally:
        await run.stop()


async def test_a_reservation_pinned_by_its_template_goes_to_that_node_or_nowhere(running):
    server, run = running
    server.put("nodes", node("a", cpu="8"))
    server.put("nodes", node("b", cpu="2"))
    await eventually(lambda: len(run.sched.snapshot.nodes) == 2)
    server.put("reservations", reservation("on-b", "1", node_name="b"))
    server.put("reservations", reservation("too-big-for-b", "4", node_name="b"))
    await eventually(lambda: status_of(server, "on-b").get("phase") == "Available")
    assert status_of(server, "on-b")["nodeName"] == "b"
    await eventually(lambda: "conditions" in status_of(server, "too-big-for-b"))
    assert condition(status_of(server, "too-big-for-b"), "Scheduled")["message"] == (
        "0/2 nodes are available: 1 Insufficient cpu, "
        "1 node(s) didn't match the requested node name."
    )


async def test_a_reservation_deleted_while_queued_is_dropped(running):
    server, run = running
    server.put("nodes", node("n1", cpu="1"))
    await eventually(lambda: "n1" in run.sched.snapshot.nodes)
    server.put("reservations", reservation("gone", "4"))
    await eventually(lambda: "conditions" in status_of(server, "gone"))
    server.remove("reservations", "gone")
    await eventually(lambda: "gone" not in run.sched.snapshot.reservations)
    server.put("nodes", node("n2", cpu="8"))
    await eventually(lambda: not run.sched._reservation_names, within=30)
    assert server.get("reservations", "gone") is None


@pytest.mark.parametrize(
    ("fault", "rejected"),
    [(409, False), (500, True)],
    ids=["conflict-retried-at-once", "error-undone-and-retried-after-backoff"],
)
async def test_a_failed_status_write_never_leaves_the_reservation_half_placed(
    running, fault, rejected
):
    server, run = running
    server.put("nodes", node("n1", cpu="4"))
    await eventually(lambda: "n1" in run.sched.snapshot.nodes)
    server.faults.append(
        Fault(status=fault, method="PUT", path_contains="reservations/r1/status", times=1)
    )
    server.put("reservations", reservation("r1", "3"))
    await eventually(lambda: status_of(server, "r1").get("phase") == "Available", within=30)
    messages = [e["note"] for e in events_for(server, "r1")]
    if rejected:
        assert len(messages) == 1
        assert messages[0].startswith("status write rejected:")
    else:
        assert messages == []
    assert status_of(server, "r1")["nodeName"] == "n1"
    # the server has the status before the scheduler has read its answer: count once it has
    await eventually(lambda: run.sched.placed == 1)
    # held once, not twice: an owner fits in what is left plus what is reserved
    server.put("pods", ours("web-1", requests={"cpu": "4"}, labels=WEB))
    await eventually(lambda: node_of(server, "web-1") == "n1")
    assert run.sched.placed == 1


# -- the reserve pod and the status, table-like -----------------------------------------------


@pytest.mark.parametrize(
    ("status", "expires", "pending"),
    [
        (None, None, True),
        ({"phase": "Pending"}, None, True),
        ({"phase": ""}, None, True),
        ({"phase": "Available", "nodeName": "n1"}, None, False),
        ({"phase": "Waiting", "nodeName": "n1"}, None, False),
        ({"phase": "Succeeded"}, None, False),
        ({"phase": "Failed"}, None, False),
        ({"phase": "Pending", "nodeName": "n1"}, None, False),
        (None, NOW - 1, False),
        (None, NOW + 60, True),
    ],
)
def test_only_pending_unexpired_reservations_wait_for_a_node(status, expires, pending):
    obj = reservation("r", "1", status=status, expires=expires, created=NOW - 60)
    assert is_pending(obj, NOW) is pending


def test_the_ttl_counts_from_creation_and_zero_disables_it():
    obj = reservation("r", "1", created=NOW - 7200)
    assert not is_pending(obj, NOW)  # ttl 1h
    obj["spec"]["ttl"] = "0s"
    assert is_pending(obj, NOW)
    del obj["spec"]["ttl"]  # default 24h
    assert is_pending(obj, NOW)


def test_a_template_without_a_scheduler_name_belongs_to_the_default_scheduler():
    assert scheduler_name_of_reservation(reservation("r", "1", scheduler=None)) == (
        "default-scheduler"
    )
    assert scheduler_name_of_reservation(reservation("r", "1")) == "koord-scheduler"


def test_the_reserve_pod_carries_the_template_and_the_reservations_identity():
    obj = reservation("r", "1500m", labels={"tier": "gold"}, priority=7, node_name="n9")
    obj["metadata"]["labels"] = {"team": "a"}
    obj["metadata"]["annotations"] = {"note": "x"}
    p = reserve_pod(obj)
    assert (p.name, p.namespace, p.uid, p.node_name) == ("r", "default", "uid-r-r", "")
    assert p.labels == {"tier": "gold", "team": "a"}
    assert p.annotations == {
        "note": "x",
        ANNOTATION_RESERVE_POD: "true",
        ANNOTATION_RESERVATION_NAME: "r",
        ANNOTATION_RESERVATION_NODE: "n9",
    }
    assert p.requests == {"cpu": 1500, "memory": 1 << 30}
    assert p.priority == 7


def test_the_available_status_holds_the_template_requests_on_the_node():
    obj = reservation("r", "1500m")
    obj["status"] = {"phase": "Pending", "allocated": {"cpu": "1"}}
    status = available_status(obj, "n1", reserve_pod(obj).requests, NOW)
    assert status["phase"] == "Available"
    assert status["nodeName"] == "n1"
    assert status["allocatable"] == {"cpu": "1500m", "memory": "1Gi"}
    assert "allocated" not in status
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("Scheduled", "True", "Scheduled"),
        ("Ready", "True", "Available"),
    ]
    assert all(c["lastTransitionTime"] == ts(NOW) for c in status["conditions"])


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (None, ("False", "Unschedulable", "new", ts(NOW))),
        (("False", "Unschedulable", "old", ts(NOW - 10)), ("False", "Unschedulable", "new", None)),
        (("True", "Scheduled", "", ts(NOW - 10)), ("True", "Scheduled", "", None)),
    ],
)
def test_the_unschedulable_condition_is_added_once_and_its_message_kept_current(before, after):
    obj = reservation("r", "1", status={"phase": "Pending"})
    if before is not None:
        s, reason, message, at = before
        obj["status"]["conditions"] = [
            {
                "type": "Scheduled",
                "status": s,
                "reason": reason,
                "message": message,
                "lastProbeTime": at,
                "lastTransitionTime": at,
            }
        ]
    status = unschedulable_status(obj, "new", NOW)
    assert status["phase"] == "Pending"
    (got,) = status["conditions"]
    s, reason, message, transition = after
    assert (got["status"], got["reason"], got.get("message", "")) == (s, reason, message)
    assert got["lastProbeTime"] == ts(NOW)
    expected_transition = transition if transition is not None else before[3]
    assert got["lastTransitionTime"] == expected_transition


def test_a_reserve_pod_never_uses_another_reservation_and_sees_what_it_holds():
    held = reservation(
        "held",
        "3",
        status={"phase": "Available", "nodeName": "n1", "allocatable": {"cpu": "3"}},
        created=NOW - 60,
    )
    # the pending reservation's template labels match the Available one's owners
    pending = reservation("new", "2", labels=WEB, created=NOW - 60)
    snap = snapshot_of(node("n1", cpu="4"), node("n2", cpu="4"), held)
    fw = Framework([Reservation(), NodeResourcesFit()])
    result = fw.evaluate(snap, reserve_pod(pending), now=NOW, all_verdicts=True)
    assert result.nodes["n1"].reasons == ["Insufficient cpu"]  # 4 - 3 held = 1 free
    assert result.nodes["n2"].feasible
    assert "Reservation" not in result.nodes["n2"].scores
    # the same labels on an ordinary pod do use it
    owner = fw.evaluate(
        snap, parse_pod(pod("web", labels=WEB, requests={"cpu": "2"}), "pod"), now=NOW
    )
    assert owner.nodes["n1"].feasible


@pytest.mark.parametrize(
    ("requests", "quantities"),
    [
        ({"cpu": 2000}, {"cpu": "2"}),
        ({"cpu": 1500}, {"cpu": "1500m"}),
        ({"memory": 3 << 29}, {"memory": "1536Mi"}),
        # NewQuantity(1000, BinarySI).String(): below 1024 Kubernetes prints DecimalSI
        ({"memory": 1000}, {"memory": "1k"}),
        ({"kubernetes.io/batch-cpu": 2500}, {"kubernetes.io/batch-cpu": "2500"}),
        ({"kubernetes.io/batch-memory": 1 << 30}, {"kubernetes.io/batch-memory": "1Gi"}),
        ({"nvidia.com/gpu": 2}, {"nvidia.com/gpu": "2"}),
    ],
)
def test_allocatable_is_written_as_quantities_that_read_back_to_the_same_requests(
    requests, quantities
):
    assert format_resources(requests) == quantities
    assert parse_resource_list(quantities, "test", "status.allocatable") == requests


def test_a_scheduler_without_a_status_writer_leaves_reservations_alone():
    snap = snapshot_of(node("n1"), reservation("r", "1", created=time.time()))
    sched = Scheduler(build_framework(), snap, KubeBinder(None), EventRecorder(None))
    sched.enqueue_all()
    sched.enqueue_reservation(snap.reservations["r"])
    assert sched._pop_ready() == (None, None)


class RecordingBinder:
    def __init__(self) -> None:
        self.bound: dict[str, tuple[str, dict[str, str]]] = {}

    async def bind(self, pod, node_name, annotations) -> None:
        self.bound[pod.name] = (node_name, dict(annotations))


async def test_in_process_a_placed_reservation_is_held_for_its_owner_and_from_the_rest():
    snap = snapshot_of(node("n1", cpu="4"), reservation("r", "3", created=time.time()))
    binder = RecordingBinder()
    sched = Scheduler(
        build_framework(),
        snap,
        binder,
        EventRecorder(None),
        reservations=ReservationWriter(None),
    )
    sched.enqueue_all()
    reserve, _ = sched._pop_ready()
    assert reserve is not None
    assert await sched.schedule_reservation(reserve) == "n1"
    placed = snap.reservations["r"]["status"]
    assert (placed["phase"], placed["nodeName"]) == ("Available", "n1")
    assert not snap.nodes["n1"].pods  # held by the Reservation, not by an assumed reserve pod
    other = parse_pod(ours("other", requests={"cpu": "2"}), "pod")
    assert await sched.schedule_one(other) is None
    owner = parse_pod(ours("owner", requests={"cpu": "4"}, labels=WEB), "pod")
    assert await sched.schedule_one(owner) == "n1"
    await sched.wait_bindings()
    assert json.loads(binder.bound["owner"][1][ALLOCATED])["name"] == "r"
