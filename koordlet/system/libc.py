"""The C library the koordlet calls through ctypes, and the machine it runs on.

``ctypes.CDLL(None)`` is the running program's own symbol table (``dlopen(NULL)``), which holds
the C library the interpreter is linked against: the same functions ``ctypes.util.find_library``
would locate, without that module's imports (``tempfile``, ``shutil``, ``random`` and the
compression modules, about 0.9 MiB with ``platform``) or the ``ldconfig`` it runs.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading

PR_SET_NAME = 15
"""``prctl(2)``: name the calling thread."""
THREAD_NAME_MAX = 15
"""Bytes of a thread's name the kernel keeps (``TASK_COMM_LEN`` less the NUL)."""


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library, with ``errno`` saved after each call (``ctypes.get_errno``)."""
    return ctypes.CDLL(None, use_errno=True)


def machine() -> str:
    """The kernel's machine name (``uname -m``): ``x86_64``, ``aarch64``, ``s390x``, ..."""
    return os.uname().machine


def python_version() -> str:
    """The interpreter's version as ``platform.python_version()`` spells it (``3.11.7``)."""
    return sys.version.split()[0]


def python_implementation() -> str:
    """The interpreter's name as ``platform.python_implementation()`` spells it."""
    name = sys.implementation.name
    return {"cpython": "CPython", "pypy": "PyPy", "ironpython": "IronPython"}.get(name, name)


def name_os_thread(name: str | None = None) -> None:
    """Give the calling thread ``name`` (its Python name when None) in the kernel too, as
    ``/proc/<pid>/task/<tid>/comm``: what ``top -H``, ``ps -L`` and ``perf`` show, so a
    node's operator sees which of the koordlet's threads spends the CPU. The kernel keeps
    the first 15 bytes. Best effort: where ``prctl`` is missing or refuses, nothing changes."""
    text = threading.current_thread().name if name is None else name
    raw = text.encode(errors="replace")[:THREAD_NAME_MAX]
    try:
        libc().prctl(PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0)
    except (AttributeError, OSError):  # no prctl in this C library
        return
