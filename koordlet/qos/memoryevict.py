"""Memory eviction: evict pods when node memory usage crosses the NodeSLO threshold.

Koordinator's ``memoryevict`` plugin, re-implemented. Each round builds up to three eviction
tasks (:mod:`koordlet.qos.evicttask`), in upstream's order, and one plan serves them all:

1. ``BEMemoryEvict`` (the table's gate): node usage ``used * 100 // capacity`` (integer percent,
   floored) at or above ``memoryEvictThresholdPercent`` releases
   ``capacity * (usage% - lower%) // 100`` bytes of usage, where ``lower%`` is
   ``memoryEvictLowerPercent`` or the threshold minus 2. Victims: BE pods, ordered by
   :func:`order_be`;
2. ``MemoryAllocatableEvict`` (gate of that name): per priority class, the requests of pods whose
   priority is at most ``allocatableEvictPriorityThreshold`` (``batch-memory`` of koord-batch
   pods, ``mid-memory`` of koord-mid pods) against the Node's allocatable of that resource:
   above ``memoryAllocatableEvictThresholdPercent`` the excess down to
   ``memoryAllocatableEvictLowerPercent`` (required) is released, batch and mid separately;
   victims: opted-in pods by priority, then request, largest first;
3. ``MemoryEvict`` (gate of that name): the usage threshold above, over opted-in pods
   (``koordinator.sh/eviction-enabled: "true"``) with priority at most
   ``evictEnabledPriorityThreshold``, by priority, then usage, largest first.

What the tasks release accumulates per target across the round, and a pod evicted in an earlier
round that is still present (the evictor's dedupe window) is a pending release: it counts, is
not evicted again, and no extra victim is picked for it (``evicttask.plan``). After a round that
evicted (or decided, in dry run), rounds wait ``memory_evict_cool_time`` seconds
(``--memory-evict-cool-time-seconds``, 4). NodeSLO ``enable: false`` disables every task.

**Capacity**: in cluster mode the Node's ``status.capacity.memory``, as upstream (no round until
the Node is known); standalone, with no Node, ``MemTotal`` of ``/proc/meminfo``
(``node_memory_total``), never the sum of the NUMA nodes (which leaves out memory outside them).

**Stale inputs skip the round**: a node usage older than twice the collection interval evicts
nobody (``ctx.stale``). **Pressure events** wake a round between ticks: on cgroup v1 a memcg
threshold on the kubepods memory cgroup at the kubepods usage that puts the node at the
threshold (re-armed when that value moves by more than 1% of capacity); on cgroup v2, or where the
threshold cannot be armed, a PSI trigger on the node's memory pressure. An event round reads the
node's memory now (``ctx.read_now(NODE_MEMORY)``) instead of the cache, whose newest sample may be
a whole interval old.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from apis.extension import QoSClass
from apis.priority import PRIORITY_MID_VALUE_MAX
from apis.slo_strategies import ResourceThresholdStrategy
from koordlet.collectors.noderesource import NODE_MEMORY
from koordlet.events.watches import PressureEvent
from koordlet.features import gate_enabled
from koordlet.metriccache import series
from koordlet.qos.evictor import EVICT_REASON_PREFIX, REASON_MEMORY, Outcome, Victim
from koordlet.qos.evicttask import (
    TARGET_REQUEST,
    TARGET_USED,
    Candidate,
    EvictTask,
    Pick,
    ResourceList,
    allocatable_release,
    by_priority,
    plan,
    priority_class_raw,
    priority_value_with_default,
    qos_raw,
    released_classes,
    request_of,
)
from koordlet.qos.framework import StrategyContext, StrategyReport
from koordlet.qos.shared import InvalidThreshold, eviction_policy_allowed, node_resources
from koordlet.statesinformer.model import PodInfo
from koordlet.system.cgroups import CgroupVersion

logger = logging.getLogger(__name__)

NAME = "memoryevict"
FEATURE_GATE = "BEMemoryEvict"
"""The table gate (Koordinator's ``BEMemoryEvict``)."""
FEATURE_MEMORY_EVICT = "MemoryEvict"
"""Upstream gate of the priority-based task (runs when this koordlet's gates know and enable it)."""
FEATURE_ALLOCATABLE_EVICT = "MemoryAllocatableEvict"
"""Upstream gate of the allocatable-based task."""
MEMORY_RELEASE_BUFFER_PERCENT = 2
"""``memoryEvictLowerPercent`` when unset: the threshold minus this (upstream's constant)."""
DEFAULT_INTERVAL = 1.0
"""Seconds between rounds (``--memory-evict-interval-seconds``)."""
WATCH_NAME = "memoryevict"
"""Name of this strategy's pressure watch."""
PSI_STALL_US = 100_000
PSI_WINDOW_US = 2_000_000
"""PSI wake-up: 100 ms of ``some`` memory stall within 2 s (2 s: allowed without
CAP_SYS_RESOURCE)."""
REARM_FRACTION = 0.01
FOLLOW_UP_INTERVAL = 0.02
FOLLOW_UP_ROUNDS = 50
"""After an event round that found the node just under the threshold (within the 2-point
buffer), look again every 20 ms for up to 1 s (then the tick carries on): the memcg threshold
counts charges a little differently from the node usage the round compares."""
"""Re-arm the memcg threshold when its target moves by more than this fraction of capacity."""


# Settings ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
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


def _used(c: Candidate) -> ResourceList:
    return {"memory": c.used}


# The strategy --------------------------------------------------------------------------------


class MemoryEvict:
    """The memory eviction strategy (see the module docstring).

    :param capacity: node memory capacity in bytes; None: the Node's ``status.capacity.memory``
        in cluster mode, ``MemTotal`` (``node_memory_total``) standalone.
    :param fresh_usage: ``(used, total)`` bytes read now, for event rounds; None: ``/proc/meminfo``.
    :param watch_dir: the memory cgroup folder to arm the threshold on; None: the kubepods root.
    :param allocatable: the node's allocatable by resource name (bytes) for the allocatable task;
        None: the Node's ``status.allocatable``.
    """

    name = NAME

    def __init__(
        self,
        ctx: StrategyContext,
        interval: float = DEFAULT_INTERVAL,
        *,
        capacity: Callable[[], int | None] | None = None,
        fresh_usage: Callable[[], tuple[int, int]] | None = None,
        watch_dir: str | None = None,
        allocatable: Callable[[], Mapping[str, int] | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        self.interval = interval
        self.cool_time = ctx.config.qos.memory_evict_cool_time
        self._capacity_fn = capacity
        self._fresh_usage = fresh_usage
        self._watch_dir = watch_dir
        self._allocatable_fn = allocatable
        self._clock = clock
        self._last_evict: float | None = None
        self._last_total: int | None = None
        self._lock = asyncio.Lock()
        self._armed: tuple[str, str, int] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._event_waiting = False
        self._near = False
        self._memcg_refused = False
        self.event_rounds = 0
        """Rounds run on a pressure event."""

    # Rounds ----------------------------------------------------------------------------------

    async def reconcile(self) -> None:
        """One tick: (re-)arm the pressure watch, then one round on the cached inputs."""
        await self._arm()
        await self.round("tick")

    async def round(self, trigger: str) -> list[Outcome]:
        """One round; ``trigger`` is ``tick`` or ``event`` (reads the node's usage now)."""
        async with self._lock:
            return await self._round(trigger)

    async def _round(self, trigger: str) -> list[Outcome]:
        ctx, name = self.ctx, self.name
        self._near = False
        now = self._clock()
        if self._last_evict is not None and now - self._last_evict < self.cool_time:
            left = self.cool_time - (now - self._last_evict)
            ctx.report(name, StrategyReport({"trigger": trigger}, f"cool-down, {left:.1f}s left"))
            return []
        settings = self._settings()
        if not settings.enabled:
            ctx.report(name, StrategyReport({"trigger": trigger}, "disabled in NodeSLO"))
            return []
        inputs: dict[str, Any] = {"trigger": trigger}
        if trigger == "event":
            used_now, total = await self._usage_now()
            self._last_total = total
            used: float = used_now
            inputs["node_memory_used"] = {"value": used_now, "age": 0.0, "fresh": True}
        else:
            reading = ctx.read_last(series.NODE_MEMORY_USAGE, series.NODE)
            inputs["node_memory_used"] = reading.as_dict()
            if not reading.fresh or reading.value is None:
                ctx.stale(name, reading.why_stale)
                ctx.report(name, StrategyReport(inputs, "skip: stale inputs", stale=True))
                return []
            used = reading.value
        capacity, source = self.capacity_and_source()
        inputs["capacity"] = capacity
        inputs["capacity_source"] = source
        if not capacity or capacity <= 0:
            ctx.report(
                name, StrategyReport(inputs, f"skip: node memory capacity unknown ({source})")
            )
            return []
        tasks = self._tasks_for(settings, used, capacity, inputs)
        if settings.threshold is not None:
            near = settings.threshold - MEMORY_RELEASE_BUFFER_PERCENT
            self._near = usage_percent(used, capacity) >= near
        pending = ctx.evictor.recent_keys() if ctx.evictor is not None else frozenset()
        the_plan = plan(tasks, pending)
        detail = {
            t.feature: {
                "need": dict(t.to_release),
                "target": t.target,
                "unmet": the_plan.unmet(t),
                "victims": [p.candidate.key for p in the_plan.picks if p.task is t],
                "pending": [p.candidate.key for p in the_plan.picks if p.task is t and p.pending],
            }
            for t in tasks
        }
        inputs["released"] = the_plan.released
        victims = the_plan.victims
        if not victims:
            decision = "nothing to do" if not tasks else "no victim left to evict"
            ctx.report(name, StrategyReport(inputs, decision, detail=detail))
            return []
        outcomes = await self._evict(victims)
        if any(o.status in ("evicted", "dry_run") for o in outcomes):
            self._last_evict = self._clock()
        counts: dict[str, int] = {}
        for o in outcomes:
            counts[o.status] = counts.get(o.status, 0) + 1
        result = ", ".join(f"{n} {s}" for s, n in counts.items())
        ctx.report(
            name, StrategyReport(inputs, f"evict {len(victims)} pods", result, detail=detail)
        )
        return outcomes

    def _tasks_for(
        self, s: MemoryEvictSettings, used: float, capacity: int, inputs: dict[str, Any]
    ) -> list[EvictTask]:
        ctx = self.ctx
        pods = list(ctx.workloads().pods.values())
        usage = self._pod_usage(pods)
        tasks: list[EvictTask] = []
        # upstream's triggerFeatures, in order; each task runs only with its own gate on
        features = [
            f
            for f in (FEATURE_GATE, FEATURE_ALLOCATABLE_EVICT, FEATURE_MEMORY_EVICT)
            if gate_enabled(ctx.config, f)
        ]
        for feature in features:
            try:
                task = self._task(feature, s, used, capacity, pods, usage, inputs)
            except InvalidThreshold as err:
                inputs[f"{feature}_skipped"] = f"invalid config: {err}"
                continue
            if task is not None:
                tasks.append(task)
        inputs["node_usage_percent"] = usage_percent(used, capacity)
        return tasks

    def _task(
        self,
        feature: str,
        s: MemoryEvictSettings,
        used: float,
        capacity: int,
        pods: list[PodInfo],
        usage: Mapping[str, int],
        inputs: dict[str, Any],
    ) -> EvictTask | None:
        reason = EVICT_REASON_PREFIX + feature
        if feature == FEATURE_ALLOCATABLE_EVICT:
            threshold, lower, prio_max = allocatable_thresholds(s)
            requested: dict[str, int] = {}
            for p in pods:
                if priority_value_with_default(p) > prio_max:
                    continue
                res, value = request_of(p, "memory")
                requested[res] = requested.get(res, 0) + value
            allocatable = self.allocatable()
            if allocatable is None:
                inputs[f"{feature}_skipped"] = "the Node's allocatable is unknown"
                return None
            release = allocatable_release(requested, allocatable, threshold, lower)
            inputs[feature] = {"requested": requested, "allocatable": dict(allocatable)}
            if not release:
                return None
            classes = released_classes(release)

            def by_request(c: Candidate) -> ResourceList:
                if priority_class_raw(c.pod) not in classes:
                    return {}
                return {c.request_name: c.request}

            def make(p: PodInfo) -> Candidate | None:
                if p.uid not in usage:
                    return None  # upstream skips a pod without a metric
                res, value = request_of(p, "memory")
                return Candidate(p, usage[p.uid], value, res)

            ordered = by_priority(pods, feature, prio_max, make, "request")
            return EvictTask(feature, reason, TARGET_REQUEST, release, ordered, by_request)
        threshold, lower = used_thresholds(s.threshold, s.lower)
        if feature == FEATURE_MEMORY_EVICT:
            prio_max = priority_threshold(s)
        need = release_by_used(used, capacity, threshold, lower)
        if need <= 0:
            return None
        if feature == FEATURE_GATE:
            be = [
                p for p in pods if qos_raw(p) is QoSClass.BE and eviction_policy_allowed(p, feature)
            ]
            ordered = order_be(Candidate(p, usage.get(p.uid, 0)) for p in be)
        else:

            def make_used(p: PodInfo) -> Candidate | None:
                if p.uid not in usage:
                    return None  # upstream skips a pod without a metric
                res, value = request_of(p, "memory")
                return Candidate(p, usage[p.uid], value, res)

            ordered = by_priority(pods, feature, prio_max, make_used, "used")
        return EvictTask(feature, reason, TARGET_USED, {"memory": need}, ordered, _used)

    def _pod_usage(self, pods: Iterable[PodInfo]) -> dict[str, int]:
        """Fresh ``pod_memory_usage`` by UID (pods without a fresh sample are left out)."""
        out: dict[str, int] = {}
        for p in pods:
            value = self.ctx.fresh_last(series.POD_MEMORY_USAGE, series.pod_entity(p.uid))
            if value is not None:
                out[p.uid] = int(value)
        return out

    async def _evict(self, picks: list[Pick]) -> list[Outcome]:
        ctx = self.ctx
        evictor = ctx.evictor
        victims = []
        for pick in picks:
            t, c = pick.task, pick.candidate
            release = t.release_of(c)
            what = ", ".join(f"{k} {v}" for k, v in sorted(release.items())) or "nothing counted"
            need = ", ".join(f"{k} {v}" for k, v in sorted(t.to_release.items()))
            victims.append(
                Victim.of_pod(
                    c.pod,
                    f"{t.reason}: release {need}; this pod {what}, priority "
                    f"{priority_value_with_default(c.pod)}",
                    release=float(sum(release.values())),
                )
            )
        if evictor is None:
            logger.warning("%s: no evictor; %d victims not evicted", self.name, len(victims))
            return []
        outcomes: list[Outcome] = await evictor.evict(
            victims, strategy=self.name, reason=REASON_MEMORY, dry_run=ctx.dry_run(self.name)
        )
        return outcomes

    # Inputs ----------------------------------------------------------------------------------

    def _settings(self) -> MemoryEvictSettings:
        """The settings of the NodeSLO in force (typed and parsed once by the states informer)."""
        return settings_of(self.ctx.node_slo().resource_used_threshold_with_be)

    def _node(self) -> Mapping[str, Any] | None:
        getter = self.ctx.node
        if getter is None:
            return None
        try:
            return getter()
        except Exception:  # a broken getter must not stop eviction decisions
            logger.exception("%s: reading the Node object failed", NAME)
            return None

    def capacity_and_source(self) -> tuple[int | None, str]:
        """Node memory capacity in bytes and where it came from: the injected reader; in cluster
        mode the Node's ``status.capacity.memory`` (upstream's only source; None until the Node
        is known); standalone ``MemTotal`` of ``/proc/meminfo`` (the last ``node_memory_total``
        sample, else the last event round's read)."""
        if self._capacity_fn is not None:
            return self._capacity_fn(), "injected"
        if not self.ctx.config.standalone:
            capacity = node_resources(self._node(), "capacity")
            if capacity is None:
                return None, "the Node object is not known yet"
            return capacity.get("memory"), "Node status.capacity.memory"
        total = self.ctx.cache.last(series.NODE_MEMORY_TOTAL, series.NODE)
        if total is not None and total > 0:
            return int(total), "MemTotal of /proc/meminfo"
        return self._last_total, "MemTotal of /proc/meminfo (event read)"

    def capacity(self) -> int | None:
        """Node memory capacity in bytes, or None when unknown (see
        :meth:`capacity_and_source`)."""
        return self.capacity_and_source()[0]

    def allocatable(self) -> Mapping[str, int] | None:
        """The Node's ``status.allocatable`` by resource name; None standalone or before the
        Node is known (the allocatable task is then skipped)."""
        if self._allocatable_fn is not None:
            return self._allocatable_fn()
        if self.ctx.config.standalone:
            return None
        return node_resources(self._node(), "allocatable")

    async def _usage_now(self) -> tuple[int, int]:
        """The node's memory used and total now, for an event round: through the collector
        runner's on-demand read (``noderesource.NODE_MEMORY``, which also refreshes the node
        memory series), or the injected reader."""
        if self._fresh_usage is not None:
            return await asyncio.to_thread(self._fresh_usage)
        read_now = self.ctx.read_now
        if read_now is None:
            raise RuntimeError(f"{NAME}: an event round needs ctx.read_now or fresh_usage")
        info = await read_now(NODE_MEMORY)
        return info.used, info.mem_total

    # Pressure events -------------------------------------------------------------------------

    def _desired_watch(self) -> tuple[str, str, int] | None:
        """``(kind, path, threshold)`` this strategy wants armed now, or None."""
        ctx = self.ctx
        if ctx.events is None:
            return None
        host = ctx.host()
        settings = self._settings()
        if not settings.enabled:
            return None
        if host.layout.version is CgroupVersion.V2 or self._memcg_refused:
            return ("psi", host.paths.proc("pressure", "memory"), PSI_STALL_US)
        try:
            threshold, _ = used_thresholds(settings.threshold, settings.lower)
        except InvalidThreshold:
            return None
        capacity = self.capacity()
        node = ctx.fresh_last(series.NODE_MEMORY_USAGE, series.NODE)
        if not capacity or node is None:
            return None
        pods = ctx.workloads().pods
        kube = 0.0
        for uid in pods:
            v = ctx.fresh_last(series.POD_MEMORY_WITH_PAGE_CACHE, series.pod_entity(uid))
            kube += v or 0.0
        # Pods grow both the node's usage and kubepods' memcg usage by the same bytes: the node
        # crosses its threshold when kubepods reaches this value.
        target = int(capacity * threshold / 100 - (node - kube))
        target = max(target, 1 << 20)
        folder = self._watch_dir or host.layout.abs_dir("memory", host.layout.kube_root)
        return ("memcg", folder, target)

    async def _arm(self) -> None:
        events = self.ctx.events
        if events is None:
            return
        if self._unsubscribe is None:
            self._unsubscribe = events.subscribe(self._on_event)
        want = self._desired_watch()
        have = self._armed
        if want == have:
            return
        if want is not None and have is not None and want[:2] == have[:2] and want[0] == "memcg":
            capacity = self.capacity() or 0
            if abs(want[2] - have[2]) <= capacity * REARM_FRACTION:
                return
        if have is not None:
            events.unwatch(WATCH_NAME)
            self._armed = None
        if want is None:
            return
        kind, path, value = want
        if kind == "memcg":
            ok = await events.watch_memcg_threshold(path, value, WATCH_NAME)
            if not ok and WATCH_NAME in events.unsupported:
                self._memcg_refused = True  # the host cannot: PSI from the next tick on
        else:
            ok = await events.watch_psi(path, "some", value, PSI_WINDOW_US, WATCH_NAME)
        if ok:
            self._armed = want

    def _on_event(self, event: PressureEvent) -> None:
        if event.name != WATCH_NAME:
            return
        task = asyncio.get_running_loop().create_task(
            self._event_round(), name="qos/memoryevict-event"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _event_round(self) -> None:
        if self._event_waiting:
            return  # an event round is already waiting for the lock: it will see this pressure
        self._event_waiting = True
        try:
            for _ in range(FOLLOW_UP_ROUNDS):
                async with self._lock:
                    self._event_waiting = False
                    self.event_rounds += 1
                    outcomes = await self._round("event")
                if outcomes or not self._near:
                    return
                # Just under the threshold: the kernel signalled a crossing of a usage that
                # differs from ours by its per-CPU charge batches; look again shortly.
                await asyncio.sleep(FOLLOW_UP_INTERVAL)
        except Exception:  # a task of our own: log, never lose the error
            logger.exception("%s: event round failed", self.name)
        finally:
            self._event_waiting = False

    async def settle(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109 (a bound, not a cancel)
        """Wait up to ``timeout`` seconds for the event rounds in flight to finish."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    async def close(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109 (see settle)
        """Disarm the watch, unsubscribe, let event rounds in flight finish (an eviction is not
        left half done) for up to ``timeout`` seconds, then cancel what remains."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._armed is not None and self.ctx.events is not None:
            self.ctx.events.unwatch(WATCH_NAME)
            self._armed = None
        await self.settle(timeout)
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def describe(self) -> dict[str, Any]:
        """Plain data for ``/debug/qos``."""
        return {
            "armed": None if self._armed is None else list(self._armed),
            "event_rounds": self.event_rounds,
            "last_evict": self._last_evict,
            "cool_time": self.cool_time,
        }


def build(ctx: StrategyContext, interval: float) -> MemoryEvict:
    """Table factory."""
    return MemoryEvict(ctx, interval)
