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

The settings, config checks, arithmetic and BE order are in :mod:`koordlet.qos.memoryrules`.

**Capacity**: in cluster mode the Node's ``status.capacity.memory``, as upstream (no round until
the Node is known); standalone, with no Node, ``MemTotal`` of ``/proc/meminfo``
(``node_memory_total``), never the sum of the NUMA nodes (which leaves out memory outside them).

**Stale inputs skip the round**: a node usage older than twice the collection interval evicts
nobody (``ctx.stale``). **Pressure events** wake a round between ticks: on cgroup v1 a memcg
threshold on the kubepods memory cgroup at the kubepods usage that puts the node at the
threshold, on cgroup v2 (or where that cannot be armed) a PSI trigger on the node's memory
pressure (:mod:`koordlet.qos.memorywatch` arms them). An event round reads the node's memory now
(``ctx.read_now(NODE_MEMORY)``) instead of the cache, whose newest sample may be a whole interval
old.

**Memory distress** (ours, off by default): with ``--memory-distress-psi-full-percent`` or
``--memory-distress-reclaim-pages-per-second`` set, :class:`~koordlet.qos.distress.DistressMonitor`
samples the node's memory PSI ``full`` and reclaim counters every
``--memory-distress-interval``; while either signal is on (hysteresis), the ``BEMemoryEvict``
task evicts at least one BE pod a round even below the usage threshold, with the reason
``EvictPodByNodeMemoryDistress``, and the trigger turning on wakes a round at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from apis.extension import QoSClass
from koordlet.collectors.noderesource import MEMORY_DISTRESS, NODE_MEMORY, DistressReading
from koordlet.features import gate_enabled
from koordlet.metriccache import series
from koordlet.qos.distress import DistressConfig, DistressMonitor
from koordlet.qos.evictor import (
    EVICT_REASON_PREFIX,
    REASON_MEMORY,
    REASON_MEMORY_DISTRESS,
    Outcome,
    Victim,
)
from koordlet.qos.evicttask import (
    TARGET_USED,
    Candidate,
    EvictTask,
    Pick,
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
from koordlet.qos.memoryrules import (
    MEMORY_RELEASE_BUFFER_PERCENT,
    MemoryEvictSettings,
    allocatable_thresholds,
    order_be,
    priority_threshold,
    release_by_used,
    settings_of,
    usage_percent,
    used_release,
    used_thresholds,
)
from koordlet.qos.memorywatch import PressureWatch
from koordlet.qos.shared import InvalidThreshold, eviction_policy_allowed, node_resources
from koordlet.statesinformer.model import PodInfo

logger = logging.getLogger(__name__)

NAME = "memoryevict"
FEATURE_GATE = "BEMemoryEvict"
"""The table gate (Koordinator's ``BEMemoryEvict``)."""
FEATURE_MEMORY_EVICT = "MemoryEvict"
"""Upstream gate of the priority-based task (runs when this koordlet's gates know and enable it)."""
FEATURE_ALLOCATABLE_EVICT = "MemoryAllocatableEvict"
"""Upstream gate of the allocatable-based task."""
DEFAULT_INTERVAL = 1.0
"""Seconds between rounds (``--memory-evict-interval-seconds``)."""
FOLLOW_UP_INTERVAL = 0.02
FOLLOW_UP_ROUNDS = 50
"""After an event round that found the node just under the threshold (within the 2-point
buffer), look again every 20 ms for up to 1 s (then the tick carries on): the memcg threshold
counts charges a little differently from the node usage the round compares."""


# The strategy --------------------------------------------------------------------------------


class MemoryEvict:
    """The memory eviction strategy (see the module docstring).

    :param capacity: node memory capacity in bytes; None: the Node's ``status.capacity.memory``
        in cluster mode, ``MemTotal`` (``node_memory_total``) standalone.
    :param fresh_usage: ``(used, total)`` bytes read now, for event rounds; None: ``/proc/meminfo``.
    :param watch_dir: the memory cgroup folder to arm the threshold on; None: the kubepods root.
    :param allocatable: the node's allocatable by resource name (bytes) for the allocatable task;
        None: the Node's ``status.allocatable``.
    :param distress: the distress counters read now; None: ``ctx.read_now(MEMORY_DISTRESS)``.
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
        distress: Callable[[], Awaitable[DistressReading]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        self.interval = interval
        self.cool_time = ctx.config.qos.memory_evict_cool_time
        self._capacity_fn = capacity
        self._fresh_usage = fresh_usage
        self._allocatable_fn = allocatable
        self._clock = clock
        self._last_evict: float | None = None
        self._last_total: int | None = None
        self._lock = asyncio.Lock()
        self._watch = PressureWatch(
            ctx, self._settings, self.capacity, self._on_pressure, watch_dir
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._event_waiting = False
        self._near = False
        self.event_rounds = 0
        """Rounds run on a pressure event or on the distress trigger turning on."""
        self._read_distress = distress
        config = DistressConfig.of(ctx.config.qos)
        self.distress: DistressMonitor | None = None
        """The distress trigger's sampler; None when no signal is configured."""
        self._distress_note = ""
        if config.enabled:
            if gate_enabled(ctx.config, FEATURE_GATE):
                self.distress = DistressMonitor(config, self._distress_now, self._on_distress)
            else:
                self._distress_note = f"configured but feature gate {FEATURE_GATE} is off"

    # Rounds ----------------------------------------------------------------------------------

    async def reconcile(self) -> None:
        """One tick: (re-)arm the pressure watch and start the distress sampler, then one round
        on the cached inputs."""
        await self._watch.arm()
        if self.distress is not None:
            self.distress.start()
        await self.round("tick")

    async def round(self, trigger: str) -> list[Outcome]:
        """One round; ``trigger`` is ``tick``, or ``event`` or ``distress`` (these read the
        node's usage now)."""
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
        if trigger != "tick":
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
        detail = plan_detail(tasks, the_plan)
        inputs["released"] = the_plan.released
        victims = the_plan.victims
        if not victims:
            decision = "nothing to do" if not tasks else "no victim left to evict"
            ctx.report(name, StrategyReport(inputs, decision, detail=detail))
            return []
        reason = REASON_MEMORY_DISTRESS if "distress" in inputs else REASON_MEMORY
        outcomes = await self._evict(victims, reason)
        if any(o.status in ("evicted", "dry_run") for o in outcomes):
            self._last_evict = self._clock()
        result = outcome_summary(outcomes)
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
            return allocatable_task(
                feature,
                reason,
                "memory",
                pods,
                allocatable_thresholds(s),
                self.allocatable(),
                lambda p: usage.get(p.uid),
                inputs,
            )
        threshold, lower = used_thresholds(s.threshold, s.lower)
        if feature == FEATURE_MEMORY_EVICT:
            prio_max = priority_threshold(s)
        need = release_by_used(used, capacity, threshold, lower)
        distress = self.distress
        if need <= 0 and feature == FEATURE_GATE and distress is not None and distress.active:
            # Below the usage threshold but the kernel is in distress: one victim a round (the
            # first BE pod in order releases at least a byte), until the trigger turns off.
            why = distress.why()
            inputs["distress"] = why
            need = 1
            reason = f"{reason} on memory distress ({why})"
        if need <= 0:
            return None
        if feature == FEATURE_GATE:
            be = [
                p for p in pods if qos_raw(p) is QoSClass.BE and eviction_policy_allowed(p, feature)
            ]
            ordered = order_be(Candidate(p, usage.get(p.uid, 0)) for p in be)
        else:
            make = used_candidates("memory", lambda p: usage.get(p.uid))  # no sample: skipped
            ordered = by_priority(pods, feature, prio_max, make, "used")
        return EvictTask(feature, reason, TARGET_USED, {"memory": need}, ordered, used_release)

    def _pod_usage(self, pods: Iterable[PodInfo]) -> dict[str, int]:
        """Fresh ``pod_memory_usage`` by UID (pods without a fresh sample are left out)."""
        out: dict[str, int] = {}
        for p in pods:
            value = self.ctx.fresh_last(series.POD_MEMORY_USAGE, series.pod_entity(p.uid))
            if value is not None:
                out[p.uid] = int(value)
        return out

    async def _evict(self, picks: list[Pick], reason: str) -> list[Outcome]:
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
            victims, strategy=self.name, reason=reason, dry_run=ctx.dry_run(self.name)
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

    def _on_pressure(self) -> None:
        """The pressure watch fired: a round now, not at the next tick."""
        self._spawn_round("event")

    def _on_distress(self) -> None:
        """The distress trigger turned on: a round now, not at the next tick."""
        self._spawn_round("distress")

    async def _distress_now(self) -> DistressReading:
        if self._read_distress is not None:
            return await self._read_distress()
        read_now = self.ctx.read_now
        if read_now is None:
            raise RuntimeError(f"{NAME}: the distress trigger needs ctx.read_now or distress")
        return await read_now(MEMORY_DISTRESS)

    def _spawn_round(self, trigger: str) -> None:
        task = asyncio.get_running_loop().create_task(
            self._event_round(trigger), name=f"qos/memoryevict-{trigger}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _event_round(self, trigger: str = "event") -> None:
        if self._event_waiting:
            return  # an event round is already waiting for the lock: it will see this pressure
        self._event_waiting = True
        try:
            for _ in range(FOLLOW_UP_ROUNDS):
                async with self._lock:
                    self._event_waiting = False
                    self.event_rounds += 1
                    outcomes = await self._round(trigger)
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
        """Stop the distress sampler, disarm the watch, unsubscribe, let event rounds in flight
        finish (an eviction is not left half done) for up to ``timeout`` seconds, then cancel
        what remains."""
        if self.distress is not None:
            await self.distress.close()
        self._watch.close()
        await self.settle(timeout)
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def describe(self) -> dict[str, Any]:
        """Plain data for ``/debug/qos``."""
        distress: dict[str, Any] | str = (
            self.distress.describe() if self.distress is not None else self._distress_note or "off"
        )
        return {
            "armed": None if self._watch.armed is None else list(self._watch.armed),
            "watch_unsupported": self._watch.unsupported_note,
            "distress": distress,
            "event_rounds": self.event_rounds,
            "last_evict": self._last_evict,
            "cool_time": self.cool_time,
        }


def build(ctx: StrategyContext, interval: float) -> MemoryEvict:
    """Table factory."""
    return MemoryEvict(ctx, interval)
