"""CPU throttling of pods and containers (Koordinator's ``PodThrottledCollector``).

For every pod and container of the inventory, each tick reads the CFS counters of ``cpu.stat``
(v1 cpu controller; v2 unified tree, the same file the v2 usage collector reads, so the tick
reads it once) and reports the throttled ratio, 0..1::

    delta(nr_throttled) / delta(nr_periods)     0 when no period elapsed

(``CalcCPUThrottledRatio`` upstream). The first reading only seeds; counters that went backwards
(the cgroup was recreated) re-seed; state of cgroups that left the inventory is dropped. A cgroup
that vanished mid-tick is skipped, with one debug line per tick.
"""

from __future__ import annotations

import logging
from itertools import repeat
from operator import gt, sub, truediv
from typing import NamedTuple

from koordlet.collectors.framework import CollectorContext, CollectResult, Tick
from koordlet.collectors.shared import TargetCache, by_columns, target_paths
from koordlet.errors import CgroupGoneError
from koordlet.metriccache.series import (
    CONTAINER_CPU_THROTTLED_RATIO,
    POD_CPU_THROTTLED_RATIO,
    Column,
    Sample,
    SeriesKey,
)
from koordlet.system.host import Host
from koordlet.system.stats import CPU_THROTTLING

logger = logging.getLogger(__name__)

NAME = "podthrottled"


class _Plan(NamedTuple):
    """The targets' columns, in the targets' order (a tuple per column: see podresource's)."""

    entities: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    keys: tuple[SeriesKey, ...] = ()


class PodThrottledCollector:
    """See the module docstring."""

    def __init__(self, host: Host, interval: float = 1.0) -> None:
        self.name = NAME
        self.interval = interval
        # v2: the usage collector parses the same cpu.stat, shared through the tick's memo;
        # v1: nobody else parses cpu.stat, and a memo would cost more than it saves.
        self._stat = CPU_THROTTLING.bind(host.layout)
        self._targets = TargetCache()
        self._plan = _Plan()
        self._last: dict[str, tuple[int, int]] = {}

    def _replan(self) -> None:
        targets = self._targets.plan
        entities = tuple(t.entity for t in targets)
        self._plan = _Plan(
            entities,
            target_paths(self._stat, targets),
            tuple(
                SeriesKey(
                    POD_CPU_THROTTLED_RATIO if t.is_pod else CONTAINER_CPU_THROTTLED_RATIO,
                    t.entity,
                )
                for t in targets
            ),
        )
        keep = set(entities)
        self._last = {e: v for e, v in self._last.items() if e in keep}

    def collect(self, tick: Tick) -> CollectResult:
        if self._targets.refresh(tick.workloads):
            self._replan()
        return by_columns(tick, self._plan.entities, self._collect_columns, self._collect_each)

    def _collect_columns(self, tick: Tick) -> list[Column] | None:
        """The steady state in C loops (see the pod resource collector's): every ``cpu.stat``
        read and parsed at once, every cgroup with a previous reading, no counter
        gone backwards, never more throttled periods than periods. Anything else returns None
        before any state changed, and :meth:`_collect_each` does the tick."""
        plan = self._plan
        counters = self._stat.column(tick, plan.paths)
        if counters is None:
            return None
        previous = list(map(self._last.get, plan.entities))
        if None in previous:
            return None  # a cgroup seeds this tick
        periods, throttled = zip(*counters, strict=True)
        prev_periods, prev_throttled = zip(*previous, strict=True)
        d_periods = list(map(sub, periods, prev_periods))
        d_throttled = list(map(sub, throttled, prev_throttled))
        if min(d_periods) < 0 or min(d_throttled) < 0 or any(map(gt, d_throttled, d_periods)):
            return None  # a counter reset (re-seed), or counters the kernel never gives
        # No period elapsed means none throttled (checked above): 0 / 1 is the 0.0 of the
        # file-by-file path, without a branch per cgroup.
        ratios = list(map(truediv, d_throttled, map(max, d_periods, repeat(1))))
        self._last.update(zip(plan.entities, counters, strict=True))
        return [(plan.keys, ratios)]

    def _collect_each(self, tick: Tick) -> list[Sample]:
        """File by file: the first tick, vanished and re-created cgroups."""
        last = self._last
        stat = self._stat  # BoundStat.get inlined: a call less per file
        parse, pick, shared = stat.parse, stat.pick, stat.shared
        read, parsed = tick.read, tick.parsed
        samples: list[Sample] = []
        append = samples.append
        new = tuple.__new__  # Sample's own __new__ is Python code; this skips it
        gone = 0
        for entity, path, key in zip(*self._plan, strict=True):
            try:
                value = parsed(path, parse) if shared else parse(read(path), path)
                periods, throttled = value if pick is None else pick(value, path)
            except CgroupGoneError:
                gone += 1
                last.pop(entity, None)
                continue
            prev = last.get(entity)
            last[entity] = (periods, throttled)
            if prev is None:
                continue
            d_periods, d_throttled = periods - prev[0], throttled - prev[1]
            if d_periods < 0 or d_throttled < 0:
                continue  # counters reset: the cgroup was recreated; this reading re-seeds
            append(new(Sample, (key, d_throttled / d_periods if d_periods else 0.0)))
        if gone:
            logger.debug("%s: %d cgroups vanished during the tick, skipped", NAME, gone)
        return samples


def build(ctx: CollectorContext, interval: float) -> PodThrottledCollector:
    """The table's factory."""
    return PodThrottledCollector(ctx.host, interval)
