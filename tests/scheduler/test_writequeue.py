"""Events and conditions off the scheduling path: the write queue (keyed, coalesced, one write a
key at a time, bounded) and the recorder on it, which records without waiting for the API server
(client-go's broadcaster writes each Event in a goroutine of its own). Writes are gated by the
test, so nothing depends on timing."""

from __future__ import annotations

import asyncio

from scheduler_plugins.reporting import EventRecorder, PodConditions
from scheduler_plugins.snapshot import PodInfo, parse_pod
from scheduler_plugins.writequeue import WriteQueue
from tests.kubefake.fixtures import eventually
from tests.kubefake.server import Fault
from tests.scheduler.bindingfake import BindingFakeApiServer
from tests.scheduler.builders import pod


class Writes:
    """Writes that each wait for the test to release them; what ran, in order."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.release: dict[str, asyncio.Event] = {}

    def write(self, label: str, *, gated: bool = False):
        async def run() -> None:
            if gated:
                await self.release.setdefault(label, asyncio.Event()).wait()
            self.ran.append(label)

        return run


async def test_a_write_waiting_for_its_key_is_replaced_by_a_later_one():
    q, w = WriteQueue("t", max_in_flight=1), Writes()
    q.submit("busy", w.write("busy", gated=True))
    q.submit("k", w.write("k-1"))
    q.submit("k", w.write("k-2"))  # k-1 never started: the latest state goes out instead
    w.release.setdefault("busy", asyncio.Event()).set()
    await q.flush()
    assert w.ran == ["busy", "k-2"]
    assert q.done == 2


async def test_one_write_a_key_at_a_time_the_next_one_after_it():
    q, w = WriteQueue("t", max_in_flight=4), Writes()
    q.submit("k", w.write("create", gated=True))
    await eventually(lambda: len(q) == 1 and "k" in q._active)
    q.submit("k", w.write("patch"))
    q.submit("other", w.write("other"))
    await eventually(lambda: w.ran == ["other"])  # another key is not held up
    w.release["create"].set()
    await q.flush()
    assert w.ran == ["other", "create", "patch"]


async def test_past_the_bound_writes_are_dropped_and_counted():
    q, w = WriteQueue("t", max_in_flight=1, max_queued=2), Writes()
    q.submit("a", w.write("a", gated=True))
    await eventually(lambda: "a" in q._active)
    assert q.submit("b", w.write("b"))
    assert q.submit("c", w.write("c"))
    assert not q.submit("d", w.write("d"))
    assert q.submit("b", w.write("b-2"))  # replacing a waiting one is no new key
    assert q.dropped == 1
    w.release["a"].set()
    await q.flush()
    assert w.ran == ["a", "b-2", "c"]


async def test_settle_withdraws_the_waiting_write_and_waits_for_the_one_in_flight():
    q, w = WriteQueue("t", max_in_flight=2), Writes()
    q.submit("k", w.write("first", gated=True))
    await eventually(lambda: "k" in q._active)
    q.submit("k", w.write("second"))
    settled = asyncio.create_task(q.settle("k"), name="t-settle")
    await asyncio.sleep(0)
    assert not settled.done()
    w.release["first"].set()
    await settled
    await q.flush()
    assert w.ran == ["first"]


async def test_close_cancels_what_is_in_flight():
    q, w = WriteQueue("t"), Writes()
    q.submit("k", w.write("never", gated=True))
    await eventually(lambda: "k" in q._active)
    await q.close()
    assert w.ran == []
    assert len(q) == 0


# -- the recorder and the condition writer on it -------------------------------------------------


def a_pod(name: str = "p") -> PodInfo:
    obj = pod(name, requests={"cpu": "1"})
    obj["metadata"]["resourceVersion"] = "7"
    return parse_pod(obj, "test")


def events(server: BindingFakeApiServer) -> list[dict]:
    return [o for (plural, _, _), o in server.objects.items() if plural == "events"]


async def test_recording_returns_before_the_api_server_answers(api):
    server, client = api
    server.faults.append(Fault(delay=0.3, method="POST", path_contains="/events"))
    rec = EventRecorder(client, instance="ks")
    rec.warn(a_pod(), "FailedScheduling", "0/1 nodes are available.")  # not awaited: no wait
    assert rec.recorded == 1
    assert events(server) == []
    assert len(rec.writes) == 1
    await rec.flush()
    (event,) = events(server)
    assert event["note"] == "0/1 nodes are available."


async def test_an_event_recurring_before_it_was_written_goes_out_once_with_its_series(api):
    server, client = api
    rec = EventRecorder(client, instance="ks", max_in_flight=1)
    p = a_pod()
    rec.warn(p, "FailedScheduling", "first")
    rec.warn(p, "FailedScheduling", "second")  # the same Event: the note is not in the key
    await rec.flush()
    (event,) = events(server)
    assert event["note"] == "first"
    assert event["series"]["count"] == 2
    assert len(server.writes("POST", "/events")) == 1
    assert server.writes("PATCH", "/events/") == []
    # the next occurrence only counts (client-go writes a running series every 30 minutes)
    rec.warn(p, "FailedScheduling", "third")
    await rec.flush()
    assert server.writes("PATCH", "/events/") == []


async def test_a_condition_queued_for_a_pod_about_to_be_bound_is_not_written(api):
    server, client = api
    server.put("pods", pod("p", requests={"cpu": "1"}))
    conditions = PodConditions(client, max_in_flight=1)
    blocker = a_pod("other")
    server.put("pods", pod("other", requests={"cpu": "1"}))
    server.faults.append(Fault(delay=0.2, method="PATCH", path_contains="/pods/other/status"))
    conditions.unschedulable(blocker, "Unschedulable", "0/1 nodes are available.")
    current = parse_pod(server.get("pods", "p", "default"), "api")
    conditions.unschedulable(current, "Unschedulable", "0/1 nodes are available.")
    await conditions.settle(current.uid)  # its binding goes next: the stale False never lands
    await conditions.flush()
    assert server.writes("PATCH", "/pods/p/status") == []
    assert len(server.writes("PATCH", "/pods/other/status")) == 1
