"""Preemption: kube-scheduler's DefaultPreemption semantics
(kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption,
``pkg/scheduler/framework/preemption``) with Koordinator's ElasticQuota rules, as the dry run
chooses, and end to end on the fake API server: victims evicted, the preemptor nominated and
bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from kubeclient.errors import TooManyRequests
from scheduler_plugins.extender import KubeBinder
from scheduler_plugins.informed import InformedSnapshot
from scheduler_plugins.preemption import (
    MSG_NO_VICTIMS,
    MSG_NOT_HELPFUL,
    MSG_POLICY_NEVER,
    Candidate,
    Evictor,
    Preemption,
)
from scheduler_plugins.snapshot import NodeInfo, PodInfo, Snapshot, parse_pod
from scheduler_plugins.standalone import EventRecorder, Scheduler
from scheduler_plugins.table import build_framework
from tests.kubefake.fixtures import eventually
from tests.scheduler.bindingfake import BindingFakeApiServer
from tests.scheduler.builders import NOW, node, node_metric, pod, ts
from tests.scheduler.helpers import snapshot_of

QUOTA = "quota.scheduling.koordinator.sh/name"
NON_PREEMPTIBLE = {"quota.scheduling.koordinator.sh/preemptible": "false"}


def running(name: str, node_name: str, cpu: str, priority: int, **kw: Any) -> dict[str, Any]:
    return pod(
        name,
        node_name=node_name,
        requests={"cpu": cpu},
        priority=priority,
        scheduled_at=kw.pop("scheduled_at", NOW - 3600),
        **kw,
    )


def incoming(cpu: str = "2", priority: int = 1000, **kw: Any) -> PodInfo:
    return parse_pod(pod("urgent", requests={"cpu": cpu}, priority=priority, **kw), "pod")


def decide(objects: list[dict[str, Any]], p: PodInfo):
    """Filter the pod everywhere, then run the dry run on the failures."""
    snap = snapshot_of(*objects)
    fw = build_framework()
    cycle = fw.new_cycle(snap, NOW)
    found = fw.find_feasible(cycle, p, list(snap.nodes.values()))
    assert not found.feasible
    before = {n: dict(info.pods) for n, info in snap.nodes.items()}
    outcome = Preemption(fw, snap).find(cycle, p, found.failures)
    after = {n: dict(info.pods) for n, info in snap.nodes.items()}
    assert before == after  # the dry run put every pod back
    return outcome


def victims_of(outcome) -> tuple[str, list[str]]:
    assert outcome.candidate is not None, outcome.message
    return outcome.candidate.node, sorted(v.name for v in outcome.candidate.victims)


def test_the_fewest_lower_priority_pods_are_evicted_keeping_the_more_important():
    objects = [
        node("n1", cpu="4"),
        running("a", "n1", "1", 10),
        running("b", "n1", "1", 20),
        running("c", "n1", "2", 30),
    ]
    # kept in order c (30), b (20), a (10): with c back only 2 cores are free, b does not fit
    # beside it, then a does not either
    assert victims_of(decide(objects, incoming("2"))) == ("n1", ["a", "b"])
    assert victims_of(decide(objects, incoming("1"))) == ("n1", ["a"])


def test_pods_of_equal_or_higher_priority_are_never_victims():
    objects = [node("n1", cpu="2"), running("same", "n1", "2", 1000)]
    outcome = decide(objects, incoming("2"))
    assert outcome.candidate is None
    # kube-scheduler's reasons end with a period, and so does its message: ".."
    assert outcome.message == f"0/1 nodes are available: 1 {MSG_NO_VICTIMS}."


def test_a_pod_with_preemption_policy_never_does_not_preempt():
    objects = [node("n1", cpu="2"), running("low", "n1", "2", 10)]
    outcome = decide(objects, incoming("2", spec={"preemptionPolicy": "Never"}))
    assert outcome.candidate is None
    assert outcome.message == MSG_POLICY_NEVER


def test_nodes_evicting_cannot_help_are_not_tried():
    objects = [
        node("tainted", cpu="2", taints=[{"key": "t", "effect": "NoSchedule"}]),
        running("low", "tainted", "2", 10),
    ]
    outcome = decide(objects, incoming("2"))
    assert outcome.candidate is None
    assert outcome.message == f"0/1 nodes are available: 1 {MSG_NOT_HELPFUL}."


def test_a_node_where_the_pod_would_not_fit_even_empty_is_no_candidate():
    objects = [node("small", cpu="1"), running("low", "small", "1", 10)]
    outcome = decide(objects, incoming("2"))
    assert outcome.candidate is None
    assert outcome.message == "0/1 nodes are available: 1 Insufficient cpu."


def budget(name: str, app: str, allowed: int) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": app}}},
        "status": {"disruptionsAllowed": allowed},
    }


def test_a_node_whose_victims_violate_no_disruption_budget_is_preferred():
    objects = [
        node("n1", cpu="2"),
        running("guarded", "n1", "2", 10, labels={"app": "db"}),
        node("n2", cpu="2"),
        running("free", "n2", "2", 50, labels={"app": "web"}),
        budget("db", "db", 0),
    ]
    # n1's victim has a lower priority, but evicting it would violate its budget
    assert victims_of(decide(objects, incoming("2"))) == ("n2", ["free"])
    objects[-1] = budget("db", "db", 1)  # the budget allows one disruption
    assert victims_of(decide(objects, incoming("2"))) == ("n1", ["guarded"])


def test_the_lowest_priority_victims_are_preferred_across_nodes():
    objects = [
        node("n1", cpu="2"),
        running("mid", "n1", "2", 50),
        node("n2", cpu="2"),
        running("low", "n2", "2", 10),
    ]
    assert victims_of(decide(objects, incoming("2"))) == ("n2", ["low"])


def test_non_preemptible_pods_are_never_victims():
    objects = [node("n1", cpu="2"), running("pinned", "n1", "2", 10, labels=NON_PREEMPTIBLE)]
    outcome = decide(objects, incoming("2"))
    assert outcome.candidate is None


def quota(name: str, cpu_min: int, cpu_max: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"min": {"cpu": str(cpu_min)}, "max": {"cpu": str(cpu_max)}},
    }


def member(name: str, q: str, node_name: str, cpu: str, priority: int) -> dict[str, Any]:
    return running(name, node_name, cpu, priority, labels={QUOTA: q})


def test_pods_of_a_borrowing_quota_are_preempted_first_and_guaranteed_ones_not_at_all():
    # a 6-core node; quota b (min 2) borrows: it uses 4; quota c (min 2) uses its 2
    objects = [
        node("n1", cpu="6"),
        quota("a", 2, 6),
        quota("b", 2, 6),
        quota("c", 2, 6),
        member("b1", "b", "n1", "2", 10),
        member("b2", "b", "n1", "2", 10),
        member("c1", "c", "n1", "2", 5),
    ]
    p = parse_pod(pod("urgent", requests={"cpu": "2"}, priority=1000, labels={QUOTA: "a"}), "pod")
    node_name, victims = victims_of(decide(objects, p))
    assert node_name == "n1"
    assert len(victims) == 1
    assert victims[0] in ("b1", "b2")  # c1 has the lowest priority but c is within its min


def test_a_full_quota_preempts_its_own_lower_priority_pods():
    objects = [
        node("n1", cpu="8"),
        node("n2", cpu="8"),
        quota("a", 2, 2),
        member("a-low", "a", "n1", "2", 10),
        running("other", "n2", "2", 5, namespace="x"),  # no quota
    ]
    p = parse_pod(pod("urgent", requests={"cpu": "2"}, priority=1000, labels={QUOTA: "a"}), "pod")
    snap = snapshot_of(*objects)
    fw = build_framework()
    cycle = fw.new_cycle(snap, NOW)
    found = fw.find_feasible(cycle, p, list(snap.nodes.values()))
    assert not found.feasible
    assert next(iter(found.failures.values()))[0][0] == "ElasticQuota"
    outcome = Preemption(fw, snap).find(cycle, p, found.failures)
    assert victims_of(outcome) == ("n1", ["a-low"])  # not the other quota-less pod


def test_a_node_too_loaded_is_a_candidate_only_when_victims_are_counted_by_estimate():
    # LoadAwareScheduling rejects n1 at 72 % cpu (16 reported + 8 x 0.85 estimated, the pod
    # bound after the last report): evicting that pod takes its estimate off
    recent = running("recent", "n1", "8", 10, scheduled_at=NOW - 10)
    objects = [node("n1"), node_metric("n1", cpu="16"), recent]
    assert victims_of(decide(objects, incoming("100m"))) == ("n1", ["recent"])
    # the reported usage (22 cores of 32) stays until the next report whatever is evicted:
    # no dry run, the node keeps LoadAware's reason
    old = running("old", "n1", "8", 10)
    objects = [node("n1"), node_metric("n1", cpu="22", pods=[("old", "6", "1Gi")]), old]
    outcome = decide(objects, incoming("100m"))
    assert outcome.candidate is None
    assert outcome.message == (
        "0/1 nodes are available: 1 node(s) cpu usage exceed threshold, "
        "cpu usage 69% > threshold 65%."
    )


def test_an_expired_node_metric_is_not_cured_by_preemption():
    objects = [node("n1"), node_metric("n1", cpu="1", age=181), running("low", "n1", "1", 10)]
    outcome = decide(objects, incoming("1"))
    assert outcome.candidate is None
    assert outcome.message == f"0/1 nodes are available: 1 {MSG_NOT_HELPFUL}."


def test_victims_that_free_too_little_are_not_dry_run():
    # 4 cores free once both lower-priority pods go; the pod wants 6: the cheap check says no
    objects = [
        node("n1", cpu="8"),
        running("high", "n1", "4", 5000),
        running("low1", "n1", "2", 10),
        running("low2", "n1", "2", 10),
    ]
    outcome = decide(objects, incoming("6"))
    assert outcome.candidate is None
    assert outcome.message == "0/1 nodes are available: 1 Insufficient cpu."
    assert victims_of(decide(objects, incoming("4"))) == ("n1", ["low1", "low2"])


# -- end to end on the fake API server ---------------------------------------------------------


def ours(name: str, **kw: Any) -> dict[str, Any]:
    p = pod(name, **kw)
    p["spec"]["schedulerName"] = "koord-scheduler"
    p["metadata"]["creationTimestamp"] = ts(time.time())
    return p


@pytest.fixture
async def loop(api) -> AsyncIterator[tuple[BindingFakeApiServer, Scheduler]]:
    server, client = api
    informed = InformedSnapshot(client)
    sched = Scheduler(
        build_framework(),
        informed.snapshot,
        KubeBinder(client),
        EventRecorder(client),
        evictor=Evictor(client),
    )
    informed.on_pending = sched.enqueue
    tasks = [asyncio.create_task(informed.run(), name="t-informers")]
    try:
        assert await informed.wait_synced(10)
        tasks.append(asyncio.create_task(sched.run(), name="t-scheduler"))
        yield server, sched
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def node_of(server: BindingFakeApiServer, name: str) -> str:
    obj = server.get("pods", name, "default") or {}
    return str((obj.get("spec") or {}).get("nodeName") or "")


def events(server: BindingFakeApiServer, name: str, reason: str) -> list[dict[str, Any]]:
    return [
        o
        for (plural, _, _), o in server.objects.items()
        if plural == "events" and o["regarding"]["name"] == name and o["reason"] == reason
    ]


async def test_a_high_priority_pod_evicts_a_low_one_and_is_bound_in_its_place(loop):
    server, sched = loop
    server.put("nodes", node("n1", cpu="4"))
    server.put("pods", pod("low", node_name="n1", requests={"cpu": "3"}, priority=10))
    await eventually(lambda: "uid-default-low" in sched.snapshot.nodes.get("n1", node_stub()).pods)
    server.put("pods", ours("urgent", requests={"cpu": "2"}, priority=1000))
    await eventually(lambda: node_of(server, "urgent") == "n1", within=15)
    assert server.get("pods", "low", "default") is None  # evicted
    evictions = server.writes("POST", "/eviction")
    assert [w.path.rsplit("/", 2)[-2] for w in evictions] == ["low"]
    assert evictions[0].body["deleteOptions"]["preconditions"]["uid"] == "uid-default-low"
    (preempted,) = events(server, "low", "Preempted")
    assert preempted["apiVersion"] == "events.k8s.io/v1"
    assert preempted["type"] == "Normal"
    assert preempted["action"] == "Preempting"
    assert preempted["note"] == "Preempted by default/urgent on node n1"
    assert preempted["related"]["name"] == "urgent"
    nominated = [
        w
        for w in server.writes("PATCH", "/pods/urgent/status")
        if w.body == {"status": {"nominatedNodeName": "n1"}}
    ]
    assert nominated


async def test_a_disruption_budget_refusal_stops_the_preemption(loop):
    server, sched = loop
    server.put("nodes", node("n1", cpu="2"))
    server.put("pods", pod("guarded", node_name="n1", requests={"cpu": "2"}, priority=10))
    await eventually(lambda: bool(sched.snapshot.nodes.get("n1", node_stub()).pods))
    server.eviction_blocked.add("guarded")
    server.put("pods", ours("urgent", requests={"cpu": "2"}, priority=1000))
    await eventually(lambda: bool(events(server, "urgent", "FailedScheduling")))
    message = events(server, "urgent", "FailedScheduling")[0]["note"]
    assert message.startswith("0/1 nodes are available: 1 Insufficient cpu. preemption: ")
    assert "eviction of default/guarded refused" in message
    assert node_of(server, "guarded") == "n1"
    assert node_of(server, "urgent") == ""


async def test_a_pod_that_may_not_preempt_says_so_in_its_event(loop):
    server, sched = loop
    server.put("nodes", node("n1", cpu="2"))
    server.put("pods", pod("low", node_name="n1", requests={"cpu": "2"}, priority=10))
    await eventually(lambda: bool(sched.snapshot.nodes.get("n1", node_stub()).pods))
    never = ours("polite", requests={"cpu": "2"}, priority=1000)
    never["spec"]["preemptionPolicy"] = "Never"
    server.put("pods", never)
    await eventually(lambda: bool(events(server, "polite", "FailedScheduling")))
    assert events(server, "polite", "FailedScheduling")[0]["note"] == (
        "0/1 nodes are available: 1 Insufficient cpu. "
        "preemption: not eligible due to preemptionPolicy=Never."
    )
    assert not server.writes("POST", "/eviction")


def node_stub() -> NodeInfo:
    return NodeInfo("", {}, {}, {}, False)


class _Binder:
    def __init__(self) -> None:
        self.bound: dict[str, str] = {}

    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        self.bound[pod.name] = node


class _Client:
    """Records evictions and patches; the victims stay until the test removes them."""

    def __init__(self, refuse: set[str] | None = None) -> None:
        self.evicted: list[str] = []
        self.patched: list[tuple[str, Any]] = []
        self.refuse = refuse or set()

    async def evict(self, namespace: str, name: str, *, uid: str = "") -> dict[str, Any]:
        if name in self.refuse:
            raise TooManyRequests(429, "TooManyRequests", "disruption budget")
        self.evicted.append(name)
        return {}

    async def patch(self, res: Any, name: str, body: Any, namespace: Any, **kw: Any) -> Any:
        self.patched.append((name, body))
        return {}

    async def create(self, res: Any, obj: Any) -> Any:
        return obj


async def test_the_nominated_node_is_held_for_the_preemptor_until_it_is_bound():
    snap: Snapshot = snapshot_of(node("n1", cpu="2"), running("low", "n1", "2", 10))
    client = _Client()
    binder = _Binder()
    sched = Scheduler(
        build_framework(),
        snap,
        binder,
        EventRecorder(None),
        clock=lambda: NOW,
        evictor=Evictor(client),
    )
    urgent = parse_pod(pod("urgent", requests={"cpu": "2"}, priority=1000), "pod")
    snap.pending_pods[urgent.uid] = urgent
    assert await sched.schedule_one(urgent) is None
    assert client.evicted == ["low"]
    assert client.patched == [("urgent", {"status": {"nominatedNodeName": "n1"}})]
    assert sched.nominations.node_of(urgent.uid) == "n1"
    # a second attempt while the victim is still terminating does not preempt again
    assert await sched.schedule_one(urgent) is None
    assert client.evicted == ["low"]
    # the victim is gone; a lower-priority pod does not get the node held for the preemptor
    snap.remove_pod("uid-default-low")
    filler = parse_pod(pod("filler", requests={"cpu": "1"}, priority=100), "pod")
    snap.pending_pods[filler.uid] = filler
    assert await sched.schedule_one(filler) is None
    assert await sched.schedule_one(urgent) == "n1"
    await sched.wait_bindings()
    assert binder.bound == {"urgent": "n1"}
    assert not sched.nominations.pods


class _Recorder(EventRecorder):
    """Keeps what it would record: (regarding name, reason, note)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.notes: list[tuple[str, str, str]] = []

    def record(
        self,
        regarding: Mapping[str, str],
        type_: str,
        reason: str,
        action: str,
        note: str,
        *,
        namespace: str = "",
        related: Mapping[str, str] | None = None,
    ) -> None:
        self.notes.append((regarding["name"], reason, note))


async def test_no_preemption_while_an_informer_is_not_current():
    snap: Snapshot = snapshot_of(node("n1", cpu="2"), running("low", "n1", "2", 10))
    client = _Client()
    events = _Recorder()
    waiting: list[str] = []
    sched = Scheduler(
        build_framework(),
        snap,
        _Binder(),
        events,
        clock=lambda: NOW,
        evictor=Evictor(client),
        gate=lambda: waiting,
    )
    urgent = parse_pod(pod("urgent", requests={"cpu": "2"}, priority=1000), "pod")
    snap.pending_pods[urgent.uid] = urgent
    # the PDB watch fell behind after the loop looked: no dry run, no eviction, no nomination
    waiting.append("poddisruptionbudgets (relisting after 410 Gone)")
    assert await sched.schedule_one(urgent) is None
    assert (client.evicted, client.patched) == ([], [])
    assert events.notes == [
        (
            "urgent",
            "FailedScheduling",
            "0/1 nodes are available: 1 Insufficient cpu. preemption: held: waiting for "
            "poddisruptionbudgets (relisting after 410 Gone)",
        )
    ]
    # relisted: the next attempt preempts, the victim's Event through the same recorder
    waiting.clear()
    assert await sched.schedule_one(urgent) is None
    assert client.evicted == ["low"]
    assert events.notes[1:] == [
        ("low", "Preempted", "Preempted by default/urgent on node n1"),
        ("urgent", "FailedScheduling", "0/1 nodes are available: 1 Insufficient cpu."),
    ]


async def test_an_informer_falling_behind_mid_preemption_stops_evictions_and_nomination():
    waiting: list[str] = []

    class _FallsBehind(_Client):
        async def evict(self, namespace: str, name: str, *, uid: str = "") -> dict[str, Any]:
            done = await super().evict(namespace, name, uid=uid)
            waiting.append("pods (relisting after 410 Gone)")
            return done

    client = _FallsBehind()
    victims = [parse_pod(running(n, "n1", "1", 10), "pod") for n in ("a", "b")]
    events = _Recorder()
    why = await Evictor(client).preempt(
        incoming(), Candidate("n1", victims, 0, 0), events=events, gate=lambda: waiting
    )
    assert why == "held: waiting for pods (relisting after 410 Gone)"
    assert client.evicted == ["a"]
    assert client.patched == []  # no nominatedNodeName
    assert events.notes == [("a", "Preempted", "Preempted by default/urgent on node n1")]
