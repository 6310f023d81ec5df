"""Emptying a cgroup: the standalone way to evict a workload that has no API object.

Koordinator's koordlet, when it may not use the Kubernetes Eviction API
(``--only-evict-by-api=false``), kills a pod's containers through the runtime; a node agent
without a kubelet (cgroup-discovered pods, host applications) has only the cgroup itself.
:func:`kill_cgroup` empties one cgroup subtree and says how:

- **cgroup v2** with ``cgroup.kill`` (Linux 5.14+): write ``1``; the kernel sends SIGKILL to
  every process of the subtree, new forks included, in one atomic step. Then wait until
  ``cgroup.events`` reads ``populated 0``.
- **cgroup v1**, or v2 without ``cgroup.kill``: rounds of "read every ``cgroup.procs`` of the
  subtree, SIGKILL each pid", until the subtree is empty or the deadline passes. When the v1
  freezer controller holds the cgroup, each round freezes the subtree first
  (``freezer.state`` = ``FROZEN``), so that no process forks or exits between the read and the
  kill, signals, then thaws (a frozen task dies when it is thawed;
  ``Documentation/admin-guide/cgroup-v1/freezer-subsystem.rst``).

Never a process outside the cgroup: each pid is pinned with ``pidfd_open(2)`` first, the
subtree's ``cgroup.procs`` are read again, and only a pinned process whose pid is still listed is
signalled, through its pidfd (``pidfd_send_signal(2)``). A pid that was reused by a process
elsewhere between the two reads is therefore never signalled: the pidfd names the process, not
the number. The koordlet's own pid, pid 1 and kernel threads (which ``cgroup.procs`` never lists
on v2, and which cannot be moved into a v1 cgroup) are never signalled.

Refused outright (:class:`~koordlet.errors.InvalidValueError`): the cgroup root, a path that
leaves the root, and the kubepods root and its QoS folders (``CgroupLayout.qos_dir``): emptying
those would kill every pod of the node.

Synchronous and blocking (it waits for the kernel): run it in a worker thread. Signalling goes
through ``signaller`` so that unit tests on a fake tree never signal real processes.
"""

from __future__ import annotations

import logging
import os
import posixpath
import signal
import time
from collections.abc import Callable, Iterable

from apis.extension import KubeQOS
from apis.records import frozen
from koordlet.errors import CgroupGoneError, InvalidValueError
from koordlet.system.cgroups import CgroupLayout, CgroupVersion
from koordlet.system.oserrors import host_file_error, is_gone

logger = logging.getLogger(__name__)

DEFAULT_DEADLINE = 5.0
"""Seconds :func:`kill_cgroup` keeps trying before it reports the cgroup not empty."""
DEFAULT_ROUND_PAUSE = 0.01
"""Seconds between two rounds (the kernel needs a moment to reap what it killed)."""
FREEZE_WAIT = 0.5
"""Seconds a round waits for ``freezer.state`` to read ``FROZEN`` before it kills unfrozen."""

_PROCS = "cgroup.procs"
_V1_PROCS_CONTROLLERS = ("freezer", "memory", "cpu", "pids", "cpuacct", "cpuset", "blkio")
"""v1 hierarchies in which the subtree's processes are listed, in order of preference."""


@frozen
class KillResult:
    """What :func:`kill_cgroup` did."""

    cgroup: str
    """The cgroup's folder, relative to a controller root."""
    method: str
    """``cgroup.kill`` (v2), ``sigkill+freezer`` (v1 with the freezer) or ``sigkill``."""
    signalled: int
    """Processes signalled (0 with ``cgroup.kill``: the kernel does it)."""
    rounds: int
    """Read-and-kill rounds (1 with ``cgroup.kill``)."""
    emptied: bool
    """True when the subtree held no process at the end."""
    gone: bool = False
    """True when the cgroup had disappeared (its workload already ended)."""
    remaining: tuple[int, ...] = ()
    """Pids still listed at the deadline (empty when emptied)."""


class Signaller:
    """Sends SIGKILL to processes pinned by pidfd; tests inject their own."""

    def pin(self, pid: int) -> int | None:
        """A pidfd for ``pid``, or None when it has already exited."""
        try:
            return os.pidfd_open(pid)
        except ProcessLookupError:
            return None

    def kill(self, pidfd: int) -> bool:
        """SIGKILL the pinned process; False when it had already exited."""
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

    def release(self, pidfd: int) -> None:
        os.close(pidfd)


def _check_target(layout: CgroupLayout, rel_dir: str) -> str:
    rel = posixpath.normpath(rel_dir.strip("/")) if rel_dir.strip("/") else ""
    if not rel or rel == "." or rel.startswith("..") or "\0" in rel:
        raise InvalidValueError(f"refusing to empty cgroup {rel_dir!r}: not below the root")
    protected = {layout.kube_root.strip("/")} | {layout.qos_dir(q).strip("/") for q in KubeQOS}
    if rel in protected:
        raise InvalidValueError(f"refusing to empty cgroup {rel!r}: it holds every pod of a class")
    return rel


def _read_pids(path: str) -> list[int]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        if is_gone(err, reading=False):
            return []
        raise host_file_error(path, err, "reading") from err
    return [int(tok) for tok in data.split() if tok.isdigit()]


def subtree_pids(top: str) -> set[int]:
    """Pids in ``cgroup.procs`` of the cgroup folder ``top`` and every cgroup below it."""
    pids: set[int] = set()
    for folder, _dirs, files in os.walk(top):
        if _PROCS in files:
            pids.update(_read_pids(os.path.join(folder, _PROCS)))
    return pids


def _populated_v2(top: str) -> bool | None:
    """``populated`` of ``cgroup.events`` (subtree-wide); None when the file is absent."""
    try:
        with open(os.path.join(top, "cgroup.events"), "rb") as f:
            for line in f.read().splitlines():
                key, _, value = line.partition(b" ")
                if key == b"populated":
                    return value.strip() != b"0"
    except OSError:
        return None
    return None


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


def _read_text(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read().strip()


def kill_cgroup(
    layout: CgroupLayout,
    rel_dir: str,
    *,
    deadline: float = DEFAULT_DEADLINE,
    pause: float = DEFAULT_ROUND_PAUSE,
    use_freezer: bool = True,
    signaller: Signaller | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> KillResult:
    """Empty the cgroup ``rel_dir`` (relative to a controller root) and its descendants.

    See the module docstring. Raises :class:`InvalidValueError` for a protected target and
    :class:`HostError` when the host refuses (``cgroup.kill`` not writable, a file unreadable);
    a cgroup that does not exist is reported ``gone`` (already ended), not an error.
    """
    rel = _check_target(layout, rel_dir)
    sig = signaller or Signaller()
    end = clock() + deadline
    if layout.version is CgroupVersion.V2:
        top = layout.abs_dir("cpu", rel)
        if not os.path.isdir(top):
            return KillResult(rel, "cgroup.kill", 0, 0, True, gone=True)
        kill_file = os.path.join(top, "cgroup.kill")
        if os.path.exists(kill_file):
            return _kill_v2(rel, top, kill_file, end, pause, clock, sleep)
        return _kill_rounds(rel, [top], None, sig, end, pause, clock, sleep)
    tops = [layout.abs_dir(c, rel) for c in _V1_PROCS_CONTROLLERS]
    tops = [t for t in tops if os.path.isdir(t)]
    if not tops:
        return KillResult(rel, "sigkill", 0, 0, True, gone=True)
    freezer = layout.abs_dir("freezer", rel)
    state = os.path.join(freezer, "freezer.state")
    use = use_freezer and os.path.exists(state)
    return _kill_rounds(rel, tops[:1], state if use else None, sig, end, pause, clock, sleep)


def _kill_v2(
    rel: str,
    top: str,
    kill_file: str,
    end: float,
    pause: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> KillResult:
    try:
        _write(kill_file, "1")
    except OSError as err:
        if is_gone(err, reading=False):
            return KillResult(rel, "cgroup.kill", 0, 1, True, gone=True)
        raise host_file_error(kill_file, err, "writing 1") from err
    while True:
        populated = _populated_v2(top)
        if populated is None:  # no cgroup.events (a fake tree, or the cgroup went away)
            remaining = subtree_pids(top)
            populated = bool(remaining)
        if not populated:
            return KillResult(rel, "cgroup.kill", 0, 1, True)
        if clock() >= end:
            left = tuple(sorted(subtree_pids(top)))
            return KillResult(rel, "cgroup.kill", 0, 1, False, remaining=left)
        sleep(pause)


def _freeze(state: str, clock: Callable[[], float], sleep: Callable[[float], None]) -> bool:
    """Freeze; True once ``freezer.state`` reads FROZEN (within :data:`FREEZE_WAIT`)."""
    try:
        _write(state, "FROZEN")
        stop = clock() + FREEZE_WAIT
        while _read_text(state) != "FROZEN":
            if clock() >= stop:
                return False
            sleep(0.001)
    except OSError as err:
        if is_gone(err, reading=False):
            raise CgroupGoneError(f"{state}: cgroup gone") from err
        raise host_file_error(state, err, "freezing") from err
    return True


def _thaw(state: str) -> None:
    try:
        _write(state, "THAWED")
    except OSError as err:
        if not is_gone(err, reading=False):
            logger.exception("%s: thawing failed; the cgroup stays frozen", state)


def _kill_rounds(
    rel: str,
    tops: list[str],
    freezer_state: str | None,
    sig: Signaller,
    end: float,
    pause: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> KillResult:
    method = "sigkill+freezer" if freezer_state else "sigkill"
    me = os.getpid()
    signalled = 0
    rounds = 0

    def listed() -> set[int]:
        out: set[int] = set()
        for top in tops:
            out |= subtree_pids(top)
        out.discard(me)
        out.discard(1)
        return out

    while True:
        pids = listed()
        if not pids:
            return KillResult(rel, method, signalled, rounds, True)
        if rounds and clock() >= end:
            return KillResult(rel, method, signalled, rounds, False, remaining=tuple(sorted(pids)))
        rounds += 1
        frozen = False
        try:
            if freezer_state is not None:
                try:
                    frozen = _freeze(freezer_state, clock, sleep)
                except CgroupGoneError:
                    return KillResult(rel, method, signalled, rounds, True, gone=True)
                if frozen:
                    pids = listed()  # stable now: nothing forks or exits while frozen
            signalled += _signal_members(pids, listed, sig)
        finally:
            if freezer_state is not None:
                _thaw(freezer_state)
        sleep(pause)


def _signal_members(pids: Iterable[int], listed: Callable[[], set[int]], sig: Signaller) -> int:
    """Pin each pid, re-read membership, SIGKILL the pinned ones still listed."""
    pinned: dict[int, int] = {}
    try:
        for pid in pids:
            fd = sig.pin(pid)
            if fd is not None:
                pinned[pid] = fd
        if not pinned:
            return 0
        members = listed()
        count = 0
        for pid, fd in pinned.items():
            if pid in members and sig.kill(fd):
                count += 1
        return count
    finally:
        for fd in pinned.values():
            sig.release(fd)
