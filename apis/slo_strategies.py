"""The NodeSLO strategy groups as typed, frozen dataclasses with Koordinator's defaults.

- ``resourceUsedThresholdWithBE``: :class:`ResourceThresholdStrategy`
  (``DefaultResourceThresholdStrategy``);
- ``resourceQOSStrategy``: :class:`apis.slo_qos.ResourceQOSStrategy`
  (``DefaultResourceQOSStrategy``);
- ``cpuBurstStrategy``: :class:`CPUBurstStrategy` (``DefaultCPUBurstStrategy``);
- ``systemStrategy``: :class:`SystemStrategy` (``DefaultSystemStrategy``).

:func:`strategies_of` gives what the koordlet works with for a NodeSLO: each section merged field
by field over the defaults (an absent or null field keeps the default, nested objects merge, lists
replace), then, as upstream's states informer does, a disabled CPU, resctrl or memory QoS of LSR,
LS and BE takes the disabled values. ``parse_*`` read one section (camelCase JSON) over the
defaults or a given base; ``to_json`` writes the full camelCase form, which the CRD accepts, so
``parse_x(to_json(s)) == s``. Bad input raises :class:`apis.slo.SchemaError` naming the full
field path, with the ranges upstream's validator uses (``validate:`` tags of
``apis/slo/v1alpha1``).
"""

# wire() returns dataclasses.field(...) with the JSON name and codec

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar

from apis.records import frozen
from apis.slo import NodeSLOSpec, NodeSLOSpecJSON, thaw
from apis.slo_qos import (
    DEFAULT_RESOURCE_QOS_STRATEGY,
    Bool,
    BoolMap,
    Enum,
    Int,
    IntOrString,
    ResourceQOSStrategy,
    SectionParser,
    dump_object,
    parse_resource_qos_strategy,
    parser,
    wire,
)

__all__ = [
    "DEFAULT_CPU_BURST_STRATEGY",
    "DEFAULT_RESOURCE_QOS_STRATEGY",
    "DEFAULT_RESOURCE_THRESHOLD_STRATEGY",
    "DEFAULT_SYSTEM_STRATEGY",
    "SECTIONS",
    "CPUBurstPolicy",
    "CPUBurstStrategy",
    "CPUEvictPolicy",
    "CPUSuppressPolicy",
    "NodeSLOStrategies",
    "ResourceQOSStrategy",
    "ResourceThresholdStrategy",
    "SystemStrategy",
    "parse_cpu_burst_strategy",
    "parse_resource_qos_strategy",
    "parse_resource_threshold_strategy",
    "parse_section",
    "parse_system_strategy",
    "strategies_of",
    "to_json",
]


class CPUSuppressPolicy(StrEnum):
    """``cpuSuppressPolicy``: how BE CPU is suppressed."""

    CPUSET = "cpuset"
    CFS_QUOTA = "cfsQuota"


class CPUEvictPolicy(StrEnum):
    """``cpuEvictPolicy``: what BE CPU satisfaction is measured against."""

    BY_REAL_LIMIT = "evictByRealLimit"
    BY_ALLOCATABLE = "evictByAllocatable"


class CPUBurstPolicy(StrEnum):
    """``cpuBurstStrategy.policy``."""

    NONE = "none"
    CPU_BURST_ONLY = "cpuBurstOnly"
    CFS_QUOTA_BURST_ONLY = "cfsQuotaBurstOnly"
    AUTO = "auto"


_INT32 = (-(2**31), 2**31 - 1)


@frozen
class ResourceThresholdStrategy:
    """``spec.resourceUsedThresholdWithBE``: BE suppression and eviction thresholds. Defaults are
    ``DefaultResourceThresholdStrategy``; fields without an upstream default are ``None``."""

    _ORDER: ClassVar[tuple[tuple[str, str], ...]] = (
        ("memory_evict_lower_percent", "memory_evict_threshold_percent"),
        ("cpu_evict_be_satisfaction_lower_percent", "cpu_evict_be_satisfaction_upper_percent"),
    )
    enable: bool = wire("enable", Bool(), False)
    """Whether suppression and eviction are on (``enable``). Default false."""
    cpu_suppress_threshold_percent: int = wire("cpuSuppressThresholdPercent", Int(0, 100), 65)
    """Node CPU usage, percent of capacity, that LS+system may reach before BE is squeezed,
    0..100 (``cpuSuppressThresholdPercent``). Default 65."""
    cpu_suppress_min_percent: int | None = wire("cpuSuppressMinPercent", Int(0, 100))
    """Lower bound of what BE keeps, percent of node CPU, 0..100 (``cpuSuppressMinPercent``).
    Default unset."""
    cpu_suppress_policy: CPUSuppressPolicy = wire(
        "cpuSuppressPolicy", Enum(CPUSuppressPolicy), CPUSuppressPolicy.CPUSET
    )
    """cpuset (default) or cfsQuota (``cpuSuppressPolicy``)."""
    memory_evict_threshold_percent: int = wire("memoryEvictThresholdPercent", Int(0, 100), 70)
    """Node memory usage, percent, above which BE pods are evicted, 0..100
    (``memoryEvictThresholdPercent``). Default 70."""
    memory_evict_lower_percent: int | None = wire("memoryEvictLowerPercent", Int(0, 100))
    """Eviction stops below this memory usage percent, 0..100, below the threshold
    (``memoryEvictLowerPercent``). Default unset, meaning threshold - 2."""
    cpu_evict_be_satisfaction_lower_percent: int | None = wire(
        "cpuEvictBESatisfactionLowerPercent", Int(0, 100)
    )
    """BE eviction starts when BE real limit / request falls below this percent, 0..100
    (``cpuEvictBESatisfactionLowerPercent``). Default unset (CPU eviction off)."""
    cpu_evict_be_satisfaction_upper_percent: int | None = wire(
        "cpuEvictBESatisfactionUpperPercent", Int(0, 100)
    )
    """Eviction releases until satisfaction exceeds this percent, 0..100
    (``cpuEvictBESatisfactionUpperPercent``). Default unset."""
    cpu_evict_be_usage_threshold_percent: int | None = wire(
        "cpuEvictBEUsageThresholdPercent", Int(0, 100)
    )
    """BE CPU usage / real limit, percent, needed before evicting, 0..100
    (``cpuEvictBEUsageThresholdPercent``). Default unset."""
    cpu_evict_threshold_percent: int | None = wire("cpuEvictThresholdPercent", Int(0, 100))
    """Node CPU usage percent above which pods are evicted by CPU, 0..100
    (``cpuEvictThresholdPercent``). Default unset."""
    cpu_evict_lower_percent: int | None = wire("cpuEvictLowerPercent", Int(0, 100))
    """CPU eviction stops below this usage percent, 0..100 (``cpuEvictLowerPercent``).
    Default unset, meaning threshold - 2."""
    cpu_evict_time_window_seconds: int | None = wire("cpuEvictTimeWindowSeconds", Int(1))
    """Seconds of usage averaged for CPU eviction, > 0 (``cpuEvictTimeWindowSeconds``).
    Default unset."""
    cpu_evict_policy: CPUEvictPolicy = wire(
        "cpuEvictPolicy", Enum(CPUEvictPolicy), CPUEvictPolicy.BY_REAL_LIMIT
    )
    """evictByRealLimit (default) or evictByAllocatable (``cpuEvictPolicy``)."""
    evict_enabled_priority_threshold: int | None = wire(
        "evictEnabledPriorityThreshold", Int(*_INT32)
    )
    """Highest pod priority the usage evictions may touch, int32
    (``evictEnabledPriorityThreshold``). Default unset."""
    cpu_allocatable_evict_threshold_percent: int | None = wire(
        "cpuAllocatableEvictThresholdPercent", Int(0)
    )
    """BE CPU requests, percent of BE allocatable, above which BE pods are evicted, ≥ 0
    (``cpuAllocatableEvictThresholdPercent``). Default unset (upstream's strategy uses 110)."""
    cpu_allocatable_evict_lower_percent: int | None = wire(
        "cpuAllocatableEvictLowerPercent", Int(0)
    )
    """Allocatable CPU eviction stops at this percent, ≥ 0
    (``cpuAllocatableEvictLowerPercent``). Default unset (100)."""
    memory_allocatable_evict_threshold_percent: int | None = wire(
        "memoryAllocatableEvictThresholdPercent", Int(0)
    )
    """As the CPU one, for memory (``memoryAllocatableEvictThresholdPercent``). Default unset
    (110)."""
    memory_allocatable_evict_lower_percent: int | None = wire(
        "memoryAllocatableEvictLowerPercent", Int(0)
    )
    """As the CPU one, for memory (``memoryAllocatableEvictLowerPercent``). Default unset (100)."""
    allocatable_evict_priority_threshold: int | None = wire(
        "allocatableEvictPriorityThreshold", Int(*_INT32)
    )
    """Highest pod priority the allocatable evictions may touch, below koord-prod, int32
    (``allocatableEvictPriorityThreshold``). Default unset."""

    @property
    def memory_evict_lower_effective(self) -> int:
        """``memoryEvictLowerPercent``, or upstream's fallback threshold - 2 when unset."""
        if self.memory_evict_lower_percent is not None:
            return self.memory_evict_lower_percent
        return self.memory_evict_threshold_percent - 2


@frozen
class CPUBurstStrategy:
    """``spec.cpuBurstStrategy``; defaults are ``DefaultCPUBurstStrategy``."""

    policy: CPUBurstPolicy = wire("policy", Enum(CPUBurstPolicy), CPUBurstPolicy.NONE)
    """none (default), cpuBurstOnly, cfsQuotaBurstOnly or auto (``policy``)."""
    cpu_burst_percent: int = wire("cpuBurstPercent", Int(1, 10000), 1000)
    """``cpu.cfs_burst_us`` (v2 ``cpu.max.burst``) as a percent of the CPU limit, 1..10000
    (``cpuBurstPercent``). Default 1000 (``DefaultCPUBurstConfig`` in
    ``pkg/util/sloconfig``; the CRD's description says the same)."""
    cfs_quota_burst_percent: int = wire("cfsQuotaBurstPercent", Int(100), 300)
    """Ceiling of the scaled-up ``cfs_quota_us``, percent of the limit, ≥ 100
    (``cfsQuotaBurstPercent``). Default 300."""
    cfs_quota_burst_period_seconds: int = wire("cfsQuotaBurstPeriodSeconds", Int(-1), -1)
    """How long a pod may stay scaled up, seconds, -1 = unlimited
    (``cfsQuotaBurstPeriodSeconds``). Default -1."""
    share_pool_threshold_percent: int = wire("sharePoolThresholdPercent", Int(0, 100), 50)
    """Share-pool CPU usage percent above which quotas scale back down, 0..100
    (``sharePoolThresholdPercent``). Default 50."""


@frozen
class SystemStrategy:
    """``spec.systemStrategy``: node-wide kernel settings; defaults are ``DefaultSystemStrategy``
    (every knob unset, meaning left alone; ``totalNetworkBandwidth`` "0").

    That is ``DefaultSystemStrategy`` in ``pkg/util/sloconfig/nodeslo_config.go`` at the version
    of our CRDs (commit a7a1b76), whose ``SystemStrategy`` type documents each knob "Unset by
    default" (``apis/slo/v1alpha1/nodeslo_types.go``; the NodeSLO CRD's descriptions, checked by
    ``tests/unit/test_slo_strategies.py``). Releases before that set ``minFreeKbytesFactor``
    100, ``watermarkScaleFactor`` 150 and ``memcgReapBackGround`` 0 there (e.g. commit 949aa79);
    upstream now only recommends 100 and 150, and so do we: set them in the NodeSLO (through
    the ``system-config`` of slo-controller-config) to have them."""

    min_free_kbytes_factor: int | None = wire("minFreeKbytesFactor", Int(1))
    """``vm.min_free_kbytes`` = factor * total memory (KiB) / 10000, > 0
    (``minFreeKbytesFactor``). Default unset; recommended 100."""
    watermark_scale_factor: int | None = wire("watermarkScaleFactor", Int(1, 400))
    """``vm.watermark_scale_factor``, 1..400 (``watermarkScaleFactor``). Default unset;
    recommended 150."""
    memcg_reap_background: int | None = wire("memcgReapBackGround", Int(0, 1))
    """``/sys/kernel/mm/memcg_reaper/reap_background``, 0..1 (``memcgReapBackGround``).
    Default unset."""
    page_cache_limit_enabled: int | None = wire("pageCacheLimitEnabled", Int(0, 1))
    """``/sys/kernel/mm/pagecache_limit/enabled``, 0..1 (``pageCacheLimitEnabled``).
    Default unset."""
    sched_group_identity_enabled: int | None = wire("schedGroupIdentityEnabled", Int(0, 1))
    """``kernel.sched_group_identity_enabled``, 0..1 (``schedGroupIdentityEnabled``).
    Default unset."""
    sched_idle_saver_wmark: int | None = wire("schedIdleSaverWmark", Int())
    """``kernel.sched_idle_saver_wmark``, ns (``schedIdleSaverWmark``). Default unset."""
    sched_features: Mapping[str, bool] | None = wire("schedFeatures", BoolMap())
    """Extra ``/sys/kernel/sched_features`` switches, name → on (``schedFeatures``); merged key
    by key. Default unset."""
    total_network_bandwidth: int | str = wire(
        "totalNetworkBandwidth", IntOrString(quantity=True), "0"
    )
    """Node network bandwidth, a quantity in Mbps; "0" means read the NIC speed
    (``totalNetworkBandwidth``). Default "0"."""

    def __hash__(self) -> int:  # the read-only mapping field is not hashable itself
        features = tuple(sorted((self.sched_features or {}).items()))
        return hash((self.min_free_kbytes_factor, self.watermark_scale_factor, features))


DEFAULT_RESOURCE_THRESHOLD_STRATEGY = ResourceThresholdStrategy()
"""Koordinator's ``DefaultResourceThresholdStrategy``."""
DEFAULT_CPU_BURST_STRATEGY = CPUBurstStrategy()
"""Koordinator's ``DefaultCPUBurstStrategy``."""
DEFAULT_SYSTEM_STRATEGY = SystemStrategy()
"""Koordinator's ``DefaultSystemStrategy`` (only ``totalNetworkBandwidth`` "0"; see
:class:`SystemStrategy` for the older releases that set the watermarks)."""

parse_resource_threshold_strategy = parser(
    ResourceThresholdStrategy, DEFAULT_RESOURCE_THRESHOLD_STRATEGY, "resourceUsedThresholdWithBE"
)
parse_cpu_burst_strategy = parser(CPUBurstStrategy, DEFAULT_CPU_BURST_STRATEGY, "cpuBurstStrategy")
parse_system_strategy = parser(SystemStrategy, DEFAULT_SYSTEM_STRATEGY, "systemStrategy")


@frozen
class NodeSLOStrategies:
    """The four strategy groups of a NodeSLO, each complete (defaults filled in)."""

    resource_used_threshold_with_be: ResourceThresholdStrategy = DEFAULT_RESOURCE_THRESHOLD_STRATEGY
    """``resourceUsedThresholdWithBE``."""
    resource_qos_strategy: ResourceQOSStrategy = DEFAULT_RESOURCE_QOS_STRATEGY
    """``resourceQOSStrategy``."""
    cpu_burst_strategy: CPUBurstStrategy = DEFAULT_CPU_BURST_STRATEGY
    """``cpuBurstStrategy``."""
    system_strategy: SystemStrategy = DEFAULT_SYSTEM_STRATEGY
    """``systemStrategy``."""


Section = ResourceThresholdStrategy | ResourceQOSStrategy | CPUBurstStrategy | SystemStrategy
"""The typed value of one strategy section."""

SECTIONS: Mapping[str, str] = MappingProxyType(
    {
        "resourceUsedThresholdWithBE": "resource_used_threshold_with_be",
        "resourceQOSStrategy": "resource_qos_strategy",
        "cpuBurstStrategy": "cpu_burst_strategy",
        "systemStrategy": "system_strategy",
    }
)
"""The four strategy sections: JSON name (``spec.<name>``) → attribute of
:class:`NodeSLOStrategies`."""

_PARSERS: Mapping[str, SectionParser[Any]] = MappingProxyType(
    {
        "resourceUsedThresholdWithBE": parse_resource_threshold_strategy,
        "resourceQOSStrategy": parse_resource_qos_strategy,
        "cpuBurstStrategy": parse_cpu_burst_strategy,
        "systemStrategy": parse_system_strategy,
    }
)


def parse_section(
    section: str,
    raw: object,
    *,
    path: str | None = None,
    source: str = "",
    strict: bool = True,
    clear_disabled: bool = True,
) -> Section:
    """One strategy section (``section`` is its JSON name, a key of :data:`SECTIONS`) read from
    its raw JSON over Koordinator's defaults; absent (``None``) is the defaults. With
    ``clear_disabled`` a disabled CPU, resctrl or memory QoS of LSR/LS/BE takes the disabled
    values, as upstream's koordlet does. Raises :class:`apis.slo.SchemaError` naming ``path``
    (default ``spec.<section>``) and the field."""
    value = _PARSERS[section](
        raw, path=f"spec.{section}" if path is None else path, source=source, strict=strict
    )
    if clear_disabled and isinstance(value, ResourceQOSStrategy):
        return value.with_disabled_parts_cleared()
    return value  # type: ignore[no-any-return]


def strategies_of(
    spec: NodeSLOSpec, *, source: str = "", strict: bool = True, clear_disabled: bool = True
) -> NodeSLOStrategies:
    """The four sections of ``spec`` merged over Koordinator's defaults field by field (see
    :func:`parse_section`); the first bad value raises :class:`apis.slo.SchemaError`. The koordlet
    reads NodeSLOs through :func:`apis.slo_inforce.node_slo_in_force`, which keeps the last good
    value of each section instead."""
    sections: dict[str, Any] = {
        attr: parse_section(
            key,
            thaw(getattr(spec, attr)),
            source=source,
            strict=strict,
            clear_disabled=clear_disabled,
        )
        for key, attr in SECTIONS.items()
    }
    return NodeSLOStrategies(**sections)


def to_json(
    value: NodeSLOStrategies
    | ResourceThresholdStrategy
    | ResourceQOSStrategy
    | CPUBurstStrategy
    | SystemStrategy,
) -> dict[str, Any]:
    """camelCase JSON of one strategy group, or of all four as a NodeSLO ``spec`` fragment."""
    if isinstance(value, NodeSLOStrategies):
        return {key: dump_object(getattr(value, attr)) for key, attr in SECTIONS.items()}
    return dump_object(value)


def spec_json(strategies: NodeSLOStrategies, spec: NodeSLOSpec | None = None) -> NodeSLOSpecJSON:
    """A full NodeSLO ``spec``: the four groups of ``strategies`` plus the host applications and
    extensions of ``spec`` (for the manager to render)."""
    out: dict[str, Any] = dict(spec.to_json()) if spec is not None else {}
    out.update(to_json(strategies))
    return out  # type: ignore[return-value]
