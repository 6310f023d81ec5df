"""Pressure stall information (PSI): parse the pressure files, arm kernel notifications.

Synchronous host access only; ``koordlet.events`` watches what is armed here from the event loop.

**Files** (``Documentation/accounting/psi.rst``)::

    /proc/pressure/{cpu,memory,io}          the node
    <v2 cgroup>/{cpu,memory,io}.pressure    every cgroup v2 cgroup, controllers enabled or not
    <v1 cpuacct cgroup>/{cpu,memory,io}.pressure   Anolis kernels booted with psi_v1=1 only

Each holds one line per degree, ``avg*`` in percent of wall time over 10, 60 and 300 s, ``total``
the cumulative stall time in microseconds::

    some avg10=0.45 avg60=0.32 avg300=5.25 total=217389162
    full avg10=0.00 avg60=0.00 avg300=0.00 total=0

``full`` is absent from cpu files before Linux 5.13: :attr:`PSIStats.full` is then None, never
zeros (Koordinator's ``FullSupported`` false).

**Errors.** A format we do not know raises :class:`~koordlet.errors.ParseError` naming the file.
:func:`psi_error` maps an ``OSError`` of a pressure file to the tree: ``EOPNOTSUPP`` (PSI compiled
in but disabled: booted ``psi=0``, or cgroup v1 without ``psi_v1``) and a file absent in an
existing directory (no ``CONFIG_PSI``; a v2 cgroup whose ``cgroup.pressure`` is 0 hides its
files) are :class:`~koordlet.errors.UnsupportedError` with the reason and errno; a cgroup that
vanished is :class:`~koordlet.errors.CgroupGoneError`.

**Triggers** (:func:`open_psi_trigger`): write ``"<some|full> <stall us> <window us>\\0"`` to a
pressure file opened read-write; the file then polls ``EPOLLPRI`` each time the stall within a
window exceeds the threshold, at most once per window. The window is 0.5 to 10 s. Without
``CAP_SYS_RESOURCE`` (Linux 6.5+ lets unprivileged users arm triggers) it must be a multiple of
2 s, and such triggers are evaluated with the 2 s averages, so they fire on 2 s boundaries.
Closing the file removes the trigger.

**Memcg thresholds** (cgroup v1, :func:`arm_memcg_threshold`): write ``"<eventfd> <fd of
memory.usage_in_bytes> <bytes>"`` to the cgroup's ``cgroup.event_control``
(``Documentation/admin-guide/cgroup-v1/memory.rst`` section 9). The eventfd counts each crossing
of the threshold, upwards AND downwards; the kernel checks at most every 128 page charges per CPU
(``MEM_CGROUP_THRESHOLDS_EVENTS_TARGET``), so a crossing is seen up to ~512 KiB late. Removing
the cgroup signals the eventfd once more; closing the eventfd unregisters the threshold.
"""

from __future__ import annotations

import errno
import math
import os
from typing import NamedTuple

from koordlet.errors import (
    CgroupGoneError,
    HostError,
    InvalidValueError,
    ParseError,
    UnsupportedError,
)
from koordlet.system.cgroups import fs_magic
from koordlet.system.oserrors import (
    DENIED_ERRNOS,
    GONE_ERRNOS,
    REFUSED_ERRNOS,
    describe,
    is_gone,
)
from koordlet.system.paths import HostPaths

DEGREES = ("some", "full")
"""The two lines of a pressure file: some tasks stalled, all non-idle tasks stalled."""
MIN_WINDOW_US = 500_000
"""Shortest trigger window the kernel accepts (``WINDOW_MIN_US``)."""
MAX_WINDOW_US = 10_000_000
"""Longest trigger window (``WINDOW_MAX_US``)."""
UNPRIVILEGED_WINDOW_US = 2_000_000
"""Without ``CAP_SYS_RESOURCE`` a window must be a multiple of this (the averaging period)."""
CAP_SYS_RESOURCE = 24
"""Capability bit number (``include/uapi/linux/capability.h``)."""
PROC_SUPER_MAGIC = 0x9FA0
"""``f_type`` of procfs (``include/uapi/linux/magic.h``)."""

_KEYS = (b"avg10=", b"avg60=", b"avg300=", b"total=")


class PSILine(NamedTuple):
    """One ``some`` or ``full`` line."""

    avg10: float
    """Percent of the last 10 s that tasks were stalled (0..100)."""
    avg60: float
    """Percent over the last 60 s."""
    avg300: float
    """Percent over the last 300 s."""
    total: int
    """Cumulative stall time, microseconds."""


class PSIStats(NamedTuple):
    """A whole pressure file."""

    some: PSILine
    """Time at least one task was stalled."""
    full: PSILine | None
    """Time all non-idle tasks were stalled at once; None when the kernel does not report it
    (cpu before Linux 5.13)."""


def _parse_line(fields: list[bytes], line: bytes, path: str) -> PSILine:
    if len(fields) != 5:
        raise ParseError(f"{path}: expected 4 fields after the degree: {line[:120]!r}")
    values: list[bytes] = []
    for key, field in zip(_KEYS, fields[1:], strict=True):
        if not field.startswith(key):
            raise ParseError(f"{path}: expected {key.decode()}... in {line[:120]!r}")
        values.append(field[len(key) :])
    try:
        avgs = [float(v) for v in values[:3]]
        total = int(values[3])
    except ValueError:
        raise ParseError(f"{path}: not a number in {line[:120]!r}") from None
    if any(not (math.isfinite(a) and a >= 0.0) for a in avgs) or total < 0:
        raise ParseError(f"{path}: value out of range in {line[:120]!r}")
    return PSILine(avgs[0], avgs[1], avgs[2], total)


def parse_psi(data: bytes, path: str) -> PSIStats:
    """A pressure file's content; ``path`` names it in errors. A ``Tick.parsed`` parser."""
    lines: dict[bytes, PSILine] = {}
    for line in data.splitlines():
        if not line.strip():
            continue
        fields = line.split()
        degree = fields[0]
        if degree not in (b"some", b"full"):
            raise ParseError(f"{path}: unknown pressure line {line[:120]!r}")
        if degree in lines:
            raise ParseError(f"{path}: {degree.decode()} appears twice")
        lines[degree] = _parse_line(fields, line, path)
    some = lines.get(b"some")
    if some is None:
        raise ParseError(f"{path}: no 'some' line in {data[:120]!r}")
    return PSIStats(some, lines.get(b"full"))


def psi_error(path: str, err: OSError, *, cgroup: bool) -> HostError:
    """The tree's error for ``err`` on pressure file ``path`` (``cgroup``: a cgroup's file, not
    ``/proc/pressure``); see the module docstring."""
    code = err.errno
    if code in REFUSED_ERRNOS:
        return UnsupportedError(
            path,
            f"{describe(err)}: PSI is built in but disabled (booted with psi=0, or cgroup v1 "
            "without psi_v1=1)",
        )
    if code == errno.ENOENT:
        parent = os.path.dirname(path)
        if not cgroup:
            return UnsupportedError(
                path, f"{describe(err)}: kernel without PSI (CONFIG_PSI) or booted with psi=0"
            )
        if os.path.isdir(parent):
            return UnsupportedError(
                path,
                f"{describe(err)}: no pressure files in {parent} (cgroup v1 without Anolis "
                "psi_v1=1, a kernel without PSI, or cgroup.pressure set to 0)",
            )
        return CgroupGoneError(f"{path}: cgroup gone ({describe(err)})")
    if code in GONE_ERRNOS:  # ENOENT was told apart above
        return CgroupGoneError(f"{path}: cgroup gone ({describe(err)})")
    if code in DENIED_ERRNOS:
        return UnsupportedError(path, f"{describe(err)}: permission denied")
    return HostError(f"{path}: {err.strerror or err}")


def read_psi(path: str, *, cgroup: bool) -> PSIStats:
    """Read and parse one pressure file; errors as :func:`psi_error` maps them."""
    try:
        with open(path, "rb", buffering=0) as f:
            data = f.read()
    except OSError as err:
        raise psi_error(path, err, cgroup=cgroup) from err
    return parse_psi(data, path)


# Triggers ----------------------------------------------------------------------------------------


def trigger_spec(degree: str, stall_us: int, window_us: int) -> bytes:
    """The bytes that arm a trigger; :class:`InvalidValueError` for what no kernel accepts."""
    if degree not in DEGREES:
        raise InvalidValueError(f"PSI trigger degree must be 'some' or 'full', not {degree!r}")
    if not MIN_WINDOW_US <= window_us <= MAX_WINDOW_US:
        raise InvalidValueError(
            f"PSI trigger window {window_us} us is outside {MIN_WINDOW_US}..{MAX_WINDOW_US} us"
        )
    if not 0 < stall_us <= window_us:
        raise InvalidValueError(
            f"PSI trigger stall {stall_us} us must be positive and within the window"
        )
    return f"{degree} {stall_us} {window_us}\0".encode()


def cap_sys_resource(status: bytes) -> bool | None:
    """Whether a ``/proc/<pid>/status`` grants ``CAP_SYS_RESOURCE`` (``CapEff``); None when the
    content has no ``CapEff`` line."""
    for line in status.splitlines():
        if line.startswith(b"CapEff:"):
            try:
                return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
            except (IndexError, ValueError):
                return None
    return None


def has_cap_sys_resource(paths: HostPaths) -> bool | None:
    """Whether this process may arm sub-2 s trigger windows; None when it cannot tell (the procfs
    root is another PID namespace's)."""
    try:
        with open(paths.proc("self", "status"), "rb") as f:
            return cap_sys_resource(f.read())
    except OSError:
        return None


def _trigger_einval(path: str, spec: bytes, window_us: int, privileged: bool | None) -> str:
    text = spec.rstrip(b"\0").decode()
    if window_us % UNPRIVILEGED_WINDOW_US and privileged is not True:
        who = "this process lacks" if privileged is False else "this process may lack"
        return (
            f"EINVAL (errno {errno.EINVAL}): trigger {text!r} refused; {who} CAP_SYS_RESOURCE, "
            f"and unprivileged windows must be multiples of {UNPRIVILEGED_WINDOW_US} us"
        )
    if text.startswith("full") and os.path.basename(path).startswith("cpu"):
        return (
            f"EINVAL (errno {errno.EINVAL}): trigger {text!r} refused; cpu has no 'full' "
            "pressure before Linux 5.13"
        )
    return f"EINVAL (errno {errno.EINVAL}): the kernel refused trigger {text!r}"


def open_psi_trigger(
    path: str, degree: str, stall_us: int, window_us: int, *, privileged: bool | None = None
) -> int:
    """Arm a trigger on pressure file ``path``; returns the file descriptor (non-blocking,
    close-on-exec) that polls ``EPOLLPRI`` when it fires. Closing it removes the trigger.

    ``privileged`` (whether this process holds ``CAP_SYS_RESOURCE``; None: unknown) only makes an
    ``EINVAL`` reason precise. Raises :class:`InvalidValueError` for arguments no kernel accepts,
    :class:`UnsupportedError` when this host refuses (``EINVAL``, ``EOPNOTSUPP``, no file),
    :class:`CgroupGoneError` when the cgroup is gone.
    """
    spec = trigger_spec(degree, stall_us, window_us)
    cgroup = os.path.basename(path).endswith(".pressure")
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise psi_error(path, err, cgroup=cgroup) from err
    try:
        os.write(fd, spec)
    except OSError as err:
        os.close(fd)
        if err.errno == errno.EINVAL:
            reason = _trigger_einval(path, spec, window_us, privileged)
            raise UnsupportedError(path, reason) from err
        raise psi_error(path, err, cgroup=cgroup) from err
    return fd


def _reason(err: HostError) -> str:
    return err.reason if isinstance(err, UnsupportedError) else str(err)


def probe_psi_trigger(paths: HostPaths) -> tuple[bool, str, str]:
    """``(supported, reason, path)`` for PSI triggers, for the start-up probe: arms a 2 s trigger
    on ``/proc/pressure/memory`` and closes it at once (nothing persists); the reason says which
    windows this process may use. Only a real procfs file is written to, never a fake tree's."""
    path = paths.proc("pressure", "memory")
    try:
        magic = fs_magic(path)
    except OSError as err:
        return False, _reason(psi_error(path, err, cgroup=False)), path
    if magic is not None and magic != PROC_SUPER_MAGIC:
        return False, f"{path} is not on procfs (f_type 0x{magic:x}): not probed", path
    privileged = has_cap_sys_resource(paths)
    try:
        fd = open_psi_trigger(path, "some", 150_000, UNPRIVILEGED_WINDOW_US, privileged=privileged)
    except HostError as err:
        return False, _reason(err), path
    os.close(fd)
    if privileged:
        return True, "armed a test trigger; CAP_SYS_RESOURCE: windows of 0.5 to 10 s", path
    return (
        True,
        f"armed a test trigger; {'no' if privileged is False else 'maybe no'} CAP_SYS_RESOURCE: "
        "windows must be multiples of 2 s and fire on 2 s boundaries",
        path,
    )


def probe_memcg_threshold(memory_root: str) -> tuple[bool, str, str]:
    """``(supported, reason, path)`` for memcg usage thresholds: the v1 memory hierarchy's
    ``cgroup.event_control`` at ``memory_root`` (absent on cgroup v2)."""
    path = os.path.join(memory_root, "cgroup.event_control")
    if os.path.isfile(path):
        return True, "cgroup v1 memory hierarchy with cgroup.event_control", path
    return (
        False,
        f"{path} absent: cgroup v2, or a kernel without memcg v1 event notification; "
        "use PSI triggers instead",
        path,
    )


# Memcg v1 usage thresholds -----------------------------------------------------------------------


def arm_memcg_threshold(cgroup_dir: str, threshold_bytes: int) -> int:
    """Register a cgroup v1 memory usage threshold; returns the eventfd (non-blocking,
    close-on-exec) that becomes readable at each crossing. Closing it unregisters.

    Raises :class:`InvalidValueError` for a threshold below one byte,
    :class:`UnsupportedError` when the cgroup has no v1 memory interface or the kernel refuses,
    :class:`CgroupGoneError` when the cgroup is gone.
    """
    if threshold_bytes < 1:
        raise InvalidValueError(f"memcg threshold must be at least 1 byte, not {threshold_bytes}")
    usage_path = os.path.join(cgroup_dir, "memory.usage_in_bytes")
    control_path = os.path.join(cgroup_dir, "cgroup.event_control")
    efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    usage = control = -1
    try:
        usage = os.open(usage_path, os.O_RDONLY | os.O_CLOEXEC)
        control = os.open(control_path, os.O_WRONLY | os.O_CLOEXEC)
        os.write(control, f"{efd} {usage} {threshold_bytes}".encode())
    except OSError as err:
        os.close(efd)
        raise _memcg_error(cgroup_dir, usage_path if usage < 0 else control_path, err) from err
    finally:
        # The kernel keeps the eventfd and the cgroup, not the usage file: both may close now.
        for fd in (usage, control):
            if fd >= 0:
                os.close(fd)
    return efd


def _memcg_error(cgroup_dir: str, path: str, err: OSError) -> HostError:
    if is_gone(err, reading=False):
        if not os.path.isdir(cgroup_dir):
            return CgroupGoneError(f"{cgroup_dir}: cgroup gone ({describe(err)})")
        return UnsupportedError(
            path,
            f"{describe(err)}: not a cgroup v1 memory cgroup, or a kernel without memcg v1 "
            "event notification (CONFIG_MEMCG_V1)",
        )
    if err.errno in DENIED_ERRNOS:
        return UnsupportedError(path, f"{describe(err)}: permission denied")
    if err.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF):
        return UnsupportedError(path, f"{describe(err)}: the kernel refused the threshold")
    return HostError(f"{path}: {err.strerror or err}")


def drain_eventfd(fd: int) -> int:
    """Read and reset an eventfd's counter: how many notifications arrived; 0 when none."""
    try:
        return os.eventfd_read(fd)
    except BlockingIOError:
        return 0
