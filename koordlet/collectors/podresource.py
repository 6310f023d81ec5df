"""Pod and container CPU and memory usage (Koordinator's ``PodResourceCollector``).

For every pod of the inventory and every container of those pods, each tick:

- **CPU**, in cores: the cgroup's CPU-time counter (v1 ``cpuacct.usage`` in ns; v2 ``cpu.stat``
  ``usage_usec``) differenced against the previous tick and divided by the seconds between the
  two ticks. The first reading of a cgroup only seeds it; a counter that went backwards (the
  cgroup was recreated under the same name) re-seeds it; state of cgroups that left the
  inventory is dropped.
- **Memory**, in bytes: ``anon + unevictable`` (``inactive_anon + active_anon + unevictable``),
  page cache excluded (``MemoryStatRaw.Usage()`` upstream, which sums those keys of
  ``memory.stat``). v1 reads the same kernel counters from the ``hierarchical_*`` lines of
  ``memory.numa_stat``, which costs the kernel half of what ``memory.stat`` does (``memory.stat``
  on kernels without that file); v2 reads ``memory.stat``. It is not a counter, so it is reported
  from the first tick (upstream skips it together with the seeding CPU reading).

A pod or container whose cgroup vanished mid-tick is skipped; the tick logs one debug line with
the count. Paths, entity ids and series keys are computed once per inventory snapshot, not per
tick (``koordlet.collectors.shared.TargetCache``), and the files are the stat table's
(``koordlet.system.stats``: ``cpu_usage``, ``memory_lru``): the page-cache collector parses the
same memory file, and on v2 the throttling collector the same ``cpu.stat``, through the tick's
memo.
"""

from __future__ import annotations

import logging
from itertools import repeat
from operator import add, sub, truediv
from typing import NamedTuple

from koordlet.collectors.framework import CollectorContext, CollectResult, Tick
from koordlet.collectors.shared import CpuCounters, TargetCache, by_columns, target_paths
from koordlet.errors import CgroupGoneError
from koordlet.metriccache.series import (
    CONTAINER_CPU_USAGE,
    CONTAINER_MEMORY_USAGE,
    POD_CPU_USAGE,
    POD_MEMORY_USAGE,
    Column,
    Sample,
    SeriesKey,
)
from koordlet.system.host import Host
from koordlet.system.stats import CPU_USAGE, MEMORY_LRU

logger = logging.getLogger(__name__)

NAME = "podresource"
NS_PER_SECOND = 1e9


class _Plan(NamedTuple):
    """The targets' columns, in the targets' order: a tuple per column rather than a record per
    target (80 bytes less a target; the three per-cgroup collectors hold 2,400 at 200 pods)."""

    entities: tuple[str, ...] = ()
    cpu_paths: tuple[str, ...] = ()
    mem_paths: tuple[str, ...] = ()
    cpu_keys: tuple[SeriesKey, ...] = ()
    mem_keys: tuple[SeriesKey, ...] = ()


class PodResourceCollector:
    """See the module docstring."""

    def __init__(self, host: Host, interval: float = 1.0) -> None:
        self.name = NAME
        self.interval = interval
        self._cpu = CPU_USAGE.bind(host.layout)
        self._memory = MEMORY_LRU.bind(host.layout)
        self._targets = TargetCache()
        self._plan = _Plan()
        self._counters = CpuCounters()

    def _replan(self) -> None:
        targets = self._targets.plan
        entities = tuple(t.entity for t in targets)
        self._plan = _Plan(
            entities,
            target_paths(self._cpu, targets),
            target_paths(self._memory, targets),
            tuple(
                SeriesKey(POD_CPU_USAGE if t.is_pod else CONTAINER_CPU_USAGE, t.entity)
                for t in targets
            ),
            tuple(
                SeriesKey(POD_MEMORY_USAGE if t.is_pod else CONTAINER_MEMORY_USAGE, t.entity)
                for t in targets
            ),
        )
        self._counters.keep_only(set(entities))

    def collect(self, tick: Tick) -> CollectResult:
        if self._targets.refresh(tick.workloads):
            self._replan()
        return by_columns(tick, self._plan.entities, self._collect_columns, self._collect_each)

    def _collect_columns(self, tick: Tick) -> list[Column] | None:
        """The steady state without a line of Python per cgroup: each column of files read and
        parsed at once (``BoundStat.column``), every cgroup with a previous CPU reading, no
        counter gone backwards. Anything else returns None before any of the collector's state
        changed, and :meth:`_collect_each` does the tick (what was read or parsed here stays
        in the tick's memo). The same values as :meth:`_collect_each`'s samples, as a memory
        column and a CPU column."""
        plan = self._plan
        usage = self._cpu.column(tick, plan.cpu_paths)
        if usage is None:
            return None
        memory = self._memory.column(tick, plan.mem_paths)
        if memory is None:
            return None
        last = self._counters.last
        previous = list(map(last.get, plan.entities))
        if None in previous:
            return None  # a cgroup seeds this tick
        prev_ns, prev_ts = zip(*previous, strict=True)
        deltas = list(map(sub, usage, prev_ns))
        elapsed = list(map(sub, repeat(tick.now), prev_ts))
        if min(deltas) < 0 or min(elapsed) <= 0:
            return None  # a cgroup re-seeds
        anon, unevictable, _ = zip(*memory, strict=True)
        values = list(map(float, map(add, anon, unevictable)))  # MemoryLru.usage
        rates = list(map(truediv, map(truediv, deltas, elapsed), repeat(NS_PER_SECOND)))
        stamps = zip(usage, repeat(tick.now, len(usage)), strict=True)
        last.update(zip(plan.entities, stamps, strict=True))
        return [(plan.mem_keys, values), (plan.cpu_keys, rates)]

    def _collect_each(self, tick: Tick) -> list[Sample]:
        """File by file: every layout, the first tick, vanished and re-created cgroups."""
        now = tick.now
        # BoundStat.get inlined (a call less per file, 1,200 files a tick at 200 pods): v1 reads
        # cpuacct.usage directly (nobody else parses it); v2 shares cpu.stat's parse with the
        # throttling collector and the memory file's with the page-cache collector, via the memo.
        cpu, mem = self._cpu, self._memory
        cpu_parse, cpu_pick, cpu_shared = cpu.parse, cpu.pick, cpu.shared
        mem_parse, mem_get = mem.parse, mem.get
        mem_memo = mem.shared and mem.pick is None  # v1 memory.numa_stat, per the stat table
        read, parsed = tick.read, tick.parsed
        last = self._counters.last  # CpuCounters.rate, inlined: entity -> (ns, timestamp)
        samples: list[Sample] = []
        append = samples.append
        new = tuple.__new__  # Sample's own __new__ is Python code; this skips it
        gone = 0
        for entity, cpu_path, mem_path, cpu_key, mem_key in zip(*self._plan, strict=True):
            try:
                usage_ns = (
                    parsed(cpu_path, cpu_parse)
                    if cpu_shared
                    else cpu_parse(read(cpu_path), cpu_path)
                )
                if cpu_pick is not None:
                    usage_ns = cpu_pick(usage_ns, cpu_path)
                memory = parsed(mem_path, mem_parse) if mem_memo else mem_get(tick, mem_path)
            except CgroupGoneError:
                gone += 1
                last.pop(entity, None)
                continue
            append(new(Sample, (mem_key, float(memory[0] + memory[1]))))  # MemoryLru.usage
            prev = last.get(entity)
            last[entity] = (usage_ns, now)
            if prev is not None:
                delta, elapsed = usage_ns - prev[0], now - prev[1]
                if delta >= 0 and elapsed > 0:  # else: the cgroup was recreated; re-seed
                    append(new(Sample, (cpu_key, delta / elapsed / NS_PER_SECOND)))
        if gone:
            logger.debug("%s: %d cgroups vanished during the tick, skipped", NAME, gone)
        return samples


def build(ctx: CollectorContext, interval: float) -> PodResourceCollector:
    """The table's factory."""
    return PodResourceCollector(ctx.host, interval)
