"""The NodeSLO controller against the fake API server, through the real client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml

from apis.crdschema import load_crds
from apis.slo import API_VERSION, KIND
from kubeclient.client import KubeClient
from manager.slo.config import NODE_SLO_KEYS, parse_key, render
from manager.slo.controller import NodeSLOController
from tests.kubefake import FakeApiServer
from tests.manager.builders import config_map, node
from tests.manager.conftest import eventually

THRESHOLD = {
    "clusterStrategy": {"enable": True, "cpuSuppressThresholdPercent": 65},
    "nodeStrategies": [
        {
            "name": "gpu-pool",
            "nodeSelector": {"matchLabels": {"pool": "gpu"}},
            "cpuSuppressThresholdPercent": 50,
        },
        {
            "name": "any-pool",
            "nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "Exists"}]},
            "cpuSuppressThresholdPercent": 40,
            "memoryEvictThresholdPercent": 80,
        },
    ],
}
BURST = {"clusterStrategy": {"policy": "auto", "cpuBurstPercent": 200}}
HOST_APPS = {
    "applications": [{"name": "nginx", "qos": "LS", "priority": "koord-prod"}],
    "nodeConfigs": [
        {
            "name": "batch-hosts",
            "nodeSelector": {"matchLabels": {"pool": "cpu"}},
            "applications": [{"name": "spark-shuffle", "qos": "BE", "priority": "koord-batch"}],
        }
    ],
}


def seed(api: FakeApiServer, **data: Any) -> None:
    api.put("nodes", node("n-gpu", labels={"pool": "gpu"}))
    api.put("nodes", node("n-cpu", labels={"pool": "cpu"}))
    api.put("nodes", node("n-plain"))
    api.put("configmaps", config_map(**data))


@asynccontextmanager
async def running(ctrl: NodeSLOController) -> AsyncIterator[None]:
    task = asyncio.create_task(ctrl.run(sync_timeout=5), name="nodeslo")
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def spec(api: FakeApiServer, name: str) -> dict[str, Any]:
    obj = api.get("nodeslos", name)
    assert obj is not None, f"no NodeSLO for {name}"
    return dict(obj["spec"])


def all_written(api: FakeApiServer) -> bool:
    return all(api.get("nodeslos", n) is not None for n in ("n-gpu", "n-cpu", "n-plain"))


async def test_each_node_gets_the_first_matching_node_strategy_over_the_cluster_one(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    seed(
        kube_api,
        resource_threshold_config=THRESHOLD,
        cpu_burst_config=BURST,
        host_application_config=HOST_APPS,
    )
    ctrl = NodeSLOController(kube_client, resync_seconds=3600)
    async with running(ctrl):
        await eventually(lambda: all_written(kube_api))
    gpu, cpu, plain = (spec(kube_api, n) for n in ("n-gpu", "n-cpu", "n-plain"))
    # n-gpu matches both entries: the first in list order wins
    assert gpu["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] == 50
    assert gpu["resourceUsedThresholdWithBE"]["memoryEvictThresholdPercent"] == 70  # default
    assert cpu["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] == 40
    assert cpu["resourceUsedThresholdWithBE"]["memoryEvictThresholdPercent"] == 80
    assert plain["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] == 65
    for s in (gpu, cpu, plain):
        assert s["resourceUsedThresholdWithBE"]["enable"] is True  # cluster value inherited
        assert s["cpuBurstStrategy"]["policy"] == "auto"
        assert s["cpuBurstStrategy"]["cpuBurstPercent"] == 200
        assert s["cpuBurstStrategy"]["cfsQuotaBurstPercent"] == 300  # default filled in
    assert [a["name"] for a in cpu["hostApplications"]] == ["spark-shuffle"]
    assert [a["name"] for a in gpu["hostApplications"]] == ["nginx"]
    crds = load_crds()
    for name in ("n-gpu", "n-cpu", "n-plain"):
        assert crds.validate(kube_api.get("nodeslos", name)) == []


async def test_an_unchanged_config_writes_nothing_and_a_change_updates_in_place(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    seed(kube_api, resource_threshold_config=THRESHOLD)
    ctrl = NodeSLOController(kube_client, resync_seconds=3600)
    async with running(ctrl):
        await eventually(lambda: all_written(kube_api))
        creates = len(kube_api.writes("POST", "/nodeslos"))
        ctrl._queue_all()  # a resync with nothing changed
        await eventually(lambda: ctrl.queue.idle())
        await asyncio.sleep(0.1)
        assert kube_api.writes("PUT", "/nodeslos") == []
        changed = {
            **THRESHOLD,
            "clusterStrategy": {"enable": True, "cpuSuppressThresholdPercent": 60},
        }
        kube_api.put("configmaps", config_map(resource_threshold_config=changed))
        await eventually(
            lambda: (
                spec(kube_api, "n-plain")["resourceUsedThresholdWithBE"][
                    "cpuSuppressThresholdPercent"
                ]
                == 60
            )
        )
    assert creates == 3
    assert len(kube_api.writes("POST", "/nodeslos")) == 3
    # only n-plain takes the cluster value; the others' specs did not move and were not written
    assert [r.path.rsplit("/", 1)[-1] for r in kube_api.writes("PUT", "/nodeslos")] == ["n-plain"]


async def test_a_bad_key_keeps_its_last_good_value_posts_an_event_and_others_still_apply(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    seed(kube_api, resource_threshold_config=THRESHOLD, cpu_burst_config=BURST)
    ctrl = NodeSLOController(kube_client, resync_seconds=3600)
    async with running(ctrl):
        await eventually(lambda: all_written(kube_api))
        bad = {"clusterStrategy": {"enable": True, "cpuSuppressThresholdPercent": 250}}
        kube_api.put(
            "configmaps",
            config_map(
                resource_threshold_config=bad,
                cpu_burst_config={"clusterStrategy": {"policy": "cpuBurstOnly"}},
            ),
        )
        await eventually(
            lambda: spec(kube_api, "n-plain")["cpuBurstStrategy"]["policy"] == "cpuBurstOnly"
        )
        await eventually(lambda: bool(kube_api.writes("POST", "/events")))
    plain = spec(kube_api, "n-plain")
    assert plain["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] == 65  # last good
    event = kube_api.writes("POST", "/events")[0].body
    assert event["type"] == "Warning"
    assert event["reason"] == "InvalidConfig"
    assert event["involvedObject"]["kind"] == "ConfigMap"
    assert event["involvedObject"]["name"] == "slo-controller-config"
    assert "resource-threshold-config" in event["message"]
    assert "clusterStrategy.cpuSuppressThresholdPercent" in event["message"]
    assert "resource-threshold-config" in ctrl.errors


async def test_invalid_json_before_any_good_value_writes_no_nodeslo(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    seed(kube_api, resource_threshold_config="{not json", cpu_burst_config=BURST)
    ctrl = NodeSLOController(kube_client, resync_seconds=3600)
    async with running(ctrl):
        await eventually(lambda: bool(kube_api.writes("POST", "/events")))
        ctrl._queue_all()
        await eventually(lambda: ctrl.queue.idle())
        await asyncio.sleep(0.1)
        assert kube_api.writes("POST", "/nodeslos") == []
        assert "invalid JSON" in kube_api.writes("POST", "/events")[0].body["message"]
        kube_api.put(
            "configmaps", config_map(resource_threshold_config=THRESHOLD, cpu_burst_config=BURST)
        )
        await eventually(lambda: all_written(kube_api))
    assert spec(kube_api, "n-cpu")["cpuBurstStrategy"]["policy"] == "auto"


async def test_a_missing_configmap_gives_default_nodeslos_and_a_deleted_one_is_recreated(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodes", node("n-plain"))
    ctrl = NodeSLOController(kube_client, resync_seconds=3600)
    async with running(ctrl):
        await eventually(lambda: kube_api.get("nodeslos", "n-plain") is not None)
        first = spec(kube_api, "n-plain")
        kube_api.remove("nodeslos", "n-plain")
        await eventually(lambda: kube_api.get("nodeslos", "n-plain") is not None)
    assert first["resourceUsedThresholdWithBE"]["enable"] is False
    assert first["cpuBurstStrategy"]["policy"] == "none"
    assert spec(kube_api, "n-plain") == first


def test_render_names_the_node_entry_each_key_used() -> None:
    key = parse_key("resource-threshold-config", json.dumps(THRESHOLD), "cm")
    rendered = render({key.key: key}, {"pool": "cpu"})
    assert rendered.matched["resource-threshold-config"] == "any-pool"
    assert rendered.matched["cpu-burst-config"] == ""


def test_the_example_configmap_renders_nodeslos_the_crd_accepts() -> None:
    path = (
        Path(__file__).resolve().parents[2]
        / "packaging/kubernetes/manager/slo-controller-config.yaml"
    )
    cm = yaml.safe_load(path.read_text(encoding="utf-8"))
    keys = {k: parse_key(k, cm["data"][k], "example") for k in NODE_SLO_KEYS}
    crds = load_crds()
    for labels in ({}, {"node.koordinator.sh/pool": "online"}):
        spec = render(keys, labels).spec
        obj = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "n"}, "spec": spec}
        assert crds.validate(obj) == []
    online = render(keys, {"node.koordinator.sh/pool": "online"}).spec
    assert online["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] == 50
