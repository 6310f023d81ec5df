"""glibc's arena limit, seen in glibc's own report (``malloc_info(3)``) of a fresh process.

Each case runs in a subprocess: the limit is process-wide and must be set before threads start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

GLIBC = (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")

SCRIPT = textwrap.dedent(
    """
    import ctypes, sys, tempfile, threading
    from koordlet.system.malloc import limit_malloc_arenas

    limited = limit_malloc_arenas(1) if sys.argv[1] == "limit" else None
    go = threading.Barrier(4)
    kept = []

    def work():
        go.wait()  # all four allocate while the others are alive
        kept.append([bytearray(4096) for _ in range(64)])  # above pymalloc's 512 bytes

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    libc = ctypes.CDLL(None)
    libc.fdopen.restype = ctypes.c_void_p
    with tempfile.TemporaryFile() as f:
        stream = libc.fdopen(f.fileno(), b"w")
        libc.malloc_info(0, ctypes.c_void_p(stream))
        libc.fflush(ctypes.c_void_p(stream))
        f.seek(0)
        report = f.read().decode()
    print(limited, report.count("<heap nr="))
    """
)


def arenas(mode: str) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True
    )
    limited, heaps = done.stdout.split()
    return limited, int(heaps)


@pytest.mark.skipif(not GLIBC, reason="the arena limit is glibc's")
def test_with_the_limit_every_thread_allocates_from_the_one_main_arena() -> None:
    limited, heaps = arenas("limit")
    assert limited == "True"
    assert heaps == 1

    unlimited, default_heaps = arenas("default")
    assert unlimited == "None"
    assert default_heaps > 1  # glibc's default: a new arena per thread, up to 8 per CPU
