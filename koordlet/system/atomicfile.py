"""Replacing a file whole: a reader sees the old content or the new, never a part.

The data goes to a new file beside the target (``O_EXCL``; mode 0600 by default, as
``tempfile.mkstemp`` makes it), is flushed to the disk, and is renamed over the target. The
temporary name is this process's id and a counter, so the daemon does without ``tempfile``
(which brings ``shutil``, ``bz2`` and ``lzma``: 0.3 MiB resident for a name); a name left by a
process that died is skipped, not reused.
"""

from __future__ import annotations

import contextlib
import itertools
import os

_counter = itertools.count()


def write_atomic(path: str, data: bytes, *, prefix: str = ".tmp-", mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` (``prefix`` starts the temporary file's name; ``mode``, less
    the umask, is the new file's). Raises ``OSError`` of the step that failed; the temporary file
    is removed then."""
    folder = os.path.dirname(path) or "."
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    while True:
        tmp = os.path.join(folder, f"{prefix}{os.getpid()}-{next(_counter)}.tmp")
        try:
            fd = os.open(tmp, flags, mode)
        except FileExistsError:
            continue
        break
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
