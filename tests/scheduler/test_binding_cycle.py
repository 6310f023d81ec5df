"""The binding cycle apart from the scheduling cycle, as kube-scheduler's assume/forget: an assumed
pod holds its node (resources, quota) while its binding is in flight, whatever the informers
send meanwhile; a failed binding forgets it and requeues it with backoff; a pod deleted meanwhile
is left alone. Bindings are gated by the test (no timing): each waits until released."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import pytest

from kubeclient.errors import Conflict, KubeError, NotFound
from scheduler_plugins.extender import KubeBinder
from scheduler_plugins.informed import InformedSnapshot
from scheduler_plugins.podqueue import INITIAL_BACKOFF_S
from scheduler_plugins.reporting import EventRecorder
from scheduler_plugins.snapshot import PodInfo, Snapshot, parse_pod
from scheduler_plugins.standalone import Scheduler
from scheduler_plugins.table import build_framework
from tests.kubefake.fixtures import eventually
from tests.kubefake.server import Fault
from tests.scheduler.bindingfake import BindingFakeApiServer
from tests.scheduler.builders import NOW, node, pod, ts
from tests.scheduler.helpers import snapshot_of

QUOTA_LABEL = "quota.scheduling.koordinator.sh/name"


def ours(name: str, cpu: str = "2", **kw: Any) -> PodInfo:
    raw = pod(name, requests={"cpu": cpu}, **kw)
    raw["spec"]["schedulerName"] = "koord-scheduler"
    return parse_pod(raw, "pod")


class GatedBinder:
    """Each binding waits for its pod's gate; ``fail`` makes it raise instead of binding."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.fail: dict[str, KubeError] = {}
        self.bound: dict[str, str] = {}
        self.started: list[str] = []

    def gate(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())

    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        self.started.append(pod.name)
        await self.gate(pod.name).wait()
        if pod.name in self.fail:
            raise self.fail[pod.name]
        self.bound[pod.name] = node


class Notes(EventRecorder):
    """Keeps what it would record: (regarding name, reason, note)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.notes: list[tuple[str, str, str]] = []

    def record(self, regarding: Mapping[str, str], type_: str, reason: str, action: str,
               note: str, *, namespace: str = "", related: Mapping[str, str] | None = None,
               ) -> None:  # fmt: skip
        self.notes.append((regarding["name"], reason, note))


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def scheduler(
    snap: Snapshot, binder: GatedBinder, events: EventRecorder, clock: Clock
) -> Scheduler:
    return Scheduler(build_framework(), snap, binder, events, clock=clock)


async def attempt(sched: Scheduler, snap: Snapshot, pod: PodInfo) -> str | None:
    """One scheduling cycle of a pod the informers have just brought."""
    snap.upsert_pod(pod)
    return await sched.schedule_one(pod)


# -- the snapshot's side ------------------------------------------------------------------------


def test_an_assumed_pod_keeps_its_node_when_an_unbound_copy_arrives():
    snap = snapshot_of(node("n1", cpu="4"))
    p = ours("p")
    snap.upsert_pod(p)
    snap.assume(p, "n1")
    later = ours("p", annotations={"patched": "yes"})  # an annotation patch, still unbound
    snap.upsert_pod(later)
    assert snap.is_assumed(p.uid)
    assert snap.nodes["n1"].pods == {p.uid: p}
    assert snap.nodes["n1"].requested["cpu"] == 2000
    assert p.uid not in snap.pending_pods
    # forgotten: pending again as the informers last saw it
    assert snap.forget(p) is later
    assert snap.pending_pods[p.uid].annotations["patched"] == "yes"
    assert snap.nodes["n1"].pods == {}
    assert snap.nodes["n1"].requested["cpu"] == 0
    assert not snap.is_assumed(p.uid)


def test_a_bound_copy_confirms_the_assumption_where_the_api_server_put_it():
    snap = snapshot_of(node("n1", cpu="4"), node("n2", cpu="4"))
    p = ours("p")
    snap.upsert_pod(p)
    snap.assume(p, "n1")
    bound = ours("p", node_name="n2")
    snap.upsert_pod(bound)
    assert not snap.is_assumed(p.uid)
    assert snap.nodes["n1"].pods == {}
    assert snap.nodes["n2"].pods == {p.uid: bound}
    # a late failure of the binding undoes nothing the API server did
    assert snap.forget(p) is None
    assert snap.nodes["n2"].pods == {p.uid: bound}
    assert p.uid not in snap.pending_pods


def test_a_pod_deleted_while_assumed_is_not_brought_back():
    snap = snapshot_of(node("n1", cpu="4"))
    p = ours("p")
    snap.upsert_pod(p)
    snap.assume(p, "n1")
    snap.remove_pod(p.uid)
    assert snap.nodes["n1"].requested["cpu"] == 0
    assert snap.forget(p) is None
    assert p.uid not in snap.pending_pods
    assert snap.nodes["n1"].pods == {}


# -- the scheduler's side -----------------------------------------------------------------------


async def test_the_next_decision_sees_the_pods_whose_bindings_are_in_flight():
    snap = snapshot_of(node("n1", cpu="2"), node("n2", cpu="2"))
    binder, clock = GatedBinder(), Clock()
    sched = scheduler(snap, binder, Notes(), clock)
    first = await attempt(sched, snap, ours("a"))
    second = await attempt(sched, snap, ours("b"))
    # neither binding has ended: the second pod went to the other node, the third fits nowhere
    assert {first, second} == {"n1", "n2"}
    assert await attempt(sched, snap, ours("c")) is None
    await eventually(lambda: sorted(binder.started) == ["a", "b"])
    assert sched.binding == 2
    for name in ("a", "b"):
        binder.gate(name).set()
    await sched.wait_bindings()
    assert binder.bound == {"a": first, "b": second}
    assert sched.bound == 2


async def test_a_failed_binding_forgets_the_pod_and_requeues_it_with_backoff():
    snap = snapshot_of(node("n1", cpu="2"))
    binder, clock, notes = GatedBinder(), Clock(), Notes()
    sched = scheduler(snap, binder, notes, clock)
    a = ours("a")
    assert await attempt(sched, snap, a) == "n1"
    # while a's binding is in flight, b does not fit
    assert await attempt(sched, snap, ours("b")) is None
    binder.fail["a"] = Conflict(409, 'pod "a" is already assigned')
    binder.gate("a").set()
    await sched.wait_bindings()
    assert snap.nodes["n1"].pods == {}
    assert "uid-default-a" in snap.pending_pods
    assert sched.binding_failures == 1
    assert any(
        n == "a" and r == "FailedScheduling" and note.startswith("binding rejected: ")
        for n, r, note in notes.notes
    )
    # requeued, not before its backoff (b failed first, so b's backoff ends first)
    assert sched.queue.attempts["uid-default-a"] == 1
    popped, wait = sched._pop_ready()
    assert popped is None
    assert wait == pytest.approx(INITIAL_BACKOFF_S)
    clock.now += INITIAL_BACKOFF_S
    ready = {sched._pop_ready()[0].name for _ in range(2)}  # type: ignore[union-attr]
    assert ready == {"a", "b"}


async def test_a_binding_failing_after_its_pod_was_deleted_leaves_nothing_behind():
    snap = snapshot_of(node("n1", cpu="2"))
    binder, clock, notes = GatedBinder(), Clock(), Notes()
    sched = scheduler(snap, binder, notes, clock)
    a = ours("a")
    assert await attempt(sched, snap, a) == "n1"
    snap.remove_pod(a.uid)  # the informer: deleted meanwhile
    binder.fail["a"] = NotFound(404, 'pods "a" not found')
    binder.gate("a").set()
    await sched.wait_bindings()
    assert snap.nodes["n1"].pods == {}
    assert a.uid not in snap.pending_pods
    assert sched._pop_ready() == (None, None)
    assert notes.notes == []


async def test_an_informer_update_mid_binding_neither_unassumes_nor_requeues_the_pod():
    snap = snapshot_of(node("n1", cpu="2"))
    binder, clock = GatedBinder(), Clock()
    sched = scheduler(snap, binder, Notes(), clock)
    a = ours("a")
    assert await attempt(sched, snap, a) == "n1"
    update = ours("a", labels={"touched": "yes"})  # unbound: the informer's hook enqueues it
    snap.upsert_pod(update)
    sched.enqueue(update)
    assert "uid-default-a" not in sched.queue
    assert snap.nodes["n1"].requested["cpu"] == 2000
    assert await attempt(sched, snap, ours("b")) is None  # the room is still a's
    binder.gate("a").set()
    await sched.wait_bindings()
    assert binder.bound == {"a": "n1"}


async def test_quota_accounting_counts_pods_whose_bindings_are_in_flight():
    snap = snapshot_of(node("n1", cpu="16"))
    snap.quotas["q"] = {
        "metadata": {"name": "q", "namespace": "default"},
        "spec": {"min": {"cpu": "4"}, "max": {"cpu": "4"}},
    }
    snap.touch("*")
    binder, clock, notes = GatedBinder(), Clock(), Notes()
    sched = scheduler(snap, binder, notes, clock)
    labels = {QUOTA_LABEL: "q"}
    assert await attempt(sched, snap, ours("a", labels=labels)) == "n1"
    assert await attempt(sched, snap, ours("b", labels=labels)) == "n1"
    # both bindings in flight: the quota is used up
    assert await attempt(sched, snap, ours("c", labels=labels)) is None
    assert any(n == "c" and "Insufficient quotas" in note for n, _, note in notes.notes)
    # a's binding fails: its share of the quota is free again, and c fits
    binder.fail["a"] = KubeError("boom")
    binder.gate("a").set()
    await eventually(lambda: sched.binding_failures == 1)
    c = snap.pending_pods["uid-default-c"]
    assert await sched.schedule_one(c) == "n1"
    for name in ("b", "c"):
        binder.gate(name).set()
    await sched.wait_bindings()
    assert binder.bound == {"b": "n1", "c": "n1"}


async def test_the_loop_waits_for_a_slot_when_the_bindings_in_flight_are_at_the_bound():
    snap = snapshot_of(node("n1", cpu="16"))
    binder, clock = GatedBinder(), Clock()
    sched = Scheduler(
        build_framework(), snap, binder, Notes(), clock=clock, max_bindings_in_flight=2
    )
    assert await attempt(sched, snap, ours("a")) == "n1"
    assert await attempt(sched, snap, ours("b")) == "n1"
    third = asyncio.create_task(attempt(sched, snap, ours("c")), name="t-third")
    await eventually(lambda: "uid-default-c" in snap.nodes["n1"].pods)
    # c is assumed (its decision made) but its binding waits for a slot
    assert not third.done()
    assert sorted(binder.started) == ["a", "b"]
    binder.gate("a").set()
    assert await third == "n1"
    await eventually(lambda: len(binder.started) == 3)
    binder.gate("b").set()
    binder.gate("c").set()
    await sched.wait_bindings()
    assert sorted(binder.bound) == ["a", "b", "c"]


# -- against the fake API server: bindings raced with failures and a restart ---------------------


def ours_raw(name: str, cpu: str = "1") -> dict[str, Any]:
    p = pod(name, requests={"cpu": cpu})
    p["spec"]["schedulerName"] = "koord-scheduler"
    p["metadata"]["creationTimestamp"] = ts(time.time())
    return p


def placements(server: BindingFakeApiServer) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for (plural, _, name), obj in server.objects.items():
        if plural == "pods" and (obj.get("spec") or {}).get("nodeName"):
            out.setdefault(obj["spec"]["nodeName"], []).append(name)
    return out


class Term:
    """One scheduling term (informers and loop) over a client, as ``koord-scheduler run``."""

    def __init__(self, client: Any) -> None:
        self.informed = InformedSnapshot(client)
        self.sched = Scheduler(
            build_framework(), self.informed.snapshot, KubeBinder(client), EventRecorder(client)
        )
        self.informed.on_pending = self.sched.enqueue
        self.tasks: list[asyncio.Task[Any]] = []

    async def start(self) -> None:
        self.tasks.append(asyncio.create_task(self.informed.run(), name="t-informers"))
        assert await self.informed.wait_synced(10)
        self.tasks.append(asyncio.create_task(self.sched.run(), name="t-scheduler"))

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def test_bindings_raced_against_failures_and_a_restart_fill_every_node_exactly(api):
    server, client = api
    for i in range(4):
        server.put("nodes", node(f"n{i}", cpu="2"))
    # slow bindings, some refused: decisions run ahead of them the whole time
    server.faults += [
        Fault(delay=0.05, method="POST", path_contains="/binding", times=6),
        Fault(status=500, method="POST", path_contains="/binding", times=2),
    ]
    first = Term(client)
    await first.start()
    names = [f"p{i}" for i in range(8)]
    for name in names[:5]:
        server.put("pods", ours_raw(name))
    await eventually(lambda: sum(map(len, placements(server).values())) >= 2, within=15)
    # a restart with bindings in flight: the old term's are cancelled, the new one starts
    # from the API server's state
    await first.stop()
    second = Term(client)
    await second.start()
    try:
        for name in names[5:]:
            server.put("pods", ours_raw(name))
        await eventually(lambda: sum(map(len, placements(server).values())) == 8, within=30)
        placed = placements(server)
        # 8 pods of 1 core on 4 nodes of 2 cores: any decision that missed an assumed pod
        # would have put a third pod on some node
        assert sorted(len(v) for v in placed.values()) == [2, 2, 2, 2]
        assert sorted(n for v in placed.values() for n in v) == names
    finally:
        await second.stop()
