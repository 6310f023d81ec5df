"""Core scheduling cookies: the kernel's ``prctl(PR_SCHED_CORE)`` and the koordlet's cookie groups.

:class:`PrctlCoreSched` talks to the kernel (``Documentation/admin-guide/hw-vuln/core-scheduling
.rst``): ``PR_SCHED_CORE_GET`` reads a thread's cookie, ``PR_SCHED_CORE_CREATE`` gives a thread
group a new one, ``PR_SCHED_CORE_SHARE_FROM`` copies a task's cookie to the calling thread and
``PR_SCHED_CORE_SHARE_TO`` pushes the calling thread's cookie to a thread group. Copying a cookie
from one container to another therefore passes through the calling thread (the executor's writer
thread, which hands its own cookie back to the default afterwards, from the koordlet's main
thread, which never holds one). :func:`probe` tells whether the kernel has it: without
``CONFIG_SCHED_CORE`` every call fails with ``EINVAL``, and that is reported, not worked around.

:class:`CookieManager` keeps upstream's cookie cache (``hooks/coresched/cookie_cache.go``,
``SetContainerCookie``): per group the cookie and the threads known to hold it, per container
its last group. Enabling a container's group assigns the group's cookie to those of its threads
that lack it, copied from a sibling still holding it; without a live sibling (or a cached cookie)
the first thread gets a new cookie and the rest share it. Disabling clears the cookie of a
container the manager gave one (back to 0). Tests drive it with a fake :class:`CoreSchedOps`.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from apis.records import frozen
from koordlet.errors import HostError, UnsupportedError
from koordlet.system import libc

logger = logging.getLogger(__name__)

PR_SCHED_CORE = 62
PR_SCHED_CORE_GET = 0
PR_SCHED_CORE_CREATE = 1
PR_SCHED_CORE_SHARE_TO = 2
PR_SCHED_CORE_SHARE_FROM = 3
"""``include/uapi/linux/prctl.h``."""
PIDTYPE_PID = 0
PIDTYPE_TGID = 1
"""``PR_SCHED_CORE_SCOPE_THREAD`` and ``_THREAD_GROUP``."""
DEFAULT_COOKIE = 0


class CoreSchedOps(Protocol):
    """The kernel's core scheduling, by thread id."""

    def get(self, pid: int) -> int:
        """The thread's cookie (0 the default); ``HostError`` when the thread is gone."""

    def create(self, pid: int) -> None:
        """Give ``pid``'s thread group a new cookie."""

    def assign(self, source: int, pids: Iterable[int]) -> list[int]:
        """Give the thread groups of ``pids`` the cookie of thread ``source``; the pids that
        failed."""

    def clear(self, pids: Iterable[int]) -> list[int]:
        """Give the thread groups of ``pids`` the default cookie; the pids that failed."""


class PrctlCoreSched:
    """:class:`CoreSchedOps` through ``prctl(2)``; call it from one thread (the writer's)."""

    def __init__(self) -> None:
        self._libc = libc.libc()
        self._home = os.getpid()
        """The koordlet's main thread: it never holds a cookie, the writer resets to it."""

    def _prctl(self, cmd: int, pid: int, scope: int, addr: int = 0) -> None:
        ret = self._libc.prctl(
            PR_SCHED_CORE, ctypes.c_ulong(cmd), ctypes.c_ulong(pid), ctypes.c_ulong(scope),
            ctypes.c_ulong(addr),
        )  # fmt: skip
        if ret != 0:
            err = ctypes.get_errno()
            if err == errno.ESRCH:
                raise HostError(f"thread {pid} is gone")
            raise OSError(err, f"prctl(PR_SCHED_CORE, {cmd}, {pid}): {os.strerror(err)}")

    def get(self, pid: int) -> int:
        cookie = ctypes.c_uint64(0)
        self._prctl(PR_SCHED_CORE_GET, pid, PIDTYPE_PID, ctypes.addressof(cookie))
        return int(cookie.value)

    def create(self, pid: int) -> None:
        self._prctl(PR_SCHED_CORE_CREATE, pid, PIDTYPE_TGID)

    def assign(self, source: int, pids: Iterable[int]) -> list[int]:
        self._prctl(PR_SCHED_CORE_SHARE_FROM, source, PIDTYPE_PID)
        try:
            return self._push(pids)
        finally:
            self._prctl(PR_SCHED_CORE_SHARE_FROM, self._home, PIDTYPE_PID)

    def clear(self, pids: Iterable[int]) -> list[int]:
        return self._push(pids)  # the calling thread holds the default cookie

    def _push(self, pids: Iterable[int]) -> list[int]:
        failed = []
        for pid in pids:
            try:
                self._prctl(PR_SCHED_CORE_SHARE_TO, pid, PIDTYPE_TGID)
            except (HostError, OSError):
                failed.append(pid)
        return failed


def probe() -> str:
    """Empty when the kernel has core scheduling; else why not (``prctl``'s error)."""
    try:
        PrctlCoreSched().get(os.getpid())
    except OSError as err:
        if err.errno == errno.EINVAL:
            return (
                "kernel without core scheduling (CONFIG_SCHED_CORE, Linux >= 5.14): "
                f"prctl(PR_SCHED_CORE_GET) failed with EINVAL ({err.strerror})"
            )
        return f"prctl(PR_SCHED_CORE_GET) failed: {err}"
    except HostError as err:
        return str(err)
    return ""


@dataclass(slots=True)
class _Group:
    cookie: int
    pids: set[int] = field(default_factory=set)


@frozen
class CookieResult:
    """What one container's update did."""

    group: str
    cookie: int
    """The group's cookie after it (0: the default)."""
    assigned: int = 0
    """Threads that got the cookie now."""
    created: bool = False
    """A new cookie was made for the group."""
    cleared: int = 0
    """Threads given the default cookie back."""


class CookieManager:
    """The cookie cache over :class:`CoreSchedOps` (module docstring). Not thread-safe: the
    writer thread runs it."""

    def __init__(self, ops: CoreSchedOps) -> None:
        self.ops = ops
        self._groups: dict[str, _Group] = {}
        self._containers: dict[str, str] = {}
        """Container key (pod UID / container id) -> its last group."""

    def groups(self) -> dict[str, tuple[int, int]]:
        """Group -> (cookie, threads known to hold it), for ``/debug``."""
        return {g: (e.cookie, len(e.pids)) for g, e in self._groups.items()}

    def update(self, key: str, group: str, enabled: bool, pids: list[int]) -> CookieResult | None:
        """Bring the threads ``pids`` of container ``key`` to ``group``'s cookie (or the default
        when not ``enabled``); None when there was nothing to do."""
        if not enabled:
            return self._disable(key, pids)
        if not pids:
            return None
        entry = self._groups.get(group)
        if entry is not None:
            done = self._assign(entry, pids)
            if done is not None:
                self._containers[key] = group
                return CookieResult(group, entry.cookie, assigned=done)
            del self._groups[group]  # no sibling holds it any more: a new cookie
        cookie, holders = self._add(pids)
        self._groups[group] = _Group(cookie, set(holders))
        self._containers[key] = group
        return CookieResult(group, cookie, assigned=len(holders), created=True)

    def forget(self, key: str) -> None:
        """A container that is gone."""
        self._containers.pop(key, None)

    def _assign(self, entry: _Group, pids: list[int]) -> int | None:
        todo = []
        for pid in pids:
            try:
                if self.ops.get(pid) != entry.cookie:
                    todo.append(pid)
            except HostError:
                continue
        if not todo:
            entry.pids.update(pids)
            return 0
        source = None
        for sibling in sorted(entry.pids):
            try:
                if self.ops.get(sibling) == entry.cookie:
                    source = sibling
                    break
            except HostError:
                pass
            entry.pids.discard(sibling)
        if source is None:
            return None
        failed = set(self.ops.assign(source, todo))
        entry.pids.update(p for p in pids if p not in failed)
        return len(todo) - len(failed)

    def _add(self, pids: list[int]) -> tuple[int, list[int]]:
        first, rest = pids[0], pids[1:]
        self.ops.create(first)
        cookie = self.ops.get(first)
        if cookie == DEFAULT_COOKIE:
            raise UnsupportedError("core scheduling cookie", f"thread {first} got the default")
        failed = set(self.ops.assign(first, rest)) if rest else set()
        return cookie, [first, *(p for p in rest if p not in failed)]

    def _disable(self, key: str, pids: list[int]) -> CookieResult | None:
        group = self._containers.pop(key, None)
        if group is None:
            return None
        todo = []
        for pid in pids:
            try:
                if self.ops.get(pid) != DEFAULT_COOKIE:
                    todo.append(pid)
            except HostError:
                continue
        failed = set(self.ops.clear(todo)) if todo else set()
        entry = self._groups.get(group)
        if entry is not None:
            entry.pids.difference_update(pids)
            if not entry.pids:
                del self._groups[group]
        return CookieResult(group, DEFAULT_COOKIE, cleared=len(todo) - len(failed))
