"""End to end without a GPU: the GPU collector over the fake NVML, the Device reporter writing to
the fake API server, and koord-scheduler's informers and DeviceShare plugin placing pods on what
was written. An Xid on one GPU takes it out of the scheduler's reach."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from apis.crdschema import validate
from apis.scheduling_keys import ANNOTATION_DEVICE_ALLOCATED
from koordlet.collectors.gpu import GPUCollector
from koordlet.collectors.runner import TickState
from koordlet.metriccache import MetricCache
from koordlet.reporter.device import DeviceReporter
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.paths import HostPaths
from kubeclient.client import KubeClient
from scheduler_plugins.framework import Framework
from scheduler_plugins.informed import InformedSnapshot
from scheduler_plugins.plugins.deviceshare import DeviceShare
from scheduler_plugins.snapshot import parse_pod
from tests.kubefake.fixtures import eventually, kube_api, kube_client, kubeconfig
from tests.kubefake.server import FakeApiServer, Kind
from tests.nvmlfake import FakeNvml, gpu
from tests.scheduler.builders import NOW, node, pod

__all__ = ["kube_api", "kube_client", "kubeconfig"]

CRDS = (
    Kind("scheduling.koordinator.sh", "v1alpha1", "devices", "Device", False),
    Kind("scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas", "ElasticQuota", True),
    Kind("scheduling.sigs.k8s.io", "v1alpha1", "podgroups", "PodGroup", True),
    Kind("scheduling.koordinator.sh", "v1alpha1", "reservations", "Reservation", False),
    Kind("quota.koordinator.sh", "v1alpha1", "elasticquotaprofiles", "ElasticQuotaProfile", True),
    Kind("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False),
)
"""What koord-scheduler's informers list, besides the core kinds the fake serves."""


class Node:
    """One node's koordlet: the collector's tick feeding the cache the reporter reads."""

    def __init__(self, client: KubeClient, paths: HostPaths) -> None:
        self.cache = MetricCache()
        self.collector = GPUCollector(paths, 1.0)
        node_obj = node("gpu-1")
        node_obj["metadata"]["uid"] = "uid-gpu-1"
        self.reporter = DeviceReporter(client, self.cache, lambda: node_obj)
        self.now = 1000.0

    async def tick_and_report(self) -> bool:
        self.now += 1
        result = self.collector.collect(TickState(self.now, WorkloadSnapshot()))
        for name, value in result.info.items():
            self.cache.set_info(name, value)
        return await self.reporter.sync_once()


@pytest.fixture
async def cluster(
    kube_api: FakeApiServer, kube_client: KubeClient, nvml: FakeNvml, sysfs: HostPaths
) -> AsyncIterator[tuple[Node, InformedSnapshot]]:
    for kind in CRDS:
        kube_api.register(kind)
    kube_api.put("nodes", node("gpu-1"))
    kube_api.put("nodes", node("cpu-only"))
    informed = InformedSnapshot(kube_client)
    task = asyncio.create_task(informed.run(), name="test-scheduler-informers")
    koordlet = Node(kube_client, sysfs)
    try:
        assert await informed.wait_synced(10)
        yield koordlet, informed
    finally:
        koordlet.collector.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def place(informed: InformedSnapshot, requests: dict[str, str]) -> tuple[str | None, dict]:
    """Where DeviceShare puts a pod, and the GPUs it reserves there (then released: each call
    asks of an empty node)."""
    fw = Framework([DeviceShare()])
    p = parse_pod(pod("p", requests=requests), "p")
    cycle = fw.new_cycle(informed.snapshot, NOW)
    best = fw.evaluate(informed.snapshot, p, cycle=cycle).best()
    if best is None:
        return None, {}
    allocated = json.loads(fw.reserve(cycle, p, best)[ANNOTATION_DEVICE_ALLOCATED])
    fw.unreserve(cycle, p, best)
    return best, allocated


async def test_the_scheduler_places_gpu_pods_on_what_the_koordlet_reported(
    cluster: tuple[Node, InformedSnapshot], kube_api: FakeApiServer, nvml: FakeNvml
) -> None:
    koordlet, informed = cluster
    assert await koordlet.tick_and_report()
    stored = kube_api.get("devices", "gpu-1")
    assert stored is not None
    assert validate(stored) == []
    await eventually(lambda: "gpu-1" in informed.snapshot.devices)

    where, allocated = place(informed, {"nvidia.com/gpu": "2"})
    assert where == "gpu-1"
    assert [a["minor"] for a in allocated["gpu"]] == [0, 1]
    where, allocated = place(
        informed, {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
    )
    assert where == "gpu-1"
    assert allocated["gpu"][0]["resources"]["koordinator.sh/gpu-memory"] == str(40 << 30)

    nvml.set(gpu(0), gpu(1, xid_events=[79]))  # GPU 1 falls off the bus
    assert await koordlet.tick_and_report()
    await eventually(
        lambda: informed.snapshot.devices["gpu-1"]["spec"]["devices"][1]["health"] is False
    )
    assert place(informed, {"nvidia.com/gpu": "2"}) == (None, {})
    where, allocated = place(informed, {"nvidia.com/gpu": "1"})
    assert where == "gpu-1"
    assert [a["minor"] for a in allocated["gpu"]] == [0]
