"""Events and the PodScheduled condition as kube-scheduler writes them, on the fake API server:
client-go's events.k8s.io/v1 series (``tools/events/event_broadcaster.go``) and
``handleSchedulingFailure``'s condition patch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from scheduler_plugins.config import SchedulerConfig
from scheduler_plugins.informed import InformedSnapshot
from scheduler_plugins.reporting import (
    FINISH_S,
    NOTE_LIMIT,
    REFRESH_S,
    EventRecorder,
    PodConditions,
)
from scheduler_plugins.snapshot import PodInfo, parse_pod
from scheduler_plugins.standalone import Scheduler, build_scheduler
from tests.kubefake.fixtures import eventually
from tests.scheduler.bindingfake import BindingFakeApiServer
from tests.scheduler.builders import node, node_metric, pod, ts

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def events(server: BindingFakeApiServer, name: str = "") -> list[dict]:
    return [
        o
        for (plural, _, _), o in sorted(server.objects.items())
        if plural == "events" and (not name or o["regarding"]["name"] == name)
    ]


def a_pod(name: str = "p", rv: str = "7") -> PodInfo:
    obj = pod(name, requests={"cpu": "1"})
    obj["metadata"]["resourceVersion"] = rv
    return parse_pod(obj, "test")


@pytest.fixture
def recorder(api) -> tuple[BindingFakeApiServer, EventRecorder, Clock]:
    server, client = api
    clock = Clock()
    return server, EventRecorder(client, "koord-scheduler", clock=clock, instance="ks-host"), clock


async def test_the_first_event_is_created_in_the_events_k8s_io_form(recorder):
    server, rec, _ = recorder
    rec.warn(a_pod(), "FailedScheduling", "0/1 nodes are available: 1 Insufficient cpu.")
    await rec.flush()
    (event,) = events(server)
    assert event["apiVersion"] == "events.k8s.io/v1"
    assert event["metadata"]["namespace"] == "default"
    assert event["metadata"]["name"].startswith("p.")
    assert {k: event[k] for k in ("type", "reason", "action", "note")} == {
        "type": "Warning",
        "reason": "FailedScheduling",
        "action": "Scheduling",
        "note": "0/1 nodes are available: 1 Insufficient cpu.",
    }
    assert (event["reportingController"], event["reportingInstance"]) == (
        "koord-scheduler",
        "ks-host",
    )
    assert event["regarding"] == {
        "kind": "Pod",
        "namespace": "default",
        "name": "p",
        "uid": "uid-default-p",
        "apiVersion": "v1",
        "resourceVersion": "7",
    }
    assert event["eventTime"] == "2027-01-15T08:00:00.000000Z"
    assert "series" not in event
    [post] = server.writes("POST", "/apis/events.k8s.io/v1/namespaces/default/events")
    assert post.body["metadata"]["name"] == event["metadata"]["name"]


async def test_a_preempted_victim_gets_kube_schedulers_event_related_to_its_preemptor(recorder):
    server, rec, _ = recorder
    victim = a_pod("low")
    rec.preempted(victim, a_pod("urgent", rv="9"), "n1")
    await rec.flush()
    rec.preempted(victim, a_pod("other", rv="3"), "n1")
    await rec.flush()
    by_preemptor = {e["related"]["name"]: e for e in events(server, "low")}
    # ``related`` is part of client-go's key: two preemptors, two Events, no series
    assert sorted(by_preemptor) == ["other", "urgent"]
    event = by_preemptor["urgent"]
    assert {k: event[k] for k in ("type", "reason", "action", "note")} == {
        "type": "Normal",
        "reason": "Preempted",
        "action": "Preempting",
        "note": "Preempted by default/urgent on node n1",
    }
    assert event["regarding"]["name"] == "low"
    assert event["related"]["resourceVersion"] == "9"
    assert all("series" not in e for e in by_preemptor.values())


async def test_repeats_become_one_series_written_at_two_then_every_30_minutes_and_at_its_end(
    recorder,
):
    server, rec, clock = recorder
    p = a_pod()
    for i in range(5):
        clock.now = T0 + 10 * i
        # a different note is the same Event: client-go keys on everything but the note
        rec.warn(p, "FailedScheduling", f"0/{i + 1} nodes are available.")
        await rec.flush()
    (event,) = events(server)
    assert event["note"] == "0/1 nodes are available."
    assert event["series"] == {"count": 2, "lastObservedTime": "2027-01-15T08:00:10.000000Z"}
    patches = server.writes("PATCH", "/events/")
    assert [r.body for r in patches] == [{"series": event["series"]}]
    assert "strategic" in patches[0].content_type
    # nothing due yet: nothing written
    rec.tick()
    await rec.flush()
    assert len(server.writes("PATCH")) == 1
    # 30 minutes on, the running count is written (it recurred within the last 6 minutes)
    clock.now = T0 + REFRESH_S - 60
    rec.warn(p, "FailedScheduling", "again")
    await rec.flush()
    clock.now = T0 + REFRESH_S
    rec.tick()
    await rec.flush()
    (event,) = events(server)
    assert event["series"]["count"] == 6
    # quiet for 6 minutes: written a last time and forgotten; the next one is a new Event
    clock.now = T0 + REFRESH_S + FINISH_S + 1
    rec.tick()
    await rec.flush()
    assert len(server.writes("PATCH")) == 3
    rec.warn(p, "FailedScheduling", "later")
    await rec.flush()
    assert [e.get("series", {}).get("count") for e in events(server)] == [6, None]


async def test_other_reasons_and_objects_are_other_events(recorder):
    server, rec, _ = recorder
    rec.warn(a_pod("a"), "FailedScheduling", "x")
    await rec.flush()
    rec.warn(a_pod("b"), "FailedScheduling", "x")
    await rec.flush()
    rec.scheduled(a_pod("a"), "n1")
    await rec.flush()
    # the same pod at a new resourceVersion is another object reference: another Event
    rec.warn(a_pod("a", rv="8"), "FailedScheduling", "x")
    await rec.flush()
    got = sorted(
        (e["regarding"]["name"], e["reason"], e["regarding"]["resourceVersion"])
        for e in events(server)
    )
    assert got == [
        ("a", "FailedScheduling", "7"),
        ("a", "FailedScheduling", "8"),
        ("a", "Scheduled", "7"),
        ("b", "FailedScheduling", "7"),
    ]
    (scheduled,) = [e for e in events(server) if e["reason"] == "Scheduled"]
    assert (scheduled["type"], scheduled["action"], scheduled["note"]) == (
        "Normal",
        "Binding",
        "Successfully assigned default/a to n1",
    )


async def test_a_long_note_is_cut_as_kube_scheduler_cuts_it(recorder):
    server, rec, _ = recorder
    rec.warn(a_pod(), "FailedScheduling", "x" * 5000)
    await rec.flush()
    (event,) = events(server)
    assert len(event["note"]) == NOTE_LIMIT
    assert event["note"].endswith("x ...")


async def test_a_series_whose_event_was_deleted_creates_it_again(recorder):
    server, rec, _ = recorder
    p = a_pod()
    rec.warn(p, "FailedScheduling", "x")
    await rec.flush()
    (event,) = events(server)
    server.remove("events", event["metadata"]["name"], "default")
    rec.warn(p, "FailedScheduling", "x")
    await rec.flush()
    (again,) = events(server)
    assert again["metadata"]["name"] == event["metadata"]["name"]
    assert again["series"]["count"] == 2


# -- the PodScheduled condition -----------------------------------------------------------------


async def test_the_pod_scheduled_condition_is_patched_false_once_per_change(api):
    server, client = api
    server.put("pods", pod("p", requests={"cpu": "1"}))
    clock = Clock()
    conditions = PodConditions(client, clock=clock)

    def current() -> PodInfo:
        return parse_pod(server.get("pods", "p", "default"), "api")

    conditions.unschedulable(current(), "Unschedulable", "0/1 nodes are available.")
    await conditions.flush()
    (cond,) = server.get("pods", "p", "default")["status"]["conditions"]
    assert cond.pop("lastProbeTime", None) is None  # the API server writes null
    assert cond == {
        "type": "PodScheduled",
        "status": "False",
        "lastTransitionTime": "2027-01-15T08:00:00Z",
        "reason": "Unschedulable",
        "message": "0/1 nodes are available.",
    }
    [patch] = server.writes("PATCH", "/pods/p/status")
    assert "strategic" in patch.content_type
    # the same again: nothing written
    conditions.unschedulable(current(), "Unschedulable", "0/1 nodes are available.")
    await conditions.flush()
    assert len(server.writes("PATCH")) == 1
    # a new message: written, the transition time kept (the status did not change)
    clock.now += 60
    conditions.unschedulable(current(), "SchedulerError", "binding rejected: boom")
    await conditions.flush()
    (cond,) = server.get("pods", "p", "default")["status"]["conditions"]
    assert (cond["reason"], cond["message"], cond["lastTransitionTime"]) == (
        "SchedulerError",
        "binding rejected: boom",
        "2027-01-15T08:00:00Z",
    )


# -- end to end: the standalone scheduler --------------------------------------------------------


@dataclass
class Standalone:
    server: BindingFakeApiServer
    informed: InformedSnapshot
    sched: Scheduler


@pytest.fixture
async def standalone(api) -> AsyncIterator[Standalone]:
    server, client = api
    informed, sched = build_scheduler(client, SchedulerConfig())
    task = asyncio.create_task(informed.run(), name="t-informers")
    try:
        assert await informed.wait_synced(10)
        yield Standalone(server, informed, sched)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def ours(name: str) -> dict:
    p = pod(name, requests={"cpu": "1"})
    p["spec"]["schedulerName"] = "koord-scheduler"
    p["metadata"]["creationTimestamp"] = ts(time.time())
    return p


async def attempt(s: Standalone, name: str) -> str | None:
    """One scheduling attempt of pod ``name`` as the informers have it now."""
    obj = s.server.get("pods", name, "default")
    await eventually(
        lambda: any(
            p.name == name
            and p.raw["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
            for p in s.informed.snapshot.pending_pods.values()
        )
    )
    current = next(p for p in s.informed.snapshot.pending_pods.values() if p.name == name)
    node = await s.sched.schedule_one(current)
    await s.sched.drain()  # its binding and what it reported written
    return node


async def test_failed_attempts_aggregate_and_the_pod_is_marked_unschedulable(standalone):
    s = standalone
    s.server.put("nodes", node("hot", cpu="16"))
    metric = node_metric("hot", cpu="15")
    metric["status"]["updateTime"] = ts(time.time() - 5)
    s.server.put("nodemetrics", metric)
    await eventually(lambda: "hot" in s.informed.snapshot.node_metrics)
    s.server.put("pods", ours("p"))
    # this scheduler's wording with the numbers, and kube-scheduler's preemption verdict
    message = (
        "0/1 nodes are available: 1 node(s) cpu usage exceed threshold, cpu usage 99% > "
        "threshold 65%. preemption: 0/1 nodes are available: 1 No preemption victims found for "
        "incoming pod.."
    )
    for _ in range(6):
        assert await attempt(s, "p") is None
    # kube-scheduler's shape: the condition patched once (it changes the pod's
    # resourceVersion, so the attempts after it regard another object reference), then one
    # series for the rest: two Events for six attempts, not six
    failed = events(s.server, "p")
    assert [e.get("series", {}).get("count") for e in failed] == [None, 2]
    assert {e["note"] for e in failed} == {message}
    (cond,) = s.server.get("pods", "p", "default")["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"], cond["message"]) == (
        "PodScheduled",
        "False",
        "Unschedulable",
        message,
    )
    assert len(s.server.writes("PATCH", "/pods/p/status")) == 1
    # room appears: bound, a Scheduled Event, and the binding set PodScheduled True
    cool = node_metric("hot", cpu="1")
    cool["status"]["updateTime"] = ts(time.time() - 5)
    rv = s.server.put("nodemetrics", cool)["metadata"]["resourceVersion"]
    metrics = next(i for i in s.informed.informers if i.resource.plural == "nodemetrics")
    await eventually(lambda: (metrics.get("hot") or {})["metadata"]["resourceVersion"] == rv)
    assert await attempt(s, "p") == "hot"
    scheduled = [e for e in events(s.server, "p") if e["reason"] == "Scheduled"]
    assert [e["note"] for e in scheduled] == ["Successfully assigned default/p to hot"]
    (cond,) = s.server.get("pods", "p", "default")["status"]["conditions"]
    assert (cond["type"], cond["status"]) == ("PodScheduled", "True")
