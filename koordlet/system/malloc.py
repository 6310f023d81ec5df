"""The C allocator's arenas: how many glibc may create for the koordlet's threads.

glibc gives each new thread an arena of its own until there are eight per CPU (``mallopt(3)``,
``M_ARENA_MAX``), and an arena keeps what its thread freed for that thread alone. The koordlet
runs about eight threads (the event loop, the collection tick's workers, the cgroup writer, the
audit log) that allocate in turns under the GIL, never at once, so separate arenas buy no
concurrency and each holds its own fragments: at 200 pods, one arena for all of them kept the
resident set about 2 MiB smaller (docs/benchmarks.md). Python's own small-object allocator
(pymalloc) is unaffected; it serves objects up to 512 bytes from its pools whatever the thread.
"""

from __future__ import annotations

import ctypes
import logging
import os

logger = logging.getLogger(__name__)

M_ARENA_MAX = -8
"""``mallopt``'s parameter number for the arena limit (glibc ``malloc.h``)."""


def limit_malloc_arenas(arenas: int) -> bool:
    """Cap glibc's arenas at ``arenas``; True when set. Call it before starting threads (an
    arena already given to a thread stays). Does nothing, and says so at debug level, on a C
    library other than glibc."""
    try:
        libc_version = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc_version = ""
    if not libc_version.startswith("glibc"):
        logger.debug("not glibc (%r): the malloc arena limit is left alone", libc_version)
        return False
    libc = ctypes.CDLL(None)  # the running program's symbols, glibc's mallopt among them
    if libc.mallopt(M_ARENA_MAX, arenas) != 1:
        logger.warning("mallopt(M_ARENA_MAX, %d) failed; glibc keeps its own limit", arenas)
        return False
    return True
