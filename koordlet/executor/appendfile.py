"""A file of whole lines, appended so that a failed write leaves no half line behind.

The originals journal (:mod:`koordlet.executor.originals`) and the audit log
(:mod:`koordlet.executor.audit`) are JSON-lines files in the state directory; a full disk
(``ENOSPC``) or a quota can cut a ``write(2)`` after some of its bytes. A half line left at the
end of the file would have the next record glued to it, and both would be lost to the reader.
:class:`LineFile` keeps them apart:

- each :meth:`LineFile.append` is one ``write(2)`` loop of whole lines on a descriptor opened
  with ``O_APPEND``; when it fails, the file is cut back to the size it had before (``ftruncate``,
  which a full file system allows), and the error is raised to the caller, who keeps the lines
  to write them again;
- before writing, a tail that does not end in a newline (a torn line: the cut back failed too,
  a crash mid-write, or a file left so by an older koordlet) is cut off (:attr:`repaired`
  counts them), so a line is never glued to one;
- :meth:`LineFile.repair` does the same without writing (the loader calls it).

No ``fsync``: what the files record is lost with the kernel state it describes on a power loss.
Synchronous, for one thread at a time (the caller's lock or thread); ``OSError`` goes to the
caller.
"""

from __future__ import annotations

import os

SCAN_BLOCK = 4096
"""Bytes read at a time, from the end, to find the last complete line."""


class LineFile:
    """Appends whole lines to ``path``; see the module docstring."""

    def __init__(self, path: str, *, mode: int = 0o640) -> None:
        self.path = path
        """The file."""
        self.mode = mode
        """Permissions of a file this creates."""
        self.size: int | None = None
        """Bytes of whole lines in the file after the last successful append or repair; None
        when not known (before the first, or after a cut back that failed)."""
        self.repaired = 0
        """Torn tails cut off."""

    def append(self, data: bytes, *, first: bytes = b"") -> int:
        """Append ``data`` (whole lines, ending in a newline); the file's size after it.
        ``first`` (a header line) goes before it when the file holds no whole line yet.

        Raises the ``OSError`` of the open or the write, the file cut back to its size before
        (as far as the kernel lets it)."""
        if data and not data.endswith(b"\n"):
            raise ValueError("LineFile.append takes whole lines")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, self.mode)
        try:
            good = self._cut_torn_tail(fd)
            if good == 0 and first:
                data = first + data
            view = memoryview(data)
            try:
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
            except OSError:
                try:
                    os.ftruncate(fd, good)
                except OSError:
                    self.size = None  # a torn tail may remain: cut at the next append
                raise
            self.size = good + len(data)
            return self.size
        finally:
            os.close(fd)

    def repair(self) -> bool:
        """Cut a torn tail off the file, if it has one; True when one was cut. A missing file
        is nothing to repair; other ``OSError`` goes to the caller."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            self.size = 0
            return False
        try:
            before = self.repaired
            self._cut_torn_tail(fd, rescan=True)
            return self.repaired > before
        finally:
            os.close(fd)

    def forget_size(self) -> None:
        """The file was replaced (a rename over it): scan it again before the next append."""
        self.size = None

    def _cut_torn_tail(self, fd: int, *, rescan: bool = False) -> int:
        end = os.fstat(fd).st_size
        good = self.size
        if rescan or good is None or good > end:
            good = _last_line_end(fd, end)
        if good != end:
            os.ftruncate(fd, good)
            self.repaired += 1
        self.size = good
        return good


def _last_line_end(fd: int, end: int) -> int:
    """The offset just after the last newline of the first ``end`` bytes (0 when none)."""
    pos = end
    while pos > 0:
        start = max(pos - SCAN_BLOCK, 0)
        block = os.pread(fd, pos - start, start)
        newline = block.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        pos = start
    return 0


__all__ = ["LineFile"]
