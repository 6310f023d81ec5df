"""Pod and container CPU and memory usage (Koordinator's ``PodResourceCollector``).

For every pod of the inventory and every container of those pods, each tick:

- **CPU**, in cores: the cgroup's CPU-time counter (v1 ``cpuacct.usage`` in ns; v2 ``cpu.stat``
  ``usage_usec``) differenced against the previous tick and divided by the seconds between the
  two ticks. The first reading of a cgroup only seeds it; a counter that went backwards (the
  cgroup was recreated under the same name) re-seeds it; state of cgroups that left the
  inventory is dropped.
- **Memory**, in bytes: ``anon + unevictable`` of ``memory.stat`` (v1 hierarchical ``total_*``
  keys, v2 plain keys), page cache excluded (``MemoryStatRaw.Usage()`` upstream). It is not a
  counter, so it is reported from the first tick (upstream skips it together with the seeding
  CPU reading).

A pod or container whose cgroup vanished mid-tick is skipped; the tick logs one debug line with
the count. Paths, entity ids and series keys are computed once per inventory snapshot, not per
tick, and the shared per-snapshot target list (:func:`cgroup_targets`) is reused by the throttling
and page-cache collectors, which read the same files through the tick's memoized ``read``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from koordlet.collectors.framework import CollectResult, Tick
from koordlet.collectors.runner import parse_file
from koordlet.errors import CgroupGoneError, ParseError
from koordlet.metriccache.series import (
    CONTAINER_CPU_USAGE,
    CONTAINER_MEMORY_USAGE,
    POD_CPU_USAGE,
    POD_MEMORY_USAGE,
    Sample,
    SeriesKey,
    container_entity,
    pod_entity,
)
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.cgroups import CgroupLayout, CgroupVersion
from koordlet.system.cgroupstats import (
    MemoryUsage,
    parse_cpu_stat,
    parse_memory_stat_v1,
    parse_memory_stat_v2,
)
from koordlet.system.host import Host

logger = logging.getLogger(__name__)

NAME = "podresource"
NS_PER_SECOND = 1e9


class CgroupTarget(NamedTuple):
    """One pod or container cgroup to collect, as of one inventory snapshot."""

    entity: str
    """``pod/<uid>`` or ``container/<uid>/<container id>``."""
    rel: str
    """Cgroup directory relative to a controller root (v1) or the unified root (v2)."""
    is_pod: bool
    """True for the pod-level cgroup, False for a container's."""


def cgroup_targets(snapshot: WorkloadSnapshot) -> tuple[CgroupTarget, ...]:
    """Every pod and container cgroup of ``snapshot``: each pod followed by its containers."""
    out: list[CgroupTarget] = []
    for uid, pod in snapshot.pods.items():
        out.append(CgroupTarget(pod_entity(uid), pod.cgroup_dir, True))
        out.extend(
            CgroupTarget(container_entity(uid, c.id), c.cgroup_dir, False) for c in pod.containers
        )
    return tuple(out)


class TargetCache:
    """Recomputes a per-target plan only when the inventory hands out a new snapshot.

    The inventory replaces its snapshot object on every change and returns the same object
    otherwise, so an identity check is the whole per-tick cost.
    """

    __slots__ = ("_snapshot", "plan")

    def __init__(self) -> None:
        self._snapshot: WorkloadSnapshot | None = None
        self.plan: tuple[CgroupTarget, ...] = ()

    def refresh(self, snapshot: WorkloadSnapshot) -> bool:
        """Adopt ``snapshot``; True when it differs from the previous one."""
        if snapshot is self._snapshot:
            return False
        self._snapshot = snapshot
        self.plan = cgroup_targets(snapshot)
        return True


CpuUsageReader = Callable[[Tick, str], int]
"""``(tick, path) -> ns``: total CPU time of a cgroup, read (and parsed once) through the tick."""


def cpu_usage_reader(layout: CgroupLayout) -> tuple[str, str, CpuUsageReader]:
    """``(controller, file name, reader)`` of a cgroup's total CPU time on this layout."""
    if layout.version is CgroupVersion.V2:
        return "cpu", "cpu.stat", _v2_usage_ns
    return "cpuacct", "cpuacct.usage", _v1_usage_ns


def memory_stat_parser(layout: CgroupLayout) -> Callable[[bytes, str], MemoryUsage]:
    """The ``memory.stat`` parser of this layout's cgroup version."""
    if layout.version is CgroupVersion.V2:
        return parse_memory_stat_v2
    return parse_memory_stat_v1


def parse_cpuacct_usage(data: bytes, path: str) -> int:
    """A v1 ``cpuacct.usage``: nanoseconds."""
    try:
        return int(data)
    except ValueError:
        raise ParseError(f"{path}: not an integer: {data[:64]!r}") from None


def _v1_usage_ns(tick: Tick, path: str) -> int:
    return parse_cpuacct_usage(tick.read(path), path)  # nobody else parses it: no memo


def _v2_usage_ns(tick: Tick, path: str) -> int:
    # The same parse of cpu.stat serves the throttling collector (parse_file memoizes it).
    usage = parse_file(tick, path, parse_cpu_stat).usage_ns
    if usage is None:
        raise ParseError(f"{path}: no usage_usec in a cgroup v2 cpu.stat")
    return usage


class _Plan(NamedTuple):
    entity: str
    cpu_path: str
    mem_path: str
    cpu_key: SeriesKey
    mem_key: SeriesKey


class CpuCounters:
    """Previous readings of monotonically increasing counters, by entity, turned into rates.

    ``rate`` returns the counter's increase per second since the previous reading, or None when
    this reading only seeds (first reading, counter went backwards, time did not advance).
    """

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: dict[str, tuple[int, float]] = {}
        """Entity -> (previous reading, its timestamp); hot loops may use it directly."""

    def rate(self, entity: str, value: int, now: float) -> float | None:
        prev = self.last.get(entity)
        self.last[entity] = (value, now)
        if prev is None:
            return None
        delta, elapsed = value - prev[0], now - prev[1]
        if delta < 0 or elapsed <= 0:
            return None
        return delta / elapsed

    def forget(self, entity: str) -> None:
        self.last.pop(entity, None)

    def keep_only(self, entities: set[str]) -> None:
        """Drop the state of every entity not in ``entities``."""
        for entity in [e for e in self.last if e not in entities]:
            del self.last[entity]


class PodResourceCollector:
    """See the module docstring."""

    def __init__(self, host: Host, interval: float = 1.0) -> None:
        self.name = NAME
        self.interval = interval
        self._layout = host.layout
        self._cpu_controller, self._cpu_file, self._cpu_usage = cpu_usage_reader(host.layout)
        self._parse_memory = memory_stat_parser(host.layout)
        self._targets = TargetCache()
        self._plan: tuple[_Plan, ...] = ()
        self._counters = CpuCounters()

    def _replan(self) -> None:
        layout = self._layout
        plan = []
        for t in self._targets.plan:
            cpu_metric, mem_metric = (
                (POD_CPU_USAGE, POD_MEMORY_USAGE)
                if t.is_pod
                else (CONTAINER_CPU_USAGE, CONTAINER_MEMORY_USAGE)
            )
            plan.append(
                _Plan(
                    t.entity,
                    layout.file(self._cpu_controller, t.rel, self._cpu_file),
                    layout.file("memory", t.rel, "memory.stat"),
                    SeriesKey(cpu_metric, t.entity),
                    SeriesKey(mem_metric, t.entity),
                )
            )
        self._plan = tuple(plan)
        self._counters.keep_only({p.entity for p in plan})

    def collect(self, tick: Tick) -> CollectResult:
        if self._targets.refresh(tick.workloads):
            self._replan()
        now = tick.now
        parse_memory = self._parse_memory
        # v1: cpuacct.usage is read by nobody else and parsed inline; v2 shares cpu.stat's parse.
        cpu_usage = None if self._cpu_usage is _v1_usage_ns else self._cpu_usage
        read, parsed = tick.read, tick.parsed
        last = self._counters.last  # CpuCounters.rate, inlined: entity -> (ns, timestamp)
        samples: list[Sample] = []
        append = samples.append
        new = tuple.__new__  # Sample's own __new__ is Python code; this skips it
        gone = 0
        for entity, cpu_path, mem_path, cpu_key, mem_key in self._plan:
            try:
                if cpu_usage is None:
                    data = read(cpu_path)
                    try:
                        usage_ns = int(data)
                    except ValueError:
                        usage_ns = parse_cpuacct_usage(data, cpu_path)  # raises ParseError
                else:
                    usage_ns = cpu_usage(tick, cpu_path)
                memory = parsed(mem_path, parse_memory)
            except CgroupGoneError:
                gone += 1
                last.pop(entity, None)
                continue
            append(new(Sample, (mem_key, float(memory[0] + memory[1]))))  # MemoryUsage.usage
            prev = last.get(entity)
            last[entity] = (usage_ns, now)
            if prev is not None:
                delta, elapsed = usage_ns - prev[0], now - prev[1]
                if delta >= 0 and elapsed > 0:  # else: the cgroup was recreated; re-seed
                    append(new(Sample, (cpu_key, delta / elapsed / NS_PER_SECOND)))
        if gone:
            logger.debug("%s: %d cgroups vanished during the tick, skipped", NAME, gone)
        return CollectResult(samples=samples)
