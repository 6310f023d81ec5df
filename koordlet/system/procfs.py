"""Parsers of the host's system-wide procfs files and of the per-NUMA-node ``meminfo`` in sysfs.

- ``/proc/stat``: CPU time in jiffies (``USER_HZ`` per second), aggregate and per CPU;
- ``/proc/meminfo`` and ``/sys/devices/system/node/node<N>/meminfo``: memory in bytes;
- ``/proc/vmstat``: the reclaim counters (pages scanned and reclaimed, refaults);
- ``/proc/<pid>/cgroup``: the cgroup of a process in every hierarchy.

Usage rules mirror Koordinator's koordlet (``pkg/koordlet/util/stat.go`` and ``meminfo.go``):
node CPU usage counts ``user + nice + system + irq + softirq`` (``guest`` is already inside
``user``); node memory usage is ``MemTotal - MemAvailable`` and usage with page cache is
``MemTotal - MemFree``.

Every path comes from :class:`~koordlet.system.paths.HostPaths`. A missing system file raises
:class:`~koordlet.errors.HostError`; a malformed one :class:`~koordlet.errors.ParseError` naming
the file and the line; a process that exited :class:`~koordlet.errors.CgroupGoneError`.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from apis.records import frozen
from koordlet.errors import CgroupGoneError, HostError, ParseError
from koordlet.system.cgroupstats import read_file_bytes
from koordlet.system.oserrors import read_error
from koordlet.system.paths import HostPaths

USER_HZ = os.sysconf("SC_CLK_TCK")
"""Jiffies per second of the counters in ``/proc/stat`` (``USER_HZ``, 100 on every mainstream
architecture)."""


def read_host_file(path: str) -> bytes:
    """A system file that must exist (procfs, sysfs): a missing one is a :class:`HostError`
    ("not there"), never the :class:`CgroupGoneError` of a cgroup race."""
    try:
        return read_file_bytes(path)
    except CgroupGoneError as err:
        raise HostError(f"{path}: missing") from err


# /proc/stat --------------------------------------------------------------------------------


class CpuTimes(NamedTuple):
    """One ``cpu`` line of ``/proc/stat``, in jiffies (divide by :data:`USER_HZ` for seconds)."""

    user: int
    """Time in user mode, guest time included."""
    nice: int
    """Time in user mode at a positive nice value, guest_nice included."""
    system: int
    """Time in kernel mode."""
    idle: int
    """Idle time."""
    iowait: int
    """Idle time with I/O outstanding (unreliable per CPU, kept for totals)."""
    irq: int
    """Time servicing hard interrupts."""
    softirq: int
    """Time servicing soft interrupts."""
    steal: int = 0
    """Time stolen by the hypervisor (0 on kernels that do not print it)."""
    guest: int = 0
    """Time running a guest; already counted in ``user``."""
    guest_nice: int = 0
    """Time running a niced guest; already counted in ``nice``."""

    @property
    def busy(self) -> int:
        """Koordinator's busy jiffies: ``user + nice + system + irq + softirq``."""
        return self.user + self.nice + self.system + self.irq + self.softirq

    @property
    def total(self) -> int:
        """All jiffies: busy plus idle, iowait and steal (guest is inside user and nice)."""
        return self.busy + self.idle + self.iowait + self.steal


def _cpu_times(line: bytes, path: str) -> CpuTimes:
    fields = line.split()[1:]
    if not 7 <= len(fields) <= 10:
        raise ParseError(f"{path}: bad cpu line {line.decode(errors='replace')!r}")
    try:
        return CpuTimes(*map(int, fields))
    except ValueError:
        raise ParseError(f"{path}: bad cpu line {line.decode(errors='replace')!r}") from None


def parse_proc_stat_cpu(data: bytes, path: str) -> CpuTimes:
    """The aggregate ``cpu`` line, which the kernel prints first."""
    end = data.find(b"\n")
    line = data if end < 0 else data[:end]
    if not line.startswith(b"cpu "):
        raise ParseError(f"{path}: first line is not the aggregate cpu line: {line[:80]!r}")
    return _cpu_times(line, path)


def parse_proc_stat_per_cpu(data: bytes, path: str) -> dict[int, CpuTimes]:
    """The ``cpu<N>`` lines by CPU id (online CPUs only: the kernel skips offline ones)."""
    per_cpu: dict[int, CpuTimes] = {}
    for line in data.split(b"\n")[1:]:
        if not line.startswith(b"cpu"):
            break  # the cpu lines come first, then intr, ctxt...
        name = line[3 : line.find(b" ")]
        if not name.isdigit():
            raise ParseError(f"{path}: bad cpu line {line[:80]!r}")
        per_cpu[int(name)] = _cpu_times(line, path)
    return per_cpu


def read_proc_stat_cpu(paths: HostPaths) -> CpuTimes:
    """Aggregate CPU times of the host since boot."""
    path = paths.proc("stat")
    return parse_proc_stat_cpu(read_host_file(path), path)


def read_proc_stat_per_cpu(paths: HostPaths) -> dict[int, CpuTimes]:
    """CPU times of each online CPU since boot."""
    path = paths.proc("stat")
    return parse_proc_stat_per_cpu(read_host_file(path), path)


# meminfo -----------------------------------------------------------------------------------


def _meminfo_values(lines: list[bytes], path: str, wanted: dict[bytes, str]) -> dict[str, int]:
    """``{field: bytes}`` of the wanted ``Key: value [kB]`` lines (counts stay counts)."""
    values: dict[str, int] = {}
    for line in lines:
        key, sep, rest = line.partition(b":")
        field = wanted.get(key)
        if field is None:
            if not sep and line.strip():
                raise ParseError(f"{path}: bad line {line.decode(errors='replace')!r}")
            continue
        parts = rest.split()
        try:
            value = int(parts[0])
        except (IndexError, ValueError):
            raise ParseError(f"{path}: bad line {line.decode(errors='replace')!r}") from None
        if len(parts) > 1:
            if parts[1:] != [b"kB"]:
                raise ParseError(f"{path}: unknown unit in {line.decode(errors='replace')!r}")
            value *= 1024
        values[field] = value
    return values


def _require(values: dict[str, int], path: str, wanted: dict[bytes, str], *keys: bytes) -> None:
    missing = [key.decode() for key in keys if wanted[key] not in values]
    if missing:
        raise ParseError(f"{path}: missing {', '.join(missing)}")


@frozen
class MemInfo:
    """``/proc/meminfo`` in bytes (``HugePages_*`` are page counts)."""

    mem_total: int
    """Usable RAM (``MemTotal``)."""
    mem_free: int
    """Unused RAM (``MemFree``)."""
    mem_available: int
    """RAM available without swapping, reclaimable cache included (``MemAvailable``)."""
    buffers: int = 0
    """Block device buffers (``Buffers``)."""
    cached: int = 0
    """Page cache excluding swap cache (``Cached``)."""
    swap_cached: int = 0
    """Swapped-out memory also still in RAM (``SwapCached``)."""
    active_anon: int = 0
    """``Active(anon)``."""
    inactive_anon: int = 0
    """``Inactive(anon)``."""
    active_file: int = 0
    """``Active(file)``."""
    inactive_file: int = 0
    """``Inactive(file)``."""
    unevictable: int = 0
    """``Unevictable``."""
    shmem: int = 0
    """Shared memory and tmpfs (``Shmem``)."""
    swap_total: int = 0
    """``SwapTotal``."""
    swap_free: int = 0
    """``SwapFree``."""
    hugepages_total: int = 0
    """Huge pages in the default-size pool (``HugePages_Total``, a count)."""
    hugepages_free: int = 0
    """``HugePages_Free`` (a count)."""
    hugepages_rsvd: int = 0
    """``HugePages_Rsvd`` (a count)."""
    hugepages_surp: int = 0
    """``HugePages_Surp`` (a count)."""
    hugepage_size: int = 0
    """Default huge page size in bytes (``Hugepagesize``)."""
    hugetlb: int = 0
    """Bytes in huge pages of every size (``Hugetlb``, 4.16+; 0 when absent)."""

    @property
    def used(self) -> int:
        """Koordinator's node memory usage: ``MemTotal - MemAvailable`` (``MemUsageBytes``)."""
        return self.mem_total - self.mem_available

    @property
    def used_with_page_cache(self) -> int:
        """Usage with page cache: ``MemTotal - MemFree`` (``MemUsageWithPageCache``)."""
        return self.mem_total - self.mem_free


_MEMINFO_KEYS = {
    b"MemTotal": "mem_total",
    b"MemFree": "mem_free",
    b"MemAvailable": "mem_available",
    b"Buffers": "buffers",
    b"Cached": "cached",
    b"SwapCached": "swap_cached",
    b"Active(anon)": "active_anon",
    b"Inactive(anon)": "inactive_anon",
    b"Active(file)": "active_file",
    b"Inactive(file)": "inactive_file",
    b"Unevictable": "unevictable",
    b"Shmem": "shmem",
    b"SwapTotal": "swap_total",
    b"SwapFree": "swap_free",
    b"HugePages_Total": "hugepages_total",
    b"HugePages_Free": "hugepages_free",
    b"HugePages_Rsvd": "hugepages_rsvd",
    b"HugePages_Surp": "hugepages_surp",
    b"Hugepagesize": "hugepage_size",
    b"Hugetlb": "hugetlb",
}


def parse_meminfo(data: bytes, path: str) -> MemInfo:
    """``/proc/meminfo``; ``MemTotal``, ``MemFree`` and ``MemAvailable`` (3.14+) are required."""
    values = _meminfo_values(data.splitlines(), path, _MEMINFO_KEYS)
    _require(values, path, _MEMINFO_KEYS, b"MemTotal", b"MemFree", b"MemAvailable")
    return MemInfo(**values)


def read_meminfo(paths: HostPaths) -> MemInfo:
    """The host's ``/proc/meminfo``."""
    path = paths.proc("meminfo")
    return parse_meminfo(read_host_file(path), path)


@frozen
class NumaMemInfo:
    """One NUMA node's ``meminfo`` in bytes (``HugePages_*`` are page counts).

    The kernel prints no ``MemAvailable`` per node, so :attr:`used` estimates it the way
    Koordinator's page-cache-free rules do: reclaimable page cache is not usage.
    """

    mem_total: int
    """RAM of the node (``MemTotal``)."""
    mem_free: int
    """Unused RAM of the node (``MemFree``)."""
    mem_used: int
    """``MemTotal - MemFree`` as the kernel prints it (``MemUsed``)."""
    active_anon: int = 0
    """``Active(anon)``."""
    inactive_anon: int = 0
    """``Inactive(anon)``."""
    active_file: int = 0
    """``Active(file)``."""
    inactive_file: int = 0
    """``Inactive(file)``."""
    unevictable: int = 0
    """``Unevictable``."""
    file_pages: int = 0
    """All page cache of the node (``FilePages``)."""
    shmem: int = 0
    """``Shmem``."""
    hugepages_total: int = 0
    """``HugePages_Total`` (a count)."""
    hugepages_free: int = 0
    """``HugePages_Free`` (a count)."""
    hugepages_surp: int = 0
    """``HugePages_Surp`` (a count)."""

    @property
    def used(self) -> int:
        """Usage without page cache: ``MemTotal - MemFree - Active(file) - Inactive(file)``.

        Upstream keeps per-node meminfo for capacity only (its ``MemUsageBytes()`` on a node's
        meminfo would read the absent ``MemAvailable`` as 0); this is the per-node counterpart
        of ``MemTotal - MemAvailable``, counting the file LRU lists as reclaimable.
        """
        return max(0, self.mem_used - self.active_file - self.inactive_file)

    @property
    def used_with_page_cache(self) -> int:
        """``MemTotal - MemFree``, the node rule with page cache."""
        return self.mem_used


_NUMA_MEMINFO_KEYS = {
    b"MemTotal": "mem_total",
    b"MemFree": "mem_free",
    b"MemUsed": "mem_used",
    b"Active(anon)": "active_anon",
    b"Inactive(anon)": "inactive_anon",
    b"Active(file)": "active_file",
    b"Inactive(file)": "inactive_file",
    b"Unevictable": "unevictable",
    b"FilePages": "file_pages",
    b"Shmem": "shmem",
    b"HugePages_Total": "hugepages_total",
    b"HugePages_Free": "hugepages_free",
    b"HugePages_Surp": "hugepages_surp",
}


def parse_numa_meminfo(data: bytes, path: str, node: int) -> NumaMemInfo:
    """A ``node<N>/meminfo``: lines ``Node <N> Key: value [kB]``; ``MemTotal`` and ``MemFree``
    are required, and every line must name ``node``."""
    prefix = b"Node %d " % node
    lines = []
    for line in data.splitlines():
        if not line.startswith(prefix):
            if line.strip():
                raise ParseError(f"{path}: line not of node {node}: {line[:80]!r}")
            continue
        lines.append(line[len(prefix) :].lstrip())
    values = _meminfo_values(lines, path, _NUMA_MEMINFO_KEYS)
    _require(values, path, _NUMA_MEMINFO_KEYS, b"MemTotal", b"MemFree")
    values.setdefault("mem_used", values["mem_total"] - values["mem_free"])
    return NumaMemInfo(**values)


_NODE_DIR = re.compile(r"node(\d+)")


def numa_node_ids(paths: HostPaths) -> list[int]:
    """Online NUMA nodes (``/sys/devices/system/node/node<N>``), ascending; empty when the
    kernel has no NUMA support (no such directory)."""
    try:
        names = os.listdir(paths.sys("devices", "system", "node"))
    except FileNotFoundError:
        return []
    except OSError as err:
        raise read_error(paths.sys("devices", "system", "node"), err) from err
    return sorted(int(m[1]) for name in names if (m := _NODE_DIR.fullmatch(name)))


def read_numa_meminfo(paths: HostPaths) -> dict[int, NumaMemInfo]:
    """Each online NUMA node's meminfo by node id; empty on a kernel without NUMA support."""
    result: dict[int, NumaMemInfo] = {}
    for node in numa_node_ids(paths):
        path = paths.sys("devices", "system", "node", f"node{node}", "meminfo")
        result[node] = parse_numa_meminfo(read_host_file(path), path, node)
    return result


# /proc/vmstat ------------------------------------------------------------------------------


@frozen
class VmStat:
    """The reclaim counters of ``/proc/vmstat``, in pages, cumulative since boot.

    They count **global** reclaim only: a cgroup reclaiming at its own memory limit is counted in
    that cgroup's statistics, not here (``shrink_inactive_list`` in ``mm/vmscan.c`` skips the
    node counters when ``cgroup_reclaim(sc)``; measured on this host's Linux 6.18: a memcg
    thrashing at its limit moved ``workingset_refault_file`` by 250,000 pages/s and ``pgscan_*``
    not at all).
    """

    pgscan: int
    """Pages scanned by reclaim: kswapd, direct, khugepaged and proactive together."""
    pgsteal: int
    """Pages reclaimed, the same reclaimers."""
    pgscan_direct: int
    """Pages scanned by direct reclaim (allocating tasks stalled in reclaim themselves)."""
    refault: int = 0
    """``workingset_refault_*``: evicted pages faulted back in soon after (thrashing)."""


_RECLAIMERS = "kswapd|direct|khugepaged|proactive"
_ZONES = "dma32|dma|normal|movable|highmem|device"
_VMSTAT_COUNTER = re.compile(rf"(pgscan|pgsteal)_({_RECLAIMERS})(?:_(?:{_ZONES}))?")
"""A reclaim counter: ``pgscan_kswapd`` (4.8+), or per zone before 4.8
(``pgscan_kswapd_normal``). ``pgscan_anon``/``pgscan_file`` (5.8+) split the same pages by LRU
and ``pgscan_direct_throttle`` counts throttling events: neither is added."""


def parse_vmstat(data: bytes, path: str) -> VmStat:
    """``/proc/vmstat`` (lines ``name value``); a file without any ``pgscan_*`` counter is a
    :class:`ParseError` (every Linux since 2.6 has them)."""
    totals = {"pgscan": 0, "pgsteal": 0}
    direct = refault = 0
    seen = False
    for line in data.splitlines():
        name, _, value = line.partition(b" ")
        if not name.startswith((b"pgscan_", b"pgsteal_", b"workingset_refault")):
            continue
        try:
            count = int(value)
        except ValueError:
            raise ParseError(f"{path}: not a number in {line[:80]!r}") from None
        text = name.decode("ascii", "replace")
        if text.startswith("workingset_refault"):
            refault += count
            continue
        match = _VMSTAT_COUNTER.fullmatch(text)
        if match is None:
            continue
        seen = True
        totals[match[1]] += count
        if match[1] == "pgscan" and match[2] == "direct":
            direct += count
    if not seen:
        raise ParseError(f"{path}: no pgscan_*/pgsteal_* counters")
    return VmStat(totals["pgscan"], totals["pgsteal"], direct, refault)


# /proc/<pid>/cgroup ------------------------------------------------------------------------


def parse_pid_cgroups(data: bytes, path: str) -> dict[str, str]:
    """``{controller: cgroup path}`` of a ``/proc/<pid>/cgroup``.

    v1 lines ``4:memory:/kubepods/...`` give one entry per controller (``2:cpu,cpuacct:/x``
    gives two); named hierarchies keep their name (``name=systemd``); the v2 line ``0::/x``
    is the entry ``""``. Paths are kept as the kernel prints them (a colon in a path is fine).
    """
    cgroups: dict[str, str] = {}
    for line in data.splitlines():
        if not line:
            continue
        parts = line.split(b":", 2)
        if len(parts) != 3 or not parts[0].isdigit():
            raise ParseError(f"{path}: bad line {line.decode(errors='replace')!r}")
        hierarchy, controllers, cgroup_path = parts
        decoded = cgroup_path.decode(errors="surrogateescape")
        if not controllers:
            if hierarchy != b"0":
                raise ParseError(f"{path}: v1 line without controllers {line!r}")
            cgroups[""] = decoded
            continue
        for controller in controllers.split(b","):
            cgroups[controller.decode()] = decoded
    return cgroups


def read_pid_cgroups(paths: HostPaths, pid: int) -> dict[str, str]:
    """The cgroups of process ``pid``; :class:`CgroupGoneError` when it exited."""
    path = paths.proc(str(pid), "cgroup")
    return parse_pid_cgroups(read_file_bytes(path), path)
