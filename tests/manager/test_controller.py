"""The node resource controller against the fake API server, through the real client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from apis.manager_keys import (
    ANNOTATION_CPU_BASIC_INFO,
    ANNOTATION_CPU_NORMALIZATION_RATIO,
    BATCH_CPU,
    BATCH_MEMORY,
    EXTENDED_RESOURCES,
    MID_CPU,
    MID_MEMORY,
    format_extended,
)
from apis.quantity import int_value
from apis.sloconfig import parse_slo_controller_config
from kubeclient.client import KubeClient
from manager.noderesource.calculator import calculate
from manager.noderesource.controller import NodeResourceController, _status_with
from manager.noderesource.inputs import parse_node, parse_node_metric, parse_pod_list
from manager.workqueue import WorkQueue
from tests.kubefake import FakeApiServer
from tests.manager.builders import NOW, config_map, node, node_metric, pod, pod_list
from tests.manager.conftest import eventually

GOOD = {"enable": True, "midUnallocatedPercent": 10}


def seed(api: FakeApiServer, colocation: dict[str, Any] | None = GOOD, **node_kw: Any) -> None:
    api.put("nodes", node(**node_kw))
    api.put(
        "nodemetrics",
        node_metric(
            system_usage=("1", "4Gi"),
            pods=[("default/web", "koord-prod", "3", "12Gi")],
            prod_reclaimable=("2", "4Gi"),
        ),
    )
    api.put("pods", pod("web", cpu="6", memory="16Gi", priority=9500))
    api.put("pods", pod("spark", cpu="4", memory="8Gi", priority=5500))
    if colocation is not None:
        api.put("configmaps", config_map(colocation_config=colocation))


@asynccontextmanager
async def running(ctrl: NodeResourceController) -> AsyncIterator[None]:
    task = asyncio.create_task(ctrl.run(sync_timeout=5), name="noderesource")
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def allocatable(api: FakeApiServer) -> dict[str, str]:
    return dict((api.get("nodes", "node-1") or {})["status"]["allocatable"])


def expected(api: FakeApiServer) -> dict[str, int | None]:
    """What the shared calculation (explain's) gives for the objects on the server."""
    cm = api.get("configmaps", "slo-controller-config", "koordinator-system")
    pods = [p for (plural, _, _), p in api.objects.items() if plural == "pods"]
    result = calculate(
        parse_slo_controller_config(cm or {}, "cm"),
        parse_node(api.get("nodes", "node-1"), "n"),
        parse_node_metric(api.get("nodemetrics", "node-1"), "m"),
        parse_pod_list(pod_list(*pods), "p"),
        NOW,
    )
    return dict(result.values)


def controller(client: KubeClient, **kw: Any) -> NodeResourceController:
    return NodeResourceController(client, clock=lambda: NOW, resync_seconds=3600, **kw)


async def test_batch_and_mid_reach_the_node_status_as_explain_computes_them(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    seed(kube_api)
    want = expected(kube_api)
    ctrl = controller(kube_client)
    async with running(ctrl):
        await eventually(lambda: BATCH_CPU in allocatable(kube_api))
    alloc = allocatable(kube_api)
    assert {name: int_value(alloc[name]) for name in EXTENDED_RESOURCES} == want
    capacity = kube_api.get("nodes", "node-1")["status"]["capacity"]  # type: ignore[index]
    assert capacity[BATCH_MEMORY] == alloc[BATCH_MEMORY]
    assert alloc["cpu"] == "32"  # the node's own resources are untouched
    assert all(w.path.endswith("/nodes/node-1/status") for w in kube_api.writes("PUT"))


@pytest.mark.parametrize(
    ("values", "printed"),
    [
        # upstream's batchresource plugin test: NewQuantity(40000, DecimalSI) and
        # NewQuantity(110*1024*1024*1024, BinarySI), whose String() is "40k" and "110Gi"
        (
            {BATCH_CPU: 40_000, BATCH_MEMORY: 110 * 1024**3},
            {BATCH_CPU: "40k", BATCH_MEMORY: "110Gi"},
        ),
        # DecimalSI keeps an exponent that is a multiple of 3 with an integer mantissa; BinarySI
        # falls back to a plain integer when the bytes are not a whole number of KiB
        ({MID_CPU: 1_500, MID_MEMORY: 1_000_000}, {MID_CPU: "1500", MID_MEMORY: "1000000"}),
        ({BATCH_CPU: 0, MID_MEMORY: 1536 * 1024**2}, {BATCH_CPU: "0", MID_MEMORY: "1536Mi"}),
        ({MID_CPU: 2_000_000, BATCH_MEMORY: 1023}, {MID_CPU: "2M", BATCH_MEMORY: "1023"}),
    ],
)
def test_the_status_holds_the_values_as_resource_quantity_prints_them(
    values: dict[str, int], printed: dict[str, str]
) -> None:
    result = SimpleNamespace(values={**dict.fromkeys(EXTENDED_RESOURCES), **values})
    current = {"status": {"allocatable": {"cpu": "32", MID_CPU: "1"}, "capacity": {}}}
    status = _status_with(current, result)  # type: ignore[arg-type]
    assert status["allocatable"] == {"cpu": "32", **printed}
    assert status["capacity"] == printed


async def test_the_put_carries_the_canonical_text_of_each_value(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    """The bytes of the PUT, not the object the fake stores: each of the four values is the
    ``String()`` of its quantity, the same text in capacity and allocatable."""
    seed(kube_api)
    want = expected(kube_api)
    async with running(controller(kube_client)):
        await eventually(lambda: bool(kube_api.writes("PUT", "/nodes/node-1/status")))
    body = kube_api.writes("PUT", "/nodes/node-1/status")[0].body
    for field in ("allocatable", "capacity"):
        written = {name: body["status"][field][name] for name in EXTENDED_RESOURCES}
        assert written == {
            name: format_extended(name, value) for name, value in want.items() if value is not None
        }


async def test_small_moves_do_not_write_and_large_ones_do(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    seed(kube_api)
    ctrl = controller(kube_client)
    async with running(ctrl):
        await eventually(lambda: ctrl.writes == 1)
        before = allocatable(kube_api)[BATCH_CPU]
        # 3.2 instead of 3 cores of usage: batch-cpu moves ~1.7 %, under resourceDiffThreshold
        small = node_metric(
            system_usage=("1", "4Gi"),
            pods=[("default/web", "koord-prod", "3200m", "12Gi")],
            prod_reclaimable=("2", "4Gi"),
        )
        rv = kube_api.put("nodemetrics", small)["metadata"]["resourceVersion"]
        await eventually(
            lambda: (
                (ctrl.node_metrics.get("node-1") or {})["metadata"]["resourceVersion"] == rv
                and ctrl.queue.idle()
            )
        )
        assert ctrl.writes == 1
        assert allocatable(kube_api)[BATCH_CPU] == before
        large = node_metric(
            system_usage=("1", "4Gi"),
            pods=[("default/web", "koord-prod", "12", "12Gi")],
            prod_reclaimable=("2", "4Gi"),
        )
        kube_api.put("nodemetrics", large)
        await eventually(lambda: ctrl.writes == 2)
    assert int_value(allocatable(kube_api)[BATCH_CPU]) == expected(kube_api)[BATCH_CPU]


async def test_a_bad_configmap_keeps_the_last_good_one_and_posts_an_event(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    seed(kube_api)
    ctrl = controller(kube_client)
    async with running(ctrl):
        await eventually(lambda: ctrl.writes == 1)
        good = ctrl.config
        kube_api.put(
            "configmaps",
            config_map(colocation_config={"enable": True, "cpuReclaimThresholdPercent": -1}),
        )
        await eventually(lambda: bool(kube_api.writes("POST", "/events")))
        assert ctrl.config is good
        assert "colocation-config: cpuReclaimThresholdPercent: must be >= 0" in ctrl.config_error
    (post,) = kube_api.writes("POST", "/events")
    assert post.body["reason"] == "InvalidConfig"
    assert post.body["type"] == "Warning"
    assert post.body["involvedObject"]["name"] == "slo-controller-config"
    assert "cpuReclaimThresholdPercent" in post.body["message"]
    # the one event writer (kubeclient.events.core_event): client-go's recorder's shape
    stamp = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert post.body["metadata"] == {
        "name": f"slo-controller-config.{int(NOW.timestamp() * 1e9):x}",
        "namespace": "koordinator-system",
    }
    assert post.body["involvedObject"]["kind"] == "ConfigMap"
    assert post.body["involvedObject"]["namespace"] == "koordinator-system"
    assert post.body["source"] == {"component": "koord-manager"}
    assert (post.body["firstTimestamp"], post.body["lastTimestamp"]) == (stamp, stamp)
    assert post.body["count"] == 1
    assert post.path == "/api/v1/namespaces/koordinator-system/events"
    assert ctrl.writes == 1


async def test_a_bad_first_configmap_touches_no_node(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    seed(kube_api, colocation=None)
    kube_api.put("configmaps", config_map(colocation_config="{not json"))
    ctrl = controller(kube_client)
    async with running(ctrl):
        await eventually(lambda: bool(kube_api.writes("POST", "/events")))
        await asyncio.sleep(0.1)
    assert ctrl.config is None
    assert kube_api.writes("PUT") == []


async def test_stale_node_metric_removes_the_resources(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    seed(kube_api)
    ctrl = controller(kube_client)
    async with running(ctrl):
        await eventually(lambda: ctrl.writes == 1)
        kube_api.put("nodemetrics", node_metric(age=timedelta(minutes=20)))
        await eventually(lambda: BATCH_CPU not in allocatable(kube_api))
    assert MID_CPU not in allocatable(kube_api)


async def test_disabling_colocation_removes_the_resources(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    seed(kube_api)
    ctrl = controller(kube_client)
    async with running(ctrl):
        await eventually(lambda: ctrl.writes == 1)
        kube_api.put("configmaps", config_map(colocation_config={"enable": False}))
        await eventually(lambda: BATCH_MEMORY not in allocatable(kube_api))


async def test_cpu_normalization_ratio_is_annotated_and_amplifies_batch_cpu(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    info = {"cpuModel": "Xeon Y", "hyperThreadEnabled": False, "turboEnabled": True}
    seed(kube_api, annotations={ANNOTATION_CPU_BASIC_INFO: json.dumps(info)})
    kube_api.put(
        "configmaps",
        config_map(
            colocation_config=GOOD,
            cpu_normalization_config={
                "enable": True,
                "ratioModel": {"Xeon Y": {"turboEnabledRatio": 1.5}},
            },
        ),
    )
    ctrl = controller(kube_client)
    async with running(ctrl):
        await eventually(
            lambda: (
                (kube_api.get("nodes", "node-1") or {})["metadata"]
                .get("annotations", {})
                .get(ANNOTATION_CPU_NORMALIZATION_RATIO)
                == "1.50"
            )
        )
        await eventually(lambda: BATCH_CPU in allocatable(kube_api))
    assert int_value(allocatable(kube_api)[BATCH_CPU]) == expected(kube_api)[BATCH_CPU]
    annotations = kube_api.get("nodes", "node-1")["metadata"]["annotations"]  # type: ignore[index]
    assert annotations["node.koordinator.sh/resource-amplification-ratio"] == '{"cpu":1.50}'


async def test_pods_of_other_nodes_do_not_count(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    seed(kube_api)
    kube_api.put("pods", pod("far", cpu="20", memory="1Gi", priority=9500, node_name="node-2"))
    ctrl = controller(kube_client)
    async with running(ctrl):
        await eventually(lambda: ctrl.writes == 1)
    assert int_value(allocatable(kube_api)[BATCH_CPU]) == expected(kube_api)[BATCH_CPU]


# The work queue --------------------------------------------------------------------------------
async def test_queue_deduplicates_waiting_keys_and_requeues_keys_changed_while_held() -> None:
    q = WorkQueue()
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    key = await q.get()
    assert key == "a"
    q.add("a")  # changed while a worker holds it
    assert len(q) == 1
    q.done("a")
    assert [await q.get(), await q.get()] == ["b", "a"]


async def test_queue_backs_off_per_key_and_forgets_on_success() -> None:
    q = WorkQueue(base=0.001, cap=0.004)
    delays = [q.add_rate_limited("x") for _ in range(4)]
    assert delays == [0.001, 0.002, 0.004, 0.004]
    assert await asyncio.wait_for(q.get(), 1) == "x"
    q.done("x")
    q.forget("x")
    assert q.failures("x") == 0
    q.close()
