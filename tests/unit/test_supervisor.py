"""The supervisor: fixed-rate guarded loops, restarted eternal tasks, bounded stop.

Time is virtual: the supervisor's clock and sleep are a :class:`VirtualTime` that the test
advances, so schedules are asserted exactly and nothing depends on wall time.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from koordlet.errors import WritesRefusedError
from koordlet.selfmetrics import SelfMetrics
from koordlet.supervisor import FAILING_WARN_EVERY, HISTORY, Supervisor


class VirtualTime:
    """A clock and a sleep whose time moves only when the test calls :meth:`advance`."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = 0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._seq += 1
        heapq.heappush(self._sleepers, (self.now + max(delay, 0.0), self._seq, fut))
        await fut

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking every sleeper due on the way, in order."""
        target = self.now + seconds
        await _settle()
        while self._sleepers and self._sleepers[0][0] <= target:
            when, _, fut = heapq.heappop(self._sleepers)
            self.now = max(self.now, when)
            if not fut.done():
                fut.set_result(None)
            await _settle()
        self.now = target


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


class FixedJitter(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def uniform(self, a: float, b: float) -> float:
        return min(max(self.value, a), b)


@pytest.fixture(autouse=True)
async def no_leftover_tasks() -> AsyncIterator[None]:
    before = asyncio.all_tasks()
    yield
    await _settle()
    current = asyncio.current_task()  # teardown runs in a task of its own
    left = [t for t in asyncio.all_tasks() - before if t is not current and not t.done()]
    assert not left, f"tasks left running: {left}"


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def vt() -> VirtualTime:
    return VirtualTime()


@pytest.fixture
async def sup(registry: CollectorRegistry, vt: VirtualTime) -> AsyncIterator[Supervisor]:
    supervisor = Supervisor(
        SelfMetrics(registry), clock=vt, sleep=vt.sleep, backoff_initial=1.0, backoff_max=4.0
    )
    try:
        yield supervisor
    finally:
        assert await supervisor.stop(timeout=2.0) == ()


def state_of(sup: Supervisor, name: str) -> dict[str, object]:
    return next(s for s in sup.describe() if s["name"] == name)


async def test_a_loop_steps_at_a_fixed_rate_without_drift(sup: Supervisor, vt: VirtualTime) -> None:
    starts: list[float] = []

    async def step() -> None:
        starts.append(vt.now)
        vt.now += 0.3  # the step's own duration must not push the next tick

    sup.spawn_loop("steady", step, 1.0)
    await vt.advance(5.0)

    assert starts == [float(k) for k in range(6)]


async def test_a_step_that_overruns_skips_the_missed_ticks_instead_of_bursting(
    sup: Supervisor, vt: VirtualTime, registry: CollectorRegistry
) -> None:
    starts: list[float] = []

    async def step() -> None:
        starts.append(vt.now)
        if len(starts) == 2:
            vt.now += 2.5  # runs over ticks 2 and 3

    sup.spawn_loop("slow", step, 1.0)
    await vt.advance(5.0)

    assert starts == [0.0, 1.0, 4.0, 5.0]
    labels = {"component": "loop", "name": "slow"}
    assert registry.get_sample_value("koordlet_step_skipped_ticks_total", labels) == 2
    assert state_of(sup, "slow")["skipped_ticks"] == 2


async def test_jitter_delays_each_tick_without_moving_the_schedule(
    registry: CollectorRegistry, vt: VirtualTime
) -> None:
    sup = Supervisor(SelfMetrics(registry), clock=vt, sleep=vt.sleep, rng=FixedJitter(0.25))
    starts: list[float] = []

    async def step() -> None:
        starts.append(vt.now)

    sup.spawn_loop("jittery", step, 1.0, jitter=0.5)
    await vt.advance(3.0)
    await sup.stop(timeout=1.0)

    assert starts == [k + 0.25 for k in range(3)]


async def test_a_failing_step_is_counted_and_retried_without_stopping_other_loops(
    sup: Supervisor, vt: VirtualTime, registry: CollectorRegistry
) -> None:
    healthy_runs = 0

    async def broken() -> None:
        raise RuntimeError("boom")

    async def healthy() -> None:
        nonlocal healthy_runs
        healthy_runs += 1

    sup.spawn_loop("broken", broken, 1.0)
    sup.spawn_loop("healthy", healthy, 1.0)
    await vt.advance(3.0)

    assert healthy_runs == 4
    broken_labels = {"component": "loop", "name": "broken"}
    healthy_labels = {"component": "loop", "name": "healthy"}
    assert registry.get_sample_value("koordlet_step_errors_total", broken_labels) == 4
    assert registry.get_sample_value("koordlet_step_errors_total", healthy_labels) is None
    assert registry.get_sample_value("koordlet_step_duration_seconds_count", healthy_labels) == 4
    broken_state = state_of(sup, "broken")
    assert broken_state["consecutive_errors"] == 4
    assert broken_state["last_error"] == "RuntimeError: boom"
    assert state_of(sup, "healthy")["errors"] == 0


async def test_a_failing_loop_logs_one_traceback_then_rare_one_line_warnings_then_recovery(
    sup: Supervisor, vt: VirtualTime, caplog: pytest.LogCaptureFixture
) -> None:
    failing = True

    async def step() -> None:
        if failing:
            raise OSError("disk on fire")

    caplog.set_level(logging.DEBUG, logger="koordlet.supervisor")
    sup.spawn_loop("flaky", step, 1.0)
    await vt.advance(2 * FAILING_WARN_EVERY + 5)
    failing = False
    await vt.advance(1.0)

    records = [r for r in caplog.records if r.name == "koordlet.supervisor"]
    with_traceback = [r for r in records if r.exc_info]
    warnings = [r for r in records if r.levelno == logging.WARNING]
    assert len(with_traceback) == 1
    assert with_traceback[0].levelno == logging.ERROR
    assert len(warnings) == 2
    assert all("disk on fire" in r.getMessage() for r in warnings)
    assert any("recovered" in r.getMessage() for r in records if r.levelno == logging.INFO)
    assert state_of(sup, "flaky")["consecutive_errors"] == 0


async def test_a_round_that_went_on_past_refused_writes_is_counted_and_logged_at_debug_only(
    sup: Supervisor, vt: VirtualTime, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    async def step() -> None:  # its owner logged each refusal once (qos.shared.WriteFailures)
        raise WritesRefusedError("cpusuppress", ["cpu_cfs_quota kubepods/besteffort: EINVAL"])

    caplog.set_level(logging.DEBUG, logger="koordlet.supervisor")
    sup.spawn_loop("refusing", step, 1.0)
    await vt.advance(2 * FAILING_WARN_EVERY + 5)

    records = [r for r in caplog.records if r.name == "koordlet.supervisor"]
    assert records
    assert all(r.levelno == logging.DEBUG and not r.exc_info for r in records)
    errors = registry.get_sample_value(
        "koordlet_step_errors_total", {"component": "loop", "name": "refusing"}
    )
    assert errors is not None
    assert errors > 2 * FAILING_WARN_EVERY


async def test_step_durations_go_into_the_histogram(
    sup: Supervisor, vt: VirtualTime, registry: CollectorRegistry
) -> None:
    duration = 0.125

    async def step() -> None:
        vt.now += duration

    sup.spawn_loop("timed", step, 1.0, component="collector")
    await vt.advance(2.0)

    labels = {"component": "collector", "name": "timed"}
    count = registry.get_sample_value("koordlet_step_duration_seconds_count", labels)
    total = registry.get_sample_value("koordlet_step_duration_seconds_sum", labels)
    assert count == 3
    assert total == pytest.approx(3 * duration)


async def test_a_loop_keeps_the_start_and_duration_of_its_recent_steps(
    sup: Supervisor, vt: VirtualTime
) -> None:
    durations = iter([0.25, 0.5] * 50)

    async def step() -> None:
        vt.now += next(durations)

    sup.spawn_loop("paced", step, 1.0)
    await vt.advance(2.0)
    assert state_of(sup, "paced")["recent_steps"] == ((0.0, 0.25), (1.0, 0.5), (2.0, 0.25))

    await vt.advance(100.0)  # only the last HISTORY steps are kept
    recent = state_of(sup, "paced")["recent_steps"]
    assert isinstance(recent, tuple)
    assert len(recent) == HISTORY
    assert recent[-1][0] == 102.0


async def test_a_step_that_exceeds_its_timeout_fails_and_the_loop_goes_on(
    sup: Supervisor, registry: CollectorRegistry
) -> None:
    never = asyncio.Event()
    timed_out = asyncio.Event()

    async def hangs() -> None:
        try:
            await never.wait()
        except asyncio.CancelledError:
            timed_out.set()
            raise

    sup.spawn_loop("hung", hangs, 1.0, step_timeout=0.01)
    async with asyncio.timeout(5):
        await timed_out.wait()
    await _settle()

    labels = {"component": "loop", "name": "hung"}
    assert registry.get_sample_value("koordlet_step_errors_total", labels) == 1
    assert "exceeded" in str(state_of(sup, "hung")["last_error"])


async def test_an_eternal_task_that_returns_is_logged_as_a_bug_and_restarted_with_backoff(
    sup: Supervisor, vt: VirtualTime, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    starts: list[float] = []

    async def returns() -> None:
        starts.append(vt.now)

    sup.spawn("watch", returns)
    await vt.advance(7.0)

    assert starts == [0.0, 1.0, 3.0, 7.0]  # backoff 1, 2, 4
    labels = {"name": "watch", "reason": "returned"}
    assert registry.get_sample_value("koordlet_task_restarts_total", labels) == len(starts)
    bugs = [r for r in caplog.records if r.levelno == logging.ERROR and "BUG" in r.getMessage()]
    assert len(bugs) == len(starts)


async def test_an_eternal_task_that_raises_is_restarted_with_a_capped_exponential_backoff(
    sup: Supervisor, vt: VirtualTime, registry: CollectorRegistry
) -> None:
    starts: list[float] = []

    async def crashes() -> None:
        starts.append(vt.now)
        raise ConnectionError("apiserver gone")

    sup.spawn("informer", crashes)
    await vt.advance(15.0)

    assert starts == [0.0, 1.0, 3.0, 7.0, 11.0, 15.0]  # 1, 2, 4, then capped at 4
    labels = {"name": "informer", "reason": "raised"}
    assert registry.get_sample_value("koordlet_task_restarts_total", labels) == len(starts)
    state = state_of(sup, "informer")
    assert state["restarts"] == len(starts)
    assert state["last_error"] == "ConnectionError: apiserver gone"


async def test_the_backoff_resets_once_an_eternal_task_ran_longer_than_the_cap(
    sup: Supervisor, vt: VirtualTime
) -> None:
    starts: list[float] = []

    async def sometimes_lasts() -> None:
        starts.append(vt.now)
        if len(starts) == 3:
            await vt.sleep(10.0)  # a healthy stretch, longer than backoff_max
        raise ConnectionError("dropped")

    sup.spawn("watch", sometimes_lasts)
    await vt.advance(15.0)

    # 0 fails, +1 -> 1 fails, +2 -> 3 runs until 13 and fails, backoff back to 1 -> 14.
    assert starts == [0.0, 1.0, 3.0, 14.0]


async def test_stop_cancels_every_task_within_the_timeout(
    registry: CollectorRegistry, vt: VirtualTime
) -> None:
    sup = Supervisor(SelfMetrics(registry), clock=vt, sleep=vt.sleep)
    forever = asyncio.Event()

    async def step() -> None:
        return None

    async def eternal() -> None:
        await forever.wait()

    loop_task = sup.spawn_loop("tick", step, 1.0)
    eternal_task = sup.spawn("serve", eternal)
    await vt.advance(1.0)

    assert await sup.stop(timeout=1.0) == ()
    assert loop_task.cancelled()
    assert eternal_task.cancelled()
    assert {s["name"]: s["state"] for s in sup.describe()} == {
        "serve": "stopped",
        "tick": "stopped",
    }


async def test_stop_names_a_task_that_ignores_cancellation(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    sup = Supervisor(SelfMetrics(registry))
    released = asyncio.Event()
    started = asyncio.Event()

    async def stubborn() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await released.wait()  # ignores the first cancellation
            raise

    sup.spawn("stubborn", stubborn)
    await started.wait()

    assert await sup.stop(timeout=0.01) == ("stubborn",)
    assert any("did not stop" in r.getMessage() for r in caplog.records)
    released.set()
    assert await sup.stop(timeout=1.0) == ()


async def test_names_are_unique_and_a_stopped_supervisor_spawns_nothing(
    registry: CollectorRegistry,
) -> None:
    sup = Supervisor(SelfMetrics(registry))

    async def step() -> None:
        return None

    sup.spawn_loop("once", step, 10.0)
    with pytest.raises(ValueError, match="already running"):
        sup.spawn_loop("once", step, 10.0)
    await sup.stop(timeout=1.0)
    with pytest.raises(RuntimeError, match="stopped"):
        sup.spawn_loop("later", step, 10.0)


@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan"), float("inf")])
def test_a_loop_needs_a_positive_finite_interval(
    registry: CollectorRegistry, interval: float
) -> None:
    sup = Supervisor(SelfMetrics(registry))

    async def step() -> None:
        return None

    with pytest.raises(ValueError, match="interval"):
        sup.spawn_loop("bad", step, interval)
