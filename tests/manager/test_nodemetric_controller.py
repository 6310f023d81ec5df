"""The NodeMetric controller against the fake API server, through the real client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from apis.crdschema import load_crds
from kubeclient.client import KubeClient
from manager.nodemetric.controller import NodeMetricController
from tests.kubefake import FakeApiServer
from tests.manager.builders import config_map, node
from tests.manager.conftest import eventually

COLOCATION = {
    "enable": True,
    "metricAggregateDurationSeconds": 120,
    "metricReportIntervalSeconds": 30,
    "metricAggregatePolicy": {"durations": ["5m", "15m"]},
    "nodeConfigs": [
        {
            "name": "slow-pool",
            "nodeSelector": {"matchLabels": {"pool": "slow"}},
            "metricReportIntervalSeconds": 90,
            "metricMemoryCollectPolicy": "usageWithPageCache",
        }
    ],
}


@asynccontextmanager
async def running(ctrl: NodeMetricController) -> AsyncIterator[None]:
    task = asyncio.create_task(ctrl.run(sync_timeout=5), name="nodemetric")
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def policy(api: FakeApiServer, name: str) -> dict[str, Any]:
    obj = api.get("nodemetrics", name)
    assert obj is not None, f"no NodeMetric for {name}"
    return dict(obj["spec"]["metricCollectPolicy"])


async def test_every_node_gets_a_nodemetric_owned_by_it_with_its_collect_policy(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodes", node("fast"))
    kube_api.put("nodes", node("slow", labels={"pool": "slow"}))
    kube_api.put("configmaps", config_map(colocation_config=COLOCATION))
    ctrl = NodeMetricController(kube_client, resync_seconds=3600)
    async with running(ctrl):
        await eventually(
            lambda: all(kube_api.get("nodemetrics", n) is not None for n in ("fast", "slow"))
        )
    assert policy(kube_api, "fast") == {
        "aggregateDurationSeconds": 120,
        "reportIntervalSeconds": 30,
        "nodeAggregatePolicy": {"durations": ["5m0s", "15m0s"]},
        "nodeMemoryCollectPolicy": "usageWithoutPageCache",
    }
    slow = policy(kube_api, "slow")
    assert slow["reportIntervalSeconds"] == 90
    assert slow["aggregateDurationSeconds"] == 120  # from the cluster strategy
    assert slow["nodeMemoryCollectPolicy"] == "usageWithPageCache"
    metric = kube_api.get("nodemetrics", "fast")
    owner = kube_api.get("nodes", "fast")
    assert metric is not None
    assert owner is not None
    assert metric["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": "fast",
            "uid": owner["metadata"]["uid"],
            "controller": True,
        }
    ]
    assert load_crds().validate(metric) == []


async def test_a_config_change_updates_the_spec_and_keeps_the_koordlet_status(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodes", node("n1"))
    ctrl = NodeMetricController(kube_client, resync_seconds=3600)
    async with running(ctrl):
        await eventually(lambda: kube_api.get("nodemetrics", "n1") is not None)
        assert policy(kube_api, "n1")["reportIntervalSeconds"] == 60  # Koordinator's default
        current = kube_api.get("nodemetrics", "n1")
        assert current is not None
        kube_api.put("nodemetrics", {**current, "status": {"updateTime": "2025-06-01T12:00:00Z"}})
        kube_api.put(
            "configmaps", config_map(colocation_config={"metricReportIntervalSeconds": 20})
        )
        await eventually(lambda: policy(kube_api, "n1")["reportIntervalSeconds"] == 20)
        writes = len(kube_api.writes("PUT", "/nodemetrics"))
        kube_api.put(
            "configmaps", config_map(colocation_config={"metricReportIntervalSeconds": -5})
        )
        await eventually(lambda: bool(ctrl.config_error))
        ctrl._queue_all()
        await eventually(lambda: ctrl.queue.idle())
        await asyncio.sleep(0.1)
    assert policy(kube_api, "n1")["reportIntervalSeconds"] == 20  # the bad value is refused
    assert len(kube_api.writes("PUT", "/nodemetrics")) == writes
    assert "metricReportIntervalSeconds" in ctrl.config_error
    final = kube_api.get("nodemetrics", "n1")
    assert final is not None
    assert final["status"] == {"updateTime": "2025-06-01T12:00:00Z"}


async def test_the_nodemetric_goes_away_with_its_node(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodes", node("n1"))
    kube_api.put("nodes", node("n2"))
    ctrl = NodeMetricController(kube_client, resync_seconds=3600)
    async with running(ctrl):
        await eventually(lambda: kube_api.get("nodemetrics", "n2") is not None)
        kube_api.remove("nodes", "n2")
        await eventually(lambda: kube_api.get("nodemetrics", "n2") is None)
    assert kube_api.get("nodemetrics", "n1") is not None
    assert [r.path.rsplit("/", 1)[-1] for r in kube_api.writes("DELETE", "/nodemetrics")] == ["n2"]
