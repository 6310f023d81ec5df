"""``perf_event_open(2)`` through ctypes: event groups counting a cgroup on each CPU.

Only counting is used, never sampling: one *group* per CPU, a leader and its members scheduled
onto the PMU together, read in one ``read(2)`` with the layout ``PERF_FORMAT_GROUP |
TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING | ID`` gives (``include/uapi/linux/perf_event.h``)::

    u64 nr; u64 time_enabled; u64 time_running; { u64 value; u64 id; } values[nr];

Values are mapped to events by ``id`` (``PERF_EVENT_IOC_ID``), never by position.

**Cgroup mode.** With ``PERF_FLAG_PID_CGROUP`` the ``pid`` argument is an open file descriptor of
the cgroup's directory in the perf_event hierarchy (v1) or the unified tree (v2) and ``cpu`` must
be a CPU: the events count only while a task of that cgroup (or a descendant) runs on that CPU,
and their ``time_enabled`` is *cgroup time*, the time the cgroup was active there. A CPU where the
cgroup never ran reads ``time_enabled == 0`` and zero counts. The kernel holds the cgroup through
the event, so the directory descriptor is closed right after opening, and reads keep working
(the counts just stop) after the cgroup is removed.

**Multiplexing.** When more events want the PMU than it has counters, the kernel rotates groups;
a group's counts are then extrapolated as ``value * time_enabled / time_running``. A group that
was enabled but never got onto the PMU (``time_running == 0``) has no estimate at all.

**Errors.** ``OSError`` becomes a :class:`~koordlet.errors.HostError` naming the event, the CPU
and the errno (the ``OSError`` is chained; ``koordlet.system.oserrors.errno_of`` digs it out).
``ENOENT`` on the directory and, in cgroup mode, from ``perf_event_open`` (the cgroup went
offline) is a :class:`~koordlet.errors.CgroupGoneError`. Since a missing hardware event also answers
``ENOENT``, whether the events exist is decided first by :func:`probe_events` (a CPU-wide group
on one CPU), where ``ENOENT``, ``EOPNOTSUPP`` and ``ENODEV`` mean no such counter here.

The system-call layer is the :class:`PerfOpener` protocol; :class:`SyscallOpener` is the real
one, and tests inject fakes that hand out fake descriptors and read buffers in the real layout.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from apis.records import frozen
from koordlet.errors import CgroupGoneError, HostError, ParseError, UnsupportedError
from koordlet.system import libc
from koordlet.system.cgroups import CgroupLayout, CgroupVersion
from koordlet.system.oserrors import DENIED_ERRNOS, errno_name, errno_of

logger = logging.getLogger(__name__)

# include/uapi/linux/perf_event.h ---------------------------------------------------------------
PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_COUNT_HW_CPU_CYCLES = 0
PERF_COUNT_HW_INSTRUCTIONS = 1
PERF_COUNT_SW_CPU_CLOCK = 0
PERF_COUNT_SW_TASK_CLOCK = 1

PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
PERF_FORMAT_ID = 1 << 2
PERF_FORMAT_GROUP = 1 << 3
GROUP_READ_FORMAT = (
    PERF_FORMAT_TOTAL_TIME_ENABLED
    | PERF_FORMAT_TOTAL_TIME_RUNNING
    | PERF_FORMAT_ID
    | PERF_FORMAT_GROUP
)
"""The read format of every group here."""

PERF_FLAG_PID_CGROUP = 1 << 2
PERF_FLAG_FD_CLOEXEC = 1 << 3

PERF_IOC_FLAG_GROUP = 1
"""ioctl argument: apply ENABLE/DISABLE/RESET to the whole group of the leader."""

ATTR_FLAG_DISABLED = 1 << 0
"""Bit 0 of the attr's flag word: the event starts disabled (only the leader; members follow)."""

PERF_ATTR_SIZE_VER5 = 112
"""Size of the attr up to ``sample_max_stack`` (Linux 4.8); newer kernels take a short attr."""


def _ioc(direction: int, nr: int, size: int) -> int:
    """``_IOC(dir, '$', nr, size)`` for this machine's ioctl encoding."""
    machine = libc.machine()
    if machine.startswith(("ppc", "powerpc", "sparc")):
        read_bit, dir_shift = 2, 29
    elif machine.startswith("mips"):
        read_bit, dir_shift = 1, 29
    else:  # asm-generic: x86, arm, arm64, riscv, s390, loongarch
        read_bit, dir_shift = 2, 30
    bits = read_bit if direction else 0
    return (bits << dir_shift) | (size << 16) | (ord("$") << 8) | nr


PERF_EVENT_IOC_ENABLE = _ioc(0, 0, 0)
PERF_EVENT_IOC_DISABLE = _ioc(0, 1, 0)
PERF_EVENT_IOC_RESET = _ioc(0, 3, 0)
PERF_EVENT_IOC_ID = _ioc(1, 7, 8)
"""``_IOR('$', 7, __u64 *)``: the event's id, as the group read reports it (Linux 3.12)."""

SYS_PERF_EVENT_OPEN: Mapping[str, int] = (
    dict.fromkeys(("aarch64", "arm64", "riscv64", "loongarch64"), 241)  # asm-generic
    | dict.fromkeys(("i386", "i686"), 336)
    | dict.fromkeys(("ppc64", "ppc64le"), 319)
    | {"x86_64": 298, "armv7l": 364, "s390x": 331}
)
"""``__NR_perf_event_open`` by ``uname -m``."""


class PerfEventAttr(ctypes.Structure):
    """``struct perf_event_attr`` up to ``PERF_ATTR_SIZE_VER5``; the bit fields after
    ``read_format`` are one 64-bit word (``flags``), bit 0 ``disabled``."""

    _fields_ = (
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("reserved_2", ctypes.c_uint16),
    )


@frozen
class PerfEvent:
    """One countable event."""

    name: str
    """Short name used in results and messages (``cycles``)."""
    type: int
    """``perf_event_attr.type`` (``PERF_TYPE_HARDWARE``, ``PERF_TYPE_SOFTWARE``)."""
    config: int
    """``perf_event_attr.config`` within the type."""


CYCLES = PerfEvent("cycles", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES)
INSTRUCTIONS = PerfEvent("instructions", PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS)
TASK_CLOCK = PerfEvent("task-clock", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK)
"""Nanoseconds the counted tasks ran (software: works without a PMU)."""
CPU_CLOCK = PerfEvent("cpu-clock", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK)
"""Nanoseconds of CPU clock while counting (software: works without a PMU)."""


def event_attr(event: PerfEvent, *, disabled: bool) -> PerfEventAttr:
    """A counting attr for ``event`` with :data:`GROUP_READ_FORMAT`."""
    attr = PerfEventAttr()
    attr.type = event.type
    attr.size = ctypes.sizeof(PerfEventAttr)
    attr.config = event.config
    attr.read_format = GROUP_READ_FORMAT
    attr.flags = ATTR_FLAG_DISABLED if disabled else 0
    return attr


class PerfOpener(Protocol):
    """The system calls on perf events. Each raises ``OSError`` (with ``errno``) on failure."""

    def open(self, attr: PerfEventAttr, pid: int, cpu: int, group_fd: int, flags: int) -> int:
        """``perf_event_open(attr, pid, cpu, group_fd, flags)``: a new descriptor."""
        ...

    def ioctl(self, fd: int, request: int, arg: int) -> None:
        """``ioctl(fd, request, arg)`` for ENABLE, DISABLE and RESET."""
        ...

    def event_id(self, fd: int) -> int:
        """``ioctl(fd, PERF_EVENT_IOC_ID)``: the id the group read reports for this event."""
        ...

    def read(self, fd: int, size: int) -> bytes:
        """``read(fd, size)``."""
        ...

    def close(self, fd: int) -> None:
        """``close(fd)``."""
        ...


def _libc() -> ctypes.CDLL:
    return libc.libc()


class SyscallOpener:
    """The real :class:`PerfOpener`: libc's ``syscall(2)`` with this machine's number."""

    def __init__(self, machine: str | None = None) -> None:
        machine = machine or libc.machine()
        number = SYS_PERF_EVENT_OPEN.get(machine)
        if number is None:
            raise UnsupportedError(
                "perf_event_open", f"no system call number known for machine {machine!r}"
            )
        self._nr = number
        self._syscall = _libc().syscall

    def open(self, attr: PerfEventAttr, pid: int, cpu: int, group_fd: int, flags: int) -> int:
        nr, flags_arg = ctypes.c_long(self._nr), ctypes.c_ulong(flags)
        fd = int(self._syscall(nr, ctypes.byref(attr), pid, cpu, group_fd, flags_arg))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return fd

    def ioctl(self, fd: int, request: int, arg: int) -> None:
        fcntl.ioctl(fd, request, arg)

    def event_id(self, fd: int) -> int:
        buf = bytearray(8)
        fcntl.ioctl(fd, PERF_EVENT_IOC_ID, buf, True)
        return int.from_bytes(buf, sys.byteorder)

    def read(self, fd: int, size: int) -> bytes:
        return os.read(fd, size)

    def close(self, fd: int) -> None:
        os.close(fd)


# Reading ---------------------------------------------------------------------------------------

_HEADER = struct.Struct("=QQQ")
_ENTRY = struct.Struct("=QQ")


def group_read_size(members: int) -> int:
    """Bytes of a group read with ``members`` events."""
    return _HEADER.size + members * _ENTRY.size


def pack_group_read(
    time_enabled: int, time_running: int, values: Sequence[tuple[int, int]]
) -> bytes:
    """The kernel's group read layout for ``(value, id)`` pairs (fakes build buffers with it)."""
    out = _HEADER.pack(len(values), time_enabled, time_running)
    return out + b"".join(_ENTRY.pack(value, event_id) for value, event_id in values)


@frozen
class GroupReading:
    """One read of one group on one CPU."""

    time_enabled: int
    """Nanoseconds the group was enabled (cgroup mode: while the cgroup was active there)."""
    time_running: int
    """Nanoseconds it was actually on the PMU."""
    values: Mapping[str, int]
    """Raw counts by event name."""

    def scaled(self) -> dict[str, float] | None:
        """Counts extrapolated over the enabled time; None when it never ran while enabled.

        Not enabled at all (the cgroup never ran on this CPU) reads zero counts: that is data.
        """
        if self.time_running == 0:
            if self.time_enabled == 0:
                return dict.fromkeys(self.values, 0.0)
            return None
        if self.time_running >= self.time_enabled:
            return {name: float(v) for name, v in self.values.items()}
        factor = self.time_enabled / self.time_running
        return {name: v * factor for name, v in self.values.items()}


def parse_group_read(data: bytes, ids: Mapping[int, str], what: str) -> GroupReading:
    """A group read (layout in the module docstring) with ``ids`` (event id → name).

    Raises ``ParseError`` naming ``what`` for a short buffer, a count that does not match the
    buffer or the group, or an id the group does not have.
    """
    if len(data) < _HEADER.size:
        raise ParseError(f"{what}: group read of {len(data)} bytes, shorter than its header")
    nr, enabled, running = _HEADER.unpack_from(data)
    if nr != len(ids) or len(data) != group_read_size(nr):
        raise ParseError(
            f"{what}: group read says {nr} events in {len(data)} bytes; the group has {len(ids)}"
        )
    values: dict[str, int] = {}
    for index in range(nr):
        value, event_id = _ENTRY.unpack_from(data, _HEADER.size + index * _ENTRY.size)
        name = ids.get(event_id)
        if name is None or name in values:
            raise ParseError(f"{what}: group read holds unknown or repeated event id {event_id}")
        values[name] = value
    return GroupReading(enabled, running, values)


# Groups ----------------------------------------------------------------------------------------


class EventGroup:
    """A leader and its members counting on one CPU (see :func:`open_group`)."""

    __slots__ = ("_ids", "_opener", "cpu", "fds", "what")

    def __init__(
        self, opener: PerfOpener, cpu: int, fds: Sequence[int], ids: Mapping[int, str], what: str
    ) -> None:
        self._opener = opener
        self.cpu = cpu
        """The CPU the group counts on."""
        self.fds: tuple[int, ...] = tuple(fds)
        """Descriptors, leader first; empty once closed."""
        self._ids = dict(ids)
        self.what = what
        """What the group counts, for messages."""

    def _group_ioctl(self, request: int, verb: str) -> None:
        try:
            self._opener.ioctl(self.fds[0], request, PERF_IOC_FLAG_GROUP)
        except OSError as err:
            raise HostError(
                f"{verb} perf group on cpu {self.cpu} for {self.what}: {errno_name(err.errno)}"
            ) from err

    def start(self) -> None:
        """Zero the counts and enable the whole group."""
        self._group_ioctl(PERF_EVENT_IOC_RESET, "reset")
        self._group_ioctl(PERF_EVENT_IOC_ENABLE, "enable")

    def read(self) -> GroupReading:
        """One read of the leader: the whole group."""
        size = group_read_size(len(self._ids))
        try:
            data = self._opener.read(self.fds[0], size)
        except OSError as err:
            raise HostError(
                f"read perf group on cpu {self.cpu} for {self.what}: {errno_name(err.errno)}"
            ) from err
        return parse_group_read(data, self._ids, f"perf group on cpu {self.cpu} for {self.what}")

    def close(self) -> None:
        """Close every descriptor, members first; idempotent."""
        fds, self.fds = self.fds, ()
        _close_all(self._opener, reversed(fds))


def _close_all(opener: PerfOpener, fds: Iterable[int]) -> None:
    for fd in fds:
        try:
            opener.close(fd)
        except OSError as err:  # EBADF would be our bug; nothing else can fail on close
            logger.warning("closing perf event fd %d: %s", fd, err)


def open_group(
    opener: PerfOpener,
    events: Sequence[PerfEvent],
    *,
    pid: int,
    cpu: int,
    flags: int = PERF_FLAG_FD_CLOEXEC,
    what: str = "",
) -> EventGroup:
    """Open ``events`` as one disabled group (``events[0]`` leads) on ``cpu`` for ``pid``.

    On any failure every descriptor opened so far is closed and ``HostError`` (``ENOENT`` in
    cgroup mode: ``CgroupGoneError``) is raised, naming the event, the CPU and the errno.
    """
    if not events:
        raise ValueError("a perf group needs at least one event")
    what = what or (f"pid {pid}" if pid >= 0 else "all tasks")
    fds: list[int] = []
    ids: dict[int, str] = {}
    try:
        for index, event in enumerate(events):
            attr = event_attr(event, disabled=index == 0)
            group_fd = fds[0] if fds else -1
            try:
                fd = opener.open(attr, pid, cpu, group_fd, flags)
            except OSError as err:
                message = (
                    f"perf_event_open({event.name}) on cpu {cpu} for {what}: "
                    f"{errno_name(err.errno)} ({err.strerror})"
                )
                if err.errno == errno.ENOENT and flags & PERF_FLAG_PID_CGROUP:
                    raise CgroupGoneError(message) from err
                raise HostError(message) from err
            fds.append(fd)
            try:
                ids[opener.event_id(fd)] = event.name
            except OSError as err:
                raise HostError(
                    f"PERF_EVENT_IOC_ID({event.name}) on cpu {cpu} for {what}: "
                    f"{errno_name(err.errno)}"
                ) from err
    except BaseException:
        _close_all(opener, reversed(fds))
        raise
    if len(ids) != len(events):
        _close_all(opener, reversed(fds))
        raise HostError(f"perf events of the group on cpu {cpu} for {what} share an id")
    return EventGroup(opener, cpu, fds, ids, what)


# Cgroup counters -------------------------------------------------------------------------------


@frozen
class CounterTotals:
    """A cgroup's counts over every CPU, each CPU's extrapolated on its own."""

    values: Mapping[str, float]
    """Event name → count summed over the CPUs."""
    time_enabled: int
    """Nanoseconds enabled, summed over the CPUs (cgroup time: while the cgroup ran there)."""
    time_running: int
    """Nanoseconds on the PMU, summed over the CPUs; below ``time_enabled`` when multiplexed."""


class CgroupCounters:
    """One event group per CPU counting one cgroup (perf's cgroup mode); see
    :meth:`open`. Holds ``len(events) * len(cpus)`` descriptors until :meth:`close`."""

    __slots__ = ("_events", "cgroup_dir", "groups")

    def __init__(
        self, cgroup_dir: str, events: Sequence[PerfEvent], groups: Sequence[EventGroup]
    ) -> None:
        self.cgroup_dir = cgroup_dir
        """The cgroup directory counted."""
        self._events = tuple(events)
        self.groups: tuple[EventGroup, ...] = tuple(groups)
        """One group per CPU; empty once closed."""

    @classmethod
    def open(
        cls,
        opener: PerfOpener,
        cgroup_dir: str,
        cpus: Sequence[int],
        events: Sequence[PerfEvent],
    ) -> CgroupCounters:
        """Open a disabled group of ``events`` on every CPU of ``cpus`` for ``cgroup_dir``.

        All or nothing: a failure on any CPU closes what was opened and raises (``ENOENT`` on the
        directory or from the kernel: ``CgroupGoneError``; else ``HostError``).
        """
        try:
            dir_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError as err:
            raise CgroupGoneError(f"{cgroup_dir}: cgroup gone") from err
        except OSError as err:
            raise HostError(f"open {cgroup_dir}: {errno_name(err.errno)}") from err
        groups: list[EventGroup] = []
        try:
            for cpu in cpus:  # a loop, not extend(): the groups opened so far must be closable
                groups.append(  # noqa: PERF401
                    open_group(
                        opener,
                        events,
                        pid=dir_fd,
                        cpu=cpu,
                        flags=PERF_FLAG_PID_CGROUP | PERF_FLAG_FD_CLOEXEC,
                        what=cgroup_dir,
                    )
                )
        except BaseException:
            for group in reversed(groups):
                group.close()
            raise
        finally:
            os.close(dir_fd)  # the events hold the cgroup
        return cls(cgroup_dir, events, groups)

    @property
    def fd_count(self) -> int:
        """Descriptors held."""
        return sum(len(g.fds) for g in self.groups)

    def start(self) -> None:
        """Zero and enable every group."""
        for group in self.groups:
            group.start()

    def read(self) -> CounterTotals | None:
        """Counts over every CPU; None when some CPU's group never got onto the PMU while
        enabled (its share cannot be estimated) or when the cgroup ran nowhere.

        A failure on any CPU raises: there is no partial result.
        """
        totals = dict.fromkeys((e.name for e in self._events), 0.0)
        enabled = running = 0
        for group in self.groups:
            reading = group.read()
            scaled = reading.scaled()
            if scaled is None:
                return None
            enabled += reading.time_enabled
            running += reading.time_running
            for name, value in scaled.items():
                totals[name] += value
        if running == 0:
            return None
        return CounterTotals(totals, enabled, running)

    def close(self) -> None:
        """Close every group; idempotent."""
        groups, self.groups = self.groups, ()
        for group in reversed(groups):
            group.close()


# Probing ---------------------------------------------------------------------------------------

_ABSENT = frozenset({errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV})
"""What ``perf_event_open`` of a hardware event answers when the PMU lacks it (or there is no
PMU: a VM without a virtual PMU, a container runtime that hides it)."""


@frozen
class PerfSupport:
    """Whether the events can be counted here."""

    supported: bool
    """True when the group opened CPU-wide."""
    reason: str
    """Why not (naming the event, the errno and what it means), or what was probed."""
    errno: int | None = None
    """The errno of the failed ``perf_event_open``; None when supported or not a system call."""


def _meaning(code: int | None) -> str:
    if code in _ABSENT:
        return "this CPU or hypervisor exposes no such hardware counter"
    if code in DENIED_ERRNOS:
        return (
            "not permitted: CPU-wide counting needs CAP_PERFMON or CAP_SYS_ADMIN, "
            "or kernel.perf_event_paranoid <= 0"
        )
    if code == errno.ENOSYS:
        return "kernel built without perf events (CONFIG_PERF_EVENTS)"
    if code == errno.EMFILE:
        return "out of file descriptors (RLIMIT_NOFILE)"
    return "perf_event_open refused it"


def probe_events(
    events: Sequence[PerfEvent],
    opener: PerfOpener | None = None,
    *,
    cpu: int | None = None,
) -> PerfSupport:
    """Open ``events`` as a group counting every task on one CPU, then close it.

    CPU-wide is what cgroup mode needs, so this checks the privilege as well as the PMU.
    ``cpu`` defaults to the lowest CPU this process may run on.
    """
    names = ", ".join(e.name for e in events)
    if cpu is None:
        cpu = min(os.sched_getaffinity(0))
    try:
        opener = opener or SyscallOpener()
        group = open_group(opener, events, pid=-1, cpu=cpu, what="all tasks")
    except UnsupportedError as err:
        return PerfSupport(False, err.reason)
    except HostError as err:
        code = errno_of(err)
        return PerfSupport(False, f"{err}: {_meaning(code)}", code)
    group.close()
    return PerfSupport(True, f"opened {names} as a group on cpu {cpu}")


def cgroup_mode_unsupported(layout: CgroupLayout) -> str:
    """Why perf cannot count per cgroup on ``layout``, or empty: cgroup v1 needs the
    ``perf_event`` controller mounted; v2 has it in the unified tree."""
    root = layout.abs_dir("perf_event", "")
    if layout.version is CgroupVersion.V1 and not os.path.isdir(root):
        return f"cgroup v1 controller perf_event not mounted at {root}"
    return ""
