"""Node CPU and memory usage, and memory per NUMA node (Koordinator's ``NodeResourceCollector``).

Each tick:

- **CPU**, in cores: busy jiffies of the aggregate ``cpu`` line of ``/proc/stat``
  (``user + nice + system + irq + softirq``; guest time is already inside ``user``) differenced
  against the previous tick, divided by ``USER_HZ`` and by the seconds between the two ticks
  (upstream: ``delta ticks / GetPeriodTicks(last, now)``). The first tick only seeds; a counter
  that went backwards (it cannot, short of a reboot under us) re-seeds.
- **Memory**, in bytes: ``MemTotal - MemAvailable`` of ``/proc/meminfo`` (``MemUsageBytes``), and
  with page cache ``MemTotal - MemFree`` (``MemUsageWithPageCache``) from the same bytes; and
  ``MemTotal`` itself (``node_memory_total``: the node's memory capacity where no Node object
  says it, standalone memory eviction).
- **NUMA**: for each node of ``/sys/devices/system/node``, ``MemTotal`` and the usage without
  page cache of its ``meminfo`` (``MemTotal - MemFree - Active(file) - Inactive(file)``: the
  kernel prints no ``MemAvailable`` per node; see ``koordlet.system.procfs.NumaMemInfo``), and
  its CPU usage in cores: the busy jiffies of its CPUs' ``cpu<N>`` lines of ``/proc/stat`` (the
  same read as the node's line) differenced against the previous tick (upstream's
  ``collectNodeNUMAResUsed``). The node list and each node's ``cpulist`` are read once (NUMA
  nodes do not come and go); a kernel without NUMA support has no such directory and the
  collector says so once as an unsupported source.

On demand (``CollectorRunner.read_now``): :data:`NODE_MEMORY` (``/proc/meminfo`` now, for a
memory pressure event) and :data:`MEMORY_DISTRESS` (the node's memory PSI ``total`` counters and
the reclaim counters of ``/proc/vmstat`` now, for memory eviction's distress trigger, which turns
successive readings into rates; docs/qos-eviction.md).
"""

from __future__ import annotations

import logging
import time

from apis.records import frozen
from koordlet.collectors.framework import CollectorContext, CollectResult, Fresh, OnDemand, Tick
from koordlet.errors import HostError
from koordlet.metriccache.series import (
    NODE,
    NODE_CPU_USAGE,
    NODE_MEMORY_TOTAL,
    NODE_MEMORY_USAGE,
    NODE_MEMORY_WITH_PAGE_CACHE,
    NUMA_CPU_USAGE,
    NUMA_MEMORY_TOTAL,
    NUMA_MEMORY_USAGE,
    Sample,
    SeriesKey,
    numa_entity,
)
from koordlet.system.host import Host
from koordlet.system.procfs import USER_HZ, MemInfo, VmStat, numa_node_ids, read_host_file
from koordlet.system.stats import (
    MEMINFO,
    NUMA_MEMINFO,
    PRESSURE,
    PROC_STAT_CPU,
    PROC_STAT_PER_CPU,
    VMSTAT,
)
from koordlet.system.topology import read_cpulist

logger = logging.getLogger(__name__)

NAME = "noderesource"

_CPU_KEY = SeriesKey(NODE_CPU_USAGE, NODE)
_MEM_KEY = SeriesKey(NODE_MEMORY_USAGE, NODE)
_MEM_PC_KEY = SeriesKey(NODE_MEMORY_WITH_PAGE_CACHE, NODE)
_MEM_TOTAL_KEY = SeriesKey(NODE_MEMORY_TOTAL, NODE)


def memory_samples(meminfo: MemInfo) -> list[Sample]:
    """The node's memory series from one ``/proc/meminfo``."""
    return [
        Sample(_MEM_KEY, float(meminfo.used)),
        Sample(_MEM_PC_KEY, float(meminfo.used_with_page_cache)),
        Sample(_MEM_TOTAL_KEY, float(meminfo.mem_total)),
    ]


def read_node_memory(host: Host, tick: Tick) -> Fresh[MemInfo]:
    """:data:`NODE_MEMORY`'s read: ``/proc/meminfo`` now, and the node memory series from it."""
    meminfo = MEMINFO.get(tick, MEMINFO.path(host.paths))
    return Fresh(meminfo, memory_samples(meminfo))


NODE_MEMORY: OnDemand[MemInfo] = OnDemand(
    "node_memory",
    read_node_memory,
    "/proc/meminfo now: the MemInfo (used, total...) and fresh node_memory_usage and "
    "node_memory_with_page_cache samples; what a memory pressure event needs",
)
"""The node's memory, read on demand (``CollectorRunner.read_now(NODE_MEMORY)``)."""


@frozen
class DistressReading:
    """The node's memory distress counters at one instant (see :data:`MEMORY_DISTRESS`)."""

    at: float
    """``time.monotonic()`` of the read, the time base of the rates."""
    vmstat: VmStat
    """The reclaim counters of ``/proc/vmstat``."""
    psi_some_us: int | None
    """``some`` total of ``/proc/pressure/memory``, µs; None without PSI."""
    psi_full_us: int | None
    """``full`` total, µs: time all non-idle tasks were stalled on memory at once; None
    without PSI."""
    psi_error: str = ""
    """Why there is no PSI (``/proc/pressure/memory`` absent or refused); empty with it."""


def read_memory_distress(host: Host, tick: Tick) -> Fresh[DistressReading]:
    """:data:`MEMORY_DISTRESS`'s read. Reading a pressure file brings its ``total`` up to date
    (``psi_show`` aggregates the per-CPU times first, ``kernel/sched/psi.c``), so two reads
    100 ms apart give the stall of those 100 ms, unlike ``avg10``, which moves every 2 s."""
    some = full = None
    why = ""
    try:
        psi = PRESSURE.get(tick, PRESSURE.path(host.paths, resource="memory"))
    except HostError as err:  # absent (no CONFIG_PSI), EOPNOTSUPP (psi=0): no PSI signal
        why = str(err)
    else:
        some = psi.some.total
        full = None if psi.full is None else psi.full.total
    at = time.monotonic()
    vmstat = VMSTAT.get(tick, VMSTAT.path(host.paths))
    return Fresh(DistressReading(at, vmstat, some, full, why))


MEMORY_DISTRESS: OnDemand[DistressReading] = OnDemand(
    "memory_distress",
    read_memory_distress,
    "/proc/pressure/memory and /proc/vmstat now: the stall and reclaim counters whose rates "
    "drive memory eviction's distress trigger (no series)",
)
"""The node's memory distress counters, read on demand (``read_now(MEMORY_DISTRESS)``)."""


class NodeResourceCollector:
    """See the module docstring."""

    def __init__(self, host: Host, interval: float = 1.0, *, user_hz: int = USER_HZ) -> None:
        self.name = NAME
        self.interval = interval
        self._paths = host.paths
        self._stat_path = PROC_STAT_CPU.path(host.paths)
        self._meminfo_path = MEMINFO.path(host.paths)
        self._user_hz = float(user_hz)
        self._last: tuple[int, float] | None = None
        self._numa: tuple[tuple[str, SeriesKey, SeriesKey], ...] | None = None
        self._numa_cpus: dict[int, tuple[int, ...]] = {}
        """NUMA node → its CPUs (``node<N>/cpulist``, read with the node list)."""
        self._numa_last: tuple[dict[int, int], float] | None = None

    def _numa_plan(self) -> tuple[tuple[str, SeriesKey, SeriesKey], ...]:
        if self._numa is None:
            plan = []
            for node in numa_node_ids(self._paths):
                entity = numa_entity(node)
                cpulist = self._paths.sys("devices", "system", "node", f"node{node}", "cpulist")
                try:
                    self._numa_cpus[node] = read_cpulist(read_host_file(cpulist), cpulist)
                except HostError as err:
                    logger.warning("NUMA node %d: its CPUs unknown (%s)", node, err)
                plan.append(
                    (
                        NUMA_MEMINFO.path(self._paths, node=node),
                        SeriesKey(NUMA_MEMORY_USAGE, entity),
                        SeriesKey(NUMA_MEMORY_TOTAL, entity),
                    )
                )
            self._numa = tuple(plan)
            if not plan:
                logger.info("no NUMA nodes under %s", self._paths.sys("devices", "system", "node"))
        return self._numa

    def collect(self, tick: Tick) -> CollectResult:
        now = tick.now
        busy = PROC_STAT_CPU.get(tick, self._stat_path).busy
        samples = memory_samples(MEMINFO.get(tick, self._meminfo_path))
        last, self._last = self._last, (busy, now)
        if last is not None:
            delta, elapsed = busy - last[0], now - last[1]
            if delta >= 0 and elapsed > 0:
                samples.append(Sample(_CPU_KEY, delta / self._user_hz / elapsed))
        unsupported: dict[str, str] = {}
        numa = self._numa_plan()
        if not numa:
            where = self._paths.sys("devices", "system", "node")
            unsupported["numa"] = f"no node<N> folders under {where} (kernel without NUMA)"
        for path, usage_key, total_key in numa:
            info = NUMA_MEMINFO.get(tick, path)
            samples.append(Sample(usage_key, float(info.used)))
            samples.append(Sample(total_key, float(info.mem_total)))
        if self._numa_cpus:
            samples.extend(self._numa_cpu(tick))
        return CollectResult(samples=samples, unsupported=unsupported)

    def _numa_cpu(self, tick: Tick) -> list[Sample]:
        """Each NUMA node's CPU usage since the previous tick; nothing on the first tick or
        when a node's counter went backwards (CPU hot-plug)."""
        per_cpu = PROC_STAT_PER_CPU.get(tick, self._stat_path)
        busy = {
            node: sum(per_cpu[c].busy for c in cpus if c in per_cpu)
            for node, cpus in self._numa_cpus.items()
        }
        last, self._numa_last = self._numa_last, (busy, tick.now)
        if last is None:
            return []
        elapsed = tick.now - last[1]
        if elapsed <= 0:
            return []
        out = []
        for node, value in busy.items():
            delta = value - last[0].get(node, value + 1)
            if delta >= 0:
                key = SeriesKey(NUMA_CPU_USAGE, numa_entity(node))
                out.append(Sample(key, delta / self._user_hz / elapsed))
        return out


def build(ctx: CollectorContext, interval: float) -> NodeResourceCollector:
    """The table's factory."""
    return NodeResourceCollector(ctx.host, interval)
