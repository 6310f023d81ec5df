"""The gpudevice controller against the fake API server: the GPU model and driver labels of each
node's Device land on the Node, once, and follow a change."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from apis.device import LABEL_GPU_DRIVER_VERSION, LABEL_GPU_MODEL, LABEL_GPU_VENDOR
from kubeclient.client import KubeClient
from manager.noderesource.gpudevice import GPUDeviceLabelController, labels_patch
from tests.kubefake.server import FakeApiServer, Kind
from tests.manager.builders import node
from tests.manager.conftest import eventually

DEVICE_KIND = Kind("scheduling.koordinator.sh", "v1alpha1", "devices", "Device", False)


def device(name: str, **labels: str) -> dict:
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": name, "labels": labels},
        "spec": {"devices": []},
    }


@asynccontextmanager
async def running(ctrl: GPUDeviceLabelController) -> AsyncIterator[None]:
    task = asyncio.create_task(ctrl.run(sync_timeout=5), name="gpudevice")
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_only_the_model_and_driver_labels_that_differ_are_patched() -> None:
    n = node("n1", labels={LABEL_GPU_DRIVER_VERSION: "535.104.05", "team": "ml"})
    d = device(
        "n1",
        **{
            LABEL_GPU_VENDOR: "nvidia",
            LABEL_GPU_MODEL: "A100-SXM4-80GB",
            LABEL_GPU_DRIVER_VERSION: "535.104.05",
        },
    )
    assert labels_patch(n, d) == {LABEL_GPU_MODEL: "A100-SXM4-80GB"}
    assert labels_patch(n, None) == {}
    assert labels_patch(node("n1"), device("n1")) == {}


async def test_the_device_labels_reach_the_node_and_follow_a_driver_upgrade(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.register(DEVICE_KIND)
    kube_api.put("nodes", node("gpu-1", labels={"team": "ml"}))
    kube_api.put("nodes", node("cpu-1"))
    labels = {LABEL_GPU_MODEL: "H100-80GB-HBM3", LABEL_GPU_DRIVER_VERSION: "550.54.15"}
    kube_api.put("devices", device("gpu-1", **labels))
    ctrl = GPUDeviceLabelController(kube_client, resync_seconds=3600)

    def node_labels(name: str) -> dict[str, str]:
        obj = kube_api.get("nodes", name)
        assert obj is not None
        return dict(obj["metadata"].get("labels") or {})

    async with running(ctrl):
        # the server stores the patch before the controller's await returns and counts it
        await eventually(lambda: ctrl.writes >= 1)
        assert node_labels("gpu-1") == {"team": "ml", **labels}
        assert ctrl.writes == 1
        upgraded = device("gpu-1", **{**labels, LABEL_GPU_DRIVER_VERSION: "560.28.03"})
        kube_api.put("devices", upgraded)
        await eventually(lambda: node_labels("gpu-1")[LABEL_GPU_DRIVER_VERSION] == "560.28.03")
    assert node_labels("cpu-1") == {}
    patches = [r for r in kube_api.writes("PATCH") if "/nodes/" in r.path]
    assert [r.path.rsplit("/", 1)[1] for r in patches] == ["gpu-1", "gpu-1"]
