"""The collector runner: one shared :class:`~koordlet.collectors.framework.Tick` per base interval.

The daemon calls :meth:`CollectorRunner.run_tick` in ONE worker thread per base tick and then
:meth:`CollectorRunner.apply` on the event loop with the report it returned::

    report = await asyncio.to_thread(runner.run_tick, time.time())
    runner.apply(report)

``run_tick`` builds the tick (file reads memoized for its duration, ENOENT → ``CgroupGoneError``,
the samples of earlier collectors visible through ``Tick.last``), runs the collectors that are due
in table order, each one guarded, and measures each step's thread CPU time and wall time.
``apply`` appends the samples and the columns to the metric cache at the tick's timestamp
(``MetricCache.append`` and ``append_columns``, step by step in table order), stores ``info``, feeds
the self-metrics and logs what changed (a collector that starts or stops failing, sources that
become unsupported) once, never once per tick.

Intervals: a collector's ``interval`` is rounded up to a whole number of base ticks; it runs at
its first tick, then whenever that many base intervals have passed (half a tick of tolerance, so
a late tick does not push it a whole period back).

Threading: ``run_tick`` reads the metric cache (``Tick.last`` falls back on it) while the event loop
waits for it; the daemon never runs ``apply`` or drops series while a ``run_tick`` is in flight.

On demand: an event handler that needs data fresher than the last tick awaits
:meth:`CollectorRunner.read_now` with an :class:`~koordlet.collectors.framework.OnDemand` read
(``noderesource.NODE_MEMORY``). The read runs in a worker thread on a tick of its own, stateless,
and its samples go to the metric cache at once, unless a tick is between ``run_tick`` and its
``apply``: then they wait for that ``apply``, which stores them after the tick's own samples
(those older than the tick are dropped: the tick saw newer values), so the cache is never written
while ``run_tick`` reads it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import field
from typing import Any, Protocol, TypeVar

from apis.records import frozen
from koordlet.collectors.framework import Collector, CollectResult, Fresh, OnDemand
from koordlet.errors import ConfigError, HostError
from koordlet.metriccache.series import Column, Sample
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.cgroupstats import READ_BUFFER, read_file_bytes
from koordlet.system.host import Host
from koordlet.system.nativeread import NativeFormat, NativeReader
from koordlet.system.nativeread import load as load_native
from koordlet.system.openfiles import OpenFiles, default_limit
from koordlet.system.oserrors import read_error

logger = logging.getLogger(__name__)

COMPONENT = "collector"
"""The ``component`` label of the collectors' steps in the self-metrics."""

FRESH_INTERVALS = 2.0
"""``Tick.last`` falls back on cache values younger than this many base intervals."""
MAX_DEFERRED = 64
"""On-demand sample batches kept for the next ``apply`` at most (oldest dropped first)."""

T = TypeVar("T")

_open, _os_read, _close = os.open, os.read, os.close
_FLAGS = os.O_RDONLY | os.O_CLOEXEC

Parser = Callable[[bytes, str], T]
"""A file parser: ``(content, path) -> value``, raising ``ParseError`` naming ``path``."""


class MetricStore(Protocol):
    """What the runner needs of the metric cache (``koordlet.metriccache.MetricCache``)."""

    def append(self, ts: float, samples: Iterable[Sample]) -> None: ...

    def append_columns(self, ts: float, columns: Iterable[Column]) -> None: ...

    def set_info(self, name: str, value: object) -> None: ...

    def last(self, metric: str, entity: str, *, max_age: float | None = None) -> float | None: ...


class StepRecorder(Protocol):
    """Where step durations and failures go: ``koordlet.selfmetrics.SelfMetrics`` fits."""

    def observe_step(self, component: str, name: str, seconds: float, *, failed: bool) -> None: ...


@frozen
class StepOutcome:
    """What one collector's step did in one tick."""

    name: str
    """The collector's table name."""
    result: CollectResult | None
    """Its result; None when it raised."""
    error: BaseException | None
    """The exception it raised, else None."""
    cpu_seconds: float
    """CPU time of the step on the worker thread (``time.thread_time``)."""
    wall_seconds: float
    """Wall time of the step (``time.perf_counter``)."""


@frozen
class TickReport:
    """Everything one ``run_tick`` produced, handed to ``apply`` on the event loop."""

    now: float
    """The tick's timestamp (``time.time()``); every sample of the tick carries it."""
    steps: tuple[StepOutcome, ...]
    """One entry per collector that was due, in table order."""
    reads: int
    """Distinct files read during the tick (memoized reads count once)."""
    cpu_seconds: float
    """CPU time of the whole tick on the worker thread, tick set-up included."""
    wall_seconds: float
    """Wall time of the whole tick."""
    unsupported: Mapping[str, str] = field(default_factory=dict)
    """``collector/source`` → reason, over every step of the tick."""

    @property
    def errors(self) -> dict[str, BaseException]:
        """Collector name → the exception its step raised."""
        return {s.name: s.error for s in self.steps if s.error is not None}

    @property
    def sample_count(self) -> int:
        return sum(s.result.sample_count for s in self.steps if s.result is not None)


class TickState:
    """The runner's :class:`~koordlet.collectors.framework.Tick`: reads memoized (failures too,
    so a vanished cgroup costs one ``open`` per tick), ``last`` over the samples published by
    the steps before. Tests and benchmarks build one directly to drive a collector's step.

    :param read: the file reader (``read_file_bytes``: ENOENT → ``CgroupGoneError``).
    :param store: where ``last`` falls back when this tick has no value; None: nowhere.
    :param max_age: seconds a fallback value may be old.
    """

    __slots__ = (
        "_direct",
        "_files",
        "_max_age",
        "_open_files",
        "_overlay",
        "_parsed",
        "_pending",
        "_read",
        "_store",
        "now",
        "workloads",
    )

    def __init__(
        self,
        now: float,
        workloads: WorkloadSnapshot,
        *,
        read: Callable[[str], bytes] = read_file_bytes,
        store: MetricStore | None = None,
        max_age: float = FRESH_INTERVALS,
        open_files: OpenFiles | None = None,
    ) -> None:
        self.now = now
        self.workloads = workloads
        self._read = read
        self._direct = read is read_file_bytes
        self._open_files = open_files if self._direct else None
        self._store = store
        self._max_age = max_age
        self._files: dict[str, bytes | HostError] = {}
        self._overlay: dict[tuple[str, str], float] = {}
        self._pending: list[Iterable[tuple[tuple[str, str], float]]] = []
        self._parsed: dict[Callable[[bytes, str], Any], dict[str, Any]] = {}

    @property
    def reads(self) -> int:
        return len(self._files)

    def read(self, path: str) -> bytes:
        # get() rather than try/except KeyError: a miss is the common case (most files are
        # read once a tick) and raising KeyError costs more than the read's bookkeeping.
        got = self._files.get(path)
        if got is None:
            open_files = self._open_files
            if open_files is not None:
                try:
                    got = open_files.read(path)
                except HostError as err:
                    got = err
            elif self._direct:
                # read_file_bytes inlined (one call less per file, 2,500 files a tick): one
                # os.read; a full buffer (never a cgroup file) goes to read_file_bytes itself.
                try:
                    fd = _open(path, _FLAGS)
                    try:
                        got = _os_read(fd, READ_BUFFER)
                    finally:
                        _close(fd)
                except OSError as err:
                    got = read_error(path, err)
                else:
                    if len(got) >= READ_BUFFER:
                        try:
                            got = read_file_bytes(path)
                        except HostError as err:
                            got = err
            else:
                try:
                    got = self._read(path)
                except HostError as err:  # remembered too: a vanished cgroup is not read twice
                    got = err
            self._files[path] = got
        if type(got) is bytes:
            return got
        assert isinstance(got, HostError)
        raise got

    def parsed(self, path: str, parser: Parser[T]) -> T:
        """``parser(read(path), path)``, computed once per tick for each (parser, path): the pod
        and page-cache collectors share one parse of each ``memory.stat``, the v2 usage and
        throttling collectors one of each ``cpu.stat``. Parse errors are not remembered."""
        memo = self._parsed.get(parser)
        if memo is None:
            memo = self._parsed[parser] = {}
        value: T | None = memo.get(path)  # no typing.cast: it is a call per file
        if value is None:
            value = memo[path] = parser(self.read(path), path)
        return value

    def column(self, paths: tuple[str, ...]) -> list[bytes] | None:
        """The contents of ``paths`` in order, read at once (``OpenFiles.column``) and
        remembered as :meth:`read` remembers; None when that does not apply (no kept files, a
        file not kept yet or read earlier in this tick, a failed read): then read file by
        file."""
        open_files = self._column_files(paths)
        if open_files is None:
            return None
        data = open_files.column(paths)
        if data is not None:
            self._files.update(zip(paths, data, strict=True))
        return data

    def native_column(self, paths: tuple[str, ...], fmt: NativeFormat) -> list[Any] | None:
        """``fmt``'s parse of every file of ``paths``, read and parsed at once by the native
        reader (``OpenFiles.native_column``); None when that does not apply, as :meth:`column`.
        The files' bytes are not kept: a :meth:`read` of one of them later in the tick reads
        it again (the memo of parsed values, :meth:`remember`, is what collectors share)."""
        open_files = self._column_files(paths)
        return None if open_files is None else open_files.native_column(paths, fmt)

    def _column_files(self, paths: tuple[str, ...]) -> OpenFiles | None:
        """The kept files, when ``paths`` can be read as a column: some, and none of them read
        earlier in this tick (the tick keeps the bytes it read first)."""
        open_files = self._open_files
        if open_files is None or not paths:
            return None
        files = self._files
        if files and not files.keys().isdisjoint(paths):
            return None
        return open_files

    def remember(self, paths: Sequence[str], parser: Parser[T], values: Sequence[T]) -> None:
        """Store values a collector parsed in bulk as :meth:`parsed` would have: the collectors
        after it that parse the same files with ``parser`` find them."""
        memo = self._parsed.get(parser)
        if memo is None:
            memo = self._parsed[parser] = {}
        memo.update(zip(paths, values, strict=True))

    def parsed_column(self, paths: Sequence[str], parser: Parser[T]) -> list[T] | None:
        """Every ``parsed(path, parser)`` of ``paths`` when each is already in the memo (an
        earlier collector parsed the column); else None."""
        memo = self._parsed.get(parser)
        if memo is None or not paths:
            return None
        values: list[T | None] = list(map(memo.get, paths))
        if None in values:
            return None
        return values  # type: ignore[return-value]  # no None left: checked above

    def publish(self, samples: Iterable[tuple[tuple[str, str], float]]) -> None:
        """Make a finished step's samples (or a column's ``zip(keys, values)``) visible to
        ``last``, folded in lazily."""
        self._pending.append(samples)

    def last(self, metric: str, entity: str) -> float | None:
        if self._pending:
            overlay = self._overlay
            for batch in self._pending:
                # Sample is a (key, value) pair. A loop of stores measured about twice as fast as
                # dict.update(batch), which takes the generic sequence-of-pairs path.
                for key, sample_value in batch:
                    overlay[key] = sample_value
            self._pending.clear()
        # A plain tuple hashes and compares equal to the SeriesKey (a NamedTuple): no object.
        value = self._overlay.get((metric, entity))
        if value is not None or self._store is None:
            return value
        return self._store.last(metric, entity, max_age=self._max_age)


class _Schedule:
    """When one collector is due."""

    __slots__ = ("every", "next_due")

    def __init__(self, every: int) -> None:
        self.every = every
        self.next_due: float | None = None


def ticks_per_step(interval: float, base_interval: float) -> int:
    """``interval`` as a whole number of base ticks, rounded up (at least one)."""
    if not interval > 0:
        return 1
    return max(1, math.ceil(interval / base_interval - 1e-9))


class CollectorRunner:
    """Runs the collectors of the table, in its order, on one shared tick."""

    def __init__(
        self,
        collectors: Sequence[Collector],
        cache: MetricStore,
        workloads: Callable[[], WorkloadSnapshot],
        *,
        base_interval: float = 1.0,
        recorder: StepRecorder | None = None,
        read: Callable[[str], bytes] = read_file_bytes,
        keep_open: int | None = None,
        native: NativeReader | bool = True,
        host: Host | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``keep_open``: how many kernel files stay open between ticks (re-read with ``pread``;
        ``koordlet.system.openfiles``); None: ``openfiles.default_limit()``, three quarters of
        the soft open-file limit; 0: none. Only with the default reader. ``native``: the
        native column reader for those kept files (``koordlet.system.nativeread``); True:
        the built one where there is one (``nativeread.load``), False: none. ``host``: what
        on-demand reads (:meth:`read_now`) read; None: they are refused. ``clock``: their
        timestamps (``time.time``)."""
        if not base_interval > 0:
            raise ConfigError(
                f"must be a positive duration, got {base_interval!r}",
                field="collect.res_used_interval",
            )
        names = [c.name for c in collectors]
        if len(set(names)) != len(names):
            raise ConfigError(f"duplicate collector names in {names}", field="collectors")
        self._collectors = tuple(collectors)
        self._cache = cache
        self._workloads = workloads
        self._base = base_interval
        self._recorder = recorder
        self._read = read
        limit = default_limit() if keep_open is None else keep_open
        self._open_files: OpenFiles | None = None
        if read is read_file_bytes and limit > 0:
            reader: NativeReader | None = None
            if native is True:
                reader, why = load_native()
                logger.info("collectors: native column reads %s", why)
            elif native is not False:
                reader = native
            self._open_files = OpenFiles(limit, reader)
        self._schedules = {
            c.name: _Schedule(ticks_per_step(c.interval, base_interval)) for c in collectors
        }
        self._failing: set[str] = set()
        self._unsupported: dict[str, str] = {}
        self._host = host
        self._clock = clock
        self._store_lock = threading.Lock()
        """Guards ``_in_flight`` and ``_deferred``, and on-demand appends to the cache."""
        self._in_flight = False
        """True from a ``run_tick``'s start until its ``apply``."""
        self._deferred: list[tuple[float, Sequence[Sample]]] = []

    @property
    def base_interval(self) -> float:
        return self._base

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self._collectors)

    def every(self, name: str) -> int:
        """How many base ticks apart the collector ``name`` runs."""
        return self._schedules[name].every

    def set_recorder(self, recorder: StepRecorder | None) -> None:
        """Install (or remove) the self-metrics hook."""
        self._recorder = recorder

    def run_tick(self, now: float) -> TickReport:
        """Run every due collector once on one shared tick; synchronous, for one worker thread."""
        with self._store_lock:
            self._in_flight = True
        cpu0 = time.thread_time()
        wall0 = time.perf_counter()
        tick = TickState(
            now,
            self._workloads(),
            read=self._read,
            store=self._cache,
            max_age=FRESH_INTERVALS * self._base,
            open_files=self._open_files,
        )
        tolerance = self._base / 2
        steps: list[StepOutcome] = []
        unsupported: dict[str, str] = {}
        for collector in self._collectors:
            schedule = self._schedules[collector.name]
            if schedule.next_due is not None and now < schedule.next_due - tolerance:
                continue
            schedule.next_due = now + schedule.every * self._base
            c0 = time.thread_time()
            w0 = time.perf_counter()
            result: CollectResult | None
            error: BaseException | None = None
            try:
                result = collector.collect(tick)
            except Exception as err:  # the framework's guard: one failing step stops nothing else
                result, error = None, err
            steps.append(
                StepOutcome(
                    collector.name, result, error, time.thread_time() - c0, time.perf_counter() - w0
                )
            )
            if result is not None:
                tick.publish(result.samples)
                for keys, values in result.columns:
                    tick.publish(zip(keys, values, strict=True))
                for source, reason in result.unsupported.items():
                    unsupported[f"{collector.name}/{source}"] = reason
        if self._open_files is not None:
            self._open_files.end_tick()
        return TickReport(
            now=now,
            steps=tuple(steps),
            reads=tick.reads,
            cpu_seconds=time.thread_time() - cpu0,
            wall_seconds=time.perf_counter() - wall0,
            unsupported=unsupported,
        )

    def apply(self, report: TickReport) -> None:
        """Store a tick's results (event loop side): samples, info, self-metrics, logs; then
        the on-demand samples that waited for it."""
        cache = self._cache
        for step in report.steps:
            result = step.result
            if result is not None:
                if result.samples:
                    cache.append(report.now, result.samples)
                if result.columns:
                    cache.append_columns(report.now, result.columns)
                for name, value in result.info.items():
                    cache.set_info(name, value)
            self._note_outcome(step)
            if self._recorder is not None:
                self._recorder.observe_step(
                    COMPONENT, step.name, step.wall_seconds, failed=step.error is not None
                )
        self._note_unsupported(report)
        with self._store_lock:
            self._in_flight = False
            deferred, self._deferred = self._deferred, []
        for ts, samples in deferred:
            if ts > report.now:  # older than the tick: the tick's values are newer
                cache.append(ts, samples)

    # On demand ---------------------------------------------------------------------------------

    async def read_now(self, what: OnDemand[T]) -> T:
        """Read ``what`` now, in a worker thread, store its samples in the metric cache at the
        read's timestamp (see the module docstring for a tick in flight) and return its value.

        Raises what the read raises (``HostError``, ``ParseError``...); nothing is stored then.
        ``RuntimeError`` when the runner was built without a host.
        """
        host = self._host
        if host is None:
            raise RuntimeError(f"CollectorRunner.read_now({what.name}) without a host")
        now, fresh = await asyncio.to_thread(self._read_now, what, host)
        self._store_now(now, fresh.samples)
        return fresh.value

    def _read_now(self, what: OnDemand[T], host: Host) -> tuple[float, Fresh[T]]:
        """In the worker thread: a tick of its own (plain reads: the kept-open files belong to
        the collect loop's thread), stamped after the thread hop, as ``run_tick`` is."""
        now = self._clock()
        tick = TickState(now, self._workloads())
        return now, what.read(host, tick)

    def _store_now(self, now: float, samples: Sequence[Sample]) -> None:
        if not samples:
            return
        with self._store_lock:
            if self._in_flight:
                self._deferred.append((now, samples))
                del self._deferred[:-MAX_DEFERRED]
                return
            self._cache.append(now, samples)  # under the lock: a run_tick starting now waits

    def _note_outcome(self, step: StepOutcome) -> None:
        if step.error is None:
            if step.name in self._failing:
                self._failing.discard(step.name)
                logger.info("collector %s works again", step.name)
            return
        if step.name not in self._failing:
            self._failing.add(step.name)
            logger.error("collector %s failed; retrying every tick", step.name, exc_info=step.error)
        else:
            logger.debug("collector %s still failing: %s", step.name, step.error)

    def _note_unsupported(self, report: TickReport) -> None:
        ran = {s.name for s in report.steps if s.result is not None}
        current = {k: v for k, v in self._unsupported.items() if k.split("/", 1)[0] not in ran}
        current.update(report.unsupported)
        if current == self._unsupported:
            return
        for key in sorted(current.keys() - self._unsupported.keys()):
            logger.warning("collector source %s unsupported: %s", key, current[key])
        for key in sorted(self._unsupported.keys() - current.keys()):
            logger.info("collector source %s available again", key)
        self._unsupported = current

    @property
    def unsupported(self) -> dict[str, str]:
        """``collector/source`` → reason, as of the last applied tick."""
        return dict(self._unsupported)

    @property
    def failing(self) -> frozenset[str]:
        """Collectors whose last step raised."""
        return frozenset(self._failing)

    def close(self) -> None:
        """Release what the collectors hold (the CPI collector's perf descriptors). Call it after
        the last tick, from one thread; a collector whose ``close`` raises is logged and the
        others are still closed. Idempotent. Also closes the kernel files kept open."""
        if self._open_files is not None:
            self._open_files.close()
        for collector in self._collectors:
            close = getattr(collector, "close", None)
            if close is None:
                continue
            try:
                close()
            except Exception:  # the guard: one collector cannot keep the others' resources
                logger.exception("collector %s failed to close", collector.name)

    @property
    def open_files(self) -> int:
        """Kernel files kept open between ticks now."""
        return 0 if self._open_files is None else len(self._open_files)

    def describe(self) -> list[dict[str, Any]]:
        """The collectors with their effective intervals (for ``/debug``)."""
        return [
            {
                "name": c.name,
                "interval_seconds": self._schedules[c.name].every * self._base,
                "failing": c.name in self._failing,
            }
            for c in self._collectors
        ]
