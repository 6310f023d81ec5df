"""CPU of the best-effort tier: real limit, request and usage (Koordinator's
``BEResourceCollector``). All three are in cores, on entity ``be``.

- **usage**: the CPU-time counter of the BestEffort QoS cgroup (``kubepods/besteffort`` or
  ``kubepods.slice/kubepods-besteffort.slice``; v1 ``cpuacct.usage``, v2 ``cpu.stat``
  ``usage_usec``) differenced against the previous tick over the elapsed seconds. The first
  reading only seeds (upstream reports 0 then); a counter that went backwards re-seeds.
- **request**: the sum of ``cpu_request_milli`` / 1000 over the inventory's pods of Koordinator
  class BE. Upstream sums the pods' ``kubernetes.io/batch-cpu`` requests; the inventory carries
  the pod's CPU request in ``PodInfo.cpu_request_milli``, and a pod whose request is unknown
  (None: kubelet-free discovery knows no requests) counts as 0.
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
from koordlet.collectors.framework import CollectResult, Tick
from koordlet.collectors.podresource import CpuCounters, cpu_usage_reader
from koordlet.errors import CgroupGoneError, ParseError
from koordlet.metriccache.series import (
    BE,
    BE_CPU_REAL_LIMIT,
    BE_CPU_REQUEST,
    BE_CPU_USAGE,
    Sample,
    SeriesKey,
)
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.cgroups import CgroupVersion
from koordlet.system.host import Host
from koordlet.system.topology import read_cpulist

logger = logging.getLogger(__name__)

NAME = "beresource"
NS_PER_SECOND = 1e9

_LIMIT_KEY = SeriesKey(BE_CPU_REAL_LIMIT, BE)
_REQUEST_KEY = SeriesKey(BE_CPU_REQUEST, BE)
_USAGE_KEY = SeriesKey(BE_CPU_USAGE, BE)


def parse_cfs_quota(version: CgroupVersion, quota: bytes, period: bytes, path: str) -> float | None:
    """Cores allowed by a CFS quota; None when unlimited. v1: ``quota`` and ``period`` are the
    two files; v2: ``quota`` is ``cpu.max`` (``"<quota|max> <period>"``) and ``period`` unused."""
    if version is CgroupVersion.V2:
        fields = quota.split()
        if len(fields) != 2:
            raise ParseError(f"{path}: expected '<quota|max> <period>', got {quota[:64]!r}")
        if fields[0] == b"max":
            return None
        raw_quota, raw_period = fields
    else:
        raw_quota, raw_period = quota, period
    try:
        q, p = int(raw_quota), int(raw_period)
    except ValueError:
        raise ParseError(f"{path}: bad CFS quota {quota[:64]!r} / {period[:64]!r}") from None
    if q < 0:
        return None  # v1: -1 means no quota
    if p <= 0:
        raise ParseError(f"{path}: CFS period {p} is not positive")
    return q / p


class BEResourceCollector:
    """See the module docstring."""

    def __init__(self, host: Host, interval: float = 1.0) -> None:
        self.name = NAME
        self.interval = interval
        layout = host.layout
        self._layout = layout
        self._v2 = layout.version is CgroupVersion.V2
        be_dir = layout.qos_dir(KubeQOS.BESTEFFORT)
        self._be_dir = be_dir
        controller, filename, self._cpu_usage = cpu_usage_reader(layout)
        self._usage_path = layout.file(controller, be_dir, filename)
        self._cpuset_file = "cpuset.cpus.effective" if self._v2 else "cpuset.cpus"
        self._be_cpuset_path = layout.file("cpuset", be_dir, self._cpuset_file)
        if self._v2:
            self._quota_paths = (layout.file("cpu", be_dir, "cpu.max"), "")
        else:
            self._quota_paths = (
                layout.file("cpu", be_dir, "cpu.cfs_quota_us"),
                layout.file("cpu", be_dir, "cpu.cfs_period_us"),
            )
        self._online_path = host.paths.sys("devices", "system", "cpu", "online")
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
                if pod.cpu_request_milli is None:
                    unknown += 1
                else:
                    milli += max(0, pod.cpu_request_milli)
            if pod.cgroup_dir.startswith(prefix):
                paths.extend(
                    self._layout.file("cpuset", c.cgroup_dir, self._cpuset_file)
                    for c in pod.containers
                )
        self._container_cpusets = tuple(paths)
        self._request_cores = milli / 1000
        if unknown:
            logger.debug("%s: %d BE pods without a known CPU request count as 0", NAME, unknown)

    def collect(self, tick: Tick) -> CollectResult:
        if tick.workloads is not self._snapshot:
            self._replan(tick.workloads)
        samples = [Sample(_REQUEST_KEY, self._request_cores)]
        unsupported: dict[str, str] = {}
        read = tick.read
        try:
            usage_ns = self._cpu_usage(tick, self._usage_path)
            quota_path, period_path = self._quota_paths
            quota = parse_cfs_quota(
                self._layout.version,
                read(quota_path),
                read(period_path) if period_path else b"",
                quota_path,
            )
        except CgroupGoneError:
            self._counters.forget(BE)
            unsupported["be_cgroup"] = f"the BestEffort QoS cgroup {self._be_dir} does not exist"
            return CollectResult(samples=samples, unsupported=unsupported)

        cpuset_cores = self._cpuset_cores(tick, unsupported)
        limit = cpuset_cores if quota is None else min(cpuset_cores, quota)
        samples.append(Sample(_LIMIT_KEY, float(limit)))
        rate = self._counters.rate(BE, usage_ns, tick.now)
        if rate is not None:
            samples.append(Sample(_USAGE_KEY, rate / NS_PER_SECOND))
        return CollectResult(samples=samples, unsupported=unsupported)

    def _cpuset_cores(self, tick: Tick, unsupported: dict[str, str]) -> int:
        """Fewest CPUs among the BE QoS cgroup's cpuset and its containers' (empty ones aside)."""
        try:
            data = tick.read(self._be_cpuset_path)
        except CgroupGoneError:
            online = read_cpulist(tick.read(self._online_path), self._online_path)
            unsupported["be_cpuset"] = (
                f"no {self._cpuset_file} for {self._be_dir}: the cpuset controller is not "
                "available there, so BE may use every online CPU"
            )
            return len(online)
        fewest = self._count(data, self._be_cpuset_path) or None
        for path in self._container_cpusets:
            try:
                count = self._count(tick.read(path), path)
            except CgroupGoneError:
                continue
            if count and (fewest is None or count < fewest):
                fewest = count
        if fewest is None:
            online = read_cpulist(tick.read(self._online_path), self._online_path)
            return len(online)
        return fewest
