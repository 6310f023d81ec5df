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
