"""Every kernel statistics file the collectors read, declared once, with its parser.

The read side of :mod:`koordlet.system.knobs`. A :class:`CgroupStat` names a value of a cgroup
(``cpu_usage``, ``memory_stat``, ``cpu_cfs_quota``...) and, for each cgroup version, the
:class:`Source` that holds it: the v1 controller, the file, the file's parser and, where the file
holds more than this value, how the value is picked from the parsed file. A :class:`HostStat`
names a ``/proc`` or ``/sys`` file. Callers never branch on the cgroup version: a collector binds
the stats it needs to the layout when it is built (:meth:`CgroupStat.bind`: the version is
resolved there, once), computes a cgroup's path once per inventory snapshot
(:meth:`BoundStat.path`) and reads it through the tick (``BoundStat.get``: a read and a parse, no
lookup).

**Shared parses.** A source marked ``shared`` is parsed through the tick's memo
(``Tick.parsed``): another stat or another collector parses the same file with the same parser
in the same tick (v2 ``cpu.stat`` holds both the CPU time and the throttling counters; every
``memory.stat`` feeds four collectors; v2 ``cpu.max`` holds quota and period). The others are read
and parsed directly, which costs less than the memo. ``tests/unit/test_stats.py`` checks that
sources sharing a file and a parser are all marked.

**Absence.** A missing cgroup file raises ``CgroupGoneError`` (``oserrors.read_error``): the
cgroup went away, a race. A missing host file of a :class:`HostStat` that every kernel has
(``required``) is a ``HostError`` instead: it is not a race, the host is broken.

The formats and upstream's rules for each value are in :mod:`koordlet.system.cgroupstats`,
:mod:`koordlet.system.procfs` and :mod:`koordlet.system.psi`; ``docs/collectors.md`` lists the
table.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Generic, Literal, Protocol, TypeVar

from apis.records import frozen
from koordlet.errors import CgroupGoneError, HostError, ParseError, UnsupportedError
from koordlet.system.cgroups import CgroupLayout, CgroupVersion
from koordlet.system.cgroupstats import (
    CpuStat,
    MemoryLru,
    MemoryUsage,
    cpu_max_period,
    lru_of_memory_stat,
    parse_cfs_quota_v1,
    parse_cpu_max,
    parse_cpu_stat,
    parse_cpu_throttling,
    parse_integer,
    parse_memory_lru_v1,
    parse_memory_stat_v1,
    parse_memory_stat_v2,
    parse_raw,
)
from koordlet.system.nativeread import CPU_THROTTLING_V1, INTEGER, MEMORY_LRU_V1, NativeFormat
from koordlet.system.paths import HostPaths
from koordlet.system.procfs import (
    CpuTimes,
    MemInfo,
    NumaMemInfo,
    VmStat,
    parse_meminfo,
    parse_numa_meminfo,
    parse_proc_stat_cpu,
    parse_proc_stat_per_cpu,
    parse_vmstat,
)
from koordlet.system.psi import PSIStats, parse_psi
from koordlet.system.resctrl import parse_cpu_flags
from koordlet.system.topology import read_cpulist

T = TypeVar("T")

Parser = Callable[[bytes, str], T]
"""A file parser: ``(content, path) -> value``, raising ``ParseError`` naming ``path``."""


class StatReader(Protocol):
    """How a stat is read: ``koordlet.collectors.framework.Tick`` (memoized per tick) fits."""

    def read(self, path: str) -> bytes:
        """The file's bytes; ``CgroupGoneError`` when it is absent, ``HostError`` otherwise."""
        ...

    def parsed(self, path: str, parser: Parser[T]) -> T:
        """``parser(read(path), path)``, computed once per tick for each (parser, path)."""
        ...


class ColumnReader(StatReader, Protocol):
    """A reader of whole columns of files: ``koordlet.collectors.framework.Tick`` fits."""

    def column(self, paths: tuple[str, ...]) -> list[bytes] | None:
        """Every file's bytes, in order, read at once; None when that does not apply."""
        ...

    def native_column(self, paths: tuple[str, ...], fmt: NativeFormat) -> list[Any] | None:
        """``fmt``'s parse of every file, read and parsed in C; None when that does not apply."""
        ...

    def parsed_column(self, paths: Sequence[str], parser: Parser[T]) -> list[T] | None:
        """Every ``parsed(path, parser)`` when all are memoized already; else None."""
        ...

    def remember(self, paths: Sequence[str], parser: Parser[T], values: Sequence[T]) -> None:
        """Store values parsed in bulk as ``parsed`` stores them."""
        ...


@frozen
class Source(Generic[T]):
    """Where a stat lives on one cgroup version."""

    controller: str
    """The v1 controller whose hierarchy holds the file (ignored on v2, kept for the docs)."""
    file: str
    """File name in the cgroup's folder."""
    parse: Parser[Any]
    """The file's parser; the tick's memo key when ``shared``."""
    pick: Callable[[Any, str], T] | None = None
    """``(parsed file, path) -> value`` when the file holds more than this stat; None: the parse
    is the value."""
    shared: bool = False
    """Parsed through the tick's memo: another stat or collector parses the same file alike."""
    kernel_wide: bool = False
    """An existing cgroup without the file means no cgroup has it (a boot-time switch), so a
    reader may stop at the first absence instead of trying every cgroup."""
    native: NativeFormat | None = None
    """The file's layout as the native column reader knows it (``koordlet.system.nativeread``),
    when it parses to what ``parse`` returns (``pick`` is None): columns of it are read in C."""


class BoundStat(Generic[T]):
    """A :class:`CgroupStat` resolved for one cgroup layout: its file and its reader.

    ``get(reader, path)`` reads and parses the file (through the memo when shared) and picks the
    value. A loop over thousands of files may inline it, one call less per file::

        value = reader.parsed(path, parse) if shared else parse(reader.read(path), path)
        if pick is not None:
            value = pick(value, path)
    """

    __slots__ = (
        "_layout",
        "controller",
        "file",
        "get",
        "kernel_wide",
        "name",
        "native",
        "parse",
        "pick",
        "shared",
    )

    def __init__(self, name: str, source: Source[T], layout: CgroupLayout) -> None:
        self.name = name
        self.controller = source.controller
        self.file = source.file
        self.parse = source.parse
        self.pick = source.pick
        self.shared = source.shared
        self.kernel_wide = source.kernel_wide
        self.native = source.native if source.pick is None else None
        self._layout = layout
        self.get: Callable[[StatReader, str], T] = _getter(source)

    def column(self, reader: ColumnReader, paths: tuple[str, ...]) -> list[T] | None:
        """``get`` of every path, in order, without a Python loop per file: the files read at
        once (``reader.column``) or, when shared, taken from the memo where an earlier collector
        parsed them all, and parsed by ``map`` with the same parser (a ``ParseError`` is
        raised as ``get`` raises it). Where the file has a ``native`` layout, the native
        reader reads and parses the column first, with the same values; the Python path
        reads it when that does not apply. None, having changed nothing, when the reader cannot
        read the column at once (a file not kept open yet or gone): read file by file then."""
        parse = self.parse
        if self.shared:
            values = reader.parsed_column(paths, parse)
            if values is None:
                values = self._read_column(reader, paths)
                if values is None:
                    return None
                reader.remember(paths, parse, values)
        else:
            values = self._read_column(reader, paths)
            if values is None:
                return None
        pick = self.pick
        if pick is not None:
            return list(map(pick, values, paths))
        return values

    def _read_column(self, reader: ColumnReader, paths: tuple[str, ...]) -> list[Any] | None:
        """``parse`` of every file, natively where that applies, else from the bytes."""
        native = self.native
        if native is not None:
            values = reader.native_column(paths, native)
            if values is not None:
                return values
        data = reader.column(paths)
        if data is None:
            return None
        return list(map(self.parse, data, paths))

    def path(self, rel: str) -> str:
        """The file of cgroup ``rel`` (relative to the hierarchy roots). Not interned: sharing
        one string between the collectors that read one file (``memory.stat``) saved 170 KiB
        at 200 pods, but the 2,558 paths pushed the interpreter's table of interned strings
        past a doubling, and the daemon was 0.47 MiB larger with them (docs/benchmarks.md)."""
        return self._layout.file(self.controller, rel, self.file)

    def dir(self, rel: str) -> str:
        """The folder of cgroup ``rel`` that holds the file."""
        return self._layout.abs_dir(self.controller, rel)


def _getter(source: Source[T]) -> Callable[[StatReader, str], T]:
    """The cheapest reader for ``source``: one closure, chosen once, no branch per read."""
    parse, pick = source.parse, source.pick
    if source.shared:
        if pick is None:

            def get_shared(reader: StatReader, path: str) -> T:
                value: T = reader.parsed(path, parse)
                return value

            return get_shared

        def get_shared_pick(reader: StatReader, path: str) -> T:
            return pick(reader.parsed(path, parse), path)

        return get_shared_pick
    if pick is None:

        def get_direct(reader: StatReader, path: str) -> T:
            value: T = parse(reader.read(path), path)
            return value

        return get_direct

    def get_direct_pick(reader: StatReader, path: str) -> T:
        return pick(parse(reader.read(path), path), path)

    return get_direct_pick


@frozen
class CgroupStat(Generic[T]):
    """One value of a cgroup and where each cgroup version keeps it."""

    name: str
    """Logical name, the key in :data:`CGROUP_STATS` (``cpu_usage``)."""
    v1: Source[T] | None
    """Where cgroup v1 keeps it; None when v1 has no such file."""
    v2: Source[T] | None
    """Where cgroup v2 keeps it; None when v2 has no such file."""
    doc: str
    """What the value is, with its unit."""
    v1_fallback: Source[T] | None = None
    """Where v1 keeps it on a kernel built without :attr:`v1`'s file (the file is absent from
    the controller's root cgroup, so from every cgroup): :meth:`bind` picks it then."""

    def source(self, version: CgroupVersion) -> Source[T]:
        """The source on ``version``; ``UnsupportedError`` when that version has none."""
        source = self.v2 if version is CgroupVersion.V2 else self.v1
        if source is None:
            raise UnsupportedError(self.name, f"cgroup {version} has no file for it")
        return source

    def bind(self, layout: CgroupLayout) -> BoundStat[T]:
        """This stat on ``layout``'s cgroup version; call once per layout, not per read.

        With a :attr:`v1_fallback`, a v1 layout whose controller root lacks :attr:`v1`'s file
        binds the fallback (one ``stat`` of the root's file, here)."""
        source = self.source(layout.version)
        fallback = self.v1_fallback
        if (
            fallback is not None
            and layout.version is CgroupVersion.V1
            and not os.path.exists(layout.file(source.controller, "", source.file))
        ):
            source = fallback
        return BoundStat(self.name, source, layout)


@frozen
class HostStat(Generic[T]):
    """One ``/proc`` or ``/sys`` file."""

    name: str
    """Logical name, the key in :data:`HOST_STATS` (``meminfo``)."""
    root: Literal["proc", "sys"]
    """Which pseudo file system (``HostPaths.proc`` or ``HostPaths.sys``)."""
    parts: tuple[str, ...]
    """Path below the root; ``{field}`` placeholders are filled by :meth:`path`."""
    parse: Parser[T]
    """The file's parser."""
    doc: str
    """What the file holds."""
    required: bool = True
    """Every kernel the koordlet runs on has it: absence is a ``HostError``, not a race."""

    def path(self, paths: HostPaths, **fields: object) -> str:
        """The file under ``paths``' roots, placeholders filled from ``fields``."""
        parts = [p.format_map(fields) for p in self.parts] if fields else self.parts
        return paths.proc(*parts) if self.root == "proc" else paths.sys(*parts)

    def get(self, reader: StatReader, path: str) -> T:
        """Read and parse the file at ``path`` (from :meth:`path`) through ``reader``."""
        try:
            data = reader.read(path)
        except CgroupGoneError as err:
            if self.required:
                raise HostError(f"{path}: missing") from err
            raise
        return self.parse(data, path)


# Picks of the v2 files that hold several values ---------------------------------------------


def _usage_ns(stat: CpuStat, path: str) -> int:
    if stat.usage_ns is None:
        raise ParseError(f"{path}: no usage_usec in a cgroup v2 cpu.stat")
    return stat.usage_ns


def _throttling(stat: CpuStat, path: str) -> tuple[int, int]:
    return stat.nr_periods, stat.nr_throttled


def _quota(cpu_max: tuple[int | None, int | None], path: str) -> int | None:
    return cpu_max[0]


def _numa_meminfo(data: bytes, path: str) -> NumaMemInfo:
    """A ``node<N>/meminfo``, the node id taken from its folder (the kernel's own layout)."""
    folder = os.path.basename(os.path.dirname(path))
    if not folder.startswith("node") or not folder[4:].isdigit():
        raise ParseError(f"{path}: not in a node<N> folder")
    return parse_numa_meminfo(data, path, int(folder[4:]))


def _pressure(stem: str, what: str) -> CgroupStat[PSIStats]:
    """``<stem>.pressure``: in the cpuacct folders on v1 (Anolis ``psi_v1=1``, a boot-time switch
    for every cgroup at once), in every cgroup on v2 (``cgroup.pressure`` 0 hides one's)."""
    return CgroupStat(
        f"{stem}_pressure",
        Source("cpuacct", f"{stem}.pressure", parse_psi, kernel_wide=True),
        Source("cpu", f"{stem}.pressure", parse_psi),
        f"PSI of the cgroup's tasks {what} (v1: Anolis kernels booted with psi_v1=1)",
    )


# The table: logical name, v1 source, v2 source, doc. Parsers and picks are in cgroupstats,
# procfs and psi; v2 keeps CPU time in cpu.stat (usage_usec), v1 in the cpuacct controller.
# fmt: off
CPU_USAGE: CgroupStat[int] = CgroupStat(
    "cpu_usage",
    Source("cpuacct", "cpuacct.usage", parse_integer, native=INTEGER),
    Source("cpu", "cpu.stat", parse_cpu_stat, _usage_ns, shared=True),
    "total CPU time of the cgroup and its descendants, ns (v2: usage_usec x 1000)")
CPU_THROTTLING: CgroupStat[tuple[int, int]] = CgroupStat(
    "cpu_throttling",
    Source("cpu", "cpu.stat", parse_cpu_throttling, native=CPU_THROTTLING_V1),
    Source("cpu", "cpu.stat", parse_cpu_stat, _throttling, shared=True),
    "(nr_periods, nr_throttled): CFS periods elapsed and periods throttled, counters")
MEMORY_STAT: CgroupStat[MemoryUsage] = CgroupStat(
    "memory_stat",
    Source("memory", "memory.stat", parse_memory_stat_v1, shared=True),
    Source("memory", "memory.stat", parse_memory_stat_v2, shared=True),
    "anon, unevictable, file LRU lists, cache and rss, bytes (v1: hierarchical total_* keys)")
MEMORY_LRU: CgroupStat[MemoryLru] = CgroupStat(
    "memory_lru",
    Source(
        "memory",
        "memory.numa_stat",
        parse_memory_lru_v1,
        shared=True,
        native=MEMORY_LRU_V1,
    ),
    Source("memory", "memory.stat", parse_memory_stat_v2, lru_of_memory_stat, shared=True),
    "anon, unevictable and file LRU lists of the cgroup and its descendants, bytes (v1:"
    " hierarchical_* of memory.numa_stat, half the kernel's cost of memory.stat)",
    v1_fallback=Source(
        "memory", "memory.stat", parse_memory_stat_v1, lru_of_memory_stat, shared=True))
MEMORY_CHARGE: CgroupStat[int] = CgroupStat(
    "memory_charge",
    Source("memory", "memory.usage_in_bytes", parse_integer),
    Source("memory", "memory.current", parse_integer),
    "everything charged to the cgroup, page cache and kernel memory included, bytes")
CPUSET_EFFECTIVE_CPUS: CgroupStat[bytes] = CgroupStat(
    "cpuset_effective_cpus",
    Source("cpuset", "cpuset.cpus", parse_raw),
    Source("cpuset", "cpuset.cpus.effective", parse_raw),
    "the CPUs the cgroup may run on, as the kernel's cpulist text (v2: what the parents allow)")
CPU_CFS_QUOTA: CgroupStat[int | None] = CgroupStat(
    "cpu_cfs_quota",
    Source("cpu", "cpu.cfs_quota_us", parse_cfs_quota_v1),
    Source("cpu", "cpu.max", parse_cpu_max, _quota, shared=True),
    "CFS runtime per period, µs; None when unlimited (v1 -1, v2 max)")
CPU_CFS_PERIOD: CgroupStat[int] = CgroupStat(
    "cpu_cfs_period",
    Source("cpu", "cpu.cfs_period_us", parse_integer),
    Source("cpu", "cpu.max", parse_cpu_max, cpu_max_period, shared=True),
    "CFS period, µs")
CPU_PRESSURE, MEMORY_PRESSURE, IO_PRESSURE = (
    _pressure(stem, what)
    for stem, what in (("cpu", "waiting for a CPU"), ("memory", "stalled on memory"),
                       ("io", "stalled on I/O"))
)
CGROUP_STATS: Mapping[str, CgroupStat[Any]] = MappingProxyType({s.name: s for s in (
    CPU_USAGE, CPU_THROTTLING, MEMORY_STAT, MEMORY_LRU, MEMORY_CHARGE, CPUSET_EFFECTIVE_CPUS,
    CPU_CFS_QUOTA, CPU_CFS_PERIOD, CPU_PRESSURE, MEMORY_PRESSURE, IO_PRESSURE,
)})
"""Every cgroup stat by logical name."""

PROC_STAT_CPU: HostStat[CpuTimes] = HostStat(
    "proc_stat_cpu", "proc", ("stat",), parse_proc_stat_cpu,
    "the aggregate cpu line of /proc/stat, jiffies")
PROC_STAT_PER_CPU: HostStat[dict[int, CpuTimes]] = HostStat(
    "proc_stat_per_cpu", "proc", ("stat",), parse_proc_stat_per_cpu,
    "the cpu<N> lines of /proc/stat, jiffies by CPU id (the same read as proc_stat_cpu)")
MEMINFO: HostStat[MemInfo] = HostStat(
    "meminfo", "proc", ("meminfo",), parse_meminfo, "the node's memory, /proc/meminfo")
NUMA_MEMINFO: HostStat[NumaMemInfo] = HostStat(
    "numa_meminfo", "sys", ("devices", "system", "node", "node{node}", "meminfo"), _numa_meminfo,
    "one NUMA node's memory (path field: node)")
CPU_ONLINE: HostStat[tuple[int, ...]] = HostStat(
    "cpu_online", "sys", ("devices", "system", "cpu", "online"), read_cpulist,
    "the online CPUs")
CPUINFO_FLAGS: HostStat[frozenset[str]] = HostStat(
    "cpuinfo_flags", "proc", ("cpuinfo",), parse_cpu_flags,
    "the first CPU's feature flags (x86 flags line; empty elsewhere)")
PRESSURE: HostStat[PSIStats] = HostStat(
    "pressure", "proc", ("pressure", "{resource}"), parse_psi,
    "the node's PSI of one resource (path field: resource, cpu/memory/io); absent without PSI",
    required=False)
VMSTAT: HostStat[VmStat] = HostStat(
    "vmstat", "proc", ("vmstat",), parse_vmstat,
    "the node's reclaim counters, /proc/vmstat (global reclaim only)")
HOST_STATS: Mapping[str, HostStat[Any]] = MappingProxyType({s.name: s for s in (
    PROC_STAT_CPU, PROC_STAT_PER_CPU, MEMINFO, NUMA_MEMINFO, CPU_ONLINE, CPUINFO_FLAGS, PRESSURE,
    VMSTAT,
)})
# fmt: on
"""Every host stat by logical name."""


def cgroup_stat(name: str) -> CgroupStat[Any]:
    """The cgroup stat called ``name``; ``UnsupportedError`` for a name not in the table."""
    return _lookup(CGROUP_STATS, name)


def host_stat(name: str) -> HostStat[Any]:
    """The host stat called ``name``; ``UnsupportedError`` for a name not in the table."""
    return _lookup(HOST_STATS, name)


def _lookup(table: Mapping[str, T], name: str) -> T:
    try:
        return table[name]
    except KeyError:
        raise UnsupportedError(name, "no such stat in koordlet.system.stats") from None
