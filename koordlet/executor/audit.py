"""The audit log: every change the koordlet makes to the host, and every decision it only logged.

One :class:`AuditLog` per daemon records three kinds of entry (:data:`KINDS`):

- ``write``: a cgroup file the executor changed (``WriteResult.changed``), with the old and
  the new text, the knob, the strategy that asked and its reason;
- ``evict``: a workload the evictor evicted or killed (``path`` is its cgroup, ``old`` the pod or
  application name), with the strategy and the reason;
- ``decision``: what a dry-run would have done (a write that would change a file, an eviction
  that would happen), or any other decision a strategy wants on record; ``dry_run`` is true.

Entries go to an in-memory ring of the most recent ones (``/debug/audit``) and, off the event
loop, to ``<dir>/audit.jsonl`` as JSON lines. The file rotates by size
(``audit.jsonl`` → ``audit.jsonl.1`` → ... → ``audit.jsonl.<backups>``, the oldest dropped),
so the log never holds more than ``max_bytes * (backups + 1)`` bytes on disk. A dedicated thread
(``audit-log``) does the file I/O; :meth:`AuditLog.record` only appends to the ring and hands the
entry to a bounded queue, so it never blocks and never raises into its caller (the writer
thread, a strategy on the event loop).

Nothing is lost that can be kept: lines are appended whole
(:class:`~koordlet.executor.appendfile.LineFile`: a failed write is cut back, a torn tail cut
off, never glued to); lines the disk refuses (``ENOSPC``, a read-only directory) are held, up to
:data:`HELD_MAX`, and written again every :data:`RETRY_INTERVAL` seconds (not only when a new
entry comes) until the disk takes them. The counters tell the truth: ``recorded`` entries
recorded; ``written`` lines the file took (counted after the write returned); ``dropped``
entries that will never reach the file (the queue full, the held lines beyond
:data:`HELD_MAX`, lines still held at close, entries recorded outside ``start``/``close``);
``errors`` failed attempts (one per attempt, however many lines it carried); ``pending``
lines held now. A failure is logged once per distinct error, and once when the file takes
lines again (with the count of failed attempts).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any, Final, Literal

from apis.records import frozen
from koordlet.executor.appendfile import LineFile
from koordlet.system.libc import name_os_thread

if TYPE_CHECKING:
    from koordlet.config import KoordletConfig
    from koordlet.executor.writer import WriteResult

logger = logging.getLogger(__name__)

AuditKind = Literal["write", "evict", "decision"]
KINDS: Final = ("write", "evict", "decision")
"""The kinds of entry."""
FILE_NAME: Final = "audit.jsonl"
"""The current file in the audit directory; rotated copies get ``.1``, ``.2``..."""
DEFAULT_MAX_BYTES: Final = 4 * 1024 * 1024
"""Bytes per file before it rotates."""
DEFAULT_BACKUPS: Final = 3
"""Rotated files kept besides the current one: 4 files of 4 MiB are Koordinator's
``--audit-max-disk-space-mb`` default of 16."""
DEFAULT_RING: Final = 1024
"""Recent entries kept in memory for ``/debug/audit``."""
QUEUE_SIZE: Final = 10_000
"""Entries waiting for the file thread before new ones skip the file."""
HELD_MAX: Final = 10_000
"""Lines the disk refused that are kept for the next attempt; beyond, the oldest are dropped
(about 3 MiB at most)."""
RETRY_INTERVAL: Final = 1.0
"""Seconds between two attempts to write held lines."""


@frozen
class AuditEntry:
    """One audited change or decision."""

    ts: float
    """Wall-clock seconds since the epoch."""
    kind: AuditKind
    """``write``, ``evict`` or ``decision``."""
    strategy: str = ""
    """The QoS strategy (table name) that asked; empty for the framework itself."""
    reason: str = ""
    """Why, with the inputs (``node cpu 82% > 65%``)."""
    path: str = ""
    """The file written or the cgroup evicted."""
    knob: str = ""
    """The logical knob name (writes)."""
    old: str = ""
    """The value before (the file's text; for an eviction the workload's name)."""
    new: str = ""
    """The value after, or that a dry run would have written."""
    dry_run: bool = False
    """True when nothing was done: the entry records what would have been."""
    detail: Mapping[str, Any] = field(default_factory=dict)
    """Anything else worth keeping (victim priority, memory used...); JSON-ready values."""

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of one line of the file (and of ``/debug/audit``)."""
        out: dict[str, Any] = {
            "ts": round(self.ts, 6),
            "kind": self.kind,
            "strategy": self.strategy,
            "reason": self.reason,
            "path": self.path,
            "knob": self.knob,
            "old": self.old,
            "new": self.new,
            "dry_run": self.dry_run,
        }
        if self.detail:
            out["detail"] = dict(self.detail)
        return out


class AuditLog:
    """The ring of recent entries and the rotated JSON-lines file.

    :param directory: where ``audit.jsonl`` lives (created when missing); None keeps the ring
        only (tests, or a directory that cannot be created).
    :param max_bytes: size at which the current file rotates.
    :param backups: rotated files kept.
    :param ring: entries kept in memory.
    :param clock: wall-clock seconds for the entries' ``ts``.
    """

    def __init__(
        self,
        directory: str | None,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = DEFAULT_BACKUPS,
        ring: int = DEFAULT_RING,
        clock: Callable[[], float] = time.time,
        retry_interval: float = RETRY_INTERVAL,
    ) -> None:
        if max_bytes < 1024:
            raise ValueError(f"max_bytes must be at least 1024, got {max_bytes}")
        if backups < 0:
            raise ValueError(f"backups must not be negative, got {backups}")
        self.directory = directory
        self.max_bytes = max_bytes
        self.backups = backups
        self._clock = clock
        self._ring: deque[AuditEntry] = deque(maxlen=ring)
        self._ring_lock = threading.Lock()
        self._queue: queue.Queue[AuditEntry | None] = queue.Queue(QUEUE_SIZE)
        self._thread: threading.Thread | None = None
        self.retry_interval = retry_interval
        """Seconds between attempts to write held lines."""
        self._line_file: LineFile | None = (
            None if directory is None else LineFile(os.path.join(directory, FILE_NAME))
        )
        self._held: deque[bytes] = deque()
        self._failing = 0
        self.recorded = 0
        """Entries recorded since start."""
        self.written = 0
        """Lines the file took (counted once the write returned)."""
        self.dropped = 0
        """Entries that will never reach the file (see the module docstring)."""
        self.errors = 0
        """Failed attempts to write the file (one per attempt)."""
        self.last_error = ""
        """What the last failed attempt said; empty once the file took every held line."""

    @property
    def path(self) -> str | None:
        """The current file, or None without a directory."""
        return None if self.directory is None else os.path.join(self.directory, FILE_NAME)

    # Lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the file thread (idempotent; nothing to start without a directory)."""
        if self.directory is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="audit-log", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 2.0) -> None:
        """Write what is queued (within ``timeout`` seconds), close the file, stop the thread."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            logger.warning("audit log: queue full at close; pending entries are lost")
        thread.join(timeout)
        if thread.is_alive():
            logger.warning("audit log: file thread did not finish within %.1fs", timeout)

    # Recording ---------------------------------------------------------------------------------

    def record(
        self,
        kind: AuditKind,
        *,
        strategy: str = "",
        reason: str = "",
        path: str = "",
        knob: str = "",
        old: str = "",
        new: str = "",
        dry_run: bool = False,
        detail: Mapping[str, Any] | None = None,
    ) -> AuditEntry:
        """Record one entry: in the ring now, in the file soon. Never blocks, never raises
        (an unknown ``kind`` is the one programming error it refuses)."""
        if kind not in KINDS:
            raise ValueError(f"audit kind must be one of {KINDS}, got {kind!r}")
        entry = AuditEntry(
            self._clock(), kind, strategy, reason, path, knob, old, new, dry_run, detail or {}
        )
        self.add(entry)
        return entry

    def add(self, entry: AuditEntry) -> None:
        """Record a ready-made entry (see :meth:`record`)."""
        with self._ring_lock:
            self._ring.append(entry)
            self.recorded += 1
        if self._thread is None:
            if self.directory is not None:
                self.dropped += 1
            return
        try:
            self._queue.put_nowait(entry)
        except queue.Full:
            self.dropped += 1

    def on_write(self, result: WriteResult) -> None:
        """The executor's ``on_change`` hook: a changed file, or a dry run's would-be change."""
        self.record(
            "decision" if result.dry_run else "write",
            strategy=result.strategy,
            reason=result.reason,
            path=result.path,
            knob=result.knob,
            old=result.old,
            new=result.new.strip(),
            dry_run=result.dry_run,
        )

    # Reading -----------------------------------------------------------------------------------

    def recent(
        self,
        limit: int = 100,
        *,
        strategy: str | None = None,
        kind: str | None = None,
    ) -> list[AuditEntry]:
        """Up to ``limit`` of the most recent entries, newest first, filtered by strategy and
        kind when given."""
        with self._ring_lock:
            entries = list(self._ring)
        out: list[AuditEntry] = []
        for entry in reversed(entries):
            if len(out) >= limit:
                break
            if strategy is not None and entry.strategy != strategy:
                continue
            if kind is not None and entry.kind != kind:
                continue
            out.append(entry)
        return out

    def stats(self) -> dict[str, Any]:
        """Counters and where the file is, for ``/debug/audit``."""
        return {
            "file": self.path,
            "max_bytes": self.max_bytes,
            "backups": self.backups,
            "recorded": self.recorded,
            "written": self.written,
            "dropped": self.dropped,
            "errors": self.errors,
            "pending": len(self._held),
            "last_error": self.last_error,
            "in_memory": len(self._ring),
        }

    @property
    def pending(self) -> int:
        """Lines held because the disk refused them."""
        return len(self._held)

    # The file thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        name_os_thread()
        try:
            while True:
                timeout = self.retry_interval if self._held else None
                try:
                    entry = self._queue.get(timeout=timeout)
                except queue.Empty:
                    self._write_held()
                    continue
                stop = entry is None
                if entry is not None:
                    self._hold(entry)
                taken = 1
                while not stop and taken < 512:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    taken += 1
                    if more is None:
                        stop = True
                    else:
                        self._hold(more)
                self._write_held()
                if stop:
                    return
        finally:
            if self._held:
                self.dropped += len(self._held)
                logger.warning(
                    "audit log %s: %d entries the disk refused are lost at close",
                    self.path,
                    len(self._held),
                )
                self._held.clear()

    def _hold(self, entry: AuditEntry) -> None:
        if len(self._held) >= HELD_MAX:
            self._held.popleft()
            self.dropped += 1
        line = json.dumps(entry.as_dict(), default=str, ensure_ascii=False) + "\n"
        self._held.append(line.encode())

    def _write_held(self) -> None:
        """Append the held lines, rotating where the current file would overflow; on a failure
        the lines not written stay held."""
        lf = self._line_file
        assert lf is not None  # the thread runs only with a directory
        while self._held:
            try:
                size = self._current_size(lf)
                if size > 0 and size + len(self._held[0]) > self.max_bytes:
                    self._rotate(lf.path)
                    lf.forget_size()
                    size = 0
                chunk: list[bytes] = []
                total = 0
                for line in self._held:
                    if chunk and size + total + len(line) > self.max_bytes:
                        break
                    chunk.append(line)
                    total += len(line)
                lf.append(b"".join(chunk))
            except OSError as err:
                self._failed(err)
                return
            for _ in chunk:
                self._held.popleft()
            self.written += len(chunk)
        if self._failing:
            logger.info(
                "audit log %s: written again after %d failed attempts", self.path, self._failing
            )
            self._failing = 0
        self.last_error = ""

    def _current_size(self, lf: LineFile) -> int:
        if lf.size is not None:
            return lf.size
        os.makedirs(os.path.dirname(lf.path), mode=0o750, exist_ok=True)
        try:
            return os.path.getsize(lf.path)
        except FileNotFoundError:
            return 0

    def _rotate(self, path: str) -> None:
        if self.backups == 0:
            os.replace(path, path + ".old")
            os.unlink(path + ".old")
            return
        for n in range(self.backups - 1, 0, -1):
            older = f"{path}.{n}"
            if os.path.exists(older):
                os.replace(older, f"{path}.{n + 1}")
        os.replace(path, f"{path}.1")

    def _failed(self, err: OSError) -> None:
        self.errors += 1
        self._failing += 1
        text = err.strerror or str(err)
        if text != self.last_error:
            logger.warning(
                "audit log %s: %s; %d entries held in memory and written once the disk takes them",
                self.path,
                text,
                len(self._held),
            )
        else:
            logger.debug("audit log %s still failing: %s", self.path, text)
        self.last_error = text


def audit_log_for(cfg: KoordletConfig) -> AuditLog:
    """The audit log in ``cfg.audit_dir``, its disk budget (``--audit-max-disk-space-mb``)
    split over the current file and :data:`DEFAULT_BACKUPS` rotated ones."""
    files = DEFAULT_BACKUPS + 1
    return AuditLog(
        cfg.audit_dir,
        max_bytes=cfg.audit.max_disk_space_mb * 1024 * 1024 // files,
        backups=DEFAULT_BACKUPS,
    )
