"""A Reservation's ``status.currentOwners`` and ``allocated`` follow the pods that land on it, as
koord-scheduler's reservation controller writes them (``syncStatus``): end to end on the fake
API server, and table tests of the status built."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from scheduler_plugins.extender import Extender, KubeBinder
from scheduler_plugins.informed import InformedSnapshot
from scheduler_plugins.reservationstatus import OwnerSync, owners_status
from scheduler_plugins.snapshot import parse_pod
from scheduler_plugins.table import build_framework
from tests.scheduler.bindingfake import BindingFakeApiServer
from tests.scheduler.builders import NOW, node, pod
from tests.scheduler.helpers import snapshot_of
from tests.scheduler.test_reservation_scheduling import (
    ALLOCATED,
    WEB,
    Running,
    reservation,
    status_of,
)
from tests.scheduler.test_standalone import eventually, node_of, ours

AVAILABLE = {
    "phase": "Available",
    "nodeName": "big",
    "allocatable": {"cpu": "3", "memory": "1Gi"},
    "currentOwners": [],
    "conditions": [
        {"type": "Scheduled", "status": "True", "reason": "Scheduled"},
        {"type": "Ready", "status": "True", "reason": "Available"},
    ],
}


def placed(name: str, *, allocate_once: bool = True) -> dict[str, Any]:
    obj = reservation(name, "3", status=copy.deepcopy(AVAILABLE))
    if not allocate_once:
        obj["spec"]["allocateOnce"] = False
    return obj


def owner(name: str, cpu: str, r: str = "r1", *, bound: bool = True) -> dict[str, Any]:
    """A pod that consumed Reservation ``r`` (its reservation-allocated annotation)."""
    return pod(
        name,
        node_name="big" if bound else "",
        requests={"cpu": cpu, "memory": "256Mi"},
        labels=WEB,
        annotations={ALLOCATED: json.dumps({"name": r, "uid": f"uid-r-{r}"})},
    )


# -- the status built ---------------------------------------------------------------------------


def test_owners_and_allocated_are_the_bound_pods_naming_it_limited_to_its_resources():
    r = placed("r1", allocate_once=False)
    snap = snapshot_of(
        node("big", cpu="8"),
        owner("b", "1"),
        owner("a", "1500m"),
        owner("other", "1", r="r2"),
        pod("plain", node_name="big", requests={"cpu": "1"}),
    )
    snap.reservations["r1"] = r
    status = owners_status(r, snap, NOW)
    assert status is not None
    assert status["currentOwners"] == [
        {"namespace": "default", "name": "a", "uid": "uid-default-a"},
        {"namespace": "default", "name": "b", "uid": "uid-default-b"},
    ]
    # memory is allocatable too: both pods' 256Mi count; nothing outside allocatable does
    assert status["allocated"] == {"cpu": "2500m", "memory": "512Mi"}
    assert status["phase"] == "Available"
    # written once: the same again is nothing to write
    assert owners_status({**r, "status": status}, snap, NOW) is None


def test_an_allocate_once_reservation_succeeds_with_its_first_owner():
    r = placed("r1")
    snap = snapshot_of(node("big", cpu="8"), owner("a", "1"))
    status = owners_status(r, snap, NOW)
    assert status is not None
    assert status["phase"] == "Succeeded"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Succeeded")
    # left alone from then on
    assert owners_status({**r, "status": status}, snap, NOW) is None


def test_pods_only_assumed_and_reservations_not_available_are_not_counted():
    snap = snapshot_of(node("big", cpu="8"))
    info = parse_pod(owner("a", "1", bound=False), "t")
    snap.assume(info, "big")  # the scheduler's view only: the API server has no nodeName yet
    assert owners_status(placed("r1"), snap, NOW) is None
    pending = reservation("r1", "3")
    snap2 = snapshot_of(node("big", cpu="8"), owner("a", "1"))
    assert owners_status(pending, snap2, NOW) is None


# -- end to end ---------------------------------------------------------------------------------


@pytest.fixture
async def running(api) -> AsyncIterator[tuple[BindingFakeApiServer, Running]]:
    server, client = api
    server.put("nodes", node("big", cpu="8"))
    run = Running(client)
    try:
        await run.start()
        yield server, run
    finally:
        await run.stop()


def owners_of(server: BindingFakeApiServer, name: str) -> list[str]:
    return [o["name"] for o in status_of(server, name).get("currentOwners") or []]


async def test_an_owner_scheduled_onto_a_reservation_is_written_to_current_owners(running):
    server, _ = running
    server.put("reservations", reservation("r1", "3"))
    await eventually(lambda: status_of(server, "r1").get("phase") == "Available")
    server.put("pods", ours("web-1", requests={"cpu": "2"}, labels=WEB))
    await eventually(lambda: node_of(server, "web-1") == "big")
    await eventually(lambda: owners_of(server, "r1") == ["web-1"])
    status = status_of(server, "r1")
    uid = server.get("pods", "web-1", "default")["metadata"]["uid"]
    assert status["currentOwners"] == [{"namespace": "default", "name": "web-1", "uid": uid}]
    assert status["allocated"] == {"cpu": "2"}  # it requests no memory
    assert status["phase"] == "Succeeded"  # allocateOnce (the default)


async def test_owners_come_and_go_on_a_reservation_that_allocates_more_than_once(running):
    server, run = running
    server.put("reservations", placed("r1", allocate_once=False))
    await eventually(lambda: "r1" in run.sched.snapshot.reservations)
    server.put("pods", owner("a", "1"))
    server.put("pods", owner("b", "1"))
    await eventually(lambda: sorted(owners_of(server, "r1")) == ["a", "b"])
    assert status_of(server, "r1")["phase"] == "Available"
    server.remove("pods", "a", "default")
    await eventually(lambda: owners_of(server, "r1") == ["b"])
    assert status_of(server, "r1")["allocated"] == {"cpu": "1", "memory": "256Mi"}


async def test_the_extender_with_bind_writes_the_owners_of_the_pods_it_binds(api):
    server, client = api
    server.put("nodes", node("big", cpu="8"))
    server.put("reservations", placed("r1"))
    informed = InformedSnapshot(client)
    sync = OwnerSync(client, informed.snapshot)
    informed.watch_owners(sync)
    ext = Extender(
        build_framework(), informed.snapshot, binder=KubeBinder(client), gate=informed.not_ready
    )
    tasks = [
        asyncio.create_task(informed.run(), name="t-informers"),
        asyncio.create_task(sync.run(informed.not_ready, retry_s=0.05), name="t-owners"),
    ]
    try:
        assert await informed.wait_synced(10)
        await eventually(lambda: "r1" in informed.snapshot.reservations)
        server.put("pods", pod("web-1", requests={"cpu": "2"}, labels=WEB))
        await eventually(lambda: bool(informed.snapshot.pending_pods))
        web = server.get("pods", "web-1", "default")
        body = {"Pod": web, "Nodes": None, "NodeNames": ["big"]}
        assert ext.filter(body)["NodeNames"] == ["big"]
        bind = {"PodName": "web-1", "PodNamespace": "default", "PodUID": "uid-default-web-1"}
        assert await ext.bind({**bind, "Node": "big"}) == {"Error": ""}
        await eventually(lambda: owners_of(server, "r1") == ["web-1"])
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
