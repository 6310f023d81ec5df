"""The GPU model and driver labels on each Node, from its Device object.

The koordlet labels the node's Device (``scheduling.koordinator.sh/v1alpha1``) with
``node.koordinator.sh/gpu-model`` and ``node.koordinator.sh/gpu-driver-version``
(``koordlet.reporter.device``); this controller copies the two onto the Node, so that pods can
select GPU models with a node selector. Upstream does it in the node resource controller's
``GPUDeviceResource`` plugin (``pkg/slo-controller/noderesource/plugins/gpudeviceresource``):
a label the Device carries is set on the Node; a label it no longer carries is left on the Node
(upstream: "TBD: shall we reset labels"). A Device event or the resync queues the node; the
write is a merge patch of the labels that differ, nothing when none does.

Not done here: the plugin's node resources (``koordinator.sh/gpu-core`` and friends in the
Node's allocatable); koord-scheduler's DeviceShare reads the Device itself.
"""

from __future__ import annotations

import logging
from typing import Unpack

from apis.device import LABEL_GPU_DRIVER_VERSION, LABEL_GPU_MODEL
from kubeclient.client import KubeClient, Obj
from kubeclient.errors import NotFound
from kubeclient.informer import Informer
from kubeclient.resources import DEVICES, NODES
from manager.nodekeyed import NodeKeyedController, Options

logger = logging.getLogger(__name__)

NODE_LABELS = (LABEL_GPU_MODEL, LABEL_GPU_DRIVER_VERSION)
"""The Device labels copied onto the Node."""


def labels_patch(node: Obj, device: Obj | None) -> dict[str, str]:
    """The Node labels to set: each of :data:`NODE_LABELS` the Device has with another value
    than the Node's."""
    if device is None:
        return {}
    have = (node.get("metadata") or {}).get("labels") or {}
    want = (device.get("metadata") or {}).get("labels") or {}
    wanted = {k: want[k] for k in NODE_LABELS if isinstance(want.get(k), str)}
    return {k: v for k, v in wanted.items() if have.get(k) != v}


class GPUDeviceLabelController(NodeKeyedController):
    """Copies the GPU labels of each node's Device onto the Node. It reads no configuration:
    the ``slo-controller-config`` ConfigMap is watched by the skeleton and ignored."""

    log = logger
    kind = "Node labels"
    task_prefix = "gpudevice"

    def __init__(self, client: KubeClient, **options: Unpack[Options]) -> None:
        super().__init__(client, **options)
        self.devices = Informer(client, DEVICES)
        self.devices.add_handler(self._queue, lambda _old, new: self._queue(new), self._queue)
        self.nodes.add_handler(self._queue, lambda _old, new: self._queue(new), lambda _o: None)

    @property
    def _config_read(self) -> bool:
        return True

    def load_config(self, cm: Obj) -> None:
        """Nothing of the ConfigMap applies."""

    def _config_gone(self, obj: Obj) -> None:
        """Nothing of the ConfigMap applies."""

    def _informers(self) -> tuple[Informer, ...]:
        return (*super()._informers(), self.devices)

    async def reconcile(self, name: str) -> bool:
        """Patch node ``name``'s labels when its Device's differ; whether it wrote."""
        node = self.nodes.get(name)
        if node is None:
            return False
        patch = labels_patch(node, self.devices.get(name))
        if not patch:
            return False
        try:
            await self._client.patch(NODES, name, {"metadata": {"labels": patch}})
        except NotFound:
            return False  # the node is gone; its delete event ends it
        self.writes += 1
        logger.info("node %s: GPU labels %s from its Device", name, patch)
        return True
