"""A whole migration on the fake API server the real client layer (kubeclient) talks to.

``koord-descheduler``'s term (informers, a LowNodeLoad round, arbitration, the
MigrationController) and ``koord-scheduler run``'s scheduler (informers and loop, as
``build_scheduler`` makes them) run in this process against one fake API server. The test plays
the two parts that are neither: the ReplicaSet controller, which creates a replacement when the
pod is evicted, and the kubelet, which reports it Ready.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from apis.crdschema import validate
from descheduler.config import parse_config
from descheduler.metrics import Metrics
from descheduler.runtime import Term
from kubeclient.client import KubeClient
from scheduler_plugins.config import SchedulerConfig
from scheduler_plugins.standalone import build_scheduler
from tests.descheduler.builders import (
    build_node,
    build_pod,
    low_node_load_config,
    node_metric,
    replica_set,
)
from tests.descheduler.fake import DeschedulerFakeApiServer
from tests.kubefake.fixtures import eventually

CPU = 1200
OWNER = ("ReplicaSet", "web", "uid-rs-web")


@asynccontextmanager
async def scheduler(client: KubeClient) -> AsyncIterator[Any]:
    informed, sched = build_scheduler(client, SchedulerConfig())
    tasks = [asyncio.create_task(informed.run(), name="t-sched-informers")]
    try:
        assert await informed.wait_synced(10)
        tasks.append(asyncio.create_task(sched.run(), name="t-sched-loop"))
        yield sched
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@asynccontextmanager
async def descheduler(client: KubeClient, doc: dict[str, Any]) -> AsyncIterator[Term]:
    term = Term(client, parse_config(doc, "test"), Metrics(), dry_run=False, sync_timeout=10)
    task = asyncio.create_task(term.run(), name="t-descheduler-term")
    try:
        yield term
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def hot_cluster(server: DeschedulerFakeApiServer) -> None:
    server.put("nodes", build_node("hot", 4000, 8 * 1024**3))
    server.put("nodes", build_node("cold", 8000, 16 * 1024**3))
    pods = [
        build_pod(f"web-{i}", CPU, 1024**3, "hot", owner=OWNER, labels={"app": "web"})
        for i in range(3)
    ]
    for p in pods:
        server.put("pods", p)
    server.put("replicasets", {**replica_set("web", replicas=3, uid="uid-rs-web")})
    # the ReplicaSet's uid must be what the pods' ownerReferences name
    rs = server.get("replicasets", "web", "default")
    assert rs is not None
    rs["metadata"]["uid"] = "uid-rs-web"
    now = time.time()
    server.put("nodemetrics", node_metric("hot", pods, updated=now - 5))
    server.put("nodemetrics", node_metric("cold", pods, updated=now - 5))


def config(**migration: Any) -> dict[str, Any]:
    return low_node_load_config(
        lowThresholds={"cpu": 30},
        highThresholds={"cpu": 60},
        anomalyCondition={"consecutiveAbnormalities": 1},
        migration={"arbitrationArgs": {"enabled": True, "interval": "100ms"}, **migration},
    )


def job_of(server: DeschedulerFakeApiServer) -> dict[str, Any]:
    (job,) = server.jobs()
    return job


def condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next(
        (c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == kind), None
    )


async def test_a_hot_nodes_pod_moves_through_a_reservation_to_the_cold_node(api) -> None:
    server, client = api
    hot_cluster(server)
    async with scheduler(client), descheduler(client, config()):
        # the round decides one move (3 x 1200m = 90 % > 60 %; one pod brings hot to 60 %)
        await eventually(lambda: len(server.jobs()) == 1, within=20)
        job = job_of(server)
        pod_name = job["spec"]["podRef"]["name"]
        assert job["spec"]["mode"] == "ReservationFirst"
        assert job["spec"]["ttl"] == "5m0s"
        assert job["metadata"]["annotations"]["koordinator.sh/evict-trigger"] == "LowNodeLoad"
        assert job["metadata"]["annotations"]["koordinator.sh/evict-reason"] == (
            "node is overutilized, node cpu usage(90.00%)>threshold(60.00%)"
        )
        # arbitration passes it, the controller reserves room and the scheduler places it
        await eventually(
            lambda: bool(server.get("reservations", job_of(server)["metadata"]["uid"]))
        )
        rname = job_of(server)["metadata"]["uid"]
        await eventually(
            lambda: (
                ((server.get("reservations", rname) or {}).get("status") or {}).get("phase")
                == "Available"
            ),
            within=20,
        )
        reservation = server.get("reservations", rname)
        assert reservation is not None
        assert reservation["status"]["nodeName"] == "cold"
        assert reservation["spec"]["owners"] == [
            {
                "controller": {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web",
                    "uid": "uid-rs-web",
                    "controller": True,
                    "namespace": "default",
                }
            }
        ]
        assert reservation["spec"]["allocateOnce"] is True
        assert reservation["metadata"]["labels"]["app.kubernetes.io/created-by"] == (
            "koord-descheduler"
        )
        # then the pod is evicted through the Eviction API
        await eventually(lambda: server.get("pods", pod_name, "default") is None, within=20)
        evictions = server.writes("POST", f"/pods/{pod_name}/eviction")
        assert len(evictions) == 1
        assert evictions[0].body["deleteOptions"]["preconditions"]["uid"] == (
            f"uid-default-{pod_name}"
        )
        await eventually(
            lambda: (condition(job_of(server), "Eviction") or {}).get("status") == "True"
        )
        assert job_of(server)["status"]["nodeName"] == "cold"
        # the ReplicaSet controller creates the replacement; the scheduler binds it to the
        # Reservation on the cold node
        replacement = build_pod(
            "web-new",
            CPU,
            1024**3,
            "",
            owner=OWNER,
            labels={"app": "web"},
            ready=False,
            phase="Pending",
        )
        server.put("pods", replacement)
        await eventually(
            lambda: (
                ((server.get("pods", "web-new", "default") or {}).get("spec") or {}).get("nodeName")
                == "cold"
            ),
            within=20,
        )
        await eventually(
            lambda: (condition(job_of(server), "ReservationBound") or {}).get("status") == "True",
            within=20,
        )
        assert job_of(server)["status"]["podRef"]["name"] == "web-new"
        # the kubelet reports it Ready
        bound = server.get("pods", "web-new", "default")
        assert bound is not None
        bound["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        bound["status"]["phase"] = "Running"
        server.put("pods", bound)
        await eventually(
            lambda: (job_of(server).get("status") or {}).get("phase") == "Succeeded", within=20
        )
        # The job's last Event is written after its status: wait for it before stopping.
        await eventually(lambda: "Complete" in job_event_reasons(server), within=20)
    status = job_of(server)["status"]
    assert status["status"] == "Complete"
    assert status["message"] == f'Bind Pod "default/web-new" in Reservation "{rname}"'
    kinds = [c["type"] for c in status["conditions"]]
    for kind in (
        "ReservationCreated",
        "ReservationScheduled",
        "Eviction",
        "PodBoundReservation",
        "ReservationBound",
        "BoundPodReady",
    ):
        assert kind in kinds
    assert all(c["status"] == "True" for c in status["conditions"])
    reasons = job_event_reasons(server)
    assert {
        "ReservationCreated",
        "ReservationScheduled",
        "Evicting",
        "EvictComplete",
        "Complete",
    } <= reasons
    assert not server.writes("DELETE", "/pods/")  # an eviction, never a delete
    # What was written would pass a real API server's validation of the CRDs.
    bodies = [
        r.body
        for r in server.writes()
        if r.method in ("POST", "PUT")
        and ("/podmigrationjobs" in r.path or "/reservations" in r.path)
    ]
    assert len(bodies) >= 3  # the job, its Reservation, status writes
    assert [v for b in bodies for v in validate(b)] == []


async def test_a_job_whose_pod_is_gone_ends_failed_with_the_reason(api) -> None:
    server, client = api
    server.put("nodes", build_node("n1"))
    server.put(
        "podmigrationjobs",
        {
            "metadata": {"name": "ghost-job"},
            "spec": {"podRef": {"namespace": "default", "name": "ghost"}, "mode": "EvictDirectly"},
        },
    )
    async with descheduler(client, low_node_load_config()):
        await eventually(
            lambda: (
                (server.get("podmigrationjobs", "ghost-job") or {}).get("status", {}).get("phase")
                == "Failed"
            )
        )
    status = server.get("podmigrationjobs", "ghost-job")["status"]  # type: ignore[index]
    assert status["reason"] == "MissingPod"
    assert status["message"] == 'Abort job caused by missing Pod "default/ghost"'


async def test_a_budget_429_is_retried_with_backoff_and_never_becomes_a_delete(api) -> None:
    server, client = api
    server.put("nodes", build_node("n1"))
    server.put("nodes", build_node("n2"))
    for i in range(3):
        server.put(
            "pods",
            build_pod(f"web-{i}", 100, 100, f"n{1 + i % 2}", owner=OWNER, labels={"app": "web"}),
        )
    server.put("replicasets", replica_set("web", replicas=10, uid="uid-rs-web"))
    server.objects[("replicasets", "default", "web")]["metadata"]["uid"] = "uid-rs-web"
    # a budget the API server has not processed yet (observedGeneration behind): 429
    budget = {
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": 1, "observedGeneration": 0},
    }
    server.put("poddisruptionbudgets", budget)
    server.put(
        "podmigrationjobs",
        {
            "metadata": {"name": "j"},
            "spec": {"podRef": {"namespace": "default", "name": "web-0"}, "mode": "EvictDirectly"},
        },
    )
    async with descheduler(client, low_node_load_config()):
        await eventually(lambda: len(server.writes("POST", "/pods/web-0/eviction")) >= 2, within=20)
        assert server.get("pods", "web-0", "default") is not None
        job = server.get("podmigrationjobs", "j") or {}
        assert job["status"]["phase"] == "Running"
        warnings = [
            e
            for (plural, _, _), e in server.objects.items()
            if plural == "events" and e["reason"] == "Evicting" and e["type"] == "Warning"
        ]
        assert warnings
        assert "disruption budget" in warnings[0]["note"]
        # the budget controller catches up: the next attempt evicts
        budget["status"] = {"disruptionsAllowed": 1, "observedGeneration": 1}
        server.put("poddisruptionbudgets", budget)
        await eventually(
            lambda: (
                (server.get("podmigrationjobs", "j") or {}).get("status", {}).get("phase")
                == "Succeeded"
            ),
            within=30,
        )
    assert server.get("pods", "web-0", "default") is None
    assert not server.writes("DELETE", "/pods/")
    assert (
        server.objects[("poddisruptionbudgets", "default", "web")]["status"]["disruptionsAllowed"]
        == 0
    )


def job_event_reasons(server: DeschedulerFakeApiServer) -> set[str]:
    """The reasons of the Events recorded on PodMigrationJobs."""
    return {
        e["reason"]
        for (plural, _, _), e in list(server.objects.items())
        if plural == "events" and e["regarding"].get("kind") == "PodMigrationJob"
    }
