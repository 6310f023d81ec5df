"""Whole files the koordlet owns in another daemon's folder (Terway's terway-qos configuration,
``apis.terway``): written atomically and only when their bytes change, removed, audited, dry-run
and recorded for ``koordlet reset``, as the cgroup writer does for a knob.

:meth:`OwnedFileWriter.write`:

1. reads the file; the same bytes: nothing is done (``changed=False``);
2. dry run (``is_dry_run(strategy)``): nothing is written; the would-be change goes to
   ``on_change`` with ``dry_run=True``, once per :data:`DRY_RUN_REPEAT` for the same content;
3. otherwise the folder is created when missing (``0755``, as upstream's ``os.MkdirAll``), the
   file is handed to ``record_original`` before its first change (kind ``owned_file``: ``koordlet
   reset`` removes it, :mod:`koordlet.executor.restore`), the content goes to a temporary file in
   the same folder (``.<name>.koordlet-tmp``), is flushed to disk, and replaces the file in one
   ``rename``: a reader (terway-qos watches the folder with inotify and reads on each event) sees
   the old file or the new one, never half of one.

:meth:`OwnedFileWriter.remove` unlinks the file (absent: nothing), audited and dry-run the same
way. An ``OSError`` becomes :class:`~koordlet.errors.HostError` naming the path. In the audit
entry, a content longer than :data:`AUDIT_TEXT_MAX` characters is summarized by its size and
hash. Call on the executor's writer thread (:func:`~koordlet.executor.sysctl.call_on_writer`).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import time
from collections.abc import Callable

from koordlet.executor.originals import Kind, Original, Recorder
from koordlet.executor.sysctl import notify, record
from koordlet.executor.writer import WriteResult
from koordlet.system.oserrors import host_file_error

logger = logging.getLogger(__name__)

KIND: Kind = "owned_file"
"""The originals journal's kind for these files."""
TMP_SUFFIX = ".koordlet-tmp"
"""The temporary file is ``.<name>`` plus this, in the file's folder (never a name terway-qos
reads)."""
AUDIT_TEXT_MAX = 1024
"""Longer contents are audited as ``<N bytes, sha256 …>``."""
DRY_RUN_REPEAT = 60.0
"""Seconds before the same dry-run decision on a file is audited again."""
ABSENT = "(absent)"
"""The audit's ``old`` of a file that did not exist, and ``new`` of one removed."""


def audit_text(content: str | None) -> str:
    """``content`` as the audit log shows it (see the module docstring)."""
    if content is None:
        return ABSENT
    if len(content) <= AUDIT_TEXT_MAX:
        return content
    digest = hashlib.sha256(content.encode()).hexdigest()[:16]
    return f"<{len(content.encode())} bytes, sha256 {digest}>"


def read_text(path: str) -> str | None:
    """The file's text; None when it does not exist. ``HostError`` for any other failure."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise host_file_error(path, err, "reading") from err


class OwnedFileWriter:
    """Writes and removes owned files; see the module docstring."""

    def __init__(
        self,
        *,
        on_change: Callable[[WriteResult], None] | None = None,
        is_dry_run: Callable[[str], bool] | None = None,
        record_original: Recorder | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.on_change = on_change
        """The audit hook (the cgroup writer's)."""
        self.is_dry_run = is_dry_run or (lambda strategy: False)
        """Whether a strategy's changes are only computed and audited."""
        self.record_original = record_original
        """The originals journal's hook, told before a file first changes."""
        self._clock = clock
        self._last_dry: dict[str, tuple[str, float]] = {}

    def write(
        self, path: str, content: str, *, knob: str, strategy: str, reason: str
    ) -> WriteResult:
        """Make ``path`` hold exactly ``content``; ``knob`` names it in the audit and the
        journal (``TerwayQoS:pod.json``)."""
        current = read_text(path)
        if current == content:
            return WriteResult(path, audit_text(current), audit_text(content), False, knob,
                               strategy, reason)  # fmt: skip
        result = WriteResult(path, audit_text(current), audit_text(content), True, knob, strategy,
                             reason)  # fmt: skip
        if self.is_dry_run(strategy):
            return self._dry(result, content)
        folder = os.path.dirname(path)
        try:
            os.makedirs(folder, mode=0o755, exist_ok=True)
        except OSError as err:
            raise host_file_error(folder, err, "creating the folder") from err
        record(self.record_original, Original(KIND, path, knob, ""))
        tmp = os.path.join(folder, "." + os.path.basename(path) + TMP_SUFFIX)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, content.encode("utf-8", "surrogateescape"))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as err:
            _unlink_quietly(tmp)
            raise host_file_error(path, err, "writing") from err
        logger.info("wrote %s (%d bytes; %s)", path, len(content), reason or strategy)
        notify(self.on_change, result)
        return result

    def remove(self, path: str, *, knob: str, strategy: str, reason: str) -> WriteResult | None:
        """Remove ``path``; None when it does not exist."""
        current = read_text(path)
        if current is None:
            return None
        result = WriteResult(path, audit_text(current), ABSENT, True, knob, strategy, reason)
        if self.is_dry_run(strategy):
            return self._dry(result, None)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise host_file_error(path, err, "removing") from err
        logger.info("removed %s (%s)", path, reason or strategy)
        notify(self.on_change, result)
        return result

    def _dry(self, result: WriteResult, content: str | None) -> WriteResult:
        dry = WriteResult(result.path, result.old, result.new, False, result.knob,
                          result.strategy, result.reason, True)  # fmt: skip
        key = ABSENT if content is None else hashlib.sha256(content.encode()).hexdigest()
        now = self._clock()
        last = self._last_dry.get(result.path)
        if last is None or last[0] != key or now - last[1] >= DRY_RUN_REPEAT:
            self._last_dry[result.path] = (key, now)
            logger.info("dry run: would %s %s (%s)", "remove" if content is None else "write",
                        result.path, result.reason)  # fmt: skip
            notify(self.on_change, dry)
        return dry


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as err:
        if err.errno != errno.ENOENT:
            logger.warning("cannot remove %s: %s", path, err.strerror)


__all__ = ["KIND", "OwnedFileWriter", "audit_text", "read_text"]
