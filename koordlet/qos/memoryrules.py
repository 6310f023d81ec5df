"""Memory eviction's rules: the ``resourceUsedThresholdWithBE`` fields it reads, upstream's config
checks, the usage arithmetic and the BE victims' order (``koordlet.qos.memoryevict`` runs them;
docs/qos-eviction.md has the tables).

Upstream: ``qosmanager/plugins/memoryevict`` (``generateConfigCheck``,
``isAllocatableThresholdConfigValid``, the BE sort of ``killAndEvictBEPods``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from apis.priority import PRIORITY_MID_VALUE_MAX
from apis.records import frozen
from apis.slo_strategies import ResourceThresholdStrategy
from koordlet.qos.evicttask import Candidate, ResourceList
from koordlet.qos.shared import InvalidThreshold

MEMORY_RELEASE_BUFFER_PERCENT = 2
"""``memoryEvictLowerPercent`` when unset: the threshold minus this (upstream's constant)."""


# Settings ------------------------------------------------------------------------------------


@frozen
class MemoryEvictSettings:
    """The ``resourceUsedThresholdWithBE`` fields memory eviction reads, merged over defaults."""

    enabled: bool
    """``enable``: false disables every task (upstream's ``IsFeatureDisabled``)."""
    threshold: int | None
    """``memoryEvictThresholdPercent`` (default 70)."""
    lower: int | None
    """``memoryEvictLowerPercent``; None: threshold - 2."""
    evict_enabled_priority_threshold: int | None
    """``evictEnabledPriorityThreshold`` (the MemoryEvict task)."""
    allocatable_threshold: int | None
    """``memoryAllocatableEvictThresholdPercent``."""
    allocatable_lower: int | None
    """``memoryAllocatableEvictLowerPercent``; required by the allocatable task."""
    allocatable_priority_threshold: int | None
    """``allocatableEvictPriorityThreshold``."""


def settings_of(t: ResourceThresholdStrategy) -> MemoryEvictSettings:
    """The fields memory eviction reads of ``resourceUsedThresholdWithBE`` in force."""
    return MemoryEvictSettings(
        enabled=t.enable,
        threshold=t.memory_evict_threshold_percent,
        lower=t.memory_evict_lower_percent,
        evict_enabled_priority_threshold=t.evict_enabled_priority_threshold,
        allocatable_threshold=t.memory_allocatable_evict_threshold_percent,
        allocatable_lower=t.memory_allocatable_evict_lower_percent,
        allocatable_priority_threshold=t.allocatable_evict_priority_threshold,
    )


def used_thresholds(threshold: int | None, lower: int | None) -> tuple[int, int]:
    """``(threshold, lower)`` percent, upstream's ``generateConfigCheck``: the threshold is set
    and not negative; the lower bound defaults to threshold - 2 and must stay below it."""
    if threshold is None:
        raise InvalidThreshold("threshold percent is nil")
    if threshold < 0:
        raise InvalidThreshold(f"threshold percent({threshold}) should equal or greater than 0")
    low = threshold - MEMORY_RELEASE_BUFFER_PERCENT if lower is None else lower
    if low >= threshold:
        raise InvalidThreshold(
            f"lower percent({low}) should less than threshold percent({threshold})"
        )
    return threshold, low


def priority_threshold(s: MemoryEvictSettings) -> int:
    """``evictEnabledPriorityThreshold``, required by the MemoryEvict task."""
    if s.evict_enabled_priority_threshold is None:
        raise InvalidThreshold("EvictEnabledPriorityThreshold not config")
    return s.evict_enabled_priority_threshold


def allocatable_thresholds(s: MemoryEvictSettings) -> tuple[int, int, int]:
    """``(threshold, lower, priority threshold)`` of the allocatable task, validated as upstream's
    ``isAllocatableThresholdConfigValid``. A missing ``memoryAllocatableEvictLowerPercent`` is
    refused: upstream's task dereferences it (a missing one stops upstream's koordlet), so it is
    no config a cluster can run with."""
    if s.allocatable_threshold is None:
        raise InvalidThreshold("MemoryAllocatableEvictThresholdPercent not config")
    if s.allocatable_threshold < 0:
        raise InvalidThreshold(
            f"threshold percent({s.allocatable_threshold}) should greater than 0"
        )
    if s.allocatable_lower is None:
        raise InvalidThreshold("MemoryAllocatableEvictLowerPercent not config")
    if s.allocatable_lower >= s.allocatable_threshold:
        raise InvalidThreshold(
            f"lower percent({s.allocatable_lower}) should less than threshold "
            f"percent({s.allocatable_threshold})"
        )
    if s.allocatable_priority_threshold is None:
        raise InvalidThreshold("AllocatableEvictPriorityThreshold not config")
    if s.allocatable_priority_threshold > PRIORITY_MID_VALUE_MAX:
        raise InvalidThreshold(
            f"priorityThresholdPercent({s.allocatable_priority_threshold}) should less than "
            f"{PRIORITY_MID_VALUE_MAX}, koor-prod pods should not be killed"
        )
    return s.allocatable_threshold, s.allocatable_lower, s.allocatable_priority_threshold


# Arithmetic ----------------------------------------------------------------------------------


def usage_percent(used: float, capacity: int) -> int:
    """Node usage as upstream computes it: ``int64(used) * 100 / capacity``, floored."""
    return int(used) * 100 // capacity


def release_by_used(used: float, capacity: int, threshold: int, lower: int) -> int:
    """Bytes to release: 0 below the threshold, else ``capacity * (usage% - lower%) // 100``."""
    if capacity <= 0:
        return 0
    pct = usage_percent(used, capacity)
    if pct < threshold:
        return 0
    return capacity * (pct - lower) // 100


# Candidates and their order ------------------------------------------------------------------


def _compare_be(a: Candidate, b: Candidate) -> int:
    """Upstream's BE order: lower ``spec.priority`` first when both have one and they differ;
    then larger usage first when both are known; both unknown: name descending; a known usage
    before an unknown one."""
    pa, pb = a.pod.priority, b.pod.priority
    if pa is not None and pb is not None and pa != pb:
        return -1 if pa < pb else 1
    if a.used and b.used:
        return (a.used < b.used) - (a.used > b.used)
    if not a.used and not b.used:
        return (a.pod.name < b.pod.name) - (a.pod.name > b.pod.name)
    return -1 if a.used else 1


def order_be(candidates: Iterable[Candidate]) -> list[Candidate]:
    """BE pods in Koordinator's memory-eviction order (see :func:`_compare_be`)."""
    return sorted(candidates, key=functools.cmp_to_key(_compare_be))


def used_release(c: Candidate) -> ResourceList:
    """What a victim of a usage task releases: its memory usage."""
    return {"memory": c.used}
