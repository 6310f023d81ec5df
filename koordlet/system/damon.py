"""A kdamond of our own through the DAMON sysfs interface: claim, set up, read, stop, clean up.

DAMON (``Documentation/admin-guide/mm/damon/usage.rst``) is machine-wide. Its sysfs interface,
``/sys/kernel/mm/damon/admin/kdamonds``, is one array shared by every user: writing
``nr_kdamonds`` removes every kdamond folder and makes that many empty ones, and the kernel
refuses it (``EBUSY``) while any kdamond of the array runs (``mm/damon/sysfs.c``,
``damon_sysfs_kdamonds_add_dirs``). So a second user cannot add a kdamond beside a running one,
and growing the array would wipe a stopped one's settings. The rules that follow:

- **Free** means ``nr_kdamonds`` is 0, or every folder is one our claim file says is ours. Any
  other folder, running or not, makes us **busy** (:class:`DamonBusyError`), with its index and
  state in the reason; we never write into it. Of a folder not ours we read ``nr_kdamonds`` and
  ``state`` only (``pid`` takes the interface's lock with a trylock, so reading it could make the
  other user's write fail).
- **The claim file** (``<state_dir>/damon/kdamond.json``) is written *before* ``nr_kdamonds``:
  boot id, our index, the kdamond's pid once it runs, the koordlet's pid and start time, and the
  settings we wrote. A start that finds one from a dead koordlet of the same boot cleans up: the
  folder is ours if it still runs with the recorded pid, or is stopped with exactly the recorded
  settings; then it is turned off and the array emptied. A folder that no longer matches is left
  alone and the stale claim dropped. A claim of a live koordlet makes us busy.
- **Stop** turns ours off (the kernel waits for the thread), empties the array and removes the
  claim file. While ours runs nobody can resize the array, so emptying it removes only ours.

What we run: one paddr context over the host's System RAM ranges (``/proc/iomem``), one DAMOS
scheme with the ``stat`` action (it changes nothing) matching regions with no access for at
least the cold age. :meth:`Kdamond.cold_regions` asks the kernel for the regions the scheme
matched at its next application (``update_schemes_tried_regions``, 6.2+; the write blocks until
then, at most one apply interval) and reads them. Which memory cgroup owns their pages is
``koordlet.system.kpagecgroup``'s part; docs/coldmemory.md explains the choice and the figures.

All I/O goes through :class:`SysfsIO` (the real files) so that tests can put a fake kernel
behind it (``tests/fakedamon.py``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from apis.records import frozen
from koordlet.errors import HostError, ParseError, UnsupportedError
from koordlet.system.atomicfile import write_atomic

logger = logging.getLogger(__name__)

ADMIN_DIR = ("kernel", "mm", "damon", "admin")
"""The DAMON sysfs interface under the sysfs root (``CONFIG_DAMON_SYSFS``)."""
KDAMONDS = "kdamonds"
CLAIM_DIR = "damon"
CLAIM_FILE = "kdamond.json"
CLAIM_VERSION = 1
OUR_INDEX = 0
"""We only claim an empty array, so ours is always folder 0."""
U32_MAX = 2**32 - 1
ULONG_MAX = 2**64 - 1
PAGE_SIZE = 4096
MIN_RAM_RANGE = 1 << 20
"""System RAM ranges smaller than this (the first page, the low 640 KiB) are not monitored."""


class DamonBusyError(UnsupportedError):
    """Every kdamond of the interface is someone else's (or another koordlet's): not now."""

    def __init__(self, reason: str) -> None:
        super().__init__("damon", f"busy: {reason}")


@frozen
class DamonAttrs:
    """The monitoring settings of our kdamond (docs/coldmemory.md says why these defaults)."""

    sample_us: int = 1_000_000
    """Sampling interval: one access check per region per interval (``sample_us``)."""
    aggr_us: int = 5_000_000
    """Aggregation interval: the unit of a region's age (``aggr_us``)."""
    update_us: int = 60_000_000
    """Operations update interval (``update_us``); paddr does nothing at it."""
    min_regions: int = 100
    """Lower bound on the number of regions (``nr_regions/min``, the kernel wants >= 3)."""
    max_regions: int = 1000
    """Upper bound on the number of regions (``nr_regions/max``): the cost per sample."""
    apply_us: int = 1_000_000
    """How often the scheme applies (``apply_interval_us``, 6.7+; before, every aggregation);
    a snapshot waits at most this for the kernel."""
    cold_age_s: float = 300.0
    """Seconds without access that make a region cold; Koordinator's kidled boundary (60 scans
    of 5 s, ``koordlet.system.kidled.DEFAULT_COLD_AGE_SCANS``)."""

    def __post_init__(self) -> None:
        if not 0 < self.sample_us <= self.aggr_us:
            raise ValueError(f"sample_us must be in (0, aggr_us], got {self.sample_us}")
        if not 3 <= self.min_regions <= self.max_regions:
            raise ValueError(f"need 3 <= min_regions <= max_regions, got {self.min_regions}")
        if self.apply_us <= 0 or self.cold_age_s <= 0:
            raise ValueError("apply_us and cold_age_s must be positive")

    @property
    def cold_age_aggrs(self) -> int:
        """The cold age in aggregation intervals, rounded up (the scheme's ``age/min``)."""
        return max(1, -(-round(self.cold_age_s * 1_000_000) // self.aggr_us))


@frozen
class Region:
    """One monitoring region as ``tried_regions/<n>`` shows it: ``[start, end)`` physical."""

    start: int
    end: int
    nr_accesses: int
    age: int
    """In aggregation intervals."""

    @property
    def size(self) -> int:
        return self.end - self.start


class SysfsIO(Protocol):
    """File access under the DAMON admin folder; paths are relative to it."""

    @property
    def root(self) -> str:
        """The admin folder (for messages)."""
        ...

    def read(self, rel: str) -> str: ...

    def write(self, rel: str, value: str) -> None: ...

    def listdir(self, rel: str) -> list[str]: ...

    def exists(self, rel: str) -> bool: ...


def io_error(path: str, err: OSError, doing: str) -> HostError:
    """``OSError`` of a DAMON file as the error tree has it (``EBUSY``: busy)."""
    name = errno.errorcode.get(err.errno or 0, str(err.errno))
    if err.errno == errno.EBUSY:
        return DamonBusyError(f"{path}: the kernel answered EBUSY {doing}")
    return HostError(f"{path}: {doing} failed: {err.strerror} ({name})")


@frozen
class RealSysfs:
    """The real files; ``OSError`` becomes :class:`HostError` (``EBUSY``:
    :class:`DamonBusyError`) naming the file."""

    root: str

    def _path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def read(self, rel: str) -> str:
        path = self._path(rel)
        try:
            with open(path, "rb") as f:
                return f.read().decode("ascii", errors="replace")
        except OSError as err:
            raise io_error(path, err, "reading") from err

    def write(self, rel: str, value: str) -> None:
        path = self._path(rel)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, value.encode("ascii"))
            finally:
                os.close(fd)
        except OSError as err:
            raise io_error(path, err, f"writing {value!r}") from err

    def listdir(self, rel: str) -> list[str]:
        path = self._path(rel)
        try:
            return os.listdir(path)
        except OSError as err:
            raise io_error(path, err, "listing") from err

    def exists(self, rel: str) -> bool:
        return os.path.exists(self._path(rel))


def admin_dir(sys_root: str) -> str:
    """The DAMON admin folder under a sysfs root."""
    return os.path.join(sys_root, *ADMIN_DIR)


def read_int(io: SysfsIO, rel: str) -> int:
    """A decimal file (``-1`` allowed: ``pid`` of a stopped kdamond)."""
    text = io.read(rel).strip()
    try:
        return int(text)
    except ValueError:
        raise ParseError(f"{os.path.join(io.root, rel)}: not an integer: {text!r}") from None


def _kd(index: int, *parts: str) -> str:
    return os.path.join(KDAMONDS, str(index), *parts)


def _ctx(index: int, *parts: str) -> str:
    return _kd(index, "contexts", "0", *parts)


def _scheme(index: int, *parts: str) -> str:
    return _ctx(index, "schemes", "0", *parts)


def kdamond_states(io: SysfsIO) -> list[str]:
    """``state`` of every kdamond folder (``on``/``off``), by index."""
    count = read_int(io, os.path.join(KDAMONDS, "nr_kdamonds"))
    return [io.read(_kd(i, "state")).strip() for i in range(count)]


def read_regions(io: SysfsIO, index: int) -> list[Region]:
    """The regions of the scheme's ``tried_regions`` folder, by address."""
    base = _scheme(index, "tried_regions")
    regions = []
    for name in io.listdir(base):
        if not name.isdigit():
            continue  # total_bytes
        d = os.path.join(base, name)
        region = Region(
            read_int(io, os.path.join(d, "start")),
            read_int(io, os.path.join(d, "end")),
            read_int(io, os.path.join(d, "nr_accesses")),
            read_int(io, os.path.join(d, "age")),
        )
        if region.end < region.start:
            raise ParseError(f"{os.path.join(io.root, d)}: end {region.end} < start")
        regions.append(region)
    regions.sort(key=lambda r: r.start)
    return regions


def system_ram_ranges(proc_root: str) -> list[tuple[int, int]]:
    """Top-level ``System RAM`` ranges of ``/proc/iomem`` as ``[start, end)``, page aligned,
    at least :data:`MIN_RAM_RANGE` long. Unsupported when the file shows none (not root: the
    kernel prints zeros)."""
    path = os.path.join(proc_root, "iomem")
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as err:
        raise UnsupportedError("damon", f"cannot read {path}: {err.strerror}") from err
    ranges = []
    for line in lines:
        if line.startswith(" ") or not line.rstrip().endswith(": System RAM"):
            continue
        span = line.split(" : ")[0]
        lo, _, hi = span.partition("-")
        try:
            start, end = int(lo, 16), int(hi, 16) + 1
        except ValueError:
            raise ParseError(f"{path}: bad range {span!r}") from None
        start = -(-start // PAGE_SIZE) * PAGE_SIZE
        end = end // PAGE_SIZE * PAGE_SIZE
        if end - start >= MIN_RAM_RANGE:
            ranges.append((start, end))
    if not ranges or ranges[-1][1] <= PAGE_SIZE:
        raise UnsupportedError("damon", f"{path} shows no System RAM (not root?)")
    return ranges


# The claim file --------------------------------------------------------------------------------


@frozen
class Claim:
    """What the claim file records (see the module docstring)."""

    boot_id: str
    index: int
    owner_pid: int
    owner_start: int
    """The koordlet's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    settings: dict[str, Any]
    """What we wrote into the folder (:func:`settings_of` reads the same back)."""
    kdamond_pid: int = -1
    version: int = CLAIM_VERSION


def process_start(proc_root: str, pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot; None when it does not exist."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    return int(fields[19])


def read_claim(path: str) -> Claim | None:
    """The claim file, or None when there is none. An unreadable or malformed one is dropped
    (logged): it cannot prove that any folder is ours."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        claim = Claim(**raw)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as err:
        logger.warning("damon: dropping unreadable claim file %s (%s)", path, err)
        _remove(path)
        return None
    if claim.version != CLAIM_VERSION:
        logger.warning("damon: dropping claim file %s of version %s", path, claim.version)
        _remove(path)
        return None
    return claim


def write_claim(path: str, claim: Claim) -> None:
    """Write atomically (temporary file, fsync, rename: :mod:`koordlet.system.atomicfile`)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = json.dumps(asdict(claim), sort_keys=True).encode("utf-8")
    write_atomic(path, data, prefix=".claim-", mode=0o644)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


# The kdamond ---------------------------------------------------------------------------------


def settings_of(attrs: DamonAttrs, ranges: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """The folder's settings we write, as :func:`read_settings` reads them back."""
    return {
        "operations": "paddr",
        "sample_us": attrs.sample_us,
        "aggr_us": attrs.aggr_us,
        "update_us": attrs.update_us,
        "min_regions": attrs.min_regions,
        "max_regions": attrs.max_regions,
        "ranges": [list(r) for r in ranges],
        "action": "stat",
        "age_min": attrs.cold_age_aggrs,
        "apply_us": attrs.apply_us,
    }


def read_settings(io: SysfsIO, index: int) -> dict[str, Any] | None:
    """The same keys as :func:`settings_of`, read from folder ``index``; None when the folder
    has not one context, one target and one scheme (so cannot be ours)."""
    try:
        if read_int(io, _kd(index, "contexts", "nr_contexts")) != 1:
            return None
        if read_int(io, _ctx(index, "targets", "nr_targets")) != 1:
            return None
        if read_int(io, _ctx(index, "schemes", "nr_schemes")) != 1:
            return None
        attrs = _ctx(index, "monitoring_attrs")
        regions = _ctx(index, "targets", "0", "regions")
        count = read_int(io, os.path.join(regions, "nr_regions"))
        ranges = [
            [
                read_int(io, os.path.join(regions, str(i), "start")),
                read_int(io, os.path.join(regions, str(i), "end")),
            ]
            for i in range(count)
        ]
        return {
            "operations": io.read(_ctx(index, "operations")).strip(),
            "sample_us": read_int(io, os.path.join(attrs, "intervals", "sample_us")),
            "aggr_us": read_int(io, os.path.join(attrs, "intervals", "aggr_us")),
            "update_us": read_int(io, os.path.join(attrs, "intervals", "update_us")),
            "min_regions": read_int(io, os.path.join(attrs, "nr_regions", "min")),
            "max_regions": read_int(io, os.path.join(attrs, "nr_regions", "max")),
            "ranges": ranges,
            "action": io.read(_scheme(index, "action")).strip(),
            "age_min": read_int(io, _scheme(index, "access_pattern", "age", "min")),
            "apply_us": read_int(io, _scheme(index, "apply_interval_us")),
        }
    except (HostError, ParseError):
        return None


@dataclass
class Kdamond:
    """Our kdamond (see the module docstring for the rules).

    :param io: the DAMON admin folder.
    :param claim_path: the claim file (``<state_dir>/damon/kdamond.json``).
    :param proc_root: procfs (boot id, System RAM ranges, process start times).
    :param attrs: monitoring settings.
    :param sleep: waits between retries of an ``EBUSY`` right after stopping (tests: no-op).
    """

    io: SysfsIO
    claim_path: str
    proc_root: str
    attrs: DamonAttrs = field(default_factory=DamonAttrs)
    sleep: Callable[[float], None] = time.sleep
    pid: int = -1
    """The running kdamond's pid; -1 when we run none."""

    @property
    def running(self) -> bool:
        return self.pid > 0

    def _boot_id(self) -> str:
        try:
            with open(os.path.join(self.proc_root, "sys", "kernel", "random", "boot_id")) as f:
                return f.read().strip()
        except OSError:
            return ""

    # start -------------------------------------------------------------------------------

    def start(self) -> None:
        """Clean what a dead koordlet left, claim the empty array and start our kdamond.

        Raises :class:`DamonBusyError` when the array holds kdamonds that are not ours,
        :class:`UnsupportedError` when the kernel lacks paddr or ``tried_regions``, and
        :class:`HostError` for other failures; nothing of ours is left behind on failure."""
        if self.running:
            return
        self.clean_stale()
        states = kdamond_states(self.io)
        if states:
            listed = ", ".join(f"kdamond {i} {s}" for i, s in enumerate(states))
            raise DamonBusyError(f"{listed}: not ours (DAMON sysfs holds one array for all)")
        ranges = system_ram_ranges(self.proc_root)
        me = os.getpid()
        claim = Claim(
            boot_id=self._boot_id(),
            index=OUR_INDEX,
            owner_pid=me,
            owner_start=process_start(self.proc_root, me) or 0,
            settings=settings_of(self.attrs, ranges),
        )
        write_claim(self.claim_path, claim)
        try:
            self.io.write(os.path.join(KDAMONDS, "nr_kdamonds"), "1")
        except BaseException:
            _remove(self.claim_path)
            raise
        try:
            self._configure(ranges)
            self.io.write(_kd(OUR_INDEX, "state"), "on")
            self.pid = read_int(self.io, _kd(OUR_INDEX, "pid"))
            write_claim(self.claim_path, _with_pid(claim, self.pid))
        except BaseException:
            self._release()
            raise
        logger.info(
            "damon: kdamond %d started (pid %d) over %d RAM ranges, cold after %gs",
            OUR_INDEX,
            self.pid,
            len(ranges),
            self.attrs.cold_age_s,
        )

    def _configure(self, ranges: Sequence[tuple[int, int]]) -> None:
        io, a = self.io, self.attrs
        io.write(_kd(OUR_INDEX, "contexts", "nr_contexts"), "1")
        avail = io.read(_ctx(OUR_INDEX, "avail_operations")).split()
        if "paddr" not in avail:
            raise UnsupportedError(
                "damon", f"no paddr operations (avail_operations: {' '.join(avail) or 'none'})"
            )
        io.write(_ctx(OUR_INDEX, "operations"), "paddr")
        attrs = _ctx(OUR_INDEX, "monitoring_attrs")
        # aggr before sample would be refused if the new sample exceeded the old aggr: the
        # kernel checks the pair only at "on", so the order does not matter; keep it readable.
        for name, value in (
            ("intervals/sample_us", a.sample_us),
            ("intervals/aggr_us", a.aggr_us),
            ("intervals/update_us", a.update_us),
            ("nr_regions/min", a.min_regions),
            ("nr_regions/max", a.max_regions),
        ):
            io.write(os.path.join(attrs, name), str(value))
        io.write(_ctx(OUR_INDEX, "targets", "nr_targets"), "1")
        regions = _ctx(OUR_INDEX, "targets", "0", "regions")
        io.write(os.path.join(regions, "nr_regions"), str(len(ranges)))
        for i, (start, end) in enumerate(ranges):
            io.write(os.path.join(regions, str(i), "start"), str(start))
            io.write(os.path.join(regions, str(i), "end"), str(end))
        io.write(_ctx(OUR_INDEX, "schemes", "nr_schemes"), "1")
        if not io.exists(_scheme(OUR_INDEX, "tried_regions")):
            raise UnsupportedError("damon", "schemes have no tried_regions (needs Linux 6.2+)")
        io.write(_scheme(OUR_INDEX, "action"), "stat")
        pattern = _scheme(OUR_INDEX, "access_pattern")
        for name, value in (
            ("sz/min", 0),
            ("sz/max", ULONG_MAX),
            ("nr_accesses/min", 0),
            ("nr_accesses/max", 0),
            ("age/min", a.cold_age_aggrs),
            ("age/max", U32_MAX),
        ):
            io.write(os.path.join(pattern, name), str(value))
        if io.exists(_scheme(OUR_INDEX, "apply_interval_us")):  # 6.7+; else every aggregation
            io.write(_scheme(OUR_INDEX, "apply_interval_us"), str(a.apply_us))

    # read ----------------------------------------------------------------------------------

    def cold_regions(self) -> list[Region]:
        """The regions our scheme matches now (no access for at least the cold age). Blocks
        until the scheme's next application (at most ``apply_us``)."""
        if not self.running:
            raise HostError("damon: our kdamond is not running")
        state = self.io.read(_kd(OUR_INDEX, "state")).strip()
        if state != "on":
            self.pid = -1
            raise HostError(f"damon: our kdamond {OUR_INDEX} stopped (state {state})")
        self.io.write(_kd(OUR_INDEX, "state"), "update_schemes_tried_regions")
        return read_regions(self.io, OUR_INDEX)

    # stop ----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Turn ours off, empty the array, remove the claim file. Idempotent."""
        if not os.path.exists(self.claim_path):
            self.pid = -1
            return
        self._release()
        logger.info("damon: kdamond %d stopped and removed", OUR_INDEX)

    def _release(self) -> None:
        """Off (if on), empty the array (only our folder is in it), remove the claim."""
        try:
            if self.io.exists(_kd(OUR_INDEX, "state")):
                if self.io.read(_kd(OUR_INDEX, "state")).strip() == "on":
                    self.io.write(_kd(OUR_INDEX, "state"), "off")
                self._empty_array()
        finally:
            self.pid = -1
            _remove(self.claim_path)

    def _empty_array(self) -> None:
        # Right after "off" the kernel may still hold the folder (a command in flight on
        # kernels before 6.14): EBUSY, retried for up to a second.
        for attempt in range(10):
            try:
                self.io.write(os.path.join(KDAMONDS, "nr_kdamonds"), "0")
            except DamonBusyError:
                if attempt == 9:
                    raise
                self.sleep(0.1)
            else:
                return

    # clean up ------------------------------------------------------------------------------

    def clean_stale(self) -> bool:
        """Stop and remove what a dead koordlet of this boot left (module docstring). True when
        something was removed. A claim of a live koordlet raises :class:`DamonBusyError`."""
        claim = read_claim(self.claim_path)
        if claim is None:
            return False
        me = os.getpid()
        if claim.owner_pid == me and self.running:
            return False
        if claim.boot_id != self._boot_id():
            _remove(self.claim_path)  # another boot: the kernel forgot everything
            return False
        if claim.owner_pid != me:
            start = process_start(self.proc_root, claim.owner_pid)
            if start is not None and start == claim.owner_start:
                raise DamonBusyError(
                    f"kdamond {claim.index} belongs to koordlet pid {claim.owner_pid}, running"
                )
        if not self._still_ours(claim):
            logger.warning(
                "damon: claim %s names kdamond %d, which is no longer ours; left alone",
                self.claim_path,
                claim.index,
            )
            _remove(self.claim_path)
            return False
        logger.warning(
            "damon: removing kdamond %d (pid %d) left by koordlet pid %d",
            claim.index,
            claim.kdamond_pid,
            claim.owner_pid,
        )
        self._release()
        return True

    def _still_ours(self, claim: Claim) -> bool:
        io = self.io
        if claim.index != OUR_INDEX:
            return False
        try:
            if read_int(io, os.path.join(KDAMONDS, "nr_kdamonds")) != 1:
                return False
            state = io.read(_kd(OUR_INDEX, "state")).strip()
            if state == "on":
                return claim.kdamond_pid > 0 and read_int(io, _kd(OUR_INDEX, "pid")) == (
                    claim.kdamond_pid
                )
        except (HostError, ParseError):
            return False
        # Stopped (or never started): ours only if it holds exactly what we wrote, or nothing
        # yet (a start cut short right after nr_kdamonds).
        settings = read_settings(io, OUR_INDEX)
        if settings is None:
            return _pristine(io, OUR_INDEX)
        return settings == claim.settings


def _with_pid(claim: Claim, pid: int) -> Claim:
    return Claim(**{**asdict(claim), "kdamond_pid": pid})


def _pristine(io: SysfsIO, index: int) -> bool:
    """A folder as ``nr_kdamonds`` made it: off, no context."""
    try:
        return read_int(io, _kd(index, "contexts", "nr_contexts")) == 0
    except (HostError, ParseError):
        return False


def claim_path(state_dir: str) -> str:
    """Where the claim file lives under the koordlet's state directory."""
    return os.path.join(state_dir, CLAIM_DIR, CLAIM_FILE)


def probe_damon(sys_root: str, proc_root: str) -> tuple[bool, str, str]:
    """``(supported, reason, path)`` for start-up probing, reading only: the DAMON sysfs folder
    and ``/proc/kpagecgroup``. paddr and ``tried_regions`` are checked when our kdamond is set
    up (their files exist only inside a kdamond folder); a busy interface is reported then."""
    admin = admin_dir(sys_root)
    if not os.path.isdir(admin):
        return False, f"{admin} absent: kernel without CONFIG_DAMON_SYSFS", admin
    kpc = os.path.join(proc_root, "kpagecgroup")
    if not os.access(kpc, os.R_OK):
        why = "absent: needs CONFIG_MEMCG and CONFIG_PROC_PAGE_MONITOR"
        if os.path.exists(kpc):
            why = "not readable (needs root)"
        return False, f"{kpc} {why}", kpc
    try:
        states = kdamond_states(RealSysfs(admin))
    except (HostError, ParseError) as err:
        return False, str(err), admin
    busy = [f"kdamond {i} {s}" for i, s in enumerate(states)]
    now = f"; now held by others ({', '.join(busy)})" if busy else ""
    return True, f"DAMON sysfs and {kpc} present{now}", admin


def clean_stale_kdamond(sys_root: str, proc_root: str, state_dir: str) -> bool:
    """At the koordlet's start, whatever its gates: remove the kdamond a killed koordlet left
    (:meth:`Kdamond.clean_stale`). Nothing to do, and nothing read under sysfs, without a claim
    file. True when something was removed."""
    path = claim_path(state_dir)
    if not os.path.exists(path):
        return False
    return Kdamond(RealSysfs(admin_dir(sys_root)), path, proc_root).clean_stale()
