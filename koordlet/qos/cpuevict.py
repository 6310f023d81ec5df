"""CPU eviction: evict pods when BE is starved of CPU, or the node's CPU is over a threshold.

Koordinator's ``cpuevict`` plugin, re-implemented. Each round builds up to three tasks
(:mod:`koordlet.qos.evicttask`), each under its own feature gate, in upstream's order, and one
plan serves them all (release accumulated per target, evicted-but-present pods as pending
releases, a victim taken once):

1. ``BECPUEvict``, **BE satisfaction**. Over the window (``cpuEvictTimeWindowSeconds`` when it
   exceeds the collection interval, else twice the interval) the averages of BE CPU usage,
   request and real limit (``be_cpu_usage``, ``be_cpu_request``, ``be_cpu_real_limit``, in
   milli-cores) decide, and only when the window is covered: the fewest samples of the three
   times the collection interval must reach a third of the window
   (:func:`~koordlet.qos.cpuevictrules.window_covered`). Then
   :func:`~koordlet.qos.cpuevictrules.satisfaction_release`: when BE usage / limit is at least
   ``cpuEvictBEUsageThresholdPercent`` (default 90; a limit under one core always passes) and
   satisfaction = limit / request is at most ``cpuEvictBESatisfactionLowerPercent``, release
   ``request * (upper% - satisfaction)`` milli-cores of ``batch-cpu`` requests; the newest
   samples must agree and the smaller release wins. With ``cpuEvictPolicy:
   evictByAllocatable`` the limit is the Node's ``batch-cpu`` allocatable (0 counts as 1).
   Victims: BE pods (by their ``koordinator.sh/qosClass`` label), lower ``spec.priority`` first,
   then higher usage / request.
2. ``CPUAllocatableEvict``: per priority class, the CPU requests of pods with priority at most
   ``allocatableEvictPriorityThreshold`` (``batch-cpu`` of koord-batch pods, ``mid-cpu`` of
   koord-mid pods) against the Node's allocatable of that resource: above
   ``cpuAllocatableEvictThresholdPercent`` the excess down to
   ``cpuAllocatableEvictLowerPercent`` (0 when unset) is released, batch and mid separately.
3. ``CPUEvict``: node CPU usage averaged over the window, as an integer percent of capacity, at
   or above ``cpuEvictThresholdPercent`` releases ``capacity * (usage% - lower%) // 100``
   (lower: ``cpuEvictLowerPercent`` or threshold - 2), over opted-in pods with priority at most
   ``evictEnabledPriorityThreshold``, by priority then usage.

Capacity is the Node's ``status.capacity.cpu`` in cluster mode (no round until the Node is
known, nor with a capacity of 0), the online CPUs standalone. Cool-down: ``cpu_evict_cool_time``
seconds (``--cpu-evict-cool-time-seconds``, 20) after a round that evicted; as upstream, the
cool-down also runs from start-up, so nothing is evicted in the first 20 s. Stale inputs (the
window's newest sample older than twice the collection interval) skip the round.

The settings, config checks, arithmetic and BE order are in :mod:`koordlet.qos.cpuevictrules`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from apis.extension import QoSClass
from apis.manager_keys import BATCH_CPU
from koordlet.features import gate_enabled
from koordlet.metriccache import series
from koordlet.qos.cpuevictrules import (
    CPUEvictSettings,
    allocatable_thresholds,
    order_be,
    release_by_used,
    satisfaction_bounds,
    satisfaction_release,
    settings_of,
    used_thresholds,
    window_covered,
    window_seconds,
)
from koordlet.qos.evictor import EVICT_REASON_PREFIX, REASON_BE_CPU_SATISFACTION, Outcome, Victim
from koordlet.qos.evicttask import (
    TARGET_BATCH_REQUEST,
    TARGET_USED,
    Candidate,
    EvictTask,
    Pick,
    ResourceList,
    allocatable_task,
    by_priority,
    outcome_summary,
    plan,
    plan_detail,
    priority_value_with_default,
    qos_raw,
    used_candidates,
)
from koordlet.qos.framework import StrategyContext, StrategyReport
from koordlet.qos.shared import InvalidThreshold, eviction_policy_allowed, node_resources
from koordlet.statesinformer.model import PodInfo

logger = logging.getLogger(__name__)

NAME = "cpuevict"
FEATURE_GATE = "BECPUEvict"
"""The table gate (Koordinator's ``BECPUEvict``)."""
FEATURE_CPU_EVICT = "CPUEvict"
FEATURE_ALLOCATABLE_EVICT = "CPUAllocatableEvict"
REASON_CPU_USAGE = "EvictPodByNodeCPUUsage"
"""Metric reason of the used-threshold and allocatable tasks."""
MIN_BATCH_ALLOCATABLE_MILLI = 1
"""A zero BE allocatable counts as this, so satisfaction can still be computed."""
DEFAULT_INTERVAL = 1.0
"""Seconds between rounds (``--cpu-evict-interval-seconds``)."""


def _by_request(c: Candidate) -> ResourceList:
    return {c.request_name: c.request}


def _by_used(c: Candidate) -> ResourceList:
    return {"cpu": c.used}


# The strategy --------------------------------------------------------------------------------


class _Stale(Exception):
    """The round's inputs are stale; the message says which."""


class CPUEvict:
    """The CPU eviction strategy (see the module docstring).

    :param capacity_milli: node CPU capacity in milli-cores; None: the Node's
        ``status.capacity.cpu`` in cluster mode, the node info's CPU count standalone.
    :param be_allocatable_milli: BE (batch) CPU allocatable for ``evictByAllocatable``; None:
        the Node's ``status.allocatable`` ``kubernetes.io/batch-cpu`` (unknown standalone: that
        policy then skips, as upstream does without a node).
    :param allocatable: the node's allocatable by resource name for the allocatable task; None:
        the Node's ``status.allocatable``.
    """

    name = NAME

    def __init__(
        self,
        ctx: StrategyContext,
        interval: float = DEFAULT_INTERVAL,
        *,
        capacity_milli: Callable[[], int | None] | None = None,
        be_allocatable_milli: Callable[[], int | None] | None = None,
        allocatable: Callable[[], Mapping[str, int] | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        self.interval = interval
        self.cool_time = ctx.config.qos.cpu_evict_cool_time
        self._capacity_fn = capacity_milli
        self._be_allocatable_fn = be_allocatable_milli
        self._allocatable_fn = allocatable
        self._clock = clock
        self._last_evict = clock()  # upstream starts the cool-down at start-up
        self._lock = asyncio.Lock()

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
        s = settings_of(ctx.node_slo().resource_used_threshold_with_be)
        if not s.enabled:
            ctx.report(name, StrategyReport({}, "disabled in NodeSLO"))
            return []
        capacity = self.capacity_milli()
        inputs: dict[str, Any] = {"capacity_milli": capacity}
        if not capacity or capacity <= 0:
            ctx.report(name, StrategyReport(inputs, "skip: node CPU capacity unknown"))
            return []
        pods = list(ctx.workloads().pods.values())
        features = [
            f
            for f in (FEATURE_GATE, FEATURE_ALLOCATABLE_EVICT, FEATURE_CPU_EVICT)
            if gate_enabled(ctx.config, f)
        ]
        tasks: list[EvictTask] = []
        try:
            for feature in features:
                try:
                    task = self._task(feature, s, pods, capacity, inputs)
                except InvalidThreshold as err:
                    inputs[f"{feature}_skipped"] = f"invalid config: {err}"
                    continue
                if task is not None:
                    tasks.append(task)
        except _Stale as err:
            ctx.stale(name, str(err))
            ctx.report(name, StrategyReport(inputs, "skip: stale inputs", stale=True))
            return []
        pending = ctx.evictor.recent_keys() if ctx.evictor is not None else frozenset()
        the_plan = plan(tasks, pending)
        detail = plan_detail(tasks, the_plan)
        inputs["released"] = the_plan.released
        victims = the_plan.victims
        if not victims:
            decision = "nothing to do" if not tasks else "no victim left to evict"
            ctx.report(name, StrategyReport(inputs, decision, detail=detail))
            return []
        outcomes: list[Outcome] = []
        if ctx.evictor is None:
            logger.warning("%s: no evictor; %d victims not evicted", name, len(victims))
        else:
            for task in tasks:
                mine = [self._victim(p) for p in victims if p.task is task]
                if mine:
                    outcomes += await ctx.evictor.evict(
                        mine, strategy=name, reason=task.reason, dry_run=ctx.dry_run(name)
                    )
        if any(o.status in ("evicted", "dry_run") for o in outcomes):
            self._last_evict = self._clock()
        result = outcome_summary(outcomes)
        ctx.report(
            name, StrategyReport(inputs, f"evict {len(victims)} pods", result, detail=detail)
        )
        return outcomes

    @staticmethod
    def _victim(pick: Pick) -> Victim:
        t, c = pick.task, pick.candidate
        release = t.release_of(c)
        what = ", ".join(f"{k} {v}" for k, v in sorted(release.items())) or "nothing counted"
        need = ", ".join(f"{k} {v}" for k, v in sorted(t.to_release.items()))
        return Victim.of_pod(
            c.pod,
            f"{EVICT_REASON_PREFIX}{t.feature}: release {need}; this pod {what}, priority "
            f"{priority_value_with_default(c.pod)}",
            release=float(sum(release.values())),
        )

    def _task(
        self,
        feature: str,
        s: CPUEvictSettings,
        pods: list[PodInfo],
        capacity: int,
        inputs: dict[str, Any],
    ) -> EvictTask | None:
        if feature == FEATURE_GATE:
            need = self._be_satisfaction_release(s, inputs)
            if need <= 0:
                return None
            cands = [
                Candidate(p, self._pod_used(p), p.extended_requests.get(BATCH_CPU, 0), BATCH_CPU)
                for p in pods
                if qos_raw(p) is QoSClass.BE and eviction_policy_allowed(p, feature)
            ]
            return EvictTask(
                feature,
                REASON_BE_CPU_SATISFACTION,
                TARGET_BATCH_REQUEST,
                {BATCH_CPU: need},
                order_be(cands),
                _by_request,
            )
        if feature == FEATURE_ALLOCATABLE_EVICT:
            return allocatable_task(
                feature,
                REASON_CPU_USAGE,
                "cpu",
                pods,
                allocatable_thresholds(s),
                self.allocatable(),
                self._used_milli,
                inputs,
            )
        # CPUEvict: node usage over the window
        threshold, lower, prio_max = used_thresholds(s)
        window = window_seconds(self.ctx.collect_interval, s.window)
        agg = self.ctx.fresh_aggregate(series.NODE_CPU_USAGE, series.NODE, window)
        if agg is None:
            raise _Stale(f"{series.NODE_CPU_USAGE}/{series.NODE} stale or absent")
        need = release_by_used(agg.avg, capacity, threshold, lower)
        inputs[feature] = {"node_cpu_avg": agg.avg, "window": window}
        if need <= 0:
            return None
        make = used_candidates("cpu", self._used_milli)
        ordered = by_priority(pods, feature, prio_max, make, "used")
        return EvictTask(feature, REASON_CPU_USAGE, TARGET_USED, {"cpu": need}, ordered, _by_used)

    def _used_milli(self, pod: PodInfo) -> int | None:
        """The pod's fresh CPU usage in milli-cores; None without a fresh sample."""
        used = self.ctx.fresh_last(series.POD_CPU_USAGE, series.pod_entity(pod.uid))
        return None if used is None else int(used * 1000)

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
            raw = self.be_allocatable_milli()
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
        return satisfaction_release(
            (avg_usage, avg_request, avg_limit),
            (cur_usage, cur_request, cur_limit),
            lower,
            upper,
            s.be_usage_threshold,
        )

    def _pod_used(self, p: PodInfo) -> int:
        used = self.ctx.fresh_last(series.POD_CPU_USAGE, series.pod_entity(p.uid))
        return 0 if used is None else int(used * 1000)

    def _node(self) -> Mapping[str, Any] | None:
        getter = self.ctx.node
        if getter is None:
            return None
        try:
            return getter()
        except Exception:  # a broken getter must not stop eviction decisions
            logger.exception("%s: reading the Node object failed", NAME)
            return None

    def allocatable(self) -> Mapping[str, int] | None:
        """The Node's ``status.allocatable`` by resource name; None standalone or before the
        Node is known (the allocatable task is then skipped)."""
        if self._allocatable_fn is not None:
            return self._allocatable_fn()
        if self.ctx.config.standalone:
            return None
        return node_resources(self._node(), "allocatable")

    def be_allocatable_milli(self) -> int | None:
        """BE's (batch) CPU allocatable in milli-cores: the Node's ``kubernetes.io/batch-cpu``
        allocatable (0 when it has none); None without a Node."""
        if self._be_allocatable_fn is not None:
            return self._be_allocatable_fn()
        allocatable = self.allocatable()
        return None if allocatable is None else allocatable.get(BATCH_CPU, 0)

    def capacity_milli(self) -> int | None:
        """Node CPU capacity in milli-cores: the Node's ``status.capacity.cpu`` in cluster mode
        (upstream's; None until the Node is known), the node info's CPU count standalone."""
        if self._capacity_fn is not None:
            return self._capacity_fn()
        if not self.ctx.config.standalone:
            capacity = node_resources(self._node(), "capacity")
            return None if capacity is None else capacity.get("cpu")
        info = self.ctx.cache.get_info("node_info")
        if isinstance(info, Mapping):
            total = info.get("total")
            if isinstance(total, Mapping) and isinstance(total.get("cpus"), int):
                return int(total["cpus"]) * 1000
        return None

    def describe(self) -> dict[str, Any]:
        return {"last_evict": self._last_evict, "cool_time": self.cool_time}


def build(ctx: StrategyContext, interval: float) -> CPUEvict:
    """Table factory."""
    return CPUEvict(ctx, interval)
