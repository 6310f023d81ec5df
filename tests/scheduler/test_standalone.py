"""The standalone scheduler end to end on the fake API server: bind, events, gangs, quotas."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

import pytest

from scheduler_plugins.extender import KubeBinder
from scheduler_plugins.informed import InformedSnapshot
from scheduler_plugins.reporting import failure_message
from scheduler_plugins.standalone import EventRecorder, Scheduler
from scheduler_plugins.table import build_framework
from tests.kubefake.fixtures import eventually as wait_for_state
from tests.kubefake.server import Fault
from tests.scheduler.bindingfake import BindingFakeApiServer
from tests.scheduler.builders import node, node_metric, nrt, pod, ts

STATUS = "scheduling.koordinator.sh/resource-status"


def ours(name: str, **kw) -> dict:
    p = pod(name, **kw)
    p["spec"]["schedulerName"] = "koord-scheduler"
    p["metadata"]["creationTimestamp"] = ts(time.time())
    return p


def metric(name: str, cpu: str) -> dict:
    m = node_metric(name, cpu=cpu)
    m["status"]["updateTime"] = ts(time.time() - 5)
    return m


async def eventually(check: Callable[[], bool], within: float = 15.0) -> None:
    await wait_for_state(check, within=within)


@pytest.fixture
async def running(api) -> AsyncIterator[tuple[BindingFakeApiServer, Scheduler]]:
    """The informers and the loop; tests wait for ``sched.snapshot`` to show what they put
    before putting the pods (the informers' kinds arrive in no particular order)."""
    server, client = api
    informed = InformedSnapshot(client)
    sched = Scheduler(
        build_framework(), informed.snapshot, KubeBinder(client), EventRecorder(client)
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


def events_for(server: BindingFakeApiServer, name: str) -> list[dict]:
    return [
        o
        for (plural, _, _), o in server.objects.items()
        if plural == "events" and o["regarding"]["name"] == name
    ]


async def test_pods_are_bound_to_the_least_loaded_node_with_their_cpuset(running):
    server, sched = running
    server.put("nodes", node("hot", cpu="16"))
    server.put("nodemetrics", metric("hot", "9"))
    server.put("nodes", node("cool", cpu="16"))
    server.put("nodemetrics", metric("cool", "1"))
    server.put("noderesourcetopologies", nrt("cool"))
    server.put("noderesourcetopologies", nrt("hot"))
    snap = sched.snapshot
    await eventually(lambda: len(snap.node_metrics) == 2 and len(snap.topologies) == 2)
    # the requests-based scores (NodeResourcesFit, BalancedAllocation) prefer the emptier node
    # a little; the real load decides
    server.put("pods", ours("web", requests={"cpu": "500m", "memory": "1Gi"}))
    lsr = ours(
        "lsr",
        requests={"cpu": "2", "memory": "1Gi"},
        limits={"cpu": "2", "memory": "1Gi"},
        labels={"koordinator.sh/qosClass": "LSR"},
        priority=9500,
    )
    server.put("pods", lsr)
    server.put("pods", pod("not-ours", requests={"cpu": "1"}))
    await eventually(lambda: node_of(server, "web") != "" and node_of(server, "lsr") != "")
    assert node_of(server, "web") == "cool"
    assert node_of(server, "lsr") == "cool"
    status = json.loads(server.get("pods", "lsr", "default")["metadata"]["annotations"][STATUS])
    assert status["cpuset"]
    await asyncio.sleep(0.2)
    assert node_of(server, "not-ours") == ""


async def test_an_unschedulable_pod_gets_a_failed_scheduling_event_in_koordinators_words(running):
    server, sched = running
    server.put("nodes", node("hot", cpu="16"))
    server.put("nodemetrics", metric("hot", "15"))
    await eventually(lambda: "hot" in sched.snapshot.node_metrics)
    server.put("pods", ours("p", requests={"cpu": "1"}))
    await eventually(lambda: bool(events_for(server, "p")))
    event = events_for(server, "p")[0]
    assert event["reason"] == "FailedScheduling"
    assert event["type"] == "Warning"
    # 15 of 16 cores used, and the pod's 1 core estimated at 85 %: 99 %
    assert event["note"] == (
        "0/1 nodes are available: "
        "1 node(s) cpu usage exceed threshold, cpu usage 99% > threshold 65%."
    )
    assert node_of(server, "p") == ""


async def test_a_gang_that_cannot_fit_binds_no_member_and_one_that_fits_binds_all(running):
    server, sched = running
    server.put("nodes", node("n1", cpu="4"))
    group = {
        "metadata": {"name": "job", "namespace": "default"},
        "spec": {"minMember": 3, "scheduleTimeoutSeconds": 2},
    }
    server.put("podgroups", group)
    await eventually(lambda: "default/job" in sched.snapshot.pod_groups)
    for i in range(3):
        server.put(
            "pods",
            ours(
                f"w{i}", requests={"cpu": "2"}, labels={"pod-group.scheduling.sigs.k8s.io": "job"}
            ),
        )
    await eventually(lambda: bool(events_for(server, "w2")) or bool(events_for(server, "w0")))
    await asyncio.sleep(0.5)
    assert [node_of(server, f"w{i}") for i in range(3)] == ["", "", ""]
    # room for the whole gang: all three are bound
    server.put("nodes", node("n2", cpu="4"))
    await eventually(lambda: all(node_of(server, f"w{i}") for i in range(3)), within=30)


async def test_a_quota_tree_under_contention_admits_pods_up_to_the_runtime_quota(api):
    server, client = api
    server.put("nodes", node("n1", cpu="10"))
    for name in ("a", "b"):
        quota = {
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"min": {"cpu": "4"}, "max": {"cpu": "10"}},
        }
        server.put("elasticquotas", quota)
    # all pods exist before the scheduler starts: a and b each ask for 8 cores, so each gets
    # its min 4 and half of the 2 left, 5 cores: two pods of 2 cores each
    for q in ("a", "b"):
        for i in range(4):
            labels = {"quota.scheduling.koordinator.sh/name": q}
            server.put("pods", ours(f"{q}{i}", requests={"cpu": "2"}, labels=labels))
    informed = InformedSnapshot(client)
    sched = Scheduler(
        build_framework(), informed.snapshot, KubeBinder(client), EventRecorder(client)
    )
    tasks = [asyncio.create_task(informed.run(), name="t-informers")]
    try:
        assert await informed.wait_synced(10)
        snap = informed.snapshot
        await eventually(lambda: len(snap.quotas) == 2 and len(snap.pending_pods) == 8)
        informed.on_pending = sched.enqueue
        tasks.append(asyncio.create_task(sched.run(), name="t-scheduler"))
        names = [f"{q}{i}" for q in ("a", "b") for i in range(4)]
        await eventually(lambda: sum(1 for n in names if node_of(server, n)) == 4)
        await eventually(
            lambda: all(events_for(server, n) for n in names if not node_of(server, n))
        )
        bound = {q: sum(1 for i in range(4) if node_of(server, f"{q}{i}")) for q in ("a", "b")}
        assert bound == {"a": 2, "b": 2}
        waiting = [n for n in names if not node_of(server, n)]
        assert all(
            any("Insufficient quotas" in e["note"] for e in events_for(server, w)) for w in waiting
        )
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_rejected_binding_is_retried(api):
    server, client = api
    server.put("nodes", node("n1"))
    server.faults.append(Fault(status=500, method="POST", path_contains="/binding", times=1))
    informed = InformedSnapshot(client)
    sched = Scheduler(
        build_framework(), informed.snapshot, KubeBinder(client), EventRecorder(client)
    )
    informed.on_pending = sched.enqueue
    tasks = [asyncio.create_task(informed.run(), name="t-informers")]
    try:
        assert await informed.wait_synced(10)
        server.put("pods", ours("p", requests={"cpu": "1"}))
        tasks.append(asyncio.create_task(sched.run(), name="t-scheduler"))
        await eventually(lambda: node_of(server, "p") == "n1")
        assert any("binding rejected" in e["note"] for e in events_for(server, "p"))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def test_failure_message_counts_reasons_over_nodes_as_kube_scheduler_does():
    reasons = {
        "a": ["Insufficient cpu"],
        "b": ["node(s) cpu usage exceed threshold"],
        "c": ["Insufficient cpu"],
    }
    assert failure_message(3, reasons) == (
        "0/3 nodes are available: 2 Insufficient cpu, 1 node(s) cpu usage exceed threshold."
    )


def test_per_node_numbers_do_not_split_the_failure_message():
    la = "node(s) cpu usage exceed threshold"
    reasons = {
        "a": [f"{la}, cpu usage 70% > threshold 65%"],
        "b": [f"{la}, cpu usage 80% > threshold 65%"],
        "c": [f"{la}, cpu usage 70% > threshold 65%"],
        "d": ["Insufficient quotas, quotaName: q, runtime: {cpu: 1}"],
    }
    assert failure_message(4, reasons) == (
        "0/4 nodes are available: 1 Insufficient quotas, quotaName: q, runtime: {cpu: 1}, "
        f"3 {la} (e.g. cpu usage 70% > threshold 65%)."
    )
    # the same numbers everywhere: the reason as it is
    same = {"a": [f"{la}, cpu usage 70% > threshold 65%"]}
    assert failure_message(1, same) == (
        f"0/1 nodes are available: 1 {la}, cpu usage 70% > threshold 65%."
    )
