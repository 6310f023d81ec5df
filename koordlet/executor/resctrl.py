"""resctrl allocation writes: control groups, ``schemata`` lines and task placement.

The kernel (``Documentation/filesystems/resctrl.rst``) exposes, under ``<sys>/fs/resctrl``::

    info/L3/cbm_mask        hex mask of every L3 way (``7ff``: 11 ways), contiguous from bit 0
    info/L3/min_cbm_bits    fewest set bits a mask may have
    info/MB/min_bandwidth   smallest memory-bandwidth percentage (Intel MBA)
    info/MB/bandwidth_gran  its granularity, percent
    schemata                the default group's allocation, one resource a line:
                                L3:0=7ff;1=7ff
                                MB:0=100;1=100
    <group>/schemata        the same for a control group (``mkdir`` makes one)
    <group>/tasks           thread ids in the group: reading lists them, writing one id moves it

A line written to a group's ``schemata`` replaces that resource's values only; the others stay.
The writer writes the whole file (the other lines as read), which the kernel applies line by line.
The kernel prints the resource name right-aligned to the longest name (``  MB`` beside
``L3CODE``), so lines are parsed stripped. Writing a thread id that exited fails with ESRCH: a
race, not an error.

:class:`ResctrlWriter` performs these writes on the caller's thread (the executor's writer thread,
see :func:`~koordlet.executor.sysctl.call_on_writer`): ``schemata`` lines only when they differ
from what the group holds, audited through ``on_change``; ``tasks`` only for threads not yet in
the group (never cached: a thread id may be reused).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field

from apis.records import frozen
from koordlet.errors import CgroupGoneError, HostError, ParseError, UnsupportedError
from koordlet.executor.originals import Original, Recorder
from koordlet.executor.sysctl import notify, record
from koordlet.executor.writer import WriteResult
from koordlet.system.cgroups import CgroupLayout, CgroupVersion
from koordlet.system.oserrors import absent_error, host_file_error
from koordlet.system.paths import HostPaths
from koordlet.system.resctrl import (
    GROUP_OF_CLASS,
    RESCTRL_GROUPS,
    is_mounted,
    read_cpu_flags,
    resctrl_root,
)

logger = logging.getLogger(__name__)

__all__ = [
    "GROUP_OF_CLASS",
    "L3",
    "MB",
    "RESCTRL_GROUPS",
    "AllocInfo",
    "ResctrlWriter",
    "read_alloc_info",
]

L3 = "L3"
MB = "MB"
CAT_FLAGS = ("cat_l3",)
"""cpuinfo flag of L3 cache allocation (CAT)."""
MBA_FLAGS = ("mba",)
"""cpuinfo flag of memory bandwidth allocation (MBA)."""
AMD_VENDOR_ID = "AuthenticAMD"


# Parsing ----------------------------------------------------------------------------------------


def parse_schemata(text: str, path: str = "schemata") -> dict[str, dict[int, str]]:
    """``schemata`` text → resource → domain id → value (``{"L3": {0: "7ff"}}``)."""
    out: dict[str, dict[int, str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        name, sep, rest = line.partition(":")
        if not sep or not name:
            raise ParseError(f"{path}: bad schemata line {raw!r}")
        domains: dict[int, str] = {}
        for item in rest.split(";"):
            dom, eq, value = item.partition("=")
            if not eq or not dom.strip().isdigit() or not value.strip():
                raise ParseError(f"{path}: bad domain {item!r} in {raw!r}")
            domains[int(dom)] = value.strip()
        out[name.strip()] = domains
    return out


def format_schemata_line(resource: str, domains: Mapping[int, str]) -> str:
    """One ``schemata`` line: ``L3:0=f;1=f`` (domains ascending)."""
    return f"{resource}:" + ";".join(f"{d}={v}" for d, v in sorted(domains.items()))


def _same_value(resource: str, a: str, b: str) -> bool:
    if resource.startswith(L3):
        try:
            return int(a, 16) == int(b, 16)
        except ValueError:
            return a == b
    return a == b


def parse_pids(text: str, path: str) -> set[int]:
    """A ``tasks``/``cgroup.threads`` file: one decimal id a line."""
    try:
        return {int(line) for line in text.split()}
    except ValueError:
        raise ParseError(f"{path}: not a list of thread ids") from None


@frozen
class AllocInfo:
    """What resctrl allocation this host offers (read once a round, on the writer thread)."""

    root: str
    """The resctrl mount point."""
    l3_cbm: int = 0
    """``info/L3/cbm_mask``; 0 when L3 CAT is unusable."""
    l3_min_cbm_bits: int = 1
    """``info/L3/min_cbm_bits``."""
    l3_domains: tuple[int, ...] = ()
    """L3 cache ids of the root ``schemata``."""
    mb_domains: tuple[int, ...] = ()
    """MB domain ids of the root ``schemata``."""
    mb_min: int = 10
    """``info/MB/min_bandwidth``."""
    mb_gran: int = 10
    """``info/MB/bandwidth_gran``."""
    amd: bool = False
    """An AMD CPU: MBA values are in 1/8 GB/s units, ``2048`` unlimited."""
    l3_reason: str = ""
    """Why L3 CAT is unusable; empty when usable."""
    mb_reason: str = ""
    """Why MBA is unusable; empty when usable."""
    groups: Mapping[str, bool] = field(default_factory=dict)
    """Control group → whether it exists."""

    @property
    def usable(self) -> bool:
        """At least one of CAT and MBA works."""
        return not self.l3_reason or not self.mb_reason


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError as err:
        raise absent_error(path, err, "reading") from err


def _read_int(path: str, base: int = 10) -> int:
    text = _read_text(path)
    try:
        return int(text.strip(), base)
    except ValueError:
        raise ParseError(f"{path}: not a number: {text[:40]!r}") from None


def _vendor(paths: HostPaths) -> str:
    try:
        text = _read_text(paths.proc("cpuinfo"))
    except HostError:
        return ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "vendor_id":
            return value.strip()
    return ""


def read_alloc_info(
    paths: HostPaths, groups: Iterable[str] = (), *, flags: frozenset[str] | None = None
) -> AllocInfo:
    """What the CPU flags and the mount offer; every reason names the flag, mount or file.

    ``flags`` are the CPU flags when the caller has read them already (they never change).
    """
    root = resctrl_root(paths)
    if flags is None:
        try:
            flags = read_cpu_flags(paths)
        except (HostError, ParseError) as err:
            why = f"cannot read CPU flags: {err}"
            return AllocInfo(root, l3_reason=why, mb_reason=why)
    cpuinfo = paths.proc("cpuinfo")
    l3_reason = "" if any(f in flags for f in CAT_FLAGS) else f"{cpuinfo} flags lack cat_l3"
    mb_reason = "" if any(f in flags for f in MBA_FLAGS) else f"{cpuinfo} flags lack mba"
    if not is_mounted(root):
        why = f"resctrl not mounted at {root} (mount -t resctrl resctrl {root})"
        return AllocInfo(root, l3_reason=l3_reason or why, mb_reason=mb_reason or why)
    try:
        schemata = parse_schemata(_read_text(os.path.join(root, "schemata")))
    except HostError as err:
        return AllocInfo(root, l3_reason=str(err), mb_reason=str(err))
    cbm, min_bits, mb_min, mb_gran = 0, 1, 10, 10
    if not l3_reason:
        try:
            cbm = _read_int(os.path.join(root, "info", L3, "cbm_mask"), 16)
            min_bits = _read_int(os.path.join(root, "info", L3, "min_cbm_bits"))
        except HostError as err:
            l3_reason = f"L3 CAT not enabled in the mount ({err})"
        if not l3_reason and L3 not in schemata:
            l3_reason = f"{root}/schemata has no L3 line (CDP on? L3CODE/L3DATA unsupported)"
    if not mb_reason:
        try:
            mb_min = _read_int(os.path.join(root, "info", MB, "min_bandwidth"))
            mb_gran = _read_int(os.path.join(root, "info", MB, "bandwidth_gran"))
        except HostError as err:
            mb_reason = f"MBA not enabled in the mount ({err})"
        if not mb_reason and MB not in schemata:
            mb_reason = f"{root}/schemata has no MB line"
    return AllocInfo(
        root,
        l3_cbm=cbm,
        l3_min_cbm_bits=min_bits,
        l3_domains=tuple(sorted(schemata.get(L3, {}))),
        mb_domains=tuple(sorted(schemata.get(MB, {}))),
        mb_min=mb_min,
        mb_gran=mb_gran,
        amd=_vendor(paths) == AMD_VENDOR_ID,
        l3_reason=l3_reason,
        mb_reason=mb_reason,
        groups={g: os.path.isdir(os.path.join(root, g)) for g in groups},
    )


# Writes -----------------------------------------------------------------------------------------


@frozen
class TaskPlacement:
    """What one ``tasks`` update did."""

    group: str
    added: int = 0
    """Threads moved into the group."""
    gone: int = 0
    """Threads that exited before they could be moved (ESRCH)."""
    missing_cgroups: int = 0
    """Container cgroups that were gone when read."""


class ResctrlWriter:
    """Creates control groups, writes ``schemata`` lines and moves threads; see the module doc."""

    def __init__(
        self,
        paths: HostPaths,
        *,
        on_change: Callable[[WriteResult], None] | None = None,
        is_dry_run: Callable[[str], bool] | None = None,
        record_original: Recorder | None = None,
    ) -> None:
        self.paths = paths
        """Host roots (``<sys>/fs/resctrl``, ``/proc/cpuinfo``)."""
        self.on_change = on_change
        """Called with every result that changed a file, and every dry-run result that would
        have (the audit log)."""
        self.is_dry_run = is_dry_run or (lambda strategy: False)
        """Whether writes asked for by a strategy are only computed and audited."""
        self.record_original = record_original
        """Called before a group is made or a ``schemata`` line changed (the originals
        journal)."""
        self._flags: frozenset[str] | None = None

    @property
    def root(self) -> str:
        return resctrl_root(self.paths)

    def cpu_lacks_rdt(self) -> bool:
        """True once :meth:`alloc_info` has read the CPU flags and they name neither L3 CAT nor
        MBA: nothing resctrl does can work on this CPU until the next boot."""
        flags = self._flags
        return (
            flags is not None
            and not any(f in flags for f in CAT_FLAGS)
            and not any(f in flags for f in MBA_FLAGS)
        )

    def alloc_info(self, groups: Iterable[str] = ()) -> AllocInfo:
        """:func:`read_alloc_info` now, the CPU flags read once (they never change)."""
        if self._flags is None:
            try:
                self._flags = read_cpu_flags(self.paths)
            except (HostError, ParseError) as err:
                why = f"cannot read CPU flags: {err}"
                return AllocInfo(self.root, l3_reason=why, mb_reason=why)
        return read_alloc_info(self.paths, groups, flags=self._flags)

    def ensure_group(self, group: str, *, strategy: str = "", reason: str = "") -> bool:
        """Make control group ``group`` when it does not exist; True when it was made."""
        path = os.path.join(self.root, group)
        if os.path.isdir(path):
            return False
        if self.is_dry_run(strategy):
            logger.info("dry run: would create resctrl group %s", path)
            return False
        record(self.record_original, Original("resctrl_group", path, "resctrl", ""))
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            return False
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise HostError(f"{path}: no free CLOSID for a new control group") from err
            raise host_file_error(path, err, "mkdir") from err
        self._notify(WriteResult(path, "", "created", True, "resctrl_group", strategy, reason))
        return True

    def write_schemata(
        self,
        group: str,
        resource: str,
        domains: Mapping[int, str],
        *,
        strategy: str = "",
        reason: str = "",
    ) -> WriteResult:
        """Set ``resource``'s line of ``group``'s ``schemata`` when any domain differs."""
        path = os.path.join(self.root, group, "schemata")
        try:
            lines = parse_schemata(_read_text(path), path)
        except CgroupGoneError as err:
            raise UnsupportedError(f"resctrl group {group}", f"{path} absent") from err
        current = lines.get(resource, {})
        old = format_schemata_line(resource, current)
        new = format_schemata_line(resource, domains)
        knob = f"resctrl_{resource.lower()}"
        same = set(current) >= set(domains) and all(
            _same_value(resource, current[d], v) for d, v in domains.items()
        )
        if same:
            return WriteResult(path, old, new, False, knob, strategy, reason)
        if self.is_dry_run(strategy):
            logger.info("dry run: would write %s: %r -> %r (%s)", path, old, new, reason)
            dry = WriteResult(path, old, new, False, knob, strategy, reason, True)
            notify(self.on_change, dry)
            return dry
        # The whole file, every other resource's line as read: the kernel applies each line
        # (the others to the values they have), and a plain file (a test tree) ends up as the
        # kernel would show it.
        record(self.record_original, Original("resctrl_schemata", path, knob, old))
        lines[resource] = {**current, **domains}
        text = "".join(format_schemata_line(r, d) + "\n" for r, d in lines.items())
        try:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
            try:
                os.write(fd, text.encode("ascii"))
            finally:
                os.close(fd)
        except OSError as err:
            status = self._last_cmd_status()
            raise HostError(
                f"{path}: writing {new!r} failed: {err.strerror}{f' ({status})' if status else ''}"
            ) from err
        result = WriteResult(path, old, new, True, knob, strategy, reason)
        self._notify(result)
        return result

    def place_tasks(
        self,
        group: str,
        layout: CgroupLayout,
        cgroup_dirs: Iterable[str],
        *,
        strategy: str = "",
        reason: str = "",
    ) -> TaskPlacement:
        """Move every thread of cgroups ``cgroup_dirs`` (relative, any layout) into ``group``
        that is not there yet."""
        tasks_path = os.path.join(self.root, group, "tasks")
        try:
            present = parse_pids(_read_text(tasks_path), tasks_path)
        except CgroupGoneError as err:
            raise UnsupportedError(f"resctrl group {group}", f"{tasks_path} absent") from err
        threads_file = "cgroup.threads" if layout.version is CgroupVersion.V2 else "tasks"
        wanted: set[int] = set()
        missing = 0
        for rel in cgroup_dirs:
            path = layout.file("cpu", rel, threads_file)
            try:
                wanted |= parse_pids(_read_text(path), path)
            except CgroupGoneError:
                missing += 1
        todo = sorted(wanted - present)
        if not todo or self.is_dry_run(strategy):
            if todo:
                logger.info("dry run: would move %d threads into %s", len(todo), tasks_path)
            return TaskPlacement(group, 0, 0, missing)
        added = gone = 0
        try:
            fd = os.open(tasks_path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as err:
            raise host_file_error(tasks_path, err, "open") from err
        try:
            for tid in todo:
                try:
                    os.write(fd, f"{tid}\n".encode("ascii"))
                except OSError as err:
                    if err.errno in (errno.ESRCH, errno.ENOENT):
                        gone += 1
                        continue
                    raise host_file_error(tasks_path, err, f"writing {tid}") from err
                added += 1
        finally:
            os.close(fd)
        if added:
            self._notify(
                WriteResult(
                    tasks_path, "", f"+{added} threads", True, "resctrl_tasks", strategy, reason
                )
            )
        return TaskPlacement(group, added, gone, missing)

    def groups(self, prefix: str) -> list[str]:
        """Control groups whose names start with ``prefix`` (``koordlet-``), sorted."""
        try:
            names = os.listdir(self.root)
        except OSError as err:
            raise host_file_error(self.root, err, "listing") from err
        return sorted(
            n for n in names if n.startswith(prefix) and os.path.isdir(os.path.join(self.root, n))
        )

    def remove_group(self, group: str, *, strategy: str = "", reason: str = "") -> bool:
        """Remove control group ``group`` (the kernel moves its threads back to the default
        group and frees its CLOSID); True when removed, False when it was not there or in dry
        run (audited as a decision)."""
        path = os.path.join(self.root, group)
        if not os.path.isdir(path):
            return False
        if self.is_dry_run(strategy):
            logger.info("dry run: would remove resctrl group %s (%s)", path, reason)
            notify(
                self.on_change,
                WriteResult(
                    path, "exists", "removed", False, "resctrl_group", strategy, reason, True
                ),
            )
            return False
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return False
        except OSError as err:
            raise host_file_error(path, err, "rmdir") from err
        self._notify(
            WriteResult(path, "exists", "removed", True, "resctrl_group", strategy, reason)
        )
        return True

    def _last_cmd_status(self) -> str:
        try:
            return _read_text(os.path.join(self.root, "info", "last_cmd_status")).strip()
        except HostError:
            return ""

    def _notify(self, result: WriteResult) -> None:
        notify(self.on_change, result)
