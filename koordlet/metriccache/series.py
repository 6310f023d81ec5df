"""Series names and entity ids shared by the collectors, the cache and its readers.

A series is one number over time for one entity: ``SeriesKey(metric, entity)``. CPU is in cores
(float), memory in bytes, ratios in 0..1. Entity ids are plain strings so that dropping everything
of a pod is a prefix match.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, TypeAlias


class SeriesKey(NamedTuple):
    metric: str
    entity: str


class Sample(NamedTuple):
    """One value of one series at the tick's timestamp (``time.time()`` seconds)."""

    key: SeriesKey
    value: float


Column: TypeAlias = "tuple[tuple[SeriesKey, ...], Sequence[float]]"
"""``(keys, values)``: one value per key, all at the tick's timestamp. A collector hands the same
``keys`` tuple object tick after tick while its targets stay the same: the metric cache plans
how to store a column once per keys tuple (``MetricCache.append_columns``)."""


# Entities ------------------------------------------------------------------------------------
NODE = "node"
SYSTEM = "system"
BE = "be"


def pod_entity(uid: str) -> str:
    return f"pod/{uid}"


def container_entity(pod_uid: str, container_id: str) -> str:
    return f"container/{pod_uid}/{container_id}"


def host_app_entity(name: str) -> str:
    return f"hostapp/{name}"


def numa_entity(node_id: int) -> str:
    return f"numa/{node_id}"


def resctrl_group_entity(group: str) -> str:
    """A resctrl control group (``LSR``, ``LS``, ``BE``): ``node/resctrl/<group>``, a node-kind
    entity (the metric cache keeps node retention for it)."""
    return f"node/resctrl/{group}"


def resctrl_domain_entity(group: str, cache_id: int) -> str:
    """One L3 cache domain of a resctrl control group: ``node/resctrl/<group>/<cache id>``."""
    return f"node/resctrl/{group}/{cache_id}"


# Metrics (Koordinator's metriccache kinds, our spelling) --------------------------------------
NODE_CPU_USAGE = "node_cpu_usage"  # cores, entity NODE
NODE_MEMORY_USAGE = "node_memory_usage"  # bytes: MemTotal - MemAvailable, entity NODE
NODE_MEMORY_WITH_PAGE_CACHE = "node_memory_with_page_cache"  # bytes: MemTotal - MemFree
NODE_MEMORY_TOTAL = "node_memory_total"  # bytes: MemTotal of /proc/meminfo, entity NODE
NUMA_MEMORY_USAGE = "numa_memory_usage"  # bytes, entity numa/<id>
NUMA_MEMORY_TOTAL = "numa_memory_total"  # bytes, entity numa/<id>
NUMA_CPU_USAGE = "numa_cpu_usage"  # cores: the NUMA node's CPUs' busy time, entity numa/<id>

POD_CPU_USAGE = "pod_cpu_usage"  # cores
POD_MEMORY_USAGE = "pod_memory_usage"  # bytes: anon + unevictable
POD_MEMORY_WITH_PAGE_CACHE = "pod_memory_with_page_cache"  # bytes
POD_CPU_THROTTLED_RATIO = "pod_cpu_throttled_ratio"  # 0..1 of periods throttled

CONTAINER_CPU_USAGE = "container_cpu_usage"
CONTAINER_MEMORY_USAGE = "container_memory_usage"
CONTAINER_MEMORY_WITH_PAGE_CACHE = "container_memory_with_page_cache"
CONTAINER_CPU_THROTTLED_RATIO = "container_cpu_throttled_ratio"
# perf counts of a container over one CPI window (scaled, summed over CPUs; gate CPICollector)
CONTAINER_CPI_CYCLES = "container_cpi_cycles"
CONTAINER_CPI_INSTRUCTIONS = "container_cpi_instructions"

BE_CPU_REAL_LIMIT = "be_cpu_real_limit"  # cores, entity BE
BE_CPU_REQUEST = "be_cpu_request"  # cores, entity BE
BE_CPU_USAGE = "be_cpu_usage"  # cores, entity BE
BE_CPU_THROTTLED_RATIO = "be_cpu_throttled_ratio"  # 0..1 of the BE QoS cgroup's periods, entity BE

SYSTEM_CPU_USAGE = "system_cpu_usage"  # cores, entity SYSTEM: node - pods - host apps
SYSTEM_MEMORY_USAGE = "system_memory_usage"  # bytes, entity SYSTEM

HOST_APP_CPU_USAGE = "host_app_cpu_usage"  # cores, entity hostapp/<name>
HOST_APP_MEMORY_USAGE = "host_app_memory_usage"  # bytes
HOST_APP_MEMORY_WITH_PAGE_CACHE = "host_app_memory_with_page_cache"  # bytes

# Cold memory (gate ColdPageCollector), bytes; entity NODE, pod/, container/ or hostapp/.
# Cold: idle at least the cold age (kidled or DAMON); with hot page cache: usage with page
# cache - cold.
NODE_MEMORY_COLD_PAGE = "node_memory_cold_page"
NODE_MEMORY_WITH_HOT_PAGE_CACHE = "node_memory_with_hot_page_cache"  # MemTotal - MemFree - cold
POD_MEMORY_COLD_PAGE = "pod_memory_cold_page"
POD_MEMORY_WITH_HOT_PAGE_CACHE = "pod_memory_with_hot_page_cache"
CONTAINER_MEMORY_COLD_PAGE = "container_memory_cold_page"
CONTAINER_MEMORY_WITH_HOT_PAGE_CACHE = "container_memory_with_hot_page_cache"
HOST_APP_MEMORY_COLD_PAGE = "host_app_memory_cold_page"
HOST_APP_MEMORY_WITH_HOT_PAGE_CACHE = "host_app_memory_with_hot_page_cache"

# resctrl monitoring, per control group (node/resctrl/<group>, summed over L3 domains) and per
# domain (node/resctrl/<group>/<cache id>). Occupancy and counters in bytes, bandwidth in bytes/s.
RESCTRL_LLC_OCCUPANCY = "resctrl_llc_occupancy"
RESCTRL_MBM_TOTAL_BANDWIDTH = "resctrl_mbm_total_bandwidth"
RESCTRL_MBM_LOCAL_BANDWIDTH = "resctrl_mbm_local_bandwidth"
RESCTRL_DOMAIN_LLC_OCCUPANCY = "resctrl_domain_llc_occupancy"
RESCTRL_DOMAIN_MBM_TOTAL_BYTES = "resctrl_domain_mbm_total_bytes"  # the running counter
RESCTRL_DOMAIN_MBM_LOCAL_BYTES = "resctrl_domain_mbm_local_bytes"  # the running counter
RESCTRL_DOMAIN_MBM_TOTAL_BANDWIDTH = "resctrl_domain_mbm_total_bandwidth"
RESCTRL_DOMAIN_MBM_LOCAL_BANDWIDTH = "resctrl_domain_mbm_local_bandwidth"

# PSI, in percent of wall time (0..100) as the kernel prints it and Koordinator exports it; one
# name per (resource, degree, window), entity NODE, pod/<uid> or container/<uid>/<id>.
PSI_RESOURCES = ("cpu", "mem", "io")  # Koordinator's psi_resource_type (files cpu, memory, io)
PSI_DEGREES = ("some", "full")  # Koordinator's psi_degree
PSI_WINDOWS = ("avg10", "avg60", "avg300")  # Koordinator's psi_precision


def psi_series(resource: str, degree: str, window: str) -> str:
    """``psi_<resource>_<degree>_<window>`` (``psi_mem_full_avg10``): percent stalled."""
    return f"psi_{resource}_{degree}_{window}"


def psi_full_supported_series(resource: str) -> str:
    """``psi_<resource>_full_supported``: 1 when the file has a ``full`` line, else 0 (cpu
    before Linux 5.13); no ``full`` series is recorded then."""
    return f"psi_{resource}_full_supported"


# GPUs (gate Accelerators), one entity per card: node/gpu/<minor>/<uuid>, a node-kind entity.
GPU_CORE_USAGE = "gpu_core_usage"  # percent of the last sample period a kernel ran (0..100)
GPU_MEMORY_USAGE = "gpu_memory_usage"  # bytes of device memory in use
GPU_MEMORY_TOTAL = "gpu_memory_total"  # bytes of device memory
GPU_HEALTHY = "gpu_healthy"  # 1 healthy, 0 not (the Device object's health)
GPU_ENTITY_PREFIX = "node/gpu/"


def gpu_entity(minor: int, uuid: str) -> str:
    """One GPU: ``node/gpu/<minor>/<uuid>`` (Koordinator's ``gpu_minor`` and
    ``gpu_device_uuid`` properties)."""
    return f"{GPU_ENTITY_PREFIX}{minor}/{uuid}"
