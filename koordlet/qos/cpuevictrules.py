"""CPU eviction's rules: the ``resourceUsedThresholdWithBE`` fields it reads, upstream's config
checks, the window and BE satisfaction arithmetic, and the BE victims' order
(:mod:`koordlet.qos.cpuevict` runs them; docs/qos-eviction.md has the tables).

Upstream: ``qosmanager/plugins/cpuevict`` (``isSatisfactionConfigValid``,
``isUsedThresholdConfigValid``, ``isAllocatableThresholdConfigValid``,
``calculateMilliReleaseByBESatisfaction``, the BE sort of its victims).
"""

from __future__ import annotations

from collections.abc import Iterable

from apis.priority import PRIORITY_MID_VALUE_MAX
from apis.records import frozen
from apis.slo_strategies import CPUEvictPolicy, ResourceThresholdStrategy
from koordlet.qos.evicttask import Candidate
from koordlet.qos.shared import InvalidThreshold

BE_SATISFACTION_LOWER_MAX = 60
"""``cpuEvictBESatisfactionLowerPercent`` must be in (0, 60]."""
BE_SATISFACTION_UPPER_MAX = 100
"""``cpuEvictBESatisfactionUpperPercent`` must be in (0, 100)."""
BE_USAGE_THRESHOLD_DEFAULT = 90
"""``cpuEvictBEUsageThresholdPercent`` when unset."""
CPU_RELEASE_BUFFER_PERCENT = 2
"""``cpuEvictLowerPercent`` when unset: the threshold minus this."""


# Settings ------------------------------------------------------------------------------------


@frozen
class CPUEvictSettings:
    """The ``resourceUsedThresholdWithBE`` fields CPU eviction reads, merged over defaults."""

    enabled: bool
    """``enable``: false disables every task."""
    satisfaction_lower: int | None
    """``cpuEvictBESatisfactionLowerPercent``."""
    satisfaction_upper: int | None
    """``cpuEvictBESatisfactionUpperPercent``."""
    be_usage_threshold: int | None
    """``cpuEvictBEUsageThresholdPercent``; None: 90."""
    threshold: int | None
    """``cpuEvictThresholdPercent`` (the CPUEvict task)."""
    lower: int | None
    """``cpuEvictLowerPercent``; None: threshold - 2."""
    window: int | None
    """``cpuEvictTimeWindowSeconds``."""
    by_allocatable: bool
    """``cpuEvictPolicy: evictByAllocatable``."""
    evict_enabled_priority_threshold: int | None
    """``evictEnabledPriorityThreshold`` (the CPUEvict task)."""
    allocatable_threshold: int | None
    """``cpuAllocatableEvictThresholdPercent``."""
    allocatable_lower: int | None
    """``cpuAllocatableEvictLowerPercent``; None: 0."""
    allocatable_priority_threshold: int | None
    """``allocatableEvictPriorityThreshold``."""


def settings_of(t: ResourceThresholdStrategy) -> CPUEvictSettings:
    """The fields CPU eviction reads of ``resourceUsedThresholdWithBE`` in force."""
    return CPUEvictSettings(
        enabled=t.enable,
        satisfaction_lower=t.cpu_evict_be_satisfaction_lower_percent,
        satisfaction_upper=t.cpu_evict_be_satisfaction_upper_percent,
        be_usage_threshold=t.cpu_evict_be_usage_threshold_percent,
        threshold=t.cpu_evict_threshold_percent,
        lower=t.cpu_evict_lower_percent,
        window=t.cpu_evict_time_window_seconds,
        by_allocatable=t.cpu_evict_policy is CPUEvictPolicy.BY_ALLOCATABLE,
        evict_enabled_priority_threshold=t.evict_enabled_priority_threshold,
        allocatable_threshold=t.cpu_allocatable_evict_threshold_percent,
        allocatable_lower=t.cpu_allocatable_evict_lower_percent,
        allocatable_priority_threshold=t.allocatable_evict_priority_threshold,
    )


def satisfaction_bounds(lower: int | None, upper: int | None) -> tuple[int, int]:
    """``(lower, upper)`` validated as upstream's ``isSatisfactionConfigValid``: lower in (0, 60],
    upper in (0, 100), upper ≥ lower."""
    if lower is None or upper is None:
        raise InvalidThreshold(
            "CPUEvictBESatisfactionLowerPercent or CPUEvictBESatisfactionUpperPercent not config"
        )
    if not 0 < lower <= BE_SATISFACTION_LOWER_MAX:
        raise InvalidThreshold(
            f"CPUEvictBESatisfactionLowerPercent({lower}) is not valid! must (0,60]"
        )
    if not 0 < upper < BE_SATISFACTION_UPPER_MAX:
        raise InvalidThreshold(
            f"CPUEvictBESatisfactionUpperPercent({upper}) is not valid,must (0,100)"
        )
    if upper < lower:
        raise InvalidThreshold(
            f"CPUEvictBESatisfactionUpperPercent({upper}) < "
            f"CPUEvictBESatisfactionLowerPercent({lower})"
        )
    return lower, upper


def used_thresholds(s: CPUEvictSettings) -> tuple[int, int, int]:
    """``(threshold, lower, priority threshold)`` of the CPUEvict task, validated as upstream's
    ``isUsedThresholdConfigValid``; the lower bound defaults to the threshold minus 2."""
    if s.threshold is None:
        raise InvalidThreshold("CPUEvictThresholdPercent not config")
    if s.threshold < 0:
        raise InvalidThreshold(f"threshold percent({s.threshold}) should greater than 0")
    lower = s.threshold - CPU_RELEASE_BUFFER_PERCENT if s.lower is None else s.lower
    if lower >= s.threshold:
        raise InvalidThreshold(
            f"lower percent({lower}) should less than threshold percent({s.threshold})"
        )
    if s.evict_enabled_priority_threshold is None:
        raise InvalidThreshold("EvictEnabledPriorityThreshold not config")
    return s.threshold, lower, s.evict_enabled_priority_threshold


def allocatable_thresholds(s: CPUEvictSettings) -> tuple[int, int, int]:
    """``(threshold, lower, priority threshold)`` of the allocatable task, validated as
    upstream's ``isAllocatableThresholdConfigValid`` (``cpuevict/cpu_evict.go``), but for a
    missing ``cpuAllocatableEvictLowerPercent``: refused, as the memory task's is
    (:func:`koordlet.qos.memoryrules.allocatable_thresholds`). Upstream's check lets it pass
    (its test table: "CPUAllocatableEvictLowerPercent == nil" is valid) and its memory twin's
    task then dereferences the missing value; taken as 0 it would release every batch and mid
    request above the threshold, evicting them all. Ours: docs/qos-evict.md."""
    if s.allocatable_threshold is None:
        raise InvalidThreshold("CPUAllocatableEvictThresholdPercent not config")
    if s.allocatable_threshold < 0:
        raise InvalidThreshold(
            f"threshold percent({s.allocatable_threshold}) should equal or greater than 0"
        )
    if s.allocatable_lower is None:
        raise InvalidThreshold("CPUAllocatableEvictLowerPercent not config")
    lower = s.allocatable_lower
    if lower >= s.allocatable_threshold:
        raise InvalidThreshold(
            f"lower percent({lower}) should less than threshold percent({s.allocatable_threshold})"
        )
    if s.allocatable_priority_threshold is None:
        raise InvalidThreshold("AllocatableEvictPriorityThreshold not config")
    if s.allocatable_priority_threshold > PRIORITY_MID_VALUE_MAX:
        raise InvalidThreshold(
            f"priorityThresholdPercent({s.allocatable_priority_threshold}) should less than "
            f"{PRIORITY_MID_VALUE_MAX}, koor-prod pods should not be killed"
        )
    return s.allocatable_threshold, lower, s.allocatable_priority_threshold


# Arithmetic ----------------------------------------------------------------------------------


def window_seconds(collect_interval: float, configured: int | None) -> int:
    """The averaging window, as upstream's ``cpuEvict``: twice the collection interval (whole
    seconds), or the configured ``cpuEvictTimeWindowSeconds`` when it exceeds the interval."""
    if configured is not None and configured > int(collect_interval):
        return configured
    return int(collect_interval * 2)


def window_covered(window: int, collect_interval: float, count: int) -> bool:
    """Upstream's coverage rule: ``count * interval`` (whole seconds) must reach ``window // 3``."""
    return count * int(collect_interval) >= window // 3


def be_usage_high_enough(usage: float, limit: float, threshold: int | None) -> bool:
    """BE usage / limit (milli-cores) at or above ``threshold`` percent (default 90); a limit
    of zero or less never is, a limit under one core always is."""
    if limit <= 0:
        return False
    if limit < 1000:
        return True
    pct = BE_USAGE_THRESHOLD_DEFAULT if threshold is None else threshold
    return usage / limit >= pct / 100


def release_by_satisfaction(request: float, limit: float, lower: int, upper: int) -> int:
    """Milli-cores of BE requests to release: 0 unless satisfaction = limit / request is at most
    ``lower``%; then ``request * (upper% - satisfaction)``, truncated."""
    if request <= 0:
        return 0
    rate = limit / request
    if rate > lower / 100:
        return 0
    gap = upper / 100 - rate
    if gap <= 0:
        return 0
    return int(request * gap)


def satisfaction_release(
    avg: tuple[float, float, float],
    current: tuple[float, float, float],
    lower: int,
    upper: int,
    usage_threshold: int | None,
) -> int:
    """Milli-cores of BE requests to release from the window's averages and the newest samples,
    each ``(usage, request, limit)`` in milli-cores (upstream's
    ``calculateMilliReleaseByBESatisfaction``, after the coverage check): the averages must show
    BE using its limit and starved; the newest samples must still show it using its limit; when
    the newest request and limit equal the averages the window's release stands, else the smaller
    of the two (0 when the newest one releases nothing)."""
    avg_usage, avg_request, avg_limit = avg
    cur_usage, cur_request, cur_limit = current
    if not be_usage_high_enough(avg_usage, avg_limit, usage_threshold):
        return 0
    release = release_by_satisfaction(avg_request, avg_limit, lower, upper)
    if release <= 0:
        return 0
    if not be_usage_high_enough(cur_usage, cur_limit, usage_threshold):
        return 0
    if cur_request == avg_request and cur_limit == avg_limit:
        return release
    now = release_by_satisfaction(cur_request, cur_limit, lower, upper)
    if now <= 0:
        return 0
    return min(release, now)


def release_by_used(used_cores: float, capacity_milli: int, threshold: int, lower: int) -> int:
    """Milli-cores to release: ``int(used * 1000) * 100 // capacity`` percent at or above the
    threshold releases ``capacity * (pct - lower) // 100``."""
    if capacity_milli <= 0:
        return 0
    pct = int(used_cores * 1000) * 100 // capacity_milli
    if pct < threshold:
        return 0
    return capacity_milli * (pct - lower) // 100


# Candidates ----------------------------------------------------------------------------------


def order_be(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Upstream's BE order: when both pods have a ``spec.priority`` and they differ, the lower
    first; otherwise the higher usage / request first. Stable."""
    items = list(candidates)
    for i in range(1, len(items)):  # insertion sort: the relation is not a total order
        j = i
        while j > 0 and _be_before(items[j], items[j - 1]):
            items[j - 1], items[j] = items[j], items[j - 1]
            j -= 1
    return items


def _be_before(a: Candidate, b: Candidate) -> bool:
    pa, pb = a.pod.priority, b.pod.priority
    if pa is None or pb is None or pa == pb:
        return a.usage_ratio > b.usage_ratio
    return pa < pb
