"""Workload and node usage as Prometheus families, built from the metric cache at each scrape.

:class:`KoordletExporter` implements prometheus-client's collector protocol: every ``collect()``
reads the latest sample of each series from the metric cache and labels it from the current
inventory snapshot, so a pod that is gone, or a series that stopped updating, simply disappears.
A value older than ``STALE_INTERVALS`` collect intervals is absent, never zero.

Family names and label keys are Koordinator's (``pkg/koordlet/metrics``) where the Go koordlet
exports the same quantity: ``koordlet_node_used_cpu_cores``, ``koordlet_node_used_memory_bytes``,
``koordlet_be_suppress_be_used_cpu_cores`` and ``koordlet_host_application_resource_usage``, with
its ``node``, ``pod_uid``, ``pod_name``, ``pod_namespace``, ``container_id`` (``<runtime>://<id>``
as in a pod's status), ``container_name``, ``numa_node_id``, ``resource`` and ``qos`` keys. The
others have no upstream counterpart and are named in the same style; ``docs/metrics.md`` lists
them all. The table :data:`FAMILIES` is the single place that maps a series to a family.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from enum import Enum
from typing import Protocol

from apis.records import frozen
from koordlet.metriccache import series as s
from koordlet.metriccache.series import SeriesKey
from koordlet.prom import GaugeMetricFamily, Metric
from koordlet.statesinformer.model import PodInfo, WorkloadSnapshot

_NUMA_PREFIX = s.numa_entity(0).removesuffix("0")
_RESCTRL_PREFIX = s.resctrl_group_entity("")
"""``node/resctrl/``: entity ids of resctrl domains are this prefix, the group and the cache id."""
"""``numa/``: entity ids of NUMA nodes are this prefix and the node id."""

STALE_INTERVALS = 3.0
"""A sample older than this many collect intervals is not exported."""


class SampleReader(Protocol):
    """The part of the metric cache the exporter reads."""

    def last_sample(self, metric: str, entity: str, /) -> tuple[float, float] | None:
        """``(timestamp, value)`` of the newest sample, or None."""
        ...

    def entities(self, metric: str | None = None, /) -> Iterable[str]:
        """Entities that have samples of ``metric`` (of any metric when None)."""
        ...

    def last_values(self, keys: Sequence[SeriesKey], since: float, /) -> list[float | None]:
        """The newest value of each series when its timestamp is ``since`` or later, else
        None, in the order of ``keys``."""
        ...

    def has_series(self, metric: str, /) -> bool:
        """Whether any series of ``metric`` is stored."""
        ...


class Scope(Enum):
    """Which entities a family has one sample per, and so which labels it carries."""

    NODE = "node"
    NUMA = "numa"
    POD = "pod"
    POD_PLAIN = "pod_plain"
    """A pod without the ``qos`` label, for families whose upstream labels lack it (PSI)."""
    CONTAINER = "container"
    HOST_APP = "host_app"
    RESCTRL = "resctrl"
    """One L3 cache domain of a resctrl QoS group (``node/resctrl/<group>/<cache id>``)."""
    GPU = "gpu"
    """One GPU (``node/gpu/<minor>/<uuid>``)."""

    @property
    def labels(self) -> tuple[str, ...]:
        return SCOPE_LABELS[self]


SCOPE_LABELS: dict[Scope, tuple[str, ...]] = {
    Scope.NODE: ("node",),
    Scope.NUMA: ("node", "numa_node_id"),
    Scope.POD: ("node", "pod_uid", "pod_name", "pod_namespace", "qos"),
    Scope.POD_PLAIN: ("node", "pod_uid", "pod_name", "pod_namespace"),
    Scope.CONTAINER: (
        "node",
        "container_id",
        "container_name",
        "pod_uid",
        "pod_name",
        "pod_namespace",
    ),
    Scope.HOST_APP: ("node", "host_application_name", "priority_class", "qos"),
    Scope.RESCTRL: ("node", "cache_id", "qos"),
    Scope.GPU: ("node", "gpu_minor", "gpu_device_uuid"),
}
"""Label keys of each scope, in exposition order (Koordinator's keys and order)."""


@frozen
class Source:
    """One series feeding a family."""

    series: str
    """Series name in the metric cache (``koordlet.metriccache.series``)."""
    entity: str = ""
    """The fixed entity of a node-scope series (``node``, ``system``, ``be``)."""
    extra: tuple[str, ...] = ()
    """Values of the family's extra labels for this series (``resource="cpu"``)."""
    only_if: tuple[str, float] | None = None
    """``(series, value)``: exported only for entities whose latest sample of that series is
    ``value``; a label valued by another series (PSI's ``cpu_full_supported``)."""


@frozen
class FamilySpec:
    """One exported gauge family."""

    name: str
    """Full family name, ``koordlet_`` prefixed."""
    help: str
    """The HELP text."""
    scope: Scope
    """Whose samples it holds; fixes the base labels."""
    sources: tuple[Source, ...]
    """The series it is built from."""
    extra_labels: tuple[str, ...] = ()
    """Labels after the scope's, valued by each source's ``extra``."""
    upstream: bool = False
    """True when the Go koordlet exports the same name and labels."""

    @property
    def labels(self) -> tuple[str, ...]:
        return self.scope.labels + self.extra_labels


def _one(name: str, help_: str, scope: Scope, series: str, entity: str = "") -> FamilySpec:
    return FamilySpec(name, help_, scope, (Source(series, entity),))


PSI_LABELS = ("psi_resource_type", "psi_precision", "psi_degree", "cpu_full_supported")
"""Koordinator's PSI labels (``pkg/koordlet/metrics/psi.go``); ``cpu_full_supported`` is whether
the resource's file has a ``full`` line, and without one only ``some`` is exported."""


def _psi(name: str, help_: str, scope: Scope, entity: str = "") -> FamilySpec:
    """A PSI family: a source per resource, degree and window; each ``some`` source twice, for
    ``cpu_full_supported`` true and false, each ``full`` one for true only."""
    sources: list[Source] = []
    for res in s.PSI_RESOURCES:
        flag = s.psi_full_supported_series(res)
        for degree in s.PSI_DEGREES:
            variants = (("true", 1.0), ("false", 0.0)) if degree == "some" else (("true", 1.0),)
            for window in s.PSI_WINDOWS:
                series = s.psi_series(res, degree, window)
                sources += (
                    Source(series, entity, (res, window, degree, full), only_if=(flag, value))
                    for full, value in variants
                )
    upstream = scope is not Scope.NODE
    return FamilySpec(name, help_, scope, tuple(sources), PSI_LABELS, upstream=upstream)


FAMILIES: tuple[FamilySpec, ...] = (
    FamilySpec(
        "koordlet_node_used_cpu_cores",
        "Number of cpu cores used by node in realtime",
        Scope.NODE,
        (Source(s.NODE_CPU_USAGE, s.NODE),),
        upstream=True,
    ),
    FamilySpec(
        "koordlet_node_used_memory_bytes",
        "Memory used by node in realtime (MemTotal - MemAvailable)",
        Scope.NODE,
        (Source(s.NODE_MEMORY_USAGE, s.NODE),),
        upstream=True,
    ),
    _one(
        "koordlet_node_used_memory_with_page_cache_bytes",
        "Memory used by node including page cache (MemTotal - MemFree)",
        Scope.NODE,
        s.NODE_MEMORY_WITH_PAGE_CACHE,
        s.NODE,
    ),
    _one(
        "koordlet_system_used_cpu_cores",
        "Cpu cores used outside pods and host applications (node - pods - host apps)",
        Scope.NODE,
        s.SYSTEM_CPU_USAGE,
        s.SYSTEM,
    ),
    _one(
        "koordlet_system_used_memory_bytes",
        "Memory used outside pods and host applications",
        Scope.NODE,
        s.SYSTEM_MEMORY_USAGE,
        s.SYSTEM,
    ),
    FamilySpec(
        "koordlet_be_suppress_be_used_cpu_cores",
        "Number of cpu cores used by BE pods",
        Scope.NODE,
        (Source(s.BE_CPU_USAGE, s.BE),),
        upstream=True,
    ),
    _one(
        "koordlet_be_cpu_real_limit_cores",
        "Cpu cores the BE pods may use now (their cgroup limit or cpuset, whichever binds)",
        Scope.NODE,
        s.BE_CPU_REAL_LIMIT,
        s.BE,
    ),
    _one(
        "koordlet_be_cpu_request_cores",
        "Sum of the cpu requests of BE pods",
        Scope.NODE,
        s.BE_CPU_REQUEST,
        s.BE,
    ),
    _one(
        "koordlet_be_cpu_throttled_ratio",
        "Fraction (0..1) of the BE QoS cgroup's CFS periods that were throttled over the last "
        "interval",
        Scope.NODE,
        s.BE_CPU_THROTTLED_RATIO,
        s.BE,
    ),
    _one(
        "koordlet_numa_node_used_memory_bytes",
        "Memory used on one NUMA node",
        Scope.NUMA,
        s.NUMA_MEMORY_USAGE,
    ),
    _one(
        "koordlet_numa_node_memory_total_bytes",
        "Memory of one NUMA node",
        Scope.NUMA,
        s.NUMA_MEMORY_TOTAL,
    ),
    _one(
        "koordlet_numa_node_used_cpu_cores",
        "Cpu cores used on one NUMA node (the busy time of its CPUs)",
        Scope.NUMA,
        s.NUMA_CPU_USAGE,
    ),
    _one(
        "koordlet_node_memory_total_bytes",
        "Memory of the node (MemTotal of /proc/meminfo)",
        Scope.NODE,
        s.NODE_MEMORY_TOTAL,
        s.NODE,
    ),
    _one("koordlet_pod_used_cpu_cores", "Cpu cores used by a pod", Scope.POD, s.POD_CPU_USAGE),
    _one(
        "koordlet_pod_used_memory_bytes",
        "Memory used by a pod without page cache (anon + unevictable)",
        Scope.POD,
        s.POD_MEMORY_USAGE,
    ),
    _one(
        "koordlet_pod_used_memory_with_page_cache_bytes",
        "Memory used by a pod including page cache",
        Scope.POD,
        s.POD_MEMORY_WITH_PAGE_CACHE,
    ),
    _one(
        "koordlet_pod_cpu_throttled_ratio",
        "Fraction (0..1) of a pod's CFS periods that were throttled over the last interval",
        Scope.POD,
        s.POD_CPU_THROTTLED_RATIO,
    ),
    _one(
        "koordlet_container_used_cpu_cores",
        "Cpu cores used by a container",
        Scope.CONTAINER,
        s.CONTAINER_CPU_USAGE,
    ),
    _one(
        "koordlet_container_used_memory_bytes",
        "Memory used by a container without page cache (anon + unevictable)",
        Scope.CONTAINER,
        s.CONTAINER_MEMORY_USAGE,
    ),
    _one(
        "koordlet_container_used_memory_with_page_cache_bytes",
        "Memory used by a container including page cache",
        Scope.CONTAINER,
        s.CONTAINER_MEMORY_WITH_PAGE_CACHE,
    ),
    _one(
        "koordlet_container_cpu_throttled_ratio",
        "Fraction (0..1) of a container's CFS periods that were throttled over the last interval",
        Scope.CONTAINER,
        s.CONTAINER_CPU_THROTTLED_RATIO,
    ),
    FamilySpec(
        "koordlet_container_cpi",
        "Container cpi collected by koordlet",
        Scope.CONTAINER,
        (
            Source(s.CONTAINER_CPI_CYCLES, extra=("cycles",)),
            Source(s.CONTAINER_CPI_INSTRUCTIONS, extra=("instructions",)),
        ),
        extra_labels=("cpi_field",),
        upstream=True,
    ),
    FamilySpec(
        "koordlet_host_application_resource_usage",
        "Host application resource usage collected by koordlet (cpu in cores, memory in bytes)",
        Scope.HOST_APP,
        (
            Source(s.HOST_APP_CPU_USAGE, extra=("cpu",)),
            Source(s.HOST_APP_MEMORY_USAGE, extra=("memory",)),
        ),
        extra_labels=("resource",),
        upstream=True,
    ),
    _one(
        "koordlet_host_application_memory_with_page_cache_bytes",
        "Memory used by a host application including page cache",
        Scope.HOST_APP,
        s.HOST_APP_MEMORY_WITH_PAGE_CACHE,
    ),
    _one(
        "koordlet_node_memory_cold_page_bytes",
        "Cold memory of the node: idle past the cold age (kidled or DAMON)",
        Scope.NODE,
        s.NODE_MEMORY_COLD_PAGE,
        s.NODE,
    ),
    _one(
        "koordlet_node_used_memory_with_hot_page_cache_bytes",
        "Memory used by the node with hot page cache (MemTotal - MemFree - cold)",
        Scope.NODE,
        s.NODE_MEMORY_WITH_HOT_PAGE_CACHE,
        s.NODE,
    ),
    _one(
        "koordlet_pod_memory_cold_page_bytes",
        "Cold memory of a pod: idle past the cold age (kidled or DAMON)",
        Scope.POD,
        s.POD_MEMORY_COLD_PAGE,
    ),
    _one(
        "koordlet_pod_used_memory_with_hot_page_cache_bytes",
        "Memory used by a pod with hot page cache (usage with page cache - cold)",
        Scope.POD,
        s.POD_MEMORY_WITH_HOT_PAGE_CACHE,
    ),
    _one(
        "koordlet_container_memory_cold_page_bytes",
        "Cold memory of a container: idle past the cold age (kidled or DAMON)",
        Scope.CONTAINER,
        s.CONTAINER_MEMORY_COLD_PAGE,
    ),
    _one(
        "koordlet_container_used_memory_with_hot_page_cache_bytes",
        "Memory used by a container with hot page cache (usage with page cache - cold)",
        Scope.CONTAINER,
        s.CONTAINER_MEMORY_WITH_HOT_PAGE_CACHE,
    ),
    _one(
        "koordlet_host_application_memory_cold_page_bytes",
        "Cold memory of a host application: idle past the cold age (kidled or DAMON)",
        Scope.HOST_APP,
        s.HOST_APP_MEMORY_COLD_PAGE,
    ),
    _one(
        "koordlet_host_application_memory_with_hot_page_cache_bytes",
        "Memory used by a host application with hot page cache (usage with page cache - cold)",
        Scope.HOST_APP,
        s.HOST_APP_MEMORY_WITH_HOT_PAGE_CACHE,
    ),
    _psi("koordlet_node_psi", "Node psi collected by koordlet", Scope.NODE, s.NODE),
    _psi("koordlet_pod_psi", "Pod psi collected by koordlet", Scope.POD_PLAIN),
    _psi("koordlet_container_psi", "Container psi collected by koordlet", Scope.CONTAINER),
    FamilySpec(
        "koordlet_resctrl_llc_occupancy",
        "L3 cache bytes held by a resctrl QoS group (LSR, LS, BE) in one cache domain",
        Scope.RESCTRL,
        (Source(s.RESCTRL_DOMAIN_LLC_OCCUPANCY),),
        upstream=True,
    ),
    FamilySpec(
        "koordlet_resctrl_memory_bandwidth",
        "Running count of memory bytes a resctrl QoS group moved in one cache domain",
        Scope.RESCTRL,
        (
            Source(s.RESCTRL_DOMAIN_MBM_TOTAL_BYTES, extra=("mbm_total_bytes",)),
            Source(s.RESCTRL_DOMAIN_MBM_LOCAL_BYTES, extra=("mbm_local_bytes",)),
        ),
        extra_labels=("mb_type",),
        upstream=True,
    ),
    FamilySpec(
        "koordlet_resctrl_memory_bandwidth_bytes_per_second",
        "Memory bandwidth of a resctrl QoS group in one cache domain over the last interval",
        Scope.RESCTRL,
        (
            Source(s.RESCTRL_DOMAIN_MBM_TOTAL_BANDWIDTH, extra=("mbm_total_bytes",)),
            Source(s.RESCTRL_DOMAIN_MBM_LOCAL_BANDWIDTH, extra=("mbm_local_bytes",)),
        ),
        extra_labels=("mb_type",),
    ),
    _one(
        "koordlet_gpu_core_used_percent",
        "Percent of the last sample period in which a kernel ran on the GPU (NVML utilization)",
        Scope.GPU,
        s.GPU_CORE_USAGE,
    ),
    _one(
        "koordlet_gpu_memory_used_bytes",
        "GPU device memory in use",
        Scope.GPU,
        s.GPU_MEMORY_USAGE,
    ),
    _one(
        "koordlet_gpu_memory_total_bytes",
        "GPU device memory",
        Scope.GPU,
        s.GPU_MEMORY_TOTAL,
    ),
    _one(
        "koordlet_gpu_healthy",
        "1 when the GPU is healthy (the Device object's health), 0 when not",
        Scope.GPU,
        s.GPU_HEALTHY,
    ),
)
"""Every family the exporter builds, in exposition order."""

EXPORTED_SERIES: tuple[str, ...] = tuple(
    dict.fromkeys(src.series for fam in FAMILIES for src in fam.sources)
)
"""The series names the families read, each once."""


def container_id_label(runtime: str, container_id: str) -> str:
    """The ``container_id`` label as Kubernetes writes it in a pod status: ``<runtime>://<id>``;
    the bare id when the runtime is unknown."""
    if runtime and runtime != "unknown":
        return f"{runtime}://{container_id}"
    return container_id


class KoordletExporter:
    """A prometheus-client collector over the metric cache and the inventory.

    :param cache: the metric cache's read side.
    :param workloads: returns the current inventory snapshot.
    :param node_name: value of every family's ``node`` label.
    :param collect_interval: the collectors' base interval (s); samples older than
        ``STALE_INTERVALS`` times it are not exported.
    :param clock: wall-clock seconds (the cache's timestamps are ``time.time()``).
    :param max_ages: family name → seconds its samples stay exported, for families whose
        collector runs less often than the base interval (CPI: one window a minute).
    """

    def __init__(
        self,
        cache: SampleReader,
        workloads: Callable[[], WorkloadSnapshot],
        *,
        node_name: str,
        collect_interval: float,
        clock: Callable[[], float] = time.time,
        max_ages: Mapping[str, float] | None = None,
    ) -> None:
        if not collect_interval > 0:
            raise ValueError(f"collect_interval must be positive, got {collect_interval}")
        self._cache = cache
        self._workloads = workloads
        self._node = node_name
        self.max_age = STALE_INTERVALS * collect_interval
        self._clock = clock
        self._max_ages = dict(max_ages or {})

    @property
    def cache(self) -> SampleReader:
        """The metric cache it reads."""
        return self._cache

    def workloads(self) -> WorkloadSnapshot:
        """The current inventory snapshot."""
        return self._workloads()

    def now(self) -> float:
        """Wall-clock seconds, the time base of the cache's timestamps."""
        return self._clock()

    def max_age_of(self, family: str) -> float:
        """Seconds a sample of ``family`` stays exported."""
        return self._max_ages.get(family, self.max_age)

    def describe(self) -> Iterable[Metric]:
        """The families without samples: lets a registry detect name clashes at registration
        without reading the cache."""
        return [GaugeMetricFamily(f.name, f.help, labels=f.labels) for f in FAMILIES]

    def collect(self) -> Iterable[Metric]:
        """Fresh families built from the latest samples (called at each scrape)."""
        now = self._clock()
        snapshot = self._workloads()
        # only_if values by (series, entity), read once a scrape (PSI asks for each 9 times).
        flags: dict[tuple[str, str], float | None] = {}
        for spec in FAMILIES:
            family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
            max_age = self.max_age_of(spec.name)
            for src in spec.sources:
                for entity, labels in self.entities(spec.scope, src, snapshot):
                    if src.only_if is not None:
                        key = (src.only_if[0], entity)
                        if key not in flags:
                            flag = self._cache.last_sample(*key)
                            flags[key] = None if flag is None else flag[1]
                        if flags[key] != src.only_if[1]:
                            continue
                    sample = self._cache.last_sample(src.series, entity)
                    if sample is None:
                        continue
                    ts, value = sample
                    if now - ts > max_age:
                        continue
                    family.add_metric([*labels, *src.extra], value)
            yield family

    def entities(
        self, scope: Scope, src: Source, snapshot: WorkloadSnapshot
    ) -> Iterator[tuple[str, tuple[str, ...]]]:
        """``(entity id, scope label values)`` for every entity a source may have samples of."""
        node = self._node
        if scope is Scope.NODE:
            yield src.entity, (node,)
        elif scope is Scope.NUMA:
            yield from self._numa_entities(src.series)
        elif scope is Scope.POD:
            for pod in _sorted_pods(snapshot.pods):
                yield s.pod_entity(pod.uid), (node, pod.uid, pod.name, pod.namespace, str(pod.qos))
        elif scope is Scope.POD_PLAIN:
            for pod in _sorted_pods(snapshot.pods):
                yield s.pod_entity(pod.uid), (node, pod.uid, pod.name, pod.namespace)
        elif scope is Scope.CONTAINER:
            for pod in _sorted_pods(snapshot.pods):
                for c in pod.containers:
                    cid = container_id_label(c.runtime, c.id)
                    labels: tuple[str, ...] = (node, cid, c.name, pod.uid, pod.name, pod.namespace)
                    yield s.container_entity(pod.uid, c.id), labels
        elif scope is Scope.RESCTRL:
            yield from self._resctrl_entities(src.series)
        elif scope is Scope.GPU:
            yield from self._gpu_entities(src.series)
        else:
            for app in snapshot.host_apps:
                if app.present:
                    yield (
                        s.host_app_entity(app.name),
                        (node, app.name, app.priority_class, str(app.qos)),
                    )

    def _numa_entities(self, series: str) -> Iterator[tuple[str, tuple[str, ...]]]:
        prefix = _NUMA_PREFIX
        found: list[tuple[int, str]] = []
        for entity in self._cache.entities(series):
            suffix = entity[len(prefix) :] if entity.startswith(prefix) else ""
            if suffix.isdigit():
                found.append((int(suffix), entity))
        for node_id, entity in sorted(found):
            yield entity, (self._node, str(node_id))

    def _resctrl_entities(self, series: str) -> Iterator[tuple[str, tuple[str, ...]]]:
        """``node/resctrl/<group>/<cache id>`` entities of ``series``, by group and cache id."""
        found: list[tuple[str, int, str]] = []
        for entity in self._cache.entities(series):
            if not entity.startswith(_RESCTRL_PREFIX):
                continue
            group, _, domain = entity[len(_RESCTRL_PREFIX) :].partition("/")
            if group and domain.isdigit():
                found.append((group, int(domain), entity))
        for group, cache_id, entity in sorted(found):
            yield entity, (self._node, str(cache_id), group)

    def _gpu_entities(self, series: str) -> Iterator[tuple[str, tuple[str, ...]]]:
        """``node/gpu/<minor>/<uuid>`` entities of ``series``, by minor number."""
        found: list[tuple[int, str, str]] = []
        for entity in self._cache.entities(series):
            if not entity.startswith(s.GPU_ENTITY_PREFIX):
                continue
            text, _, uuid = entity[len(s.GPU_ENTITY_PREFIX) :].partition("/")
            if text.isdigit() and uuid:
                found.append((int(text), uuid, entity))
        for minor, uuid, entity in sorted(found):
            yield entity, (self._node, str(minor), uuid)


def _sorted_pods(pods: Mapping[str, PodInfo]) -> list[PodInfo]:
    return sorted(pods.values(), key=lambda p: (p.namespace, p.name, p.uid))
