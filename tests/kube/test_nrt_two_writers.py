"""The NodeResourceTopology has two writers: the koordlet (zones, their ``cpu`` and ``memory``)
and koord-manager (each zone's ``kubernetes.io/batch-cpu`` and ``batch-memory``). Both write the
whole object (a PUT on its resourceVersion), against one fake API server; whichever writes
last, neither wipes what the other wrote (upstream's ``MergeZoneList`` on the koordlet's side,
the manager changing only its own resources)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from apis.manager_keys import BATCH_CPU, BATCH_MEMORY
from apis.quantity import milli_value
from koordlet.metriccache import MetricCache
from koordlet.reporter.topology import KubeletTopology, TopologyReporter
from kubeclient.client import KubeClient, Obj
from manager.noderesource.controller import NodeResourceController
from tests.kube.test_topology_report import GiB, _info
from tests.kubefake import FakeApiServer
from tests.kubefake.fixtures import eventually
from tests.manager.builders import NOW, config_map, node, node_metric

NRT = "noderesourcetopologies"
NAME = "node-1"
KOORDLET = ("cpu", "memory")
MANAGER = (BATCH_CPU, BATCH_MEMORY)


def zone_resources(api: FakeApiServer) -> dict[str, dict[str, str]]:
    """Zone → resource → allocatable, as stored."""
    obj = api.get(NRT, NAME) or {}
    return {
        z["name"]: {r["name"]: r["allocatable"] for r in z.get("resources") or ()}
        for z in obj.get("zones") or ()
    }


def metric(prod_cpu: str) -> Obj:
    return node_metric(
        name=NAME,
        node_usage=("2", "4Gi"),
        system_usage=("1", "2Gi"),
        pods=[("default/web", "koord-prod", prod_cpu, "2Gi")],
    )


@dataclass
class Writers:
    api: FakeApiServer
    koordlet: TopologyReporter
    manager: NodeResourceController
    kubelet: Callable[[KubeletTopology], None]

    async def settled(self) -> None:
        """The manager has seen the stored NRT and NodeMetric and has nothing left to do."""

        def seen(plural: str, informer: Any) -> bool:
            stored = (self.api.get(plural, NAME) or {}).get("metadata", {})
            mine = (informer.get(NAME) or {}).get("metadata", {})
            return bool(stored) and stored.get("resourceVersion") == mine.get("resourceVersion")

        await eventually(
            lambda: (
                seen(NRT, self.manager.topologies)
                and seen("nodemetrics", self.manager.node_metrics)
                and self.manager.queue.idle()
            )
        )

    async def koordlet_writes(self, reserved_gib: int) -> None:
        """A koordlet round that must write: the kubelet now reserves ``reserved_gib`` of NUMA
        node 1's memory, so that zone's memory allocatable moves."""
        self.kubelet(KubeletTopology(reserved_memory={1: reserved_gib * GiB}))
        assert await self.koordlet.sync_once()

    async def manager_writes(self, prod_cpu: str) -> None:
        """A manager round that must write: prod usage moves the zones' batch-cpu past the
        diff threshold."""
        before = self.manager.zone_writes
        self.api.put("nodemetrics", metric(prod_cpu))
        await self.settled()
        assert self.manager.zone_writes > before


@pytest.fixture
async def writers(kube_api: FakeApiServer, kube_client: KubeClient) -> AsyncIterator[Writers]:
    kube_api.put("nodes", node(NAME, cpu="8", memory="16Gi"))
    kube_api.put("nodemetrics", metric("1"))
    kube_api.put("configmaps", config_map(colocation_config={"enable": True}))
    cache = MetricCache()
    cache.set_info("node_info", _info(cpus_per_node=4, nodes=2))  # 2 x (4 CPUs, 8 GiB)
    koordlet = TopologyReporter(
        kube_client,
        cache,
        lambda: kube_api.get("nodes", NAME),
        list,
        KubeletTopology(),
        clock=lambda: 0.0,
    )

    def set_kubelet(k: KubeletTopology) -> None:
        koordlet.kubelet = k

    assert await koordlet.sync_once()  # the koordlet creates the object with its zones
    manager = NodeResourceController(kube_client, clock=lambda: NOW, resync_seconds=3600)
    task = asyncio.create_task(manager.run(sync_timeout=5), name="noderesource")
    try:
        await eventually(lambda: manager.zone_writes >= 1)  # the manager's first zone write
        yield Writers(kube_api, koordlet, manager, set_kubelet)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def assert_both_present(api: FakeApiServer, memory_1: str) -> dict[str, dict[str, str]]:
    zones = zone_resources(api)
    assert list(zones) == ["node-0", "node-1"]
    for name, resources in zones.items():
        assert set(resources) == {*KOORDLET, *MANAGER}, name
        assert resources["cpu"] == "4"
    assert zones["node-0"]["memory"] == "8Gi"
    assert zones["node-1"]["memory"] == memory_1
    return zones


@pytest.mark.parametrize(
    "order",
    [
        ("koordlet", "manager", "koordlet"),
        ("manager", "koordlet", "manager"),
    ],
)
async def test_neither_writer_wipes_the_other(writers: Writers, order: tuple[str, ...]) -> None:
    reserved = 0
    usage = 1
    await writers.settled()
    last_batch = {z: milli_value(r[BATCH_CPU]) for z, r in zone_resources(writers.api).items()}
    for step in order:
        if step == "koordlet":
            reserved += 1
            await writers.koordlet_writes(reserved)
            # read before the manager reacts: the koordlet's write alone kept its values
            zones = assert_both_present(writers.api, f"{8 - reserved}Gi")
            assert {z: milli_value(r[BATCH_CPU]) for z, r in zones.items()} == last_batch
            await writers.settled()
        else:
            usage += 1
            await writers.manager_writes(str(usage))
            zones = assert_both_present(writers.api, f"{8 - reserved}Gi")
            batch = {z: milli_value(r[BATCH_CPU]) for z, r in zones.items()}
            assert batch != last_batch  # the manager's new values are there
            last_batch = batch
    assert len(writers.api.writes("PUT", f"/{NRT}/{NAME}")) >= len(order)


async def test_the_koordlet_does_not_rewrite_for_the_managers_resources(
    writers: Writers,
) -> None:
    """Its change detection compares only zone names, types, ``cpu`` and ``memory``: a manager
    write does not make the next koordlet round write (upstream's ``isEqualNRTZones``)."""
    await writers.manager_writes("5")
    writers.koordlet._known = None  # force a read of the object, as after a resync
    assert not await writers.koordlet.sync_once()


async def test_a_zone_the_koordlet_no_longer_reports_goes_with_its_batch_resources(
    writers: Writers,
) -> None:
    """``TrimDifferentZone``: the zone set is the koordlet's."""
    cache = MetricCache()
    cache.set_info("node_info", _info(cpus_per_node=8, nodes=1))
    writers.koordlet._cache = cache
    assert await writers.koordlet.sync_once()
    zones = zone_resources(writers.api)
    assert list(zones) == ["node-0"]
    assert zones["node-0"]["cpu"] == "8"
    assert BATCH_CPU in zones["node-0"]  # kept for the zone that stays
