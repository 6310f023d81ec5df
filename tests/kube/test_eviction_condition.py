"""The BE eviction Node condition against the fake API server: set at the first BE eviction through
the status subresource (the kubelet's conditions kept), lifted after the cool-down (an injected
clock), retried on a conflict, never set by a dry run or another strategy, lifted when the gate is
off, held a whole cool-down after a restart."""

from __future__ import annotations

import asyncio
from typing import Any

from apis.extension import QoSClass
from apis.node_conditions import (
    CONDITION_BE_EVICTION_PRESSURE,
    REASON_BE_EVICTION_CONDITION_OFF,
    REASON_BE_EVICTION_COOLED_DOWN,
    REASON_EVICTING_BE_PODS,
)
from koordlet.qos.evictor import Evictor, Outcome, Victim
from koordlet.reporter.evictioncondition import EvictionCondition, condition_of
from kubeclient.client import KubeClient, Obj
from tests.kubefake import FakeApiServer
from tests.kubefake.fixtures import Clock, eventually

NODE = "node-1"
T0 = 1_714_557_600.0  # 2024-05-01T10:00:00Z
KUBELET_READY = {"type": "Ready", "status": "True", "reason": "KubeletReady"}


def node(*conditions: dict[str, Any]) -> Obj:
    return {
        "metadata": {"name": NODE},
        "status": {"conditions": [KUBELET_READY, *conditions], "allocatable": {"cpu": "4"}},
    }


def outcome(status: str = "evicted") -> Outcome:
    v = Victim("pod/u1", "ns/p1", QoSClass.BE, "kubepods/besteffort/podu1")
    return Outcome(v, status)  # type: ignore[arg-type]


async def _no_sleep(_: float) -> None:
    return None


def make(
    kube_api: FakeApiServer, client: KubeClient, *, enabled: bool = True, clock: Clock
) -> EvictionCondition:
    return EvictionCondition(
        client,
        NODE,
        lambda: kube_api.get("nodes", NODE),
        enabled=enabled,
        cool_down=300.0,
        clock=clock,
        wall=lambda: T0 + clock.now,
        sleep=_no_sleep,
    )


def the_condition(kube_api: FakeApiServer) -> dict[str, Any]:
    cond = condition_of(kube_api.get("nodes", NODE))
    assert cond is not None
    return dict(cond)


async def test_a_be_eviction_sets_the_condition_and_the_cool_down_lifts_it(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodes", node())
    clock = Clock(0.0)
    cond = make(kube_api, kube_client, clock=clock)
    assert await cond.step() is None
    assert kube_api.writes("PUT") == []  # nothing to say yet

    cond.on_evictions("memoryevict", "EvictPodByNodeMemoryUsage", [outcome()], False)
    assert await cond.step() == 300.0
    (put,) = kube_api.writes("PUT")
    assert put.path == f"/api/v1/nodes/{NODE}/status"
    got = the_condition(kube_api)
    assert (got["status"], got["reason"]) == ("True", REASON_EVICTING_BE_PODS)
    assert "memoryevict: EvictPodByNodeMemoryUsage" in got["message"]
    assert got["lastTransitionTime"] == "2024-05-01T10:00:00Z"
    status = kube_api.get("nodes", NODE)["status"]  # type: ignore[index]
    assert KUBELET_READY in status["conditions"]
    assert status["allocatable"] == {"cpu": "4"}

    clock.now = 200.0  # another eviction pushes the end back, without a write
    cond.on_evictions("cpuevict", "EvictPodByBECPUSatisfaction", [outcome()], False)
    assert await cond.step() == 300.0
    assert len(kube_api.writes("PUT")) == 1

    clock.now = 499.0
    assert await cond.step() == 1.0
    clock.now = 500.0
    assert await cond.step() is None
    got = the_condition(kube_api)
    assert (got["status"], got["reason"]) == ("False", REASON_BE_EVICTION_COOLED_DOWN)
    assert got["lastTransitionTime"] == "2024-05-01T10:08:20Z"
    assert await cond.step() is None
    assert len(kube_api.writes("PUT")) == 2  # said once


async def test_dry_runs_other_strategies_and_non_evictions_change_nothing(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodes", node())
    cond = make(kube_api, kube_client, clock=Clock(0.0))
    cond.on_evictions("memoryevict", "r", [outcome()], True)  # dry run
    cond.on_evictions("cpusuppress", "r", [outcome()], False)
    cond.on_evictions("memoryevict", "r", [outcome("duplicate"), outcome("failed")], False)
    assert await cond.step() is None
    assert kube_api.writes("PUT") == []
    assert cond.evictions == 0


async def test_a_conflicting_write_is_read_again_and_retried(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodes", node())
    cond = make(kube_api, kube_client, clock=Clock(0.0))
    cond.on_evictions("memoryevict", "r", [outcome()], False)
    real_get = kube_client.get
    calls = 0

    async def racing_get(*args: Any, **kwargs: Any) -> Obj:
        nonlocal calls
        calls += 1
        got = await real_get(*args, **kwargs)
        if calls == 1:  # the kubelet writes its status between our read and our write
            kube_api.put("nodes", node({"type": "MemoryPressure", "status": "False"}))
        return got

    kube_client.get = racing_get  # type: ignore[method-assign]
    await cond.step()
    assert len(kube_api.writes("PUT")) == 2
    types = [c["type"] for c in kube_api.get("nodes", NODE)["status"]["conditions"]]  # type: ignore[index]
    assert types == ["Ready", "MemoryPressure", CONDITION_BE_EVICTION_PRESSURE]


async def test_with_the_gate_off_a_stale_condition_is_lifted_and_nothing_else_written(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    stale = {"type": CONDITION_BE_EVICTION_PRESSURE, "status": "True", "reason": "x"}
    kube_api.put("nodes", node(stale))
    cond = make(kube_api, kube_client, enabled=False, clock=Clock(0.0))
    cond.on_evictions("memoryevict", "r", [outcome()], False)
    await cond.step()
    got = the_condition(kube_api)
    assert (got["status"], got["reason"]) == ("False", REASON_BE_EVICTION_CONDITION_OFF)
    await cond.step()
    assert len(kube_api.writes("PUT")) == 1


async def test_after_a_restart_a_condition_left_on_is_held_a_whole_cool_down(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    left = {"type": CONDITION_BE_EVICTION_PRESSURE, "status": "True", "reason": "EvictingBEPods"}
    kube_api.put("nodes", node(left))
    clock = Clock(0.0)
    cond = make(kube_api, kube_client, clock=clock)
    assert await cond.step() == 300.0
    assert kube_api.writes("PUT") == []
    clock.now = 300.0
    await cond.step()
    assert the_condition(kube_api)["status"] == "False"


async def test_the_loop_writes_on_the_evictors_call_and_retries_a_failed_write(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    from tests.kubefake.server import Fault

    kube_api.put("nodes", node())

    class Backend:
        name = "test"

        async def evict(self, victim: Victim, *, reason: str, message: str) -> str:
            return "killed"

    evictor = Evictor(Backend())
    cond = make(kube_api, kube_client, clock=Clock(0.0))
    evictor.add_listener(cond.on_evictions)
    kube_api.faults.append(Fault(method="PUT", status=500, times=1))
    task = asyncio.create_task(cond.run(), name="be-eviction-condition")
    try:
        victim = Victim("pod/u1", "ns/p1", QoSClass.BE, "kubepods/besteffort/podu1")
        await evictor.evict([victim], strategy="memoryevict", reason="EvictPodByNodeMemoryUsage")
        await eventually(lambda: condition_of(kube_api.get("nodes", NODE)) is not None)
        assert the_condition(kube_api)["status"] == "True"
        assert len(kube_api.writes("PUT")) == 2  # the first refused with a 500, then again
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
