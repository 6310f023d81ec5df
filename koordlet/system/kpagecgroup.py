"""Which memory cgroup owns each page frame: ``/proc/kpagecgroup`` tallied over address ranges.

``/proc/kpagecgroup`` (``Documentation/admin-guide/mm/pagemap.rst``, ``CONFIG_MEMCG`` and
``CONFIG_PROC_PAGE_MONITOR``, root only) holds one native 64-bit word per page frame: the inode
number of the memory cgroup the page is charged to, 0 when none (free pages, most kernel pages,
slab: ``page_cgroup_ino`` skips them). A page of a removed cgroup reads as its nearest online
ancestor. The inode is the cgroup folder's ``st_ino`` in the memory hierarchy (v1) or the unified
one (v2), so a cgroup's *hierarchical* count is the sum over the inodes of its subtree.

:func:`tally` reads the frames of given physical ranges in chunks and counts pages per inode.
Most of an idle node is free memory in large aligned blocks, and used memory comes in runs of one
owner, so a chunk of 512 frames (2 MiB) that is all zero or all one inode is counted with one
comparison; only mixed chunks are counted word by word. The kernel's side (about 50 ns a frame
on this machine) dominates: docs/coldmemory.md has the figures.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from collections.abc import Iterable, Mapping

from koordlet.errors import HostError, UnsupportedError

PAGE_SIZE = 4096
WORD = 8
FAST_RUN = 512
"""Frames compared at once (2 MiB of memory, 4 KiB of the file)."""
CHUNK_FRAMES = 1 << 16
"""Frames read by one ``pread`` (512 KiB of the file, 256 MiB of memory)."""
_ZERO_RUN = bytes(FAST_RUN * WORD)


def kpagecgroup_path(proc_root: str) -> str:
    return os.path.join(proc_root, "kpagecgroup")


def _count_chunk(buf: bytes, counts: Counter[int]) -> None:
    mv = memoryview(buf)
    step = FAST_RUN * WORD
    for off in range(0, len(buf), step):
        run = buf[off : off + step]
        if run == _ZERO_RUN[: len(run)]:
            continue
        first = run[:WORD]
        if run == first * (len(run) // WORD):
            counts[int.from_bytes(first, "little")] += len(run) // WORD
            continue
        counts.update(mv[off : off + len(run)].cast("Q"))


def tally(proc_root: str, ranges: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Pages per memory cgroup inode over the physical byte ranges ``[start, end)`` (inode 0,
    no cgroup, left out). Raises :class:`UnsupportedError` when the file is absent or not
    readable, :class:`HostError` for other read failures."""
    path = kpagecgroup_path(proc_root)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.EACCES, errno.EPERM):
            raise UnsupportedError(
                "kpagecgroup", f"{path}: {err.strerror} (needs root, CONFIG_PROC_PAGE_MONITOR)"
            ) from err
        raise HostError(f"{path}: open failed: {err.strerror}") from err
    counts: Counter[int] = Counter()
    try:
        for start, end in ranges:
            pfn, last = start // PAGE_SIZE, end // PAGE_SIZE
            while pfn < last:
                n = min(last - pfn, CHUNK_FRAMES)
                buf = os.pread(fd, n * WORD, pfn * WORD)
                if not buf:
                    break  # past the last frame
                _count_chunk(buf, counts)
                pfn += len(buf) // WORD
    except OSError as err:
        raise HostError(f"{path}: read failed at frame {pfn}: {err.strerror}") from err
    finally:
        os.close(fd)
    counts.pop(0, None)
    return dict(counts)


def subtree_inodes(cgroup_dir: str) -> set[int]:
    """Inodes of ``cgroup_dir`` and every cgroup below it; empty when it does not exist."""
    found: set[int] = set()
    stack = [cgroup_dir]
    while stack:
        d = stack.pop()
        try:
            found.add(os.stat(d).st_ino)
            with os.scandir(d) as it:
                stack.extend(e.path for e in it if e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            continue
    return found


def pages_of(counts: Mapping[int, int], inodes: Iterable[int]) -> int:
    """Pages charged to any of ``inodes``."""
    return sum(counts.get(i, 0) for i in inodes)
