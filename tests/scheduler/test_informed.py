"""The extender over a snapshot that informers keep current, against the fake API server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from scheduler_plugins.extender import Extender
from scheduler_plugins.informed import InformedSnapshot
from scheduler_plugins.table import build_framework
from tests.kubefake.server import FakeApiServer, Kind
from tests.scheduler.builders import node, node_metric, pod, ts

CRDS = (
    Kind("scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas", "ElasticQuota", True),
    Kind("scheduling.sigs.k8s.io", "v1alpha1", "podgroups", "PodGroup", True),
    Kind("scheduling.koordinator.sh", "v1alpha1", "reservations", "Reservation", False),
    Kind("scheduling.koordinator.sh", "v1alpha1", "devices", "Device", False),
)


def fresh_metric(name: str, cpu: str) -> dict:
    m = node_metric(name, cpu=cpu)
    m["status"]["updateTime"] = ts(time.time() - 5)
    return m


async def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        while not check():  # noqa: ASYNC110 - polling the informer-fed state is the point
            await asyncio.sleep(0.02)


@pytest.fixture
async def cluster(kube_api: FakeApiServer, kube_client):
    for kind in CRDS:
        kube_api.register(kind)
    for name, cpu in (("hot", "24"), ("cool", "4")):
        kube_api.put("nodes", node(name))
        kube_api.put("nodemetrics", fresh_metric(name, cpu))
    informed = InformedSnapshot(kube_client)
    task = asyncio.create_task(informed.run(), name="test-informers")
    try:
        assert await informed.wait_synced(10)
        yield kube_api, informed, Extender(build_framework(), informed.snapshot)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def filter_names(ext: Extender, p: dict) -> tuple[list[str], dict[str, str]]:
    result = ext.filter({"pod": p, "nodenames": ["hot", "cool"]})
    return result["nodenames"], result["failedNodes"]


async def test_informer_events_change_the_verdicts(cluster):
    api, informed, ext = cluster
    p = pod("p", requests={"cpu": "2"})
    await eventually(lambda: "hot" in informed.snapshot.node_metrics)
    assert filter_names(ext, p) == (["cool"], {"hot": "node(s) cpu usage exceed threshold"})
    # the koordlet reports the hot node cooled down
    api.put("nodemetrics", fresh_metric("hot", "2"))
    await eventually(lambda: filter_names(ext, p)[0] == ["hot", "cool"])
    # a pod bound to cool takes 31 of its 32 cores
    api.put("pods", pod("big", node_name="cool", requests={"cpu": "31"}))
    await eventually(lambda: filter_names(ext, p)[1].get("cool") == "Insufficient cpu")
    # the node goes away
    api.remove("nodes", "cool")
    await eventually(lambda: filter_names(ext, p)[1].get("cool") == "node(s) not found")


async def test_finished_and_deleted_pods_free_their_node(cluster):
    api, informed, ext = cluster
    api.put("pods", pod("big", node_name="cool", requests={"cpu": "31"}))
    p = pod("p", requests={"cpu": "2"})
    await eventually(lambda: "cool" in filter_names(ext, p)[1])
    done = pod("big", node_name="cool", requests={"cpu": "31"})
    done["status"]["phase"] = "Succeeded"
    api.put("pods", done)
    await eventually(lambda: "cool" not in filter_names(ext, p)[1])
    assert informed.snapshot.nodes["cool"].pods == {}
