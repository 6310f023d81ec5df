"""Cold memory from Anolis kidled: the scanner's state and the ``memory.idle_page_stats`` histogram.

kidled (Anolis / Alibaba Cloud Linux kernels, ``Documentation/vm/kidled.rst``) is a kernel thread
that walks every page frame once per *scan period* and ages the pages nobody touched. Each memory
cgroup then shows a histogram of idle bytes in ``memory.idle_page_stats``::

    # version: 1.0
    # page_scans: 24                       4.19 kernels print "# scans:" instead
    # slab_scans: 0                        5.10 kernels only
    # scan_period_in_seconds: 120
    # use_hierarchy: 1                     5.10 kernels only
    # buckets: 1,2,5,15,30,60,120,240
    #
    #   _-----=> clean/dirty               (legend, one line per flag)
    # |||||             [1,2)          [2,5) ...   [240,+inf)
      csei            2613248        4657152 ...            0
      ...                                  16 idle types, plus "slab" on 5.10
      slab                  0              0 ...            0

A row is an idle type (c/d clean or dirty, s/f swap-backed or file, e/u evictable or not, i/a
inactive or active); column ``j`` holds the bytes idle for ``[buckets[j], buckets[j+1])`` scan
periods, the last column ``[buckets[-1], +inf)``. A memcg whose accounting was switched off prints
``# buckets: no valid bucket available`` and no table.

**Cold bytes** follow Koordinator's ``ColdPageInfoByKidled.GetColdPageTotalBytes``: every row
(page cache, anon and slab alike) summed over the buckets from the *cold boundary* on. Upstream
keeps the boundary as an index into the default buckets (``defaultKidledColdBoundary = 5``, the
``[60,120)`` column); here it is the age it stands for, in scan periods
(:data:`DEFAULT_COLD_AGE_SCANS`, 60), so a memcg with custom buckets is cut at the same age. A
bucket that straddles the age is not counted (its pages may be younger).

**Enablement** (``/sys/kernel/mm/kidled``): ``scan_period_in_seconds`` 0 means the scanner is off
and every histogram stays empty, ``use_hierarchy`` must be 1 so that a parent's histogram covers
its children (Koordinator's ``IsKidledSupported``). Both files missing means a kernel without
kidled. Any of these makes the source *unsupported*, with the reason; it is never read as zero.
The koordlet does not switch kidled on itself: that is a host setting (upstream writes it when its
gate is on; here the operator or the system-config strategy owns it).

:class:`ColdPageSource` is the seam for other cold-page sources (a DAMON-based one would walk
``/sys/kernel/mm/damon``): the cold-memory collector only asks a source for the cold bytes of a
memcg.
"""

from __future__ import annotations

import errno
import itertools
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Protocol

from apis.records import frozen
from koordlet.errors import CgroupGoneError, HostError, ParseError, UnsupportedError
from koordlet.system.cgroups import CgroupLayout
from koordlet.system.cgroupstats import read_file_bytes
from koordlet.system.oserrors import refused_errno
from koordlet.system.paths import HostPaths

IDLE_PAGE_STATS = "memory.idle_page_stats"
"""The hierarchical histogram file of every memory cgroup (``.local`` is the cgroup alone)."""
KIDLED_DIR = ("kernel", "mm", "kidled")
"""Where the scanner's knobs are, under the sysfs root."""
SCAN_PERIOD_FILE = "scan_period_in_seconds"
USE_HIERARCHY_FILE = "use_hierarchy"
DEFAULT_BUCKETS = (1, 2, 5, 15, 30, 60, 120, 240)
"""The kernel's default bucket edges, in scan periods (``kidled_default_buckets``)."""
COLD_BOUNDARY = 5
"""Koordinator's ``defaultKidledColdBoundary``: the index of the first default bucket counted as
cold."""
DEFAULT_COLD_AGE_SCANS = DEFAULT_BUCKETS[COLD_BOUNDARY]
"""Pages idle at least this many scan periods are cold (60; 5 minutes at Koordinator's default
kidled scan period of 5 s)."""
NO_BUCKETS = "no valid bucket available"
"""What the ``# buckets:`` line says when the memcg does not account idle pages."""
_OPTIONAL_HEADERS = ("slab_scans", "use_hierarchy")

Reader = Callable[[str], bytes]
"""Reads a whole file: ``Tick.read`` or ``read_file_bytes`` (ENOENT → ``CgroupGoneError``)."""


@frozen
class IdlePageStats:
    """One ``memory.idle_page_stats``."""

    version: str
    """Format version (``1.0``)."""
    scans: int
    """Completed scans of this memcg's pages (``page_scans``, or ``scans`` on 4.19)."""
    scan_period_seconds: int
    """Seconds per scan when the histogram was taken."""
    buckets: tuple[int, ...]
    """Lower edges of the columns, in scan periods; empty when the memcg does not account."""
    rows: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Idle type (``csei`` … ``dfua``, ``slab``) → bytes per column."""
    slab_scans: int | None = None
    """Completed slab scans (5.10 kernels), else None."""
    use_hierarchy: int | None = None
    """``use_hierarchy`` as the file reports it (5.10 kernels), else None."""

    @property
    def accounting(self) -> bool:
        """False when the memcg's buckets were cleared (``no valid bucket available``)."""
        return bool(self.buckets)

    def idle_bytes(self) -> int:
        """Every idle byte, whatever its age (Koordinator's original, boundary-free total)."""
        return sum(sum(values) for values in self.rows.values())

    def cold_bytes(self, min_age_scans: int = DEFAULT_COLD_AGE_SCANS) -> int:
        """Bytes idle at least ``min_age_scans`` scan periods: the columns whose lower edge is at
        or past that age, summed over every row."""
        first = next((i for i, edge in enumerate(self.buckets) if edge >= min_age_scans), None)
        if first is None:
            return 0
        return sum(sum(values[first:]) for values in self.rows.values())


def _header(line: str, path: str) -> tuple[str, str] | None:
    """``(key, value)`` of a ``# key: value`` line; None for legend and column lines."""
    body = line[1:].strip()
    key, sep, value = body.partition(":")
    if not sep or not key or " " in key or "|" in key:
        return None
    return key, value.strip()


def _int(text: str, path: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ParseError(f"{path}: {what} is not an integer: {text!r}") from None
    if value < 0:
        raise ParseError(f"{path}: {what} is negative: {value}")
    return value


def _buckets(text: str, path: str) -> tuple[int, ...]:
    if text == NO_BUCKETS:
        return ()
    edges = tuple(_int(part.strip(), path, "a bucket edge") for part in text.split(","))
    if any(b <= a for a, b in itertools.pairwise(edges)):
        raise ParseError(f"{path}: buckets are not increasing: {text!r}")
    return edges


def parse_idle_page_stats(data: bytes, path: str) -> IdlePageStats:
    """Parse a ``memory.idle_page_stats`` (either kernel generation; see the module docstring).

    Raises :class:`ParseError` naming ``path`` for a missing ``version``, scan count, scan period
    or ``buckets`` header, a row whose column count differs from the buckets, a non-integer
    value, or a table without buckets.
    """
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ParseError(f"{path}: not ASCII text") from None
    headers: dict[str, str] = {}
    rows: dict[str, tuple[int, ...]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            pair = _header(line, path)
            if pair is not None:
                headers.setdefault(*pair)
            continue
        name, *values = line.split()
        if not name.isalpha() or not name.islower():
            raise ParseError(f"{path}: bad row {line!r}")
        if name in rows:
            raise ParseError(f"{path}: row {name} appears twice")
        rows[name] = tuple(_int(v, path, f"{name} value") for v in values)
    missing = [k for k in ("version", "scan_period_in_seconds", "buckets") if k not in headers]
    scans_key = "page_scans" if "page_scans" in headers else "scans"
    if scans_key not in headers:
        missing.append("page_scans (or scans)")
    if missing:
        raise ParseError(f"{path}: no {', '.join(missing)} header; not an idle_page_stats file")
    buckets = _buckets(headers["buckets"], path)
    if rows and not buckets:
        raise ParseError(f"{path}: a histogram table without buckets")
    for name, row in rows.items():
        if len(row) != len(buckets):
            raise ParseError(
                f"{path}: row {name} has {len(row)} columns for {len(buckets)} buckets"
            )
    optional = {k: _int(headers[k], path, k) for k in _OPTIONAL_HEADERS if k in headers}
    return IdlePageStats(
        version=headers["version"],
        scans=_int(headers[scans_key], path, scans_key),
        scan_period_seconds=_int(headers["scan_period_in_seconds"], path, "scan_period_in_seconds"),
        buckets=buckets,
        rows=rows,
        slab_scans=optional.get("slab_scans"),
        use_hierarchy=optional.get("use_hierarchy"),
    )


# The scanner ---------------------------------------------------------------------------------


@frozen
class KidledState:
    """The scanner's settings, as ``/sys/kernel/mm/kidled`` reports them."""

    scan_period_seconds: int
    """Seconds per full scan; 0 means the scanner is off."""
    use_hierarchy: int
    """1 when a memcg's histogram includes its descendants."""


def kidled_file(paths: HostPaths, name: str) -> str:
    """Path of a kidled knob under the sysfs root."""
    return paths.sys(*KIDLED_DIR, name)


def _knob(read: Reader, path: str) -> int:
    try:
        data = read(path)
    except CgroupGoneError as err:
        raise UnsupportedError(
            "kidled", f"{path} absent: kernel without kidled (Anolis kernels only)"
        ) from err
    except HostError as err:
        code = refused_errno(err)
        if code is not None:
            raise UnsupportedError(
                "kidled",
                f"{path}: the kernel refuses reads ({errno.errorcode[code]}, errno {code})",
            ) from err
        raise
    return _int(data.decode("ascii", errors="replace").strip(), path, "the value")


def read_kidled_state(read: Reader, paths: HostPaths) -> KidledState:
    """The scanner's state; :class:`UnsupportedError` with the reason when cold pages cannot be
    measured: knob files absent, the kernel refusing reads (ENOTSUP/EOPNOTSUPP), scanning off
    (period 0) or ``use_hierarchy`` not 1."""
    scan_path = kidled_file(paths, SCAN_PERIOD_FILE)
    hierarchy_path = kidled_file(paths, USE_HIERARCHY_FILE)
    period = _knob(read, scan_path)
    hierarchy = _knob(read, hierarchy_path)
    if period == 0:
        raise UnsupportedError("kidled", f"scanning is off: {scan_path} is 0")
    if hierarchy != 1:
        raise UnsupportedError(
            "kidled",
            f"{hierarchy_path} is {hierarchy}: a parent's histogram would miss its children",
        )
    return KidledState(period, hierarchy)


def probe_kidled(paths: HostPaths) -> tuple[bool, str, str]:
    """``(supported, reason, path)`` for start-up probing: whether kidled is there and scanning."""
    try:
        state = read_kidled_state(read_file_bytes, paths)
    except UnsupportedError as err:
        return False, err.reason, kidled_file(paths, SCAN_PERIOD_FILE)
    except (HostError, ParseError) as err:
        return False, str(err), kidled_file(paths, SCAN_PERIOD_FILE)
    reason = f"scanning every {state.scan_period_seconds} s, use_hierarchy 1"
    return True, reason, kidled_file(paths, SCAN_PERIOD_FILE)


# Sources -------------------------------------------------------------------------------------


class ColdPageSource(Protocol):
    """Where cold-page sizes come from (kidled here; DAMON or kstaled could follow)."""

    name: str
    """Short name, used as the unsupported-source key (``kidled``)."""

    def check(self, read: Reader) -> Mapping[str, object]:
        """Facts about the source for ``/debug`` (scan period, cold age); raises
        :class:`UnsupportedError` with the reason when it cannot measure now."""
        ...

    def cold_bytes(self, read: Reader, cgroup_rel: str) -> int:
        """Cold bytes charged to memory cgroup ``cgroup_rel`` (``""``: the root, i.e. the node).

        Raises :class:`CgroupGoneError` when the cgroup vanished, :class:`ParseError` for a
        malformed file and :class:`UnsupportedError` when this memcg has nothing to report (its
        accounting is off, or no scan has completed yet)."""
        ...


class KidledColdPageSource:
    """Cold bytes from kidled's ``memory.idle_page_stats``.

    :param layout: the cgroup layout (finds each memcg's file, v1 or v2).
    :param paths: host roots (``/sys/kernel/mm/kidled``).
    :param cold_age_scans: pages idle at least this many scan periods are cold.
    """

    name = "kidled"

    def __init__(
        self,
        layout: CgroupLayout,
        paths: HostPaths,
        cold_age_scans: int = DEFAULT_COLD_AGE_SCANS,
    ) -> None:
        if cold_age_scans < 1:
            raise ValueError(f"cold_age_scans must be at least 1, got {cold_age_scans}")
        self._layout = layout
        self._paths = paths
        self.cold_age_scans = cold_age_scans

    def path(self, cgroup_rel: str) -> str:
        """The ``memory.idle_page_stats`` of a memory cgroup."""
        return self._layout.file("memory", cgroup_rel, IDLE_PAGE_STATS)

    def check(self, read: Reader) -> Mapping[str, object]:
        state = read_kidled_state(read, self._paths)
        return {
            "source": self.name,
            "scan_period_seconds": state.scan_period_seconds,
            "cold_age_scans": self.cold_age_scans,
            "cold_age_seconds": self.cold_age_scans * state.scan_period_seconds,
        }

    def cold_bytes(self, read: Reader, cgroup_rel: str) -> int:
        path = self.path(cgroup_rel)
        stats = parse_idle_page_stats(read(path), path)
        if not stats.accounting:
            raise UnsupportedError(path, f"idle page accounting is off ({NO_BUCKETS})")
        if stats.scans == 0:
            raise UnsupportedError(path, "no kidled scan has completed yet")
        return stats.cold_bytes(self.cold_age_scans)
