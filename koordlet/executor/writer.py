"""The single cgroup writer: every cgroup write of the koordlet goes through here.

Like Koordinator's ``ResourceUpdateExecutor``, it owns one writer thread, so writes never race
each other and never block the event loop, and it skips writes that would change nothing:

Writes name the knob by its :class:`~koordlet.system.knobs.Knob` object (``write(CPU_SHARES,
rel_dir, 512)``), so mypy checks the value against the knob's type. Then:

1. the knob table validates the value (out of range → ``InvalidValueError``, nothing written);
2. the knob's file is resolved through the cgroup layout (a knob this version or this host lacks
   → ``UnsupportedError`` with the probed reason);
3. a write of the value last written to the same file within ``cache_ttl`` seconds is skipped
   without touching the file (Koordinator's ``--resource-force-update-seconds``, 60 s); after
   that the file is read again, so a value changed behind our back is restored;
4. the current text is read, the new text encoded from it (``cpu.max`` keeps its other half) and
   written only when the logical value differs;
5. ENOENT or ENODEV on the cgroup → ``CgroupGoneError``: the cgroup was removed, a normal race.

A keyed knob (one line per block device, :mod:`koordlet.system.devcodec`) is compared as the
decoded file against the value, and its lines are written one ``write(2)`` each.

``on_change`` is called with each :class:`WriteResult` that changed a file, and with each
dry-run result that would have (the audit log hooks in here). ``record_original`` is called
before a file is changed, with what it held (:mod:`koordlet.executor.originals`, the journal
``koordlet reset`` puts back); it keeps the first value it sees of each file and knob.
``observe`` times every file write
(``koordlet_resource_update_duration_milliseconds{type,status}``).

Dry run (``--dry-run``, ``--qos-dry-run-strategies``): a write submitted for a strategy in dry
run is validated, resolved and compared with the file's current text exactly as a real one, but
nothing is written and the skip cache is not fed; the result has ``dry_run=True`` and
``changed=False``, and when the value would have changed it goes to ``on_change`` as an audited
decision, once per ``cache_ttl`` for the same decision on the same file text.

The cache starts empty, so after a start every knob is read from the file before it is written
(nothing from an earlier run is trusted); :meth:`CgroupWriter.resync` empties it again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from apis.records import frozen
from koordlet.errors import ParseError, UnsupportedError
from koordlet.executor.batch import BatchResult, BatchWrite, apply_batch
from koordlet.executor.originals import Original, Recorder
from koordlet.system.cgroupstats import read_whole
from koordlet.system.knobs import KNOBS, Knob
from koordlet.system.libc import name_os_thread
from koordlet.system.oserrors import knob_error

if TYPE_CHECKING:
    from koordlet.system.host import Host
    from koordlet.system.probe import Capabilities

logger = logging.getLogger(__name__)

_R = TypeVar("_R")
_V = TypeVar("_V")

DEFAULT_CACHE_TTL = 60.0
"""Seconds a written value is trusted before the file is read again (Koordinator's
``ResourceForceUpdateSeconds``)."""
PATHS_KEPT = 100_000
"""Resolved file paths the writer remembers before it starts again (pods come and go)."""


@frozen
class WriteResult:
    """What one write did."""

    path: str
    """The cgroup file."""
    old: str
    """Its text before (stripped); the cached text when the write was skipped from cache."""
    new: str
    """The text that was written, or would have been."""
    changed: bool
    """True when the file was written."""
    knob: str = ""
    """The logical knob name."""
    strategy: str = ""
    """Who asked for the write (a QoS strategy's table name), for the audit log."""
    reason: str = ""
    """Why, in a few words with the inputs (``node cpu 82% > 65%``), for the audit log."""
    dry_run: bool = False
    """True when the strategy is in dry run: nothing was written; ``new`` is what would have
    been, and ``old != new`` (by value) tells whether it would have changed the file."""


@frozen
class _Cached:
    value: object
    text: str
    at: float


class CgroupWriter:
    """Validates, resolves, deduplicates and performs cgroup writes on one thread."""

    def __init__(
        self,
        host: Host,
        *,
        capabilities: Capabilities | None = None,
        cache_ttl: float = DEFAULT_CACHE_TTL,
        on_change: Callable[[WriteResult], None] | None = None,
        observe: Callable[[str, str, float], None] | None = None,
        dry_run_all: bool = False,
        dry_run_strategies: frozenset[str] = frozenset(),
        clock: Callable[[], float] = time.monotonic,
        record_original: Recorder | None = None,
    ) -> None:
        self.host = host
        """Paths and cgroup layout the writes resolve through."""
        self.capabilities = capabilities
        """Start-up probe results; a knob probed unsupported is refused with its reason."""
        self.cache_ttl = cache_ttl
        """Seconds a written value is trusted before the file is read again."""
        self.on_change = on_change
        """Called (on the writing thread) with every result that changed a file, and every
        dry-run result that would have."""
        self.observe = observe
        """Called with (file name, ``success`` or ``failed``, seconds) for every file write."""
        self.dry_run_all = dry_run_all
        """``--dry-run``: nothing is written, whoever asks."""
        self.dry_run_strategies = dry_run_strategies
        """Strategies whose writes are computed and audited but not performed."""
        self.record_original = record_original
        """Called before a file is changed with what it held (the originals journal)."""
        self._clock = clock
        self._cache: dict[tuple[str, ...], _Cached] = {}
        self._paths: dict[tuple[str, str, str], str] = {}
        """(controller, cgroup, file name) -> absolute path, for :attr:`_paths_layout`."""
        self._paths_layout: object = None
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    # Lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer thread (idempotent)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="cgroup-writer", initializer=name_os_thread
            )

    def stop(self, *, cancel_pending: bool = False) -> None:
        """Stop the writer thread after the queued writes (or dropping them when asked)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=cancel_pending)

    def __enter__(self) -> CgroupWriter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def resync(self) -> int:
        """Forget every cached value, so the next write of each knob reads the file again;
        returns how many were dropped. The cache starts empty: a fresh writer never trusts a
        value from before its start."""
        with self._lock:
            dropped = len(self._cache)
            self._cache.clear()
        return dropped

    def is_dry_run(self, strategy: str) -> bool:
        """Whether writes asked for by ``strategy`` are only computed and audited."""
        return self.dry_run_all or (bool(strategy) and strategy in self.dry_run_strategies)

    # Writes --------------------------------------------------------------------------------------

    def submit(
        self, knob: Knob[_V], rel_dir: str, value: _V, *, strategy: str = "", reason: str = ""
    ) -> Future[WriteResult]:
        """Queue :meth:`write` on the writer thread; the future carries its result or error.

        ``knob`` is a :class:`~koordlet.system.knobs.Knob` of the table, so that mypy checks the
        value against the knob's type.
        """
        pool = self._pool
        if pool is None:
            raise RuntimeError("CgroupWriter.submit() before start() or after stop()")
        return pool.submit(self._apply, knob, rel_dir, value, strategy, reason)

    def write(
        self, knob: Knob[_V], rel_dir: str, value: _V, *, strategy: str = "", reason: str = ""
    ) -> WriteResult:
        """Write ``value`` to ``knob`` of cgroup ``rel_dir`` now, on this thread.

        For the writer thread itself (and tests); everyone else uses :meth:`submit`. Raises
        ``InvalidValueError``, ``UnsupportedError``, ``CgroupGoneError``, ``ParseError`` or
        ``HostError``; the file is untouched in every case but the last.
        """
        return self._apply(knob, rel_dir, value, strategy, reason)

    def _apply(
        self, k: Knob[Any], rel_dir: str, value: object, strategy: str, reason: str
    ) -> WriteResult:
        version = self.host.layout.version
        filename = k.file_for(version)
        if filename is None:
            raise UnsupportedError(k.name, f"cgroup {version} has no file for it")
        if not k.writable:
            raise UnsupportedError(k.name, f"{filename} is read-only")
        caps = self.capabilities
        if caps is not None and k.name in caps and not caps.supported(k.name):
            raise UnsupportedError(k.name, caps[k.name].reason)
        canonical = k.validate(value)
        path = self._path(k.controller, rel_dir, filename)
        key = (path, k.name)
        dry = self.is_dry_run(strategy)

        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit.value == canonical and now - hit.at < self.cache_ttl:
            return WriteResult(path, hit.text, hit.text, False, k.name, strategy, reason, dry)

        current = self._read(path, k)
        new = k.encode(canonical, version, current, path=path)
        if self._same(k, current, new, path, canonical):
            if not dry:
                self._remember(key, canonical, new, now)
            return WriteResult(path, current.strip(), new, False, k.name, strategy, reason, dry)

        if dry:
            result = WriteResult(path, current.strip(), new, False, k.name, strategy, reason, True)
            logger.debug("dry run %s: %r -> %r (not written)", path, result.old, new)
            # The same decision on the same file text is audited once per cache lifetime, as a
            # real write is made once: a dry-run strategy deciding it every round is no news.
            dry_key = (path, k.name, "dry-run")
            with self._lock:
                seen = self._cache.get(dry_key)
            if (
                seen is None
                or (seen.value, seen.text) != (canonical, result.old)
                or (now - seen.at >= self.cache_ttl)
            ):
                with self._lock:
                    self._cache[dry_key] = _Cached(canonical, result.old, now)
                self._notify(result)
            return result

        self._record(Original("cgroup", path, k.name, current.strip(), rel_dir.strip("/")))
        self._timed_write(path, new, k, filename)
        self._remember(key, canonical, new, now)
        result = WriteResult(path, current.strip(), new, True, k.name, strategy, reason)
        logger.debug("wrote %s: %r -> %r", path, result.old, new)
        self._notify(result)
        return result

    def submit_batch(self, writes: Sequence[BatchWrite[Any]]) -> Future[BatchResult]:
        """Queue a leveled batch (:mod:`koordlet.executor.batch`) as one job on the writer
        thread; the future carries its :class:`BatchResult`."""
        pool = self._pool
        if pool is None:
            raise RuntimeError("CgroupWriter.submit_batch() before start() or after stop()")
        return pool.submit(apply_batch, self, tuple(writes))

    def read(self, knob: Knob[_V], rel_dir: str) -> _V:
        """The logical value of ``knob`` of cgroup ``rel_dir``, read from the file now.

        For the writer thread (batches) and tests. A cached value that disagrees with the file
        is dropped, so the next write reads again. Raises like :meth:`write`.
        """
        k = knob
        version = self.host.layout.version
        filename = k.file_for(version)
        if filename is None:
            raise UnsupportedError(k.name, f"cgroup {version} has no file for it")
        path = self._path(k.controller, rel_dir, filename)
        value = k.decode(self._read(path, k), version, path=path)
        key = (path, k.name)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit.value != value:
                del self._cache[key]
        return value

    def call(self, fn: Callable[[], _R]) -> Future[_R]:
        """Run ``fn`` on the writer thread, in order with the queued writes: the node-wide
        writers (``executor.sysctl``, ``executor.resctrl``) go through here so that every write
        of the koordlet stays on one thread."""
        pool = self._pool
        if pool is None:
            raise RuntimeError("CgroupWriter.call() before start() or after stop()")
        return pool.submit(fn)

    def forget(self, rel_dir: str) -> int:
        """Drop the cached values of cgroup ``rel_dir`` and its descendants (it was removed)."""
        layout = self.host.layout
        controllers = {k.controller for k in KNOBS.values()}
        bases = tuple(layout.abs_dir(c, rel_dir).rstrip("/") + "/" for c in controllers)
        with self._lock:
            gone = [key for key in self._cache if key[0].startswith(bases)]
            for key in gone:
                del self._cache[key]
        return len(gone)

    # Internals -----------------------------------------------------------------------------------

    def _path(self, controller: str, rel_dir: str, filename: str) -> str:
        """The layout's path of a cgroup file, remembered: a round of the reconcilers resolves
        the same few thousand paths (forgotten when the layout changes or past
        :data:`PATHS_KEPT`)."""
        layout = self.host.layout
        paths = self._paths
        if layout is not self._paths_layout or len(paths) > PATHS_KEPT:
            paths = self._paths = {}
            self._paths_layout = layout
        key = (controller, rel_dir, filename)
        path = paths.get(key)
        if path is None:
            path = paths[key] = layout.file(controller, rel_dir, filename)
        return path

    def _same(self, k: Knob[Any], current: str, new: str, path: str, value: object) -> bool:
        version = self.host.layout.version
        if k.keyed:  # the file lists every device; ``new`` only the lines to write
            try:
                return bool(k.decode(current, version, path=path) == value)
            except ParseError:
                logger.debug("%s: unparsable current text %r, rewriting", path, current)
                return False
        if current.split() == new.split():
            return True
        try:
            return bool(k.decode(current, version, path=path) == k.decode(new, version, path=path))
        except ParseError:
            logger.debug("%s: unparsable current text %r, rewriting", path, current)
            return False

    def _remember(self, key: tuple[str, str], value: object, text: str, now: float) -> None:
        with self._lock:
            self._cache[key] = _Cached(value, text, now)

    def _drop(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._cache.pop(key, None)

    def _read(self, path: str, k: Knob[Any]) -> str:
        try:
            data = read_whole(path)  # no text wrapper for a file of a few bytes, read each round
        except OSError as err:
            raise knob_error(path, err, k.name, "reading") from err
        return data.decode("ascii", errors="replace")

    def _timed_write(self, path: str, text: str, k: Knob[Any], filename: str) -> None:
        observe = self.observe
        if observe is None:
            self._write(path, text, k)
            return
        t0 = time.perf_counter()
        status = "failed"
        try:
            self._write(path, text, k)
            status = "success"
        finally:
            try:
                observe(filename, status, time.perf_counter() - t0)
            except Exception:  # a broken metric must not fail a write
                logger.exception("observe hook failed for %s", path)

    def _write(self, path: str, text: str, k: Knob[Any]) -> None:
        # A keyed file takes one device per write(2) (koordlet.system.devcodec).
        chunks = [f"{line}\n" for line in text.splitlines()] if k.keyed else [text or "\n"]
        try:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
            try:
                for chunk in chunks:
                    os.write(fd, chunk.encode("ascii"))
            finally:
                os.close(fd)
        except OSError as err:
            self._drop((path, k.name))
            raise knob_error(path, err, k.name, f"writing {text!r}") from err

    def _record(self, original: Original) -> None:
        hook = self.record_original
        if hook is None:
            return
        try:
            hook(original)
        except Exception:  # a broken journal must not stop a protective write
            logger.exception("recording the original of %s failed", original.path)

    def _notify(self, result: WriteResult) -> None:
        hook = self.on_change
        if hook is None:
            return
        try:
            hook(result)
        except Exception:  # a broken hook must not turn a done write into a failed one
            logger.exception("on_change hook failed for %s", result.path)
