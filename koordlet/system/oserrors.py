"""``OSError`` → the koordlet's error tree (``koordlet.errors``), in one place.

Every module that touches the host translates an ``OSError`` at its boundary with these
functions and chains the cause (``raise ... from err``), so the errno sets and the wording of the
common cases are decided once:

=====================================  =========================================================
errno                                  meaning for the koordlet
=====================================  =========================================================
``ENOENT``, ``ENODEV``                 the file or its cgroup vanished (``ENODEV``: a read or
                                       write on an open file of a removed cgroup); a normal race
                                       with deletion: :class:`~koordlet.errors.CgroupGoneError`
``ESRCH``                              also gone, on reads: a dead process's ``/proc`` file
``ENOENT`` in an existing folder       a file this kernel lacks (the writer's and the probes'
                                       reading): :class:`~koordlet.errors.UnsupportedError`
``EOPNOTSUPP``/``ENOTSUP``             a feature built in but switched off at boot (PSI,
                                       kidled): :class:`~koordlet.errors.UnsupportedError`
``EACCES``, ``EPERM``                  not permitted (a capability): ``UnsupportedError`` where
                                       the module can say which (PSI triggers, perf)
anything else                          :class:`~koordlet.errors.HostError` with ``strerror``
=====================================  =========================================================

Modules with domain-specific reasons (PSI triggers, memcg thresholds, perf events) build their
messages themselves but classify the errno with :func:`is_gone`, :func:`refused_errno` and name it
with :func:`describe`. Nothing here opens a file.
"""

from __future__ import annotations

import errno
import os

from koordlet.errors import CgroupGoneError, HostError, UnsupportedError

VANISHED_ERRNOS = frozenset({errno.ENOENT, errno.ENODEV})
"""A file or its cgroup was removed (``ENODEV``: I/O on an open file of a removed cgroup)."""
GONE_ERRNOS = VANISHED_ERRNOS | {errno.ESRCH}
"""On reads: :data:`VANISHED_ERRNOS`, or a dead process (``ESRCH`` from its ``/proc`` file)."""
REFUSED_ERRNOS = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP})
"""The kernel has the file but refuses the operation: a feature disabled at boot."""
DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM})
"""Not permitted: a missing capability or privilege (``UnsupportedError`` with the reason)."""


def errno_name(code: int | None) -> str:
    """``ENOENT`` for 2; ``errno 999`` for an unknown number; ``no errno`` for None."""
    if code is None:
        return "no errno"
    if code == errno.EOPNOTSUPP:  # == ENOTSUP on Linux; the kernel's own code says EOPNOTSUPP
        return "EOPNOTSUPP"
    return errno.errorcode.get(code, f"errno {code}")


def describe(err: OSError) -> str:
    """``ENOENT (errno 2)``: the symbolic name and the number, for messages."""
    code = err.errno or 0
    return f"{errno.errorcode.get(code, 'errno')} (errno {code})"


def errno_of(err: BaseException) -> int | None:
    """The errno of ``err`` or of the ``OSError`` it was raised from (follows ``__cause__``)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen.errno
        seen = seen.__cause__
    return None


def is_gone(err: OSError, *, reading: bool = True) -> bool:
    """Whether ``err`` says the file, its cgroup (or, when ``reading``, its process) is gone."""
    return err.errno in (GONE_ERRNOS if reading else VANISHED_ERRNOS)


def refused_errno(err: BaseException) -> int | None:
    """The errno when ``err`` (or the ``OSError`` it was raised from) is ``EOPNOTSUPP``/``ENOTSUP``:
    the kernel has the file but a boot switch disabled the feature (PSI, kidled). None else."""
    code = errno_of(err)
    return code if code in REFUSED_ERRNOS else None


def read_error(path: str, err: OSError) -> HostError:
    """The error for a failed read of kernel file ``path``: :class:`CgroupGoneError` when it or
    its cgroup (or process) vanished, else :class:`HostError` with ``strerror``.

    The collectors' reader returns (not raises) it too, to remember a failure for the tick."""
    if err.errno in GONE_ERRNOS:
        return CgroupGoneError(f"{path}: gone ({os.strerror(err.errno or 0)})")
    return HostError(f"{path}: {err.strerror or err}")


def host_file_error(path: str, err: OSError, doing: str) -> HostError:
    """The error for ``doing`` (``reading``, ``writing '1'``...) on a file that must exist
    (``/proc``, ``/sys``, a resctrl file): :class:`HostError` whatever the errno."""
    return HostError(f"{path}: {doing} failed: {err.strerror}")


def knob_error(path: str, err: OSError, what: str, doing: str) -> HostError:
    """The error for ``doing`` on knob ``what``'s file ``path`` of a cgroup.

    ``ENOENT`` while the folder exists: the kernel lacks the file (:class:`UnsupportedError`);
    ``ENOENT``/``ENODEV`` otherwise: the cgroup was removed (:class:`CgroupGoneError`); anything
    else: :class:`HostError`.
    """
    if err.errno == errno.ENOENT and os.path.isdir(os.path.dirname(path)):
        return UnsupportedError(what, f"file {path} absent")
    if err.errno in VANISHED_ERRNOS:
        return CgroupGoneError(f"{path}: cgroup gone ({doing})")
    return host_file_error(path, err, doing)


def system_file_error(path: str, err: OSError, what: str, requires: str = "") -> HostError:
    """The error for a failed read of node-wide setting ``what`` at ``path`` (a sysctl): absent
    is :class:`UnsupportedError` naming what the kernel needs (``requires``)."""
    if err.errno == errno.ENOENT:
        why = f" ({requires})" if requires else ""
        return UnsupportedError(what, f"{path} absent{why}")
    return host_file_error(path, err, "reading")


def absent_error(path: str, err: OSError, doing: str = "") -> HostError:
    """The error for ``doing`` on ``path`` (a resctrl group's file or folder) where absence means
    the group is not there: ``ENOENT`` is :class:`CgroupGoneError`, the rest :class:`HostError`."""
    if err.errno == errno.ENOENT:
        return CgroupGoneError(f"{path}: absent")
    if doing:
        return host_file_error(path, err, doing)
    return HostError(f"{path}: {err.strerror or err}")
