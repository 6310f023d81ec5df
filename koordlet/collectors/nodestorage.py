"""The node's block devices, volume groups and the devices under pod volumes (Koordinator's
``NodeStorageInfoCollector`` and its ``NodeLocalStorageInfo``), every
``collect.node_storage_info_interval`` (1 s by default), with the gate ``BlkIOReconcile``: blkio
QoS (``koordlet.qos.blkio``) resolves NodeSLO block names with it and never reads sysfs itself.

It reports no series: ``info["node_storage"]`` holds a JSON-ready dict built from
``koordlet.system.blockdev``::

    {"collected_at": 1700000000.0,
     "devices": {"vdb1": {"dev": "253:17", "disks": ["vdb"], "scheduler": ""},
                 "vdb": {"dev": "253:16", "disks": ["vdb"], "scheduler": "bfq"},
                 "dm-0": {"dev": "252:0", "disks": ["vdc"], "dm_name": "vg0-data",
                          "lvm": "vg0/data"}, ...},
     "volume_groups": {"vg0": ["vdc"]},
     "pod_volumes": {"<pod uid>": {"data": {"path": ".../mount", "dev": "253:16",
                                           "disks": ["vdb"]}}}}

``disks`` are the whole devices a block policy can name: a partition's disk, the disks under a
device-mapper or md device (recursively), or the device itself. Pod volumes are looked up only
for pods that carry ``koordinator.sh/blkioQOS``; a volume whose filesystem has no block device
(tmpfs, overlay) gets ``error`` instead of ``disks``. Upstream fills the same maps from ``lsblk``,
``vgs`` and the mount table.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from apis.slo_qos import ANNOTATION_POD_BLKIO_QOS
from koordlet.collectors.framework import CollectorContext, CollectResult, Tick
from koordlet.system.blockdev import BlockDevice, device_number, scan_block_devices
from koordlet.system.paths import HostPaths

logger = logging.getLogger(__name__)

NAME = "nodestorage"
INFO_KEY = "node_storage"
FEATURE_GATE = "BlkIOReconcile"
"""Only blkio QoS uses what it collects."""


def disks_under(devices: dict[str, BlockDevice], name: str) -> list[str]:
    """The whole devices at the bottom of ``name`` (itself when it is one)."""
    out: list[str] = []
    stack, seen = [name], set()
    while stack:
        current = stack.pop()
        if current in seen or current not in devices:
            continue
        seen.add(current)
        dev = devices[current]
        if dev.parent:
            stack.append(dev.parent)
        elif dev.slaves:
            stack.extend(dev.slaves)
        else:
            out.append(current)
    return sorted(set(out))


def storage_info(devices: dict[str, BlockDevice]) -> dict[str, Any]:
    """The ``devices`` and ``volume_groups`` parts of the info value."""
    entries: dict[str, Any] = {}
    groups: dict[str, set[str]] = {}
    for name, dev in devices.items():
        disks = disks_under(devices, name)
        entry: dict[str, Any] = {"dev": dev.dev, "disks": disks, "scheduler": dev.scheduler}
        if dev.dm_name:
            entry["dm_name"] = dev.dm_name
        if dev.lvm is not None:
            entry["lvm"] = "/".join(dev.lvm)
            groups.setdefault(dev.lvm[0], set()).update(disks)
        entries[name] = entry
    return {
        "devices": entries,
        "volume_groups": {vg: sorted(disks) for vg, disks in sorted(groups.items())},
    }


def pod_volumes(
    paths: HostPaths, uid: str, by_number: dict[str, str], devices: dict[str, BlockDevice]
) -> dict[str, Any]:
    """Every volume of pod ``uid`` with its device and disks, or why there is none."""
    base = paths.kubelet("pods", uid, "volumes")
    out: dict[str, Any] = {}
    try:
        plugins = sorted(os.listdir(base))
    except OSError as err:
        return {"": {"error": f"cannot list {base}: {err.strerror}"}}
    for plugin in plugins:
        try:
            names = sorted(os.listdir(os.path.join(base, plugin)))
        except OSError:
            continue
        for volume in names:
            path = os.path.join(base, plugin, volume)
            mount = os.path.join(path, "mount")
            path = mount if os.path.isdir(mount) else path
            try:
                dev = device_number(path)
            except OSError as err:
                out[volume] = {"path": path, "error": f"stat failed: {err.strerror}"}
                continue
            name = by_number.get(dev)
            if name is None:
                out[volume] = {
                    "path": path,
                    "dev": dev,
                    "error": f"filesystem device {dev} is not a block device (tmpfs, overlay?)",
                }
                continue
            out[volume] = {"path": path, "dev": dev, "disks": disks_under(devices, name)}
    return out


class NodeStorageCollector:
    """See the module docstring."""

    def __init__(self, paths: HostPaths, interval: float = 1.0) -> None:
        self.name = NAME
        self.interval = interval
        self._paths = paths
        self._last_count = -1

    def collect(self, tick: Tick) -> CollectResult:
        try:
            devices = scan_block_devices(self._paths)
        except OSError as err:
            why = f"cannot list {self._paths.sys('class', 'block')}: {err.strerror}"
            return CollectResult(unsupported={"block_devices": why})
        if len(devices) != self._last_count:
            logger.info("node storage: %d block devices", len(devices))
            self._last_count = len(devices)
        info = storage_info(devices)
        by_number = {d.dev: d.name for d in devices.values()}
        info["pod_volumes"] = {
            pod.uid: pod_volumes(self._paths, pod.uid, by_number, devices)
            for pod in tick.workloads.pods.values()
            if ANNOTATION_POD_BLKIO_QOS in pod.annotations
        }
        info["collected_at"] = tick.now
        return CollectResult(info={INFO_KEY: info})


def build(ctx: CollectorContext, interval: float) -> NodeStorageCollector:
    """The table's factory."""
    return NodeStorageCollector(ctx.host.paths, interval)
