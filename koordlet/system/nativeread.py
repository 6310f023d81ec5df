"""Columns of kept-open cgroup files read and parsed in C: ``_colread.c``, through ctypes.

The collection tick reads the same three files of every pod and container each second
(``cpuacct.usage``, ``cpu.stat``, ``memory.numa_stat``: 2,400 at 200 pods on cgroup v1). In
Python each costs a ``bytes`` object, a release and re-take of the GIL around its ``pread`` and
a parse; in C a whole column is one call, the GIL released once, and only the values come back
(an ``int64`` array). Measured with ``bench.daemon_ab`` at 200 pods: 0.4 % of a core less for
the whole daemon (docs/benchmarks.md, "The ninth session").

The library is built by ``pip install`` where a C compiler is found (``setup.py``; optional).
It reads only what the Python path reads, the same kept descriptors
(:class:`koordlet.system.openfiles.OpenFiles`), and accepts only the kernel's exact layout of
each file: on anything else (a read that fails, a file not in that layout, a value of more than
18 digits) it stops, and the column is read and parsed in Python, which names the failure. The
values it returns are the Python parsers' for the same bytes (``tests/unit/test_nativeread.py``).

:func:`load` finds the library; ``KOORDLET_NATIVE_READS=off`` in the environment keeps it unused
(every column is then read in Python, as on a host where it was not built).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import mul
from typing import Any

from koordlet.system.cgroupstats import PAGE_SIZE, MemoryLru

LIBRARY_FILE = "_colread.so.1"
"""The library's file, beside this module (``setup.py`` names it so: not a module to import)."""
ENV = "KOORDLET_NATIVE_READS"
"""``off`` (or ``0``, ``false``, ``no``) keeps the library unused."""
_OFF = frozenset({"off", "0", "false", "no"})


class NativeFormat:
    """A file layout the library parses: its ``kind`` code in ``_colread.c``, the values it
    writes a file (``width``), and ``decode``, which turns a column's flat values into what the
    Python parser returns for each file."""

    __slots__ = ("decode", "kind", "name", "width")

    def __init__(
        self, name: str, kind: int, width: int, decode: Callable[[list[int]], list[Any]]
    ) -> None:
        self.name = name
        self.kind = kind
        self.width = width
        self.decode = decode

    def __repr__(self) -> str:
        return f"NativeFormat({self.name})"


def _integers(flat: list[int]) -> list[int]:
    return flat


def _pairs(flat: list[int]) -> list[tuple[int, int]]:
    values = iter(flat)
    return list(zip(values, values, strict=True))


_new = tuple.__new__


def _memory_lru(flat: list[int]) -> list[MemoryLru]:
    # per file: hierarchical file, anon, unevictable, in pages
    file = map(mul, flat[0::3], repeat(PAGE_SIZE))
    anon = map(mul, flat[1::3], repeat(PAGE_SIZE))
    unevictable = map(mul, flat[2::3], repeat(PAGE_SIZE))
    return list(map(_new, repeat(MemoryLru), zip(anon, unevictable, file, strict=True)))


INTEGER = NativeFormat("integer", 0, 1, _integers)
"""A file of one decimal integer and a newline (``cpuacct.usage``): ``parse_integer``."""
CPU_THROTTLING_V1 = NativeFormat("cpu_throttling_v1", 1, 2, _pairs)
"""A v1 ``cpu.stat``: ``(nr_periods, nr_throttled)``, as ``parse_cpu_throttling``."""
MEMORY_LRU_V1 = NativeFormat("memory_lru_v1", 2, 3, _memory_lru)
"""A v1 ``memory.numa_stat``: :class:`MemoryLru` in bytes, as ``parse_memory_lru_v1``."""


class Prepared:
    """One column's arguments, built once and reused each tick: its descriptors as a C array,
    the output array, the error slot."""

    __slots__ = ("err", "fds", "n", "out", "width")

    def __init__(self, fds: Sequence[int], width: int) -> None:
        self.fds = (ctypes.c_int * len(fds))(*fds)
        self.n = len(fds)
        self.width = width
        self.out = (ctypes.c_int64 * (len(fds) * width))()
        self.err = ctypes.c_int()


class ColumnFailure(Exception):
    """The library stopped at ``index`` (a read's ``errno``, or 0: not the kernel's layout)."""

    def __init__(self, index: int, errno: int) -> None:
        super().__init__(index, errno)
        self.index = index
        self.errno = errno


class NativeReader:
    """The loaded library."""

    __slots__ = ("_read", "path")

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)  # raises OSError when the file is not a loadable library
        read = lib.koord_read_column
        read.argtypes = (
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_int64),
            ctypes.POINTER(ctypes.c_int),
        )
        read.restype = ctypes.c_int
        self._read = read
        self.path = path

    def read(self, prepared: Prepared, fmt: NativeFormat) -> list[Any]:
        """Every file of the column read and parsed: what ``fmt``'s Python parser returns for
        each. Raises :class:`ColumnFailure` at the first file that was not."""
        if prepared.width != fmt.width:
            raise ValueError(f"{fmt}: prepared for {prepared.width} values a file")
        done = self._read(prepared.fds, prepared.n, fmt.kind, fmt.width, prepared.out, prepared.err)
        if done != prepared.n:
            raise ColumnFailure(done, prepared.err.value)
        return fmt.decode(prepared.out[:])


def library_path() -> str | None:
    """The built library's file, or None when this installation has none."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_FILE)
    return path if os.path.isfile(path) else None


def load() -> tuple[NativeReader | None, str]:
    """The native reader, or None; and a line saying which, and why not."""
    if os.environ.get(ENV, "").strip().lower() in _OFF:
        return None, f"off: {ENV}={os.environ[ENV]}"
    path = library_path()
    if path is None:
        return None, (
            f"off: {LIBRARY_FILE} was not built (no C compiler when the package was installed);"
            " columns are read in Python"
        )
    try:
        reader = NativeReader(path)
    except (OSError, AttributeError) as err:
        return None, f"off: {path} does not load: {err}"
    return reader, f"on: {path}"
