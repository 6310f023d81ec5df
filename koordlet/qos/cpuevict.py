"""CPU eviction: evict pods when BE is starved of CPU, or the node's CPU is over a threshold.

Koordinator's ``cpuevict`` plugin, re-implemented. Each round builds up to three tasks, in
upstream's order, and hands their victims to the evictor:

1. ``BECPUEvict`` (the table's gate), **BE satisfaction**. Over the window
   (``cpuEvictTimeWindowSeconds``, at least the collection interval) the averages of BE CPU
   usage, request and real limit (``be_cpu_usage``, ``be_cpu_request``,
   ``be_cpu_real_limit``, in milli-cores) decide, and only when the window is covered: the
   fewest samples of the three times the collection interval must reach a third of the window
   (:func:`window_covered`). Then, when BE usage / limit is at least
   ``cpuEvictBEUsageThresholdPercent`` (default 90; a limit under one core always passes) and
   satisfaction = limit / request is at most ``cpuEvictBESatisfactionLowerPercent``, release
   ``request * (upper% - satisfaction)`` milli-cores of BE requests. The same check on the
   newest samples (within two intervals) must agree, and the smaller release wins. With
   ``cpuEvictPolicy: evictByAllocatable`` the limit is BE's allocatable instead. Victims: BE
   pods, lower ``spec.priority`` first, then higher usage / request.
2. ``CPUAllocatableEvict`` (gate of that name): CPU requests of pods with priority ≤
   ``allocatableEvictPriorityThreshold`` above ``cpuAllocatableEvictThresholdPercent`` of the
   allocatable release down to ``cpuAllocatableEvictLowerPercent``.
3. ``CPUEvict`` (gate of that name): node CPU usage averaged over the window, as an integer
   percent of capacity, at or above ``cpuEvictThresholdPercent`` releases
   ``capacity * (usage% - lower%) // 100`` (lower: ``cpuEvictLowerPercent`` or threshold - 2),
   over opted-in pods with priority ≤ ``evictEnabledPriorityThreshold``, by priority then usage.

Cool-down: ``cpu_evict_cool_time`` seconds (``--cpu-evict-cool-time-seconds``, 20) after a round
that evicted; as upstream, the cool-down also runs from start-up, so nothing is evicted in the
first 20 s. Stale inputs (the window's newest sample older than twice the collection interval)
skip the round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from apis.extension import QoSClass
from apis.priority import PRIORITY_MID_VALUE_MAX
from apis.slo_strategies import CPUEvictPolicy, ResourceThresholdStrategy
from koordlet.features import gate_enabled
from koordlet.metriccache import series
from koordlet.qos.evictor import (
    EVICT_REASON_PREFIX,
    LABEL_EVICTION_ENABLED,
    REASON_BE_CPU_SATISFACTION,
    Outcome,
    Victim,
    order_by_priority,
)
from koordlet.qos.evictor import pick_victims as pick
from koordlet.qos.framework import StrategyContext, StrategyReport
from koordlet.qos.shared import InvalidThreshold, eviction_policy_allowed
from koordlet.statesinformer.model import PodInfo

logger = logging.getLogger(__name__)

NAME = "cpuevict"
FEATURE_GATE = "BECPUEvict"
"""The table gate (Koordinator's ``BECPUEvict``)."""
FEATURE_CPU_EVICT = "CPUEvict"
FEATURE_ALLOCATABLE_EVICT = "CPUAllocatableEvict"
REASON_CPU_USAGE = "EvictPodByNodeCPUUsage"
"""Metric reason of the used-threshold and allocatable tasks."""
BE_SATISFACTION_LOWER_MAX = 60
"""``cpuEvictBESatisfactionLowerPercent`` must be in (0, 60]."""
BE_SATISFACTION_UPPER_MAX = 100
"""``cpuEvictBESatisfactionUpperPercent`` must be in (0, 100)."""
BE_USAGE_THRESHOLD_DEFAULT = 90
"""``cpuEvictBEUsageThresholdPercent`` when unset."""
CPU_RELEASE_BUFFER_PERCENT = 2
"""``cpuEvictLowerPercent`` when unset: the threshold minus this."""
MIN_BATCH_ALLOCATABLE_MILLI = 1
"""A zero BE allocatable counts as this, so satisfaction can still be computed."""
DEFAULT_INTERVAL = 1.0
"""Seconds between rounds (``--cpu-evict-interval-seconds``)."""


# Settings ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CPUEvictSettings:
    """The ``resourceUsedThresholdWithBE`` fields CPU eviction reads, merged over defaults."""

    enabled: bool
    satisfaction_lower: int | None
    satisfaction_upper: int | None
    be_usage_threshold: int | None
    threshold: int | None
    lower: int | None
    window: int | None
    by_allocatable: bool
    """``cpuEvictPolicy: evictByAllocatable``."""
    evict_enabled_priority_threshold: int | None
    allocatable_threshold: int | None
    allocatable_lower: int | None
    allocatable_priority_threshold: int | None


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
    """``(lower, upper)`` validated as upstream: lower in (0, 60], upper in (0, 100), upper ≥
    lower."""
    if lower is None or upper is None:
        raise InvalidThreshold("cpuEvictBESatisfactionLower/UpperPercent not set")
    if not 0 < lower <= BE_SATISFACTION_LOWER_MAX:
        raise InvalidThreshold(f"cpuEvictBESatisfactionLowerPercent {lower} not in (0, 60]")
    if not 0 < upper < BE_SATISFACTION_UPPER_MAX:
        raise InvalidThreshold(f"cpuEvictBESatisfactionUpperPercent {upper} not in (0, 100)")
    if upper < lower:
        raise InvalidThreshold(f"cpuEvictBESatisfactionUpperPercent {upper} < lower {lower}")
    return lower, upper


# Arithmetic ----------------------------------------------------------------------------------


def window_seconds(collect_interval: float, configured: int | None) -> int:
    """The averaging window: the collection interval (whole seconds), or the configured
    ``cpuEvictTimeWindowSeconds`` when larger."""
    window = int(collect_interval)
    return configured if configured is not None and configured > window else window


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


def release_by_used(used_cores: float, capacity_milli: int, threshold: int, lower: int) -> int:
    """Milli-cores to release: ``int(used * 1000) * 100 // capacity`` percent at or above the
    threshold releases ``capacity * (pct - lower) // 100``."""
    if capacity_milli <= 0:
        return 0
    pct = int(used_cores * 1000) * 100 // capacity_milli
    if pct < threshold:
        return 0
    return capacity_milli * (pct - lower) // 100


def release_by_allocatable(requested: int, allocatable: int, threshold: int, lower: int) -> int:
    """Milli-cores of requests to release above ``threshold``% of the allocatable, down to
    ``lower``%: ``int(requested - lower/100 * allocatable)``; every request without an
    allocatable."""
    if threshold < 0 or requested <= 0:
        return 0
    if allocatable <= 0:
        return requested
    if requested / allocatable <= threshold / 100:
        return 0
    return int(requested - lower / 100 * allocatable)


# Candidates ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    pod: PodInfo
    used: int = 0
    """Milli-cores used (``pod_cpu_usage``); 0 when unknown."""
    request: int = 0
    """Milli-cores requested; 0 when unknown."""

    @property
    def key(self) -> str:
        return f"pod/{self.pod.uid}"

    @property
    def usage_ratio(self) -> float:
        """used / request; 0 without a request."""
        return self.used / self.request if self.request > 0 else 0.0


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


# The strategy --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Task:
    feature: str
    reason: str
    need: int
    victims: list[Candidate]
    by: str


class _Stale(Exception):
    """The round's inputs are stale; the message says which."""


class CPUEvict:
    """The CPU eviction strategy (see the module docstring).

    :param capacity_milli: node CPU capacity in milli-cores; None: the node info in the cache.
    :param be_allocatable_milli: BE (batch) CPU allocatable for ``evictByAllocatable``; None:
        unknown (that policy then skips, as upstream does without a node).
    :param allocatable_milli: node CPU allocatable for the allocatable task; None: the capacity.
    """

    name = NAME

    def __init__(
        self,
        ctx: StrategyContext,
        interval: float = DEFAULT_INTERVAL,
        *,
        capacity_milli: Callable[[], int | None] | None = None,
        be_allocatable_milli: Callable[[], int | None] | None = None,
        allocatable_milli: Callable[[], int | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        self.interval = interval
        self.cool_time = ctx.config.qos.cpu_evict_cool_time
        self._capacity_fn = capacity_milli
        self._be_allocatable_fn = be_allocatable_milli
        self._allocatable_fn = allocatable_milli
        self._clock = clock
        self._last_evict = clock()  # upstream starts the cool-down at start-up
        self._lock = asyncio.Lock()
        self._settings_of: tuple[ResourceThresholdStrategy, CPUEvictSettings] | None = None

    async def reconcile(self) -> None:
        async with self._lock:
            await self._round()

    async def _round(self) -> list[Outcome]:
        ctx, name = self.ctx, self.name
        now = self._clock()
        if now - self._last_evict < self.cool_time:
            left = self.cool_time - (now - self._last_evict)
            ctx.report(name, StrategyReport({}, f"cool-down, {left:.1f}s left"))
            return []
        section = ctx.node_slo().resource_used_threshold_with_be
        if self._settings_of is None or self._settings_of[0] is not section:
            self._settings_of = (section, settings_of(section))
        s = self._settings_of[1]
        if not s.enabled:
            ctx.report(name, StrategyReport({}, "disabled in NodeSLO"))
            return []
        inputs: dict[str, Any] = {}
        pending = ctx.evictor.recent_keys() if ctx.evictor is not None else frozenset()
        pods = list(ctx.workloads().pods.values())
        features = [FEATURE_GATE] + [
            f for f in (FEATURE_ALLOCATABLE_EVICT, FEATURE_CPU_EVICT) if gate_enabled(ctx.config, f)
        ]
        tasks: list[_Task] = []
        taken: set[str] = set()
        try:
            for feature in features:
                try:
                    task = self._task(feature, s, pods, pending, frozenset(taken), inputs)
                except InvalidThreshold as err:
                    inputs[f"{feature}_skipped"] = str(err)
                    continue
                if task is not None:
                    tasks.append(task)
                    taken.update(c.key for c in task.victims)
        except _Stale as err:
            ctx.stale(name, str(err))
            ctx.report(name, StrategyReport(inputs, "skip: stale inputs", stale=True))
            return []
        detail = {
            t.feature: {"need_milli": t.need, "victims": [c.key for c in t.victims]} for t in tasks
        }
        victims = [(t, c) for t in tasks for c in t.victims]
        if not victims:
            decision = "nothing to do" if not tasks else "no victim left to evict"
            ctx.report(name, StrategyReport(inputs, decision, detail=detail))
            return []
        outcomes: list[Outcome] = []
        if ctx.evictor is None:
            logger.warning("%s: no evictor; %d victims not evicted", name, len(victims))
        else:
            for t in tasks:
                outcomes += await ctx.evictor.evict(
                    [self._victim(t, c) for c in t.victims],
                    strategy=name,
                    reason=t.reason,
                    dry_run=ctx.dry_run(name),
                )
        if any(o.status in ("evicted", "dry_run") for o in outcomes):
            self._last_evict = self._clock()
        counts: dict[str, int] = {}
        for o in outcomes:
            counts[o.status] = counts.get(o.status, 0) + 1
        result = ", ".join(f"{n} {st}" for st, n in counts.items())
        ctx.report(
            name, StrategyReport(inputs, f"evict {len(victims)} pods", result, detail=detail)
        )
        return outcomes

    @staticmethod
    def _victim(t: _Task, c: Candidate) -> Victim:
        value = c.used if t.by == "used" else c.request
        what = "used" if t.by == "used" else "requested"
        return Victim.of_pod(
            c.pod,
            f"{EVICT_REASON_PREFIX}{t.feature}: release {t.need} milli-cores; {what} {value}m, "
            f"priority {c.pod.priority}",
            release=value,
        )

    def _task(
        self,
        feature: str,
        s: CPUEvictSettings,
        pods: list[PodInfo],
        pending: frozenset[str],
        taken: frozenset[str],
        inputs: dict[str, Any],
    ) -> _Task | None:
        if feature == FEATURE_GATE:
            need = self._be_satisfaction_release(s, inputs)
            if need <= 0:
                return None
            cands = [
                Candidate(p, self._pod_used(p), p.cpu_request_milli or 0)
                for p in pods
                if p.qos is QoSClass.BE and eviction_policy_allowed(p, feature)
            ]
            picks, _ = pick(order_be(cands), need, lambda c: c.request, pending, taken)
            return _Task(feature, REASON_BE_CPU_SATISFACTION, need, picks, "request")
        if feature == FEATURE_ALLOCATABLE_EVICT:
            if s.allocatable_threshold is None or s.allocatable_threshold < 0:
                raise InvalidThreshold("cpuAllocatableEvictThresholdPercent not set")
            if s.allocatable_lower is None or s.allocatable_lower >= s.allocatable_threshold:
                raise InvalidThreshold("cpuAllocatableEvictLowerPercent not set or not below")
            prio_max = s.allocatable_priority_threshold
            if prio_max is None or prio_max > PRIORITY_MID_VALUE_MAX:
                raise InvalidThreshold("allocatableEvictPriorityThreshold unset or koord-prod")
            eligible = [p for p in pods if p.priority is not None and p.priority <= prio_max]
            requested = sum(p.cpu_request_milli or 0 for p in eligible)
            allocatable = (self._allocatable_fn or self.capacity_milli)() or 0
            need = release_by_allocatable(
                requested, allocatable, s.allocatable_threshold, s.allocatable_lower
            )
            inputs[feature] = {"requested_milli": requested, "allocatable_milli": allocatable}
            if need <= 0:
                return None
            cands = [
                Candidate(p, self._pod_used(p), p.cpu_request_milli or 0)
                for p in _opted_in(eligible, feature)
            ]
            ordered = order_by_priority(cands, "request")
            picks, _ = pick(ordered, need, lambda c: c.request, pending, taken)
            return _Task(feature, REASON_CPU_USAGE, need, picks, "request")
        # CPUEvict: node usage over the window
        if s.threshold is None or s.threshold < 0:
            raise InvalidThreshold("cpuEvictThresholdPercent not set")
        lower = s.threshold - CPU_RELEASE_BUFFER_PERCENT if s.lower is None else s.lower
        if lower >= s.threshold:
            raise InvalidThreshold(f"cpuEvictLowerPercent {lower} not below the threshold")
        prio_max = s.evict_enabled_priority_threshold
        if prio_max is None:
            raise InvalidThreshold("evictEnabledPriorityThreshold not set")
        window = window_seconds(self.ctx.collect_interval, s.window)
        agg = self.ctx.fresh_aggregate(series.NODE_CPU_USAGE, series.NODE, window)
        if agg is None:
            raise _Stale(f"{series.NODE_CPU_USAGE}/{series.NODE} stale or absent")
        capacity = self.capacity_milli() or 0
        need = release_by_used(agg.avg, capacity, s.threshold, lower)
        inputs[feature] = {"node_cpu_avg": agg.avg, "capacity_milli": capacity, "window": window}
        if need <= 0:
            return None
        eligible = [p for p in pods if p.priority is not None and p.priority <= prio_max]
        cands = []
        for p in _opted_in(eligible, feature):
            used = self.ctx.fresh_last(series.POD_CPU_USAGE, series.pod_entity(p.uid))
            if used is not None:  # upstream skips pods without a metric here
                cands.append(Candidate(p, int(used * 1000), p.cpu_request_milli or 0))
        picks, _ = pick(order_by_priority(cands, "used"), need, lambda c: c.used, pending, taken)
        return _Task(feature, REASON_CPU_USAGE, need, picks, "used")

    def _be_satisfaction_release(self, s: CPUEvictSettings, inputs: dict[str, Any]) -> int:
        ctx = self.ctx
        lower, upper = satisfaction_bounds(s.satisfaction_lower, s.satisfaction_upper)
        window = window_seconds(ctx.collect_interval, s.window)
        aggs = {}
        for metric in (series.BE_CPU_USAGE, series.BE_CPU_REQUEST, series.BE_CPU_REAL_LIMIT):
            agg = ctx.fresh_aggregate(metric, series.BE, window)
            if agg is None:
                raise _Stale(f"{metric}/{series.BE} stale or absent")
            aggs[metric] = agg
        count = min(a.count for a in aggs.values())
        avg_usage = aggs[series.BE_CPU_USAGE].avg * 1000
        avg_request = aggs[series.BE_CPU_REQUEST].avg * 1000
        avg_limit = aggs[series.BE_CPU_REAL_LIMIT].avg * 1000
        cur_usage = aggs[series.BE_CPU_USAGE].last * 1000
        cur_request = aggs[series.BE_CPU_REQUEST].last * 1000
        cur_limit = aggs[series.BE_CPU_REAL_LIMIT].last * 1000
        be_allocatable: float | None = None
        if s.by_allocatable:
            raw = self._be_allocatable_fn() if self._be_allocatable_fn is not None else None
            be_allocatable = -1 if raw is None or raw < 0 else max(raw, MIN_BATCH_ALLOCATABLE_MILLI)
            avg_limit = cur_limit = be_allocatable
        inputs[FEATURE_GATE] = {
            "window": window,
            "samples": count,
            "avg_milli": {"usage": avg_usage, "request": avg_request, "limit": avg_limit},
            "current_milli": {"usage": cur_usage, "request": cur_request, "limit": cur_limit},
            "be_allocatable_milli": be_allocatable,
        }
        if not window_covered(window, ctx.collect_interval, count):
            inputs[FEATURE_GATE]["skipped"] = "window not covered"
            return 0
        if not be_usage_high_enough(avg_usage, avg_limit, s.be_usage_threshold):
            return 0
        release = release_by_satisfaction(avg_request, avg_limit, lower, upper)
        if release <= 0:
            return 0
        if not be_usage_high_enough(cur_usage, cur_limit, s.be_usage_threshold):
            return 0
        if cur_request == avg_request and cur_limit == avg_limit:
            return release
        current = release_by_satisfaction(cur_request, cur_limit, lower, upper)
        if current <= 0:
            return 0
        return min(release, current)

    def _pod_used(self, p: PodInfo) -> int:
        used = self.ctx.fresh_last(series.POD_CPU_USAGE, series.pod_entity(p.uid))
        return 0 if used is None else int(used * 1000)

    def capacity_milli(self) -> int | None:
        """Node CPU capacity in milli-cores (the node info's CPU count), or None."""
        if self._capacity_fn is not None:
            return self._capacity_fn()
        info = self.ctx.cache.get_info("node_info")
        if isinstance(info, Mapping):
            total = info.get("total")
            if isinstance(total, Mapping) and isinstance(total.get("cpus"), int):
                return int(total["cpus"]) * 1000
        return None

    def describe(self) -> dict[str, Any]:
        return {"last_evict": self._last_evict, "cool_time": self.cool_time}


def _opted_in(pods: Iterable[PodInfo], feature: str) -> list[PodInfo]:
    return [
        p
        for p in pods
        if p.labels.get(LABEL_EVICTION_ENABLED) == "true" and eviction_policy_allowed(p, feature)
    ]


def build(ctx: StrategyContext, interval: float) -> CPUEvict:
    """Table factory."""
    return CPUEvict(ctx, interval)
