"""CPU of the best-effort tier: real limit, request and usage (Koordinator's
``BEResourceCollector``). All three are in cores, on entity ``be``.

- **usage**: the CPU-time counter of the BestEffort QoS cgroup (``kubepods/besteffort`` or
  ``kubepods.slice/kubepods-besteffort.slice``; v1 ``cpuacct.usage``, v2 ``cpu.stat``
  ``usage_usec``) differenced against the previous tick over the elapsed seconds. The first
  reading only seeds (upstream reports 0 then); a counter that went backwards re-seeds.
- **request**: the sum over the inventory's pods of Koordinator class BE of their
  ``kubernetes.io/batch-cpu`` requests (upstream's; ``PodInfo.extended_requests``), for a pod
  the source knows no extended requests of, its plain CPU request (``cpu_request_milli``); a
  pod whose request is unknown (kubelet-free discovery knows no requests) counts as 0.
- **throttling** (ours: upstream has no such series): the fraction of the BestEffort QoS
  cgroup's own CFS periods that were throttled since the previous tick (``cpu.stat``
  ``nr_throttled`` / ``nr_periods`` differences, as the pod throttling collector computes them),
  ``be_cpu_throttled_ratio``; what the ``cfsQuota`` suppress policy costs BE, as a whole.
- **real limit**: what the BE tier can use at most, the smaller of
  - its cpuset: the fewest CPUs among the BestEffort QoS cgroup's ``cpuset.cpus`` and those of
    the BE containers below it (upstream takes the minimum so that a sandbox's all-CPU cpuset
    does not hide a shrunk one; v2 reads ``cpuset.cpus.effective``, as upstream does). An empty
    cpuset (not configured) is ignored. Where the cpuset controller is absent the tier may use
    every online CPU; the collector then bounds it by the online CPUs and says so as the
    unsupported source ``be_cpuset``;
  - its CFS quota: v1 ``cpu.cfs_quota_us / cpu.cfs_period_us`` (``-1``: none), v2 ``cpu.max``
    (``max``: none).

When the BestEffort QoS cgroup itself does not exist, only the request is reported and the
source ``be_cgroup`` is listed as unsupported with the reason.
"""

from __future__ import annotations

import logging

from apis.extension import KubeQOS, QoSClass
from apis.manager_keys import BATCH_CPU
from koordlet.collectors.framework import CollectorContext, CollectResult, Tick
from koordlet.collectors.shared import CpuCounters
from koordlet.errors import CgroupGoneError, ParseError
from koordlet.metriccache.series import (
    BE,
    BE_CPU_REAL_LIMIT,
    BE_CPU_REQUEST,
    BE_CPU_THROTTLED_RATIO,
    BE_CPU_USAGE,
    Sample,
    SeriesKey,
)
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.host import Host
from koordlet.system.stats import (
    CPU_CFS_PERIOD,
    CPU_CFS_QUOTA,
    CPU_ONLINE,
    CPU_THROTTLING,
    CPU_USAGE,
    CPUSET_EFFECTIVE_CPUS,
)
from koordlet.system.topology import read_cpulist

logger = logging.getLogger(__name__)

NAME = "beresource"
NS_PER_SECOND = 1e9

_LIMIT_KEY = SeriesKey(BE_CPU_REAL_LIMIT, BE)
_REQUEST_KEY = SeriesKey(BE_CPU_REQUEST, BE)
_USAGE_KEY = SeriesKey(BE_CPU_USAGE, BE)
_THROTTLED_KEY = SeriesKey(BE_CPU_THROTTLED_RATIO, BE)


def cfs_cores(quota: int | None, period: int, path: str) -> float | None:
    """Cores allowed by a CFS ``quota`` per ``period`` (both µs); None when unlimited."""
    if quota is None:
        return None
    if period <= 0:
        raise ParseError(f"{path}: CFS period {period} is not positive")
    return quota / period


class BEResourceCollector:
    """See the module docstring."""

    def __init__(self, host: Host, interval: float = 1.0) -> None:
        self.name = NAME
        self.interval = interval
        layout = host.layout
        be_dir = layout.qos_dir(KubeQOS.BESTEFFORT)
        self._be_dir = be_dir
        self._cpu = CPU_USAGE.bind(layout)
        self._usage_path = self._cpu.path(be_dir)
        self._cpuset = CPUSET_EFFECTIVE_CPUS.bind(layout)
        self._be_cpuset_path = self._cpuset.path(be_dir)
        self._quota = CPU_CFS_QUOTA.bind(layout)
        self._period = CPU_CFS_PERIOD.bind(layout)
        self._quota_path = self._quota.path(be_dir)
        self._period_path = self._period.path(be_dir)
        self._throttling = CPU_THROTTLING.bind(layout)
        self._throttling_path = self._throttling.path(be_dir)
        self._last_throttling: tuple[int, int] | None = None
        self._online_path = CPU_ONLINE.path(host.paths)
        self._snapshot: WorkloadSnapshot | None = None
        self._container_cpusets: tuple[str, ...] = ()
        self._request_cores = 0.0
        self._counters = CpuCounters()
        self._cpu_counts: dict[bytes, int] = {}
        """Parsed cpuset sizes by file content: cpusets repeat, parsing a cpulist does not pay."""

    def _count(self, data: bytes, path: str) -> int:
        count = self._cpu_counts.get(data)
        if count is None:
            if len(self._cpu_counts) > 256:
                self._cpu_counts.clear()
            count = self._cpu_counts[data] = len(read_cpulist(data, path))
        return count

    def _replan(self, snapshot: WorkloadSnapshot) -> None:
        self._snapshot = snapshot
        prefix = self._be_dir + "/"
        paths: list[str] = []
        milli = 0
        unknown = 0
        for pod in snapshot.pods.values():
            if pod.qos is QoSClass.BE:
                batch = pod.extended_requests.get(BATCH_CPU)
                if batch is not None:
                    milli += max(0, batch)
                elif pod.extended_requests:
                    continue  # extended requests known, no batch-cpu among them: 0
                elif pod.cpu_request_milli is None:
                    unknown += 1
                else:
                    milli += max(0, pod.cpu_request_milli)
            if pod.cgroup_dir.startswith(prefix):
                paths.extend(self._cpuset.path(c.cgroup_dir) for c in pod.containers)
        self._container_cpusets = tuple(paths)
        self._request_cores = milli / 1000
        if unknown:
            logger.debug("%s: %d BE pods without a known CPU request count as 0", NAME, unknown)

    def collect(self, tick: Tick) -> CollectResult:
        if tick.workloads is not self._snapshot:
            self._replan(tick.workloads)
        samples = [Sample(_REQUEST_KEY, self._request_cores)]
        unsupported: dict[str, str] = {}
        try:
            usage_ns = self._cpu.get(tick, self._usage_path)
            quota = cfs_cores(
                self._quota.get(tick, self._quota_path),
                self._period.get(tick, self._period_path),
                self._quota_path,
            )
        except CgroupGoneError:
            self._counters.forget(BE)
            self._last_throttling = None
            unsupported["be_cgroup"] = f"the BestEffort QoS cgroup {self._be_dir} does not exist"
            return CollectResult(samples=samples, unsupported=unsupported)
        throttled = self._throttled_ratio(tick)
        if throttled is not None:
            samples.append(Sample(_THROTTLED_KEY, throttled))

        cpuset_cores = self._cpuset_cores(tick, unsupported)
        limit = cpuset_cores if quota is None else min(cpuset_cores, quota)
        samples.append(Sample(_LIMIT_KEY, float(limit)))
        rate = self._counters.rate(BE, usage_ns, tick.now)
        if rate is not None:
            samples.append(Sample(_USAGE_KEY, rate / NS_PER_SECOND))
        return CollectResult(samples=samples, unsupported=unsupported)

    def _throttled_ratio(self, tick: Tick) -> float | None:
        """Δ``nr_throttled`` / Δ``nr_periods`` of the BE QoS cgroup since the last tick (0 when no
        period elapsed); None on the first reading or after a counter reset (re-seeds)."""
        try:
            periods, throttled = self._throttling.get(tick, self._throttling_path)
        except CgroupGoneError:
            self._last_throttling = None
            return None
        prev, self._last_throttling = self._last_throttling, (periods, throttled)
        if prev is None:
            return None
        d_periods, d_throttled = periods - prev[0], throttled - prev[1]
        if d_periods < 0 or d_throttled < 0:
            return None
        return d_throttled / d_periods if d_periods else 0.0

    def _cpuset_cores(self, tick: Tick, unsupported: dict[str, str]) -> int:
        """Fewest CPUs among the BE QoS cgroup's cpuset and its containers' (empty ones aside)."""
        try:
            data = self._cpuset.get(tick, self._be_cpuset_path)
        except CgroupGoneError:
            unsupported["be_cpuset"] = (
                f"no {self._cpuset.file} for {self._be_dir}: the cpuset controller is not "
                "available there, so BE may use every online CPU"
            )
            return len(CPU_ONLINE.get(tick, self._online_path))
        fewest = self._count(data, self._be_cpuset_path) or None
        paths = self._container_cpusets
        column = self._cpuset.column(tick, paths) if paths else None
        if column is not None:  # every file read at once (a gone one: file by file below)
            counts = [n for n in map(self._count, column, paths) if n]
            if counts:
                fewest = min(counts) if fewest is None else min(fewest, *counts)
            paths = ()
        for path in paths:
            try:
                count = self._count(self._cpuset.get(tick, path), path)
            except CgroupGoneError:
                continue
            if count and (fewest is None or count < fewest):
                fewest = count
        if fewest is None:
            return len(CPU_ONLINE.get(tick, self._online_path))
        return fewest


def build(ctx: CollectorContext, interval: float) -> BEResourceCollector:
    """The table's factory."""
    return BEResourceCollector(ctx.host, interval)
