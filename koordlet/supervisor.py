"""Named, guarded asyncio tasks: fixed-rate loops and eternal tasks.

Every long-running piece of the daemon runs under one :class:`Supervisor`, which owns its task
by name (as kopf owns its daemons and timers). Unlike ``asyncio.TaskGroup``, one task failing
never cancels the others:

- :meth:`Supervisor.spawn_loop` calls a step at a fixed rate. The schedule is anchored at the
  loop's start, so it does not drift; a step that overruns its interval skips the ticks it
  missed instead of bursting to catch up. A step that raises is logged (with its traceback the
  first time, then one line at most once a minute while it keeps failing), counted in
  ``koordlet_step_errors_total`` and retried at the next tick; a
  :class:`~koordlet.errors.WritesRefusedError` (a round that went on past refused writes, each
  logged by its owner) is counted and logged at debug only.
- :meth:`Supervisor.spawn` runs an eternal task (a watch, a server). Returning is a bug and is
  logged as one; raising is logged. Both restart it after an exponential backoff (1 s doubling up
  to 30 s by default), which resets once the task has run longer than the cap.
- :meth:`Supervisor.stop` cancels everything, waits up to a timeout and names the tasks that did
  not stop.

Time and sleeping are injectable so tests drive the schedule with a fake clock.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict
from types import TracebackType
from typing import Any

from apis.records import frozen
from koordlet.errors import WritesRefusedError
from koordlet.selfmetrics import SelfMetrics

logger = logging.getLogger(__name__)

Step = Callable[[], Awaitable[None]]
Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

FAILING_WARN_EVERY = 60.0
"""Seconds between the one-line warnings of a loop that keeps failing."""
HISTORY = 64
"""Steps of each loop whose start and duration are kept for ``/debug/tasks``."""
_TICK_EPSILON = 1e-9
"""Tolerance (in intervals) so a step ending exactly on a tick does not skip it to rounding."""


@frozen
class TaskState:
    """What ``/debug/tasks`` shows about one supervised task."""

    name: str
    """The task's unique name (``collect``, ``inventory``, ``qos/cpu_suppress``)."""
    kind: str
    """``loop`` (fixed-rate step) or ``eternal`` (restarted when it ends)."""
    component: str
    """The ``component`` label of its step metrics."""
    state: str
    """``waiting``, ``running``, ``backoff`` (eternal, before a restart), ``stopped`` or
    ``crashed`` (the guard itself ended on an unexpected exception)."""
    interval: float | None
    """Seconds between ticks of a loop; None for an eternal task."""
    runs: int
    """Steps run (loop) or starts (eternal)."""
    errors: int
    """Steps that raised (loop) or runs that raised or returned (eternal)."""
    consecutive_errors: int
    """Failures since the last success; 0 when healthy."""
    restarts: int
    """Restarts of an eternal task."""
    skipped_ticks: int
    """Ticks a loop skipped because a step overran."""
    last_error: str
    """``Type: message`` of the latest failure; empty when none."""
    last_duration_s: float | None
    """Duration of the latest step (loop); None before the first."""
    since_last_run_s: float | None
    """Seconds since the latest step or start began; None before the first."""
    recent_steps: tuple[tuple[float, float], ...] = ()
    """``(start, seconds)`` of a loop's last :data:`HISTORY` steps, oldest first; ``start`` on
    the supervisor's clock (the event loop's monotonic time by default). What a benchmark reads
    to judge step times under load."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class _Record:
    """Mutable bookkeeping of one task (the public view is :class:`TaskState`)."""

    __slots__ = (
        "component",
        "consecutive_errors",
        "errors",
        "history",
        "interval",
        "kind",
        "last_duration",
        "last_error",
        "last_error_type",
        "last_started",
        "last_warned",
        "name",
        "restarts",
        "runs",
        "skipped_ticks",
        "state",
        "task",
    )

    def __init__(self, name: str, kind: str, component: str, interval: float | None) -> None:
        self.name = name
        self.kind = kind
        self.component = component
        self.interval = interval
        self.state = "waiting"
        self.task: asyncio.Task[None] | None = None
        self.runs = 0
        self.errors = 0
        self.consecutive_errors = 0
        self.restarts = 0
        self.skipped_ticks = 0
        self.last_error = ""
        self.last_error_type: type[BaseException] | None = None
        self.last_duration: float | None = None
        self.last_started: float | None = None
        self.last_warned = -math.inf
        self.history: deque[tuple[float, float]] = deque(maxlen=HISTORY)


class Supervisor:
    """Owns the daemon's named tasks; see the module docstring for the guarantees.

    :param metrics: where step durations, errors, skipped ticks and restarts are recorded.
    :param clock: monotonic seconds; defaults to the running loop's ``time()``.
    :param sleep: how to wait; defaults to ``asyncio.sleep``.
    :param rng: source of loop jitter.
    :param backoff_initial: first delay (s) before restarting an eternal task.
    :param backoff_max: cap (s) of the doubling delay; a run longer than this resets it.
    :param stop_timeout: default wait (s) of :meth:`stop` and of leaving ``async with``.
    """

    def __init__(
        self,
        metrics: SelfMetrics,
        *,
        clock: Clock | None = None,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
        backoff_initial: float = 1.0,
        backoff_max: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        if not 0 < backoff_initial <= backoff_max:
            raise ValueError("need 0 < backoff_initial <= backoff_max")
        self._metrics = metrics
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._stop_timeout = stop_timeout
        self._records: dict[str, _Record] = {}
        self._stopped = False

    # Spawning -------------------------------------------------------------------------------

    def spawn_loop(
        self,
        name: str,
        step: Step,
        interval: float,
        *,
        jitter: float = 0.0,
        component: str = "loop",
        step_timeout: float | None = None,
    ) -> asyncio.Task[None]:
        """Run ``step`` every ``interval`` seconds until stopped.

        ``jitter`` (seconds) delays each tick by a random amount in ``[0, jitter]`` without
        moving the schedule; ``step_timeout`` (seconds) fails a step that runs longer.
        """
        if not interval > 0 or not math.isfinite(interval):
            raise ValueError(f"loop {name}: interval must be a positive number, got {interval}")
        if jitter < 0:
            raise ValueError(f"loop {name}: jitter must not be negative, got {jitter}")
        rec = self._register(name, "loop", component, interval)
        return self._start(rec, self._run_loop(rec, step, interval, jitter, step_timeout))

    def spawn(
        self, name: str, coro_fn: Callable[[], Awaitable[None]], *, component: str = "task"
    ) -> asyncio.Task[None]:
        """Run ``coro_fn()`` forever: restart it with backoff whenever it raises or returns."""
        rec = self._register(name, "eternal", component, None)
        return self._start(rec, self._run_eternal(rec, coro_fn))

    def _register(self, name: str, kind: str, component: str, interval: float | None) -> _Record:
        if self._stopped:
            raise RuntimeError(f"cannot spawn {name}: the supervisor is stopped")
        old = self._records.get(name)
        if old is not None and old.task is not None and not old.task.done():
            raise ValueError(f"a task named {name!r} is already running")
        rec = _Record(name, kind, component, interval)
        self._records[name] = rec
        return rec

    def _start(self, rec: _Record, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=f"koordlet:{rec.name}")
        rec.task = task
        task.add_done_callback(lambda t: self._on_done(rec, t))
        return task

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    # Loops ----------------------------------------------------------------------------------

    async def _run_loop(
        self, rec: _Record, step: Step, interval: float, jitter: float, step_timeout: float | None
    ) -> None:
        start = self._now()
        tick = 0
        while True:
            delay = start + tick * interval - self._now()
            if jitter:
                delay += self._rng.uniform(0.0, jitter)
            if delay > 0:
                rec.state = "waiting"
                await self._sleep(delay)
            rec.state = "running"
            began = self._now()
            rec.last_started = began
            failed = False
            try:
                async with asyncio.timeout(step_timeout):
                    await step()
            except Exception as err:
                failed = True
                self._loop_failed(rec, err, step_timeout)
            else:
                if rec.consecutive_errors:
                    logger.info(
                        "loop %s recovered after %d failed steps", rec.name, rec.consecutive_errors
                    )
                rec.consecutive_errors = 0
            ended = self._now()
            rec.runs += 1
            rec.last_duration = ended - began
            rec.history.append((round(began, 6), round(ended - began, 6)))
            self._metrics.observe_step(rec.component, rec.name, ended - began, failed=failed)
            due = math.ceil((ended - start) / interval - _TICK_EPSILON)
            next_tick = max(tick + 1, due)
            skipped = next_tick - tick - 1
            if skipped:
                rec.skipped_ticks += skipped
                self._metrics.skipped(rec.component, rec.name, skipped)
                logger.debug(
                    "loop %s: step took %.3fs (interval %.3fs), skipping %d ticks",
                    rec.name,
                    ended - began,
                    interval,
                    skipped,
                )
            tick = next_tick

    def _loop_failed(self, rec: _Record, err: Exception, step_timeout: float | None) -> None:
        rec.errors += 1
        rec.consecutive_errors += 1
        if isinstance(err, TimeoutError) and step_timeout is not None:
            rec.last_error = f"TimeoutError: step exceeded {step_timeout}s"
        else:
            rec.last_error = f"{type(err).__name__}: {err}"
        now = self._now()
        if isinstance(err, WritesRefusedError):  # its owner logged each refusal once
            logger.debug("loop %s: %s", rec.name, rec.last_error)
        elif rec.consecutive_errors == 1 or type(err) is not rec.last_error_type:
            logger.error("loop %s: step failed; retrying at the next tick", rec.name, exc_info=err)
            rec.last_warned = now
        elif now - rec.last_warned >= FAILING_WARN_EVERY:
            logger.warning(
                "loop %s still failing (%d steps in a row): %s",
                rec.name,
                rec.consecutive_errors,
                rec.last_error,
            )
            rec.last_warned = now
        else:
            logger.debug("loop %s failed again: %s", rec.name, rec.last_error)
        rec.last_error_type = type(err)

    # Eternal tasks --------------------------------------------------------------------------

    async def _run_eternal(self, rec: _Record, coro_fn: Callable[[], Awaitable[None]]) -> None:
        delay = self._backoff_initial
        while True:
            rec.state = "running"
            began = self._now()
            rec.last_started = began
            rec.runs += 1
            failure: Exception | None = None
            try:
                await coro_fn()
            except Exception as err:
                failure = err
            if self._now() - began >= self._backoff_max:
                # It ran healthily for a while: this is a fresh failure, not a crash loop.
                rec.consecutive_errors = 0
                delay = self._backoff_initial
            rec.consecutive_errors += 1
            rec.errors += 1
            rec.restarts += 1
            if failure is None:
                rec.last_error = "returned (an eternal task must not return)"
                rec.last_error_type = None
                logger.error("BUG: eternal task %s returned; restarting in %.1fs", rec.name, delay)
            else:
                self._eternal_failed(rec, failure, delay)
            self._metrics.restarted(rec.name, "returned" if failure is None else "raised")
            rec.state = "backoff"
            await self._sleep(delay)
            delay = min(delay * 2, self._backoff_max)

    def _eternal_failed(self, rec: _Record, err: Exception, delay: float) -> None:
        rec.last_error = f"{type(err).__name__}: {err}"
        if rec.consecutive_errors == 1 or type(err) is not rec.last_error_type:
            logger.error("task %s failed; restarting in %.1fs", rec.name, delay, exc_info=err)
        else:
            logger.warning(
                "task %s failed again (%d in a row); restarting in %.1fs: %s",
                rec.name,
                rec.consecutive_errors,
                delay,
                rec.last_error,
            )
        rec.last_error_type = type(err)

    # Lifecycle ------------------------------------------------------------------------------

    def _on_done(self, rec: _Record, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            rec.state = "stopped"
            if not self._stopped:
                logger.error("task %s was cancelled outside Supervisor.stop()", rec.name)
            return
        rec.state = "crashed"
        # The guards never return and catch every Exception: only a BaseException that is not
        # an Exception (or a bug in a guard) ends a task other than by cancellation.
        logger.error("task %s ended unexpectedly", rec.name, exc_info=task.exception())

    # ASYNC109: the timeout bounds the wait for the *other* tasks after cancelling them; an
    # asyncio.timeout around the call would cancel stop() itself and leave the stuck ones unnamed.
    async def stop(self, timeout: float | None = None) -> tuple[str, ...]:  # noqa: ASYNC109
        """Cancel every task and wait up to ``timeout`` seconds for them to end.

        Returns (and logs) the names of tasks still running after the timeout; calling it
        again cancels them again. No new task may be spawned afterwards.
        """
        self._stopped = True
        limit = self._stop_timeout if timeout is None else timeout
        live = {
            r.task: r for r in self._records.values() if r.task is not None and not r.task.done()
        }
        if not live:
            return ()
        for task in live:
            task.cancel()
        _, pending = await asyncio.wait(live, timeout=limit)
        stuck = tuple(sorted(live[t].name for t in pending))
        for name in stuck:
            logger.error("task %s did not stop within %.1fs of being cancelled", name, limit)
        if not stuck:
            logger.info("stopped %d tasks", len(live))
        return stuck

    def states(self) -> tuple[TaskState, ...]:
        """A snapshot of every task, by name."""
        now = self._now()
        return tuple(
            TaskState(
                name=r.name,
                kind=r.kind,
                component=r.component,
                state=r.state,
                interval=r.interval,
                runs=r.runs,
                errors=r.errors,
                consecutive_errors=r.consecutive_errors,
                restarts=r.restarts,
                skipped_ticks=r.skipped_ticks,
                last_error=r.last_error,
                last_duration_s=r.last_duration,
                since_last_run_s=None if r.last_started is None else now - r.last_started,
                recent_steps=tuple(r.history),
            )
            for r in sorted(self._records.values(), key=lambda r: r.name)
        )

    def describe(self) -> list[dict[str, object]]:
        """:meth:`states` as JSON-ready dicts (what ``/debug/tasks`` serves)."""
        return [s.as_dict() for s in self.states()]

    async def __aenter__(self) -> Supervisor:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
