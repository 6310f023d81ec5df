"""``GPUEnvInject``: the GPUs the scheduler allocated, in the container's environment.

Upstream: ``pkg/koordlet/runtimehooks/hooks/gpu/gpu.go`` (``InjectContainerGPUEnv``). At
``PreCreateContainer``, a pod whose ``scheduling.koordinator.sh/device-allocated`` annotation (the
scheduler's DeviceShare plugin writes it: ``{"gpu": [{"minor": 0, "resources": {...}}]}``) lists
GPUs gets ``NVIDIA_VISIBLE_DEVICES`` with their minors, comma-separated in the annotation's
order. With the pod label ``koordinator.sh/gpu-isolation-provider: HAMi-core`` and a GPU shared
below 100 % of its memory (``koordinator.sh/gpu-memory-ratio``), HAMi's in-container library
enforces the share: ``CUDA_DEVICE_MEMORY_LIMIT`` (bytes of ``koordinator.sh/gpu-memory``),
``CUDA_DEVICE_SM_LIMIT`` (``koordinator.sh/gpu-core``, when given), ``LD_PRELOAD`` of the library,
and bind mounts of the library and of ``/tmp/vgpulock`` (HAMi issue 696).

Environment and mounts are applied by NRI. koord-runtime-proxy's hook service has no field for
either (``apis/runtime/v1alpha1``): in proxy mode the container is created without them and the
koordlet logs what it could not send. A malformed annotation, or a HAMi share that lacks the
resources it needs, leaves the container unchanged with a Warning Event naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from apis.quantity import parse_quantity
from apis.scheduling_keys import (
    ANNOTATION_DEVICE_ALLOCATED,
    GPU_ISOLATION_PROVIDER_HAMI_CORE,
    LABEL_GPU_ISOLATION_PROVIDER,
    RESOURCE_GPU_CORE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_MEMORY_RATIO,
)
from koordlet.runtimehooks.errors import BadPodInput
from koordlet.runtimehooks.model import Change, ContainerRequest, Mount, PodRequest

if TYPE_CHECKING:
    from koordlet.runtimehooks.table import HookContext

NAME = "GPUEnvInject"
"""The gate's name (upstream's hook is ``gpu env inject``)."""
REASON = "InvalidDeviceAllocated"
"""The Warning Event reason for a malformed annotation."""
ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_MEMORY_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"
ENV_SM_LIMIT = "CUDA_DEVICE_SM_LIMIT"
ENV_PRELOAD = "LD_PRELOAD"
HAMI_CORE_LIBRARY = "/usr/local/vgpu/libvgpu.so"
"""Upstream's default ``HAMICoreLibraryDirectoryPath``."""
HAMI_LOCK_DIR = "/tmp/vgpulock"


def gpu_allocations(annotations: Mapping[str, str]) -> list[Mapping[str, object]]:
    """The ``gpu`` entries of the pod's ``device-allocated``; empty when none. Raises BadPodInput
    naming the field for anything malformed."""
    raw = annotations.get(ANNOTATION_DEVICE_ALLOCATED)
    if raw is None:
        return []
    key = ANNOTATION_DEVICE_ALLOCATED
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise BadPodInput(REASON, key, f"not JSON: {err}") from err
    if not isinstance(doc, Mapping):
        raise BadPodInput(REASON, key, "must be a JSON object of device type: allocations")
    gpus = doc.get("gpu") or []
    if not isinstance(gpus, list):
        raise BadPodInput(REASON, f"{key}: gpu", "must be a list")
    for i, entry in enumerate(gpus):
        minor = entry.get("minor") if isinstance(entry, Mapping) else None
        if not isinstance(minor, int) or isinstance(minor, bool) or minor < 0:
            raise BadPodInput(REASON, f"{key}: gpu[{i}].minor", f"must be a GPU minor: {minor!r}")
    return gpus


def _quantity(resources: Mapping[str, object], name: str, where: str) -> int | None:
    value = resources.get(name)
    if value is None:
        return None
    try:
        return parse_quantity(str(value)).int_value
    except ValueError as err:
        raise BadPodInput(REASON, f"{where}.{name}", str(err)) from err


class GPUEnvInject:
    """The hook."""

    def pod(self, req: PodRequest) -> Change | None:
        return None

    def container(self, req: ContainerRequest) -> Change | None:
        gpus = gpu_allocations(req.pod_annotations)
        if not gpus:
            return None
        env = {ENV_VISIBLE_DEVICES: ",".join(str(g["minor"]) for g in gpus)}
        mounts: tuple[Mount, ...] = ()
        if req.pod_labels.get(LABEL_GPU_ISOLATION_PROVIDER) == GPU_ISOLATION_PROVIDER_HAMI_CORE:
            where = f"{ANNOTATION_DEVICE_ALLOCATED}: gpu[0].resources"
            resources = gpus[0].get("resources") or {}
            if not isinstance(resources, Mapping):
                raise BadPodInput(REASON, where, "must be an object of resource: quantity")
            ratio = _quantity(resources, RESOURCE_GPU_MEMORY_RATIO, where)
            if ratio is None:
                raise BadPodInput(REASON, f"{where}.{RESOURCE_GPU_MEMORY_RATIO}", "missing")
            if ratio < 100:
                memory = _quantity(resources, RESOURCE_GPU_MEMORY, where)
                if memory is None:
                    raise BadPodInput(REASON, f"{where}.{RESOURCE_GPU_MEMORY}", "missing")
                env[ENV_MEMORY_LIMIT] = str(memory)
                core = _quantity(resources, RESOURCE_GPU_CORE, where)
                if core is not None:
                    env[ENV_SM_LIMIT] = str(core)
                env[ENV_PRELOAD] = HAMI_CORE_LIBRARY
                mounts = (
                    Mount(HAMI_CORE_LIBRARY, HAMI_CORE_LIBRARY),
                    Mount(HAMI_LOCK_DIR, HAMI_LOCK_DIR),
                )
        return Change(env=env, mounts=mounts, reason=f"allocated GPUs {env[ENV_VISIBLE_DEVICES]}")


def build(_ctx: HookContext) -> GPUEnvInject:
    """The table's factory (row ``GPUEnvInject``)."""
    return GPUEnvInject()
