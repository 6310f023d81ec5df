"""A real small file system for the state directory: a tmpfs the test mounts, fills, frees and
remounts read-only, always unmounted at the end (``mount -t tmpfs -o size=64k``).

Root only (``mount(2)``); a test using :func:`small_tmpfs` is skipped elsewhere. The mount point
is a unique folder under the test's ``tmp_path``; nothing outside it is touched.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

FILLER = "filler"
"""The file :func:`fill` grows until the file system is full."""


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "64k") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``where`` (created) for the ``with`` block; unmounted
    (lazily if busy) whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir(parents=True, exist_ok=True)
    try:
        _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where))
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"cannot mount a tmpfs here: {err}")
    try:
        yield where
    finally:
        try:
            _run("umount", str(where))
        except subprocess.CalledProcessError:
            _run("umount", "-l", str(where))


def fill(mount: Path) -> int:
    """Write :data:`FILLER` until the file system refuses (``ENOSPC``); bytes written."""
    written = 0
    chunk = b"\0" * 4096
    fd = os.open(mount / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            try:
                n = os.write(fd, chunk)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                break
            if n == 0:
                break
            written += n
    finally:
        os.close(fd)
    return written


def free(mount: Path) -> None:
    """Remove what :func:`fill` wrote."""
    for path in mount.glob(f"{FILLER}*"):
        path.unlink()


def remount(mount: Path, *, read_only: bool) -> None:
    """Remount ``mount`` read-only or read-write in place."""
    _run("mount", "-o", f"remount,{'ro' if read_only else 'rw'}", str(mount))


__all__ = ["fill", "free", "remount", "small_tmpfs"]
