"""Folder watches with ``inotify(7)``, through ctypes: which watched folders had a child folder
created, removed or renamed since the last look.

The kubepods walker (``koordlet.statesinformer.kubepods``) uses it to list a folder again only
when the kernel said something changed in it, instead of listing folders every tick just in
case. cgroupfs reports ``mkdir`` and ``rmdir`` of cgroups like any file system (the kubelet,
runc and systemd make cgroups with ``mkdir(2)``); Koordinator's koordlet watches the same
folders for its pod lifecycle events (``pkg/koordlet/pleg``).

Only folder events are kept (``IN_ISDIR``): files appearing in a cgroup folder are the kernel's
own and say nothing about pods. A watched folder removed, or renamed away, is reported gone.
The descriptor is non-blocking, so :meth:`DirWatcher.changes` costs one ``read`` returning
``EAGAIN`` when nothing happened. A queue overflow (``IN_Q_OVERFLOW``: more events than
``fs.inotify.max_queued_events`` between two looks) is reported, so the caller walks everything
again.

Failures: no inotify at all (no libc, ``ENOSYS``), no instance left
(``fs.inotify.max_user_instances``, ``EMFILE``) or no watch left (``fs.inotify.max_user_watches``,
``ENOSPC``) raise :class:`~koordlet.errors.UnsupportedError` with the reason, so the walker
falls back to listing; a folder that vanished before it was watched is None, not an error.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import weakref
from dataclasses import dataclass, field

from koordlet.errors import HostError, UnsupportedError
from koordlet.system import libc

IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

CHILD_EVENTS = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
"""A child appeared or went away (``rename`` within or across watched folders included)."""
_MASK = CHILD_EVENTS | IN_MOVE_SELF | IN_ONLYDIR
_EVENT = struct.Struct("iIII")
"""``struct inotify_event`` without its name: wd, mask, cookie, len."""
_READ_SIZE = 64 * 1024


def _libc() -> ctypes.CDLL | None:
    return libc.libc()


@dataclass
class Changes:
    """What :meth:`DirWatcher.changes` saw since the previous call."""

    changed: set[int] = field(default_factory=set)
    """Watches whose folder had a child folder created, removed or renamed."""
    gone: set[int] = field(default_factory=set)
    """Watches whose folder is no longer at its path: dropped by the kernel (``IN_IGNORED``: the
    folder was removed), or removed here because the folder was renamed away (``IN_MOVE_SELF``;
    cgroup v1 allows renaming a cgroup)."""
    overflow: bool = False
    """Events were lost: the caller must look at everything again."""

    def __bool__(self) -> bool:
        return bool(self.changed or self.gone or self.overflow)


class DirWatcher:
    """One inotify instance watching folders for child folder events; see the module docstring.

    Not thread-safe; one walker uses it. The descriptor is closed by :meth:`close` or when the
    object is collected.
    """

    def __init__(self) -> None:
        lib = _libc()
        if lib is None or not hasattr(lib, "inotify_init1"):
            raise UnsupportedError("inotify", "no C library with inotify_init1")
        self._libc = lib
        fd = lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            reason = (
                "no inotify instance left (fs.inotify.max_user_instances)"
                if err == errno.EMFILE
                else f"inotify_init1: {os.strerror(err)}"
            )
            raise UnsupportedError("inotify", reason)
        self.fd = fd
        self._finalizer = weakref.finalize(self, os.close, fd)

    def add(self, path: str) -> int | None:
        """Watch folder ``path``; its watch descriptor (the same one for a folder watched
        already), or None when the folder is gone. ``UnsupportedError`` when no watch is left,
        ``HostError`` for any other failure."""
        wd = int(self._libc.inotify_add_watch(self.fd, os.fsencode(path), _MASK))
        if wd >= 0:
            return wd
        err = ctypes.get_errno()
        if err in (errno.ENOENT, errno.ENOTDIR):
            return None
        if err == errno.ENOSPC:
            raise UnsupportedError(
                "inotify", f"no inotify watch left for {path} (fs.inotify.max_user_watches)"
            )
        raise HostError(f"inotify_add_watch {path}: {os.strerror(err)}")

    def remove(self, wd: int) -> None:
        """Stop watching; a watch the kernel dropped already is no error."""
        self._libc.inotify_rm_watch(self.fd, wd)

    def changes(self) -> Changes:
        """Drain the queue: the watches with child folder events, those dropped, an overflow."""
        out = Changes()
        while True:
            try:
                data = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                return out
            except OSError as err:
                raise HostError(f"reading inotify events: {err}") from err
            offset, end = 0, len(data)
            while offset + _EVENT.size <= end:
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    out.overflow = True
                elif mask & IN_IGNORED:
                    out.gone.add(wd)
                elif mask & IN_MOVE_SELF:  # what it watched is elsewhere now: stop watching it
                    out.gone.add(wd)
                    self._libc.inotify_rm_watch(self.fd, wd)
                elif mask & IN_ISDIR and mask & CHILD_EVENTS:
                    out.changed.add(wd)

    def close(self) -> None:
        """Close the instance (idempotent); the kernel drops its watches."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive


def probe_inotify(folder: str) -> tuple[bool, str, str]:
    """``(supported, reason, path)`` for watching cgroup folders, for the start-up probe: makes
    an instance, watches ``folder`` (a cgroup root) and closes it."""
    try:
        watcher = DirWatcher()
    except HostError as err:
        return False, f"{err}: the kubepods walker lists the pod folders instead", folder
    try:
        wd = watcher.add(folder)
    except HostError as err:
        return False, f"{err}: the kubepods walker lists the pod folders instead", folder
    finally:
        watcher.close()
    if wd is None:
        return False, f"{folder} absent: not probed", folder
    return True, f"watched {folder}; {_limit('max_user_watches')} watches a user", folder


def _limit(name: str) -> str:
    try:
        with open(f"/proc/sys/fs/inotify/{name}") as f:
            return f"fs.inotify.{name}={f.read().strip()}"
    except OSError:
        return f"fs.inotify.{name} unknown"
