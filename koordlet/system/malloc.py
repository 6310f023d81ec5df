"""The C allocator: how many arenas glibc may create for the koordlet's threads, and giving its
free pages back.

glibc gives each new thread an arena of its own until there are eight per CPU (``mallopt(3)``,
``M_ARENA_MAX``), and an arena keeps what its thread freed for that thread alone. The koordlet
runs about eight threads (the event loop, the collection tick's workers, the cgroup writer, the
audit log) that allocate in turns under the GIL, never at once, so separate arenas buy no
concurrency and each holds its own fragments: at 200 pods, one arena for all of them kept the
resident set about 2 MiB smaller (docs/benchmarks.md). Python's own small-object allocator
(pymalloc) is unaffected; it serves objects up to 512 bytes from its pools whatever the thread.

glibc keeps what a program frees for its next allocations, returning to the kernel only a free
top of its heap past ``M_TRIM_THRESHOLD``; a burst (a start-up, an API server's list, a NodeMetric
report) leaves free pages inside the heap that stay resident. ``malloc_trim(0)`` gives every
free page back (``madvise(MADV_DONTNEED)``); the daemon calls it once ready and then every
:data:`TRIM_INTERVAL` seconds: 0.8 MiB less resident standalone, 1.2 MiB in cluster mode, at
200 pods (docs/benchmarks.md, issue 26).
"""

from __future__ import annotations

import ctypes
import logging
import os

logger = logging.getLogger(__name__)

M_ARENA_MAX = -8
"""``mallopt``'s parameter number for the arena limit (glibc ``malloc.h``)."""
TRIM_INTERVAL = 60.0
"""Seconds between two :func:`trim_malloc` calls of the daemon (each walks the heap once: well
under a millisecond at 200 pods)."""


def _glibc() -> ctypes.CDLL | None:
    try:
        libc_version = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc_version = ""
    if not libc_version.startswith("glibc"):
        logger.debug("not glibc (%r): the C allocator is left alone", libc_version)
        return None
    return ctypes.CDLL(None)  # the running program's symbols, glibc's among them


def trim_malloc() -> bool:
    """Give the C allocator's free pages back to the kernel (``malloc_trim(0)``); whether some
    were. Does nothing on a C library other than glibc."""
    libc = _glibc()
    return libc is not None and libc.malloc_trim(0) == 1


def limit_malloc_arenas(arenas: int) -> bool:
    """Cap glibc's arenas at ``arenas``; True when set. Call it before starting threads (an
    arena already given to a thread stays). Does nothing, and says so at debug level, on a C
    library other than glibc."""
    libc = _glibc()
    if libc is None:
        return False
    if libc.mallopt(M_ARENA_MAX, arenas) != 1:
        logger.warning("mallopt(M_ARENA_MAX, %d) failed; glibc keeps its own limit", arenas)
        return False
    return True
