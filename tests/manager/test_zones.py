"""Batch resources per NUMA zone on the NodeResourceTopology.

The calculation cases are upstream's ``TestPluginCalculate`` NUMA cases
(``pkg/slo-controller/noderesource/plugins/batchresource/plugin_test.go``: "calculate with one
NUMA-level resources", "... multiple NUMA-level resources", "... memory not over-committed, LSE
pods and NUMA-level resources", "... missing metric LSE pod and dangling pod"), with their
expected zone quantities; the merge cases follow ``UpdateNRTZoneListIfNeeded``
(``plugins/util/util.go``). The controller test runs against the fake API server.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

from apis.configuration import CalculatePolicy, ColocationStrategy
from apis.extension import ANNOTATION_RESOURCE_STATUS
from apis.manager_keys import ANNOTATION_CPU_BASIC_INFO, BATCH_CPU, BATCH_MEMORY
from apis.quantity import milli_value
from kubeclient.client import KubeClient
from manager.noderesource.controller import NodeResourceController
from manager.noderesource.inputs import parse_node, parse_node_metric, parse_pod_list
from manager.noderesource.zones import (
    ZoneBatch,
    calculate_zones,
    read_zones,
    update_zones,
    zone_values,
)
from tests.kubefake import FakeApiServer
from tests.manager.builders import NOW, config_map, node, node_metric, pod, pod_list
from tests.manager.conftest import eventually

G = 10**9
STRATEGY = replace(
    ColocationStrategy(),
    enable=True,
    cpu_reclaim_threshold_percent=65,
    memory_reclaim_threshold_percent=65,
    degrade_time_minutes=15,
    update_time_threshold_seconds=300,
    resource_diff_threshold=0.1,
)
BY_REQUEST = replace(STRATEGY, memory_calculate_policy=CalculatePolicy.REQUEST)


def zone(name: str, cpu: str, memory: str, **extra: str) -> dict[str, Any]:
    resources = [
        {"name": r, "capacity": v, "allocatable": v, "available": v}
        for r, v in (("cpu", cpu), ("memory", memory), *extra.items())
    ]
    return {"name": name, "type": "Node", "resources": resources}


def nrt(*zones: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha1",
        "kind": "NodeResourceTopology",
        "metadata": {"name": "test-node1", "annotations": annotations or {}},
        "topologyPolicies": ["None"],
        "zones": list(zones),
    }


def numa(p: dict[str, Any], *nodes: int, cpuset: str = "") -> dict[str, Any]:
    status: dict[str, Any] = {"numaNodeResources": [{"node": n} for n in nodes]}
    if cpuset:
        status["cpuset"] = cpuset
    p["metadata"]["annotations"] = {ANNOTATION_RESOURCE_STATUS: json.dumps(status)}
    return p


def upstream_pods(first: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod list of upstream's NUMA cases, after its first pod."""
    mid = pod("podMid", cpu="20", memory="40G", priority=7000, qos="BE", phase="Pending")
    return [
        first,
        pod("podProd1", cpu="10", memory="10G", priority=9999),
        pod("podBatch", cpu="10", memory="10G", qos="BE"),
        mid,
        pod("podProd2", cpu="10", memory="10G", phase="Succeeded"),
    ]


def inputs(pods: list[dict[str, Any]], metrics: list[tuple[str, str, str, str]]) -> Any:
    for p in pods:
        p["metadata"]["namespace"] = "test"
        p["spec"]["nodeName"] = "test-node1"
    n = parse_node(node("test-node1", cpu="100", memory="120G"), "n")
    m = parse_node_metric(
        node_metric(node_usage=("50", "55G"), system_usage=("7", "12G"), pods=metrics), "m"
    )
    return n, m, parse_pod_list(pod_list(*pods), "p")


PROD_METRICS = [
    ("test/podProd1", "", "6", "6G"),
    ("test/podBatch", "", "10", "10G"),
    ("test/podMid", "", "22", "22G"),
]


@pytest.mark.parametrize(
    ("case", "strategy", "first", "metrics", "zones", "want"),
    [
        (
            "calculate with one NUMA-level resources",
            STRATEGY,
            pod("podProd", cpu="10", memory="10G", qos="LS"),
            [("test/podProd", "", "5", "5G"), *PROD_METRICS],
            [zone("node-0", "100", "120G")],
            {"node-0": (25_000, 33 * G)},
        ),
        (
            "calculate with multiple NUMA-level resources",
            STRATEGY,
            numa(pod("podProd", cpu="10", memory="10G", qos="LS"), 0),
            [("test/podProd", "", "5", "5G"), *PROD_METRICS],
            [zone("node-0", "50", "62G"), zone("node-1", "50", "58G")],
            # 50 - 17.5 - 3.5 - (14 + 5); 62 - 21.7 - 6 - (14 + 5)
            {"node-0": (10_000, 15_300_000_000), "node-1": (15_000, 17_700_000_000)},
        ),
        (
            "calculate with memory not over-committed, LSE pods and NUMA-level resources",
            BY_REQUEST,
            numa(pod("podProdLSE", cpu="10", memory="10G", qos="LSE"), 0, cpuset="2-5,10-13"),
            [("test/podProdLSE", "", "5", "5G"), *PROD_METRICS],
            [zone("node-0", "50", "62G"), zone("node-1", "50", "58G")],
            # CPU: the LSE pod by request; memory by request (25 + 10, 25)
            {"node-0": (5_000, 5_300_000_000), "node-1": (15_000, 12_700_000_000)},
        ),
        (
            "calculate NUMA resources with memory not over-committed, "
            "missing metric LSE pod and dangling pod",
            BY_REQUEST,
            numa(pod("podProdLSE", cpu="10", memory="10G", qos="LSE"), 0, cpuset="2-5,10-13"),
            [
                ("test/podProd1", "koord-prod", "6", "6G"),
                ("test/podProd2", "koord-prod", "2", "4G"),  # succeeded: counted as dangling
                ("test/podBatch", "koord-batch", "10", "10G"),
                ("test/podMid", "koord-mid", "22", "22G"),
            ],
            [zone("node-0", "50", "62G"), zone("node-1", "50", "58G")],
            {"node-0": (4_000, 5_300_000_000), "node-1": (14_000, 12_700_000_000)},
        ),
    ],
)
def test_upstream_numa_level_batch_table(
    case: str,
    strategy: ColocationStrategy,
    first: dict[str, Any],
    metrics: list[tuple[str, str, str, str]],
    zones: list[dict[str, Any]],
    want: dict[str, tuple[int, int]],
) -> None:
    n, m, pods = inputs(upstream_pods(first), metrics)
    read = read_zones(nrt(*zones))
    assert read is not None
    got = calculate_zones(strategy, n, m, pods, read)
    assert {z: (b.cpu, b.memory_milli // 1000) for z, b in got.items()} == want, case
    assert all(b.memory_milli % 1000 == 0 for b in got.values())


def test_zones_without_cpu_or_memory_are_not_calculated() -> None:
    """``isNRTResourcesCreated``: no zone, or zones the koordlet has not filled, give none."""
    assert read_zones(nrt()) is None
    assert read_zones(nrt({"name": "node-0", "type": "Node", "resources": []})) is None


def test_a_share_rounds_up_to_a_whole_milli_unit() -> None:
    """``DivideResourceList``: 1 milli-core of system usage over 3 zones is 1 milli each."""
    n = parse_node(node("test-node1", cpu="3", memory="3"), "n")
    m = parse_node_metric(node_metric(system_usage=("1m", "1"), pods=[]), "m")
    zones = read_zones(nrt(zone("a", "1", "1"), zone("b", "1", "1"), zone("c", "1", "1")))
    assert zones is not None
    no_margin = replace(STRATEGY, cpu_reclaim_threshold_percent=100)
    got = calculate_zones(no_margin, n, m, (), zones)
    assert [b.cpu for b in got.values()] == [999, 999, 999]


def test_update_writes_amplified_cpu_and_keeps_other_resources_in_name_order() -> None:
    obj = nrt(zone("node-0", "50", "62G", **{"nvidia.com/gpu": "2"}))
    out, changed = update_zones(obj, {"node-0": ZoneBatch(10_000, 15_300 * 10**9)}, 1.5, 0.1)
    assert changed
    names = [r["name"] for r in out["zones"][0]["resources"]]
    assert names == sorted(names)
    assert set(names) == {"cpu", "memory", "nvidia.com/gpu", BATCH_CPU, BATCH_MEMORY}
    values = zone_values(out)["node-0"]
    assert values[BATCH_CPU] == 15_000_000  # 10000 x 1.5, as a count of milli-cores
    assert values[BATCH_MEMORY] == 15_300_000_000_000
    assert obj["zones"][0]["resources"][0]["name"] == "cpu"  # the input is left alone


@pytest.mark.parametrize(
    ("batch", "ratio", "cpu_text", "memory_text"),
    [
        # NewQuantity(milli, DecimalSI) and NewQuantity(bytes, BinarySI), as at node level
        (ZoneBatch(10_000, 16 * 1024**3 * 1000), None, "10k", "16Gi"),
        (ZoneBatch(10_000, 10**9 * 1000), 1.5, "15k", "1000000000"),
        # MultiplyMilliQuant keeps milli-units: 10001 x 1.5 = 15001.5 milli-cores
        (ZoneBatch(10_001, 1536 * 1024**2 * 1000), 1.5, "15001500m", "1536Mi"),
    ],
)
def test_the_zone_text_is_resource_quantitys_string(
    batch: ZoneBatch, ratio: float | None, cpu_text: str, memory_text: str
) -> None:
    out, _ = update_zones(nrt(zone("node-0", "50", "62G")), {"node-0": batch}, ratio, 0.1)
    written = {r["name"]: r for r in out["zones"][0]["resources"]}
    for field in ("capacity", "allocatable", "available"):
        assert written[BATCH_CPU][field] == cpu_text
        assert written[BATCH_MEMORY][field] == memory_text


def test_update_replaces_only_what_moved_past_the_threshold() -> None:
    obj, _ = update_zones(
        nrt(zone("node-0", "50", "62G")), {"node-0": ZoneBatch(10_000, 0)}, None, 0.1
    )
    same, changed = update_zones(obj, {"node-0": ZoneBatch(10_500, 0)}, None, 0.1)
    assert not changed  # 5 % < 10 %
    assert zone_values(same)["node-0"][BATCH_CPU] == 10_000_000
    moved, changed = update_zones(obj, {"node-0": ZoneBatch(12_000, 0)}, None, 0.1)
    assert changed
    assert zone_values(moved)["node-0"][BATCH_CPU] == 12_000_000


def test_a_zone_without_a_result_has_its_batch_resources_zeroed() -> None:
    obj, _ = update_zones(
        nrt(zone("node-0", "50", "62G"), zone("node-1", "50", "58G")),
        {"node-0": ZoneBatch(1, 1000), "node-1": ZoneBatch(1, 1000)},
        None,
        0.1,
    )
    out, changed = update_zones(obj, {"node-0": ZoneBatch(1, 1000)}, None, 0.1)
    assert changed
    assert zone_values(out)["node-1"] == {BATCH_CPU: 0, BATCH_MEMORY: 0}
    _, changed = update_zones(out, {"node-0": ZoneBatch(1, 1000)}, None, 0.1)
    assert not changed  # already reset


async def test_the_controller_writes_zone_batch_resources_onto_the_topology(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodes", node("test-node1", cpu="100", memory="120G"))
    metrics = [("test/podProd", "", "5", "5G"), *PROD_METRICS]
    kube_api.put(
        "nodemetrics",
        node_metric(
            name="test-node1", node_usage=("50", "55G"), system_usage=("7", "12G"), pods=metrics
        ),
    )
    for p in upstream_pods(numa(pod("podProd", cpu="10", memory="10G", qos="LS"), 0)):
        p["metadata"]["namespace"] = "test"
        p["spec"]["nodeName"] = "test-node1"
        kube_api.put("pods", p)
    basic = json.dumps({"cpuModel": "XXX", "hyperThreadEnabled": False, "turboEnabled": False})
    kube_api.put(
        "noderesourcetopologies",
        nrt(
            zone("node-0", "50", "62G"),
            zone("node-1", "50", "58G"),
            annotations={ANNOTATION_CPU_BASIC_INFO: basic},
        ),
    )
    kube_api.put(
        "configmaps",
        config_map(
            colocation_config={"enable": True, "cpuReclaimThresholdPercent": 65,
                               "memoryReclaimThresholdPercent": 65},
            cpu_normalization_config={"enable": True, "ratioModel": {"XXX": {"baseRatio": 1.5}}},
        ),
    )  # fmt: skip
    ctrl = NodeResourceController(kube_client, clock=lambda: NOW, resync_seconds=3600)
    task = asyncio.create_task(ctrl.run(sync_timeout=5), name="noderesource")
    try:
        await eventually(lambda: ctrl.zone_writes >= 1)
        written = kube_api.get("noderesourcetopologies", "test-node1")
        values = zone_values(written)
        # the upstream case's zones, batch-cpu amplified by the ratio from the NRT's basic info
        assert values["node-0"][BATCH_CPU] == 15_000_000
        assert values["node-1"][BATCH_CPU] == 22_500_000
        assert values["node-0"][BATCH_MEMORY] == 15_300_000_000_000
        assert written["metadata"]["annotations"][ANNOTATION_CPU_BASIC_INFO] == basic
        status = kube_api.get("nodes", "test-node1")["status"]["allocatable"]
        assert milli_value(status[BATCH_CPU]) == 37_500_000  # 25000 x 1.5
        writes = ctrl.zone_writes
        ctrl._queue_all()  # nothing moved: no second zone write
        await eventually(lambda: ctrl.queue.idle())
        await asyncio.sleep(0.05)
        assert ctrl.zone_writes == writes
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
