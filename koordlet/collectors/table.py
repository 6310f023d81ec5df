"""The collector table: one :class:`~koordlet.collectors.framework.CollectorSpec` row per
collector, in execution order. Nothing registers itself.

A row holds everything about its collector as data: its name, the factory by reference (each
module's ``build``, ``"koordlet.collectors.<name>:build"``, imported only when the row is
enabled: :mod:`koordlet.plugins`), Koordinator's feature gate or ``collect`` switch when it has
one, its interval from the ``collect`` configuration, and the ``/metrics`` families built from its
series with how long their samples stay exported. The daemon takes the table as an argument;
tests pass their own.

The order matters: every collector of a tick sees, through ``Tick.last``, the samples of those
before it, and the system collector (node - pods - host applications) must come after the node,
pod and host-application collectors. ``docs/collectors.md`` describes each one.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from koordlet.collectors.framework import Collector, CollectorContext, CollectorSpec
from koordlet.config import CollectConfig
from koordlet.errors import ConfigError

EXPORT_INTERVALS = 3
"""A slow collector's samples stay exported for this many of its own intervals."""


def _base(c: CollectConfig) -> float:
    """The base tick: ``collect.res_used_interval`` (``--collect-res-used-interval-seconds``)."""
    return c.res_used_interval


def until_next_window(period: float, step: float) -> float:
    """Seconds a windowed collector's sample (CPI, PSI) stays exported: until the next window
    replaces it (one ``period``, give or take a base tick ``step`` each end). A container whose
    next count failed then drops out, as upstream resets its gauge at every window."""
    return period + 2 * step


COLLECTORS: tuple[CollectorSpec, ...] = (
    CollectorSpec(
        "noderesource",
        "koordlet.collectors.noderesource:build",
        _base,
        "NodeResourceCollector",
        families=(
            "koordlet_node_used_cpu_cores",
            "koordlet_node_used_memory_bytes",
            "koordlet_node_used_memory_with_page_cache_bytes",
            "koordlet_numa_node_used_memory_bytes",
            "koordlet_numa_node_memory_total_bytes",
            "koordlet_numa_node_used_cpu_cores",
            "koordlet_node_memory_total_bytes",
        ),
    ),
    CollectorSpec(
        "nodeinfo",
        "koordlet.collectors.nodeinfo:build",
        lambda c: c.node_cpu_info_interval,
        "NodeInfoCollector",
    ),
    CollectorSpec(
        "nodestorage",
        "koordlet.collectors.nodestorage:build",
        lambda c: c.node_storage_info_interval,
        "NodeStorageInfoCollector",
        gate="BlkIOReconcile",
    ),
    CollectorSpec(
        "podresource",
        "koordlet.collectors.podresource:build",
        _base,
        "PodResourceCollector",
        families=(
            "koordlet_pod_used_cpu_cores",
            "koordlet_pod_used_memory_bytes",
            "koordlet_container_used_cpu_cores",
            "koordlet_container_used_memory_bytes",
        ),
    ),
    CollectorSpec(
        "podthrottled",
        "koordlet.collectors.podthrottled:build",
        _base,
        "PodThrottledCollector",
        families=("koordlet_pod_cpu_throttled_ratio", "koordlet_container_cpu_throttled_ratio"),
    ),
    CollectorSpec(
        "pagecache",
        "koordlet.collectors.pagecache:build",
        _base,
        "PageCacheCollector",
        families=(
            "koordlet_pod_used_memory_with_page_cache_bytes",
            "koordlet_container_used_memory_with_page_cache_bytes",
        ),
    ),
    CollectorSpec(
        "hostapplication",
        "koordlet.collectors.hostapplication:build",
        _base,
        "HostApplicationCollector",
        families=(
            "koordlet_host_application_resource_usage",
            "koordlet_host_application_memory_with_page_cache_bytes",
        ),
    ),
    CollectorSpec(
        "beresource",
        "koordlet.collectors.beresource:build",
        _base,
        "BEResourceCollector",
        families=(
            "koordlet_be_suppress_be_used_cpu_cores",
            "koordlet_be_cpu_real_limit_cores",
            "koordlet_be_cpu_request_cores",
            "koordlet_be_cpu_throttled_ratio",
        ),
    ),
    CollectorSpec(
        "coldmemory",
        "koordlet.collectors.coldmemory:build",
        lambda c: c.cold_page_interval,
        "ColdMemoryCollector",
        gate="ColdPageCollector",
        families=(
            "koordlet_node_memory_cold_page_bytes",
            "koordlet_node_used_memory_with_hot_page_cache_bytes",
            "koordlet_pod_memory_cold_page_bytes",
            "koordlet_pod_used_memory_with_hot_page_cache_bytes",
            "koordlet_container_memory_cold_page_bytes",
            "koordlet_container_used_memory_with_hot_page_cache_bytes",
            "koordlet_host_application_memory_cold_page_bytes",
            "koordlet_host_application_memory_with_hot_page_cache_bytes",
        ),
        max_age=lambda c: EXPORT_INTERVALS * max(c.cold_page_interval, c.res_used_interval),
    ),
    CollectorSpec(
        "resctrlmon",
        "koordlet.collectors.resctrlmon:build",
        lambda c: c.resctrl_interval,
        "resctrlCollector",
        switch=lambda c: c.enable_resctrl_collector,
        families=(
            "koordlet_resctrl_llc_occupancy",
            "koordlet_resctrl_memory_bandwidth",
            "koordlet_resctrl_memory_bandwidth_bytes_per_second",
        ),
        max_age=lambda c: EXPORT_INTERVALS * max(c.resctrl_interval, c.res_used_interval),
    ),
    CollectorSpec(
        "sysresource",
        "koordlet.collectors.sysresource:build",
        _base,
        "SystemResourceCollector",
        families=("koordlet_system_used_cpu_cores", "koordlet_system_used_memory_bytes"),
    ),
    CollectorSpec(
        "cpi",
        "koordlet.collectors.cpi:build",
        _base,  # it steps every base tick; its windows start every collect.cpi_interval
        "CPICollector",
        gate="CPICollector",
        families=("koordlet_container_cpi",),
        max_age=lambda c: until_next_window(c.cpi_interval, c.res_used_interval),
    ),
    CollectorSpec(
        "psi",
        "koordlet.collectors.psi:build",
        lambda c: c.psi_interval,
        "performanceCollector (PSI)",
        gate="PSICollector",
        families=("koordlet_node_psi", "koordlet_pod_psi", "koordlet_container_psi"),
        max_age=lambda c: until_next_window(c.psi_interval, c.res_used_interval),
    ),
    CollectorSpec(
        "gpu",
        "koordlet.collectors.gpu:build",
        _base,  # upstream's GPU collector runs at --collect-res-used-interval-seconds
        "GPU device collector (NVML)",
        gate="Accelerators",
        families=(
            "koordlet_gpu_core_used_percent",
            "koordlet_gpu_memory_used_bytes",
            "koordlet_gpu_memory_total_bytes",
            "koordlet_gpu_healthy",
        ),
    ),
)
"""Every collector, in execution order."""


def build_collectors(
    ctx: CollectorContext,
    table: Sequence[CollectorSpec] = COLLECTORS,
    *,
    disabled: Collection[str] = (),
) -> list[Collector]:
    """Instantiate the collectors of ``table`` in its order, leaving out those named in
    ``disabled`` and those whose feature gate or ``collect`` switch is off in ``ctx.config``.

    A name in ``disabled`` that the table does not hold, a name the table holds twice, or a
    factory that builds a collector of another name is a :class:`ConfigError`.
    """
    names = [spec.name for spec in table]
    if len(set(names)) != len(names):
        raise ConfigError(f"duplicate collector names in {names}", field="collectors")
    unknown = sorted(set(disabled) - set(names))
    if unknown:
        raise ConfigError(f"unknown collectors {unknown}; known: {names}", field="collectors")
    collect = ctx.config.collect
    collectors: list[Collector] = []
    for spec in table:
        if spec.name in disabled or not spec.enabled(ctx.config):
            continue
        collector = spec.build(ctx, spec.interval(collect))
        if collector.name != spec.name:
            raise ConfigError(
                f"row {spec.name!r} built a collector named {collector.name!r}", field="collectors"
            )
        collectors.append(collector)
    return collectors


def export_max_ages(table: Sequence[CollectorSpec], collect: CollectConfig) -> dict[str, float]:
    """Family → seconds its samples stay in ``/metrics``, for the rows that set a ``max_age``
    (the collectors slower than the base tick); the exporter's default covers the others."""
    return {
        family: spec.max_age(collect)
        for spec in table
        if spec.max_age is not None
        for family in spec.families
    }
