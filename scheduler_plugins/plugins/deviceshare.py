"""DeviceShare: GPUs shared by core and memory, from the Device CRD.

Koordinator's semantics (``pkg/scheduler/plugins/deviceshare``), re-implemented for GPUs:

- **Devices.** The Device object named after the node (``scheduling.koordinator.sh/v1alpha1``):
  ``spec.devices[]`` of ``type: gpu`` and ``health: true``, each with ``minor`` and resources
  ``koordinator.sh/gpu-core`` (100 a GPU), ``koordinator.sh/gpu-memory`` (bytes) and
  ``koordinator.sh/gpu-memory-ratio`` (100 a GPU).
- **Requests.** ``koordinator.sh/gpu-core`` with ``gpu-memory`` or ``gpu-memory-ratio``;
  ``koordinator.sh/gpu`` (core and ratio together) or ``nvidia.com/gpu: N`` (N whole GPUs). A
  request above 100 cores must be whole GPUs (multiples of 100, ratio equal to core):
  ``invalid gpu request``.
- **Used.** What assigned pods' ``scheduling.koordinator.sh/device-allocated`` annotations
  (``{"gpu": [{"minor": 0, "resources": {...}}]}``) took from each GPU.
- **Filter.** A share (core ≤ 100) needs one GPU with that much core and memory free; N whole
  GPUs need N untouched GPUs: ``Insufficient gpu devices``.
- **Score** LeastAllocated over the node's GPU memory (100: all free after the pod).
- **Reserve** takes the fullest GPU that fits (so whole GPUs stay free) and returns the
  ``scheduling.koordinator.sh/device-allocated`` annotation.

Not done: RDMA and FPGA devices, GPU topology (NUMA/PCIe) alignment, device-level scoring
strategies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apis.records import frozen
from apis.scheduling_keys import ANNOTATION_DEVICE_ALLOCATED
from apis.scheduling_keys import RESOURCE_GPU as GPU_SHARED
from apis.scheduling_keys import RESOURCE_GPU_CORE as GPU_CORE
from apis.scheduling_keys import RESOURCE_GPU_MEMORY as GPU_MEMORY
from apis.scheduling_keys import RESOURCE_GPU_MEMORY_RATIO as GPU_MEMORY_RATIO
from apis.scheduling_keys import RESOURCE_NVIDIA_GPU as NVIDIA_GPU
from scheduler_plugins.framework import Cycle, Plugin, ReserveError
from scheduler_plugins.objectfields import parse_resource_list
from scheduler_plugins.snapshot import NodeInfo, PodInfo

NAME = "DeviceShare"
ERR_INSUFFICIENT = "Insufficient gpu devices"
ERR_INVALID = "invalid gpu request"


@dataclass(slots=True)
class GPU:
    """One GPU and what is free on it."""

    minor: int
    core: int
    memory: int
    free_core: int
    free_memory: int


@frozen
class GPURequest:
    """What the pod asks for: ``count`` whole GPUs, or one share of ``core`` and ``memory``
    (``memory`` may be given as a ``ratio`` of the GPU's memory)."""

    count: int
    core: int
    memory: int
    ratio: int


def gpu_request(pod: PodInfo) -> GPURequest | str | None:
    """The pod's GPU request, a reason it is invalid, or ``None`` when it asks for none."""
    req = pod.requests
    nvidia = req.get(NVIDIA_GPU, 0)
    if nvidia:
        return GPURequest(nvidia, 100, 0, 100)
    core = req.get(GPU_CORE, 0) or req.get(GPU_SHARED, 0)
    ratio = req.get(GPU_MEMORY_RATIO, 0) or req.get(GPU_SHARED, 0)
    memory = req.get(GPU_MEMORY, 0)
    if not (core or ratio or memory):
        return None
    if core > 100:
        if core % 100 or (ratio and ratio != core) or memory:
            return ERR_INVALID
        return GPURequest(core // 100, 100, 0, 100)
    if core == 100 and ratio == 100:
        return GPURequest(1, 100, 0, 100)
    return GPURequest(0, core, memory, ratio)


def node_gpus(device: Mapping[str, Any] | None, node: NodeInfo) -> list[GPU]:
    """The node's healthy GPUs less what its pods were allocated."""
    if device is None:
        return []
    gpus: dict[int, GPU] = {}
    where = f"Device {node.name}"
    for i, d in enumerate((device.get("spec") or {}).get("devices") or []):
        if not isinstance(d, dict) or d.get("type") != "gpu" or d.get("health") is False:
            continue
        res = parse_resource_list(d.get("resources"), where, f"spec.devices[{i}].resources")
        minor = int(d.get("minor", i))
        core, mem = res.get(GPU_CORE, 100), res.get(GPU_MEMORY, 0)
        gpus[minor] = GPU(minor, core, mem, core, mem)
    for pod in node.pods.values():
        raw = pod.annotations.get(ANNOTATION_DEVICE_ALLOCATED)
        if not raw:
            continue
        try:
            allocs = json.loads(raw).get("gpu") or []
        except (ValueError, AttributeError):
            continue
        for a in allocs:
            gpu = gpus.get(int(a.get("minor", -1)))
            if gpu is None:
                continue
            res = parse_resource_list(a.get("resources"), f"pod {pod.key}", "device-allocated")
            gpu.free_core -= res.get(GPU_CORE, 0)
            mem = res.get(GPU_MEMORY, 0) or gpu.memory * res.get(GPU_MEMORY_RATIO, 0) // 100
            gpu.free_memory -= mem
    return [gpus[m] for m in sorted(gpus)]


def allocate(gpus: Sequence[GPU], request: GPURequest) -> list[tuple[GPU, int, int]] | None:
    """``(gpu, core, memory)`` for the request, or ``None`` when it does not fit."""
    if request.count:
        whole = [g for g in gpus if g.free_core == g.core and g.free_memory == g.memory]
        if len(whole) < request.count:
            return None
        return [(g, g.core, g.memory) for g in whole[: request.count]]
    fitting = []
    for g in gpus:
        memory = request.memory or g.memory * request.ratio // 100
        if g.free_core >= request.core and g.free_memory >= memory:
            fitting.append((g.free_core, g.free_memory, g.minor, g, memory))
    if not fitting:
        return None
    _, _, _, gpu, memory = min(fitting)
    return [(gpu, request.core, memory)]


class DeviceShare(Plugin):
    """See the module docstring."""

    name = NAME

    def _request(self, cycle: Cycle, pod: PodInfo) -> GPURequest | str | None:
        key = f"{NAME}/request/{pod.uid}"
        if key not in cycle.data:
            cycle.data[key] = gpu_request(pod)
        return cycle.data[key]  # type: ignore[no-any-return]

    def pre_filter(self, cycle: Cycle, pod: PodInfo) -> str | None:
        req = self._request(cycle, pod)
        return req if isinstance(req, str) else None

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        req = self._request(cycle, pod)
        if not isinstance(req, GPURequest):
            return {}
        devices = cycle.snapshot.devices
        return {
            n.name: ERR_INSUFFICIENT
            for n in nodes
            if allocate(node_gpus(devices.get(n.name), n), req) is None
        }

    def score_nodes(
        self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]
    ) -> dict[str, int] | None:
        req = self._request(cycle, pod)
        if not isinstance(req, GPURequest):
            return None
        out: dict[str, int] = {}
        for n in nodes:
            gpus = node_gpus(cycle.snapshot.devices.get(n.name), n)
            total = sum(g.memory for g in gpus)
            got = allocate(gpus, req)
            if not total or got is None:
                out[n.name] = 0
                continue
            free = sum(g.free_memory for g in gpus) - sum(m for _, _, m in got)
            out[n.name] = max(free, 0) * 100 // total
        return out

    def reserve(self, cycle: Cycle, pod: PodInfo, node: NodeInfo) -> dict[str, str]:
        req = self._request(cycle, pod)
        if not isinstance(req, GPURequest):
            return {}
        got = allocate(node_gpus(cycle.snapshot.devices.get(node.name), node), req)
        if got is None:
            raise ReserveError(f"{NAME}: {ERR_INSUFFICIENT}")
        allocs = [
            {
                "minor": g.minor,
                "resources": {
                    GPU_CORE: str(core),
                    GPU_MEMORY: str(memory),
                    GPU_MEMORY_RATIO: str(memory * 100 // g.memory if g.memory else core),
                },
            }
            for g, core, memory in got
        ]
        return {ANNOTATION_DEVICE_ALLOCATED: json.dumps({"gpu": allocs}, separators=(",", ":"))}


def build(args: Mapping[str, Any] | None, source: str) -> DeviceShare:
    """Factory for the plugin table (no args)."""
    return DeviceShare()
