"""The server's request limits and the protective loops' health behind /readyz.

The limiter's arithmetic runs on a virtual clock; its effect on the wire is checked on a real
aiohttp server with real clients (503 and ``Retry-After`` beyond the limits, probes answered
apart), without asserting on how long anything took.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from koordlet.metriccache.series import SeriesKey
from koordlet.qos.framework import QoSBook
from koordlet.selfmetrics import Readiness, SelfMetrics
from koordlet.server import ServerDeps, build_app, start_server
from koordlet.server.app import LIMITERS, PROBE_LIMITS, Limiters, ServerLimits
from koordlet.server.health import LoopHealth
from koordlet.server.limiter import LimitConfig, Refusal, RequestLimiter
from koordlet.statesinformer.model import WorkloadSnapshot


class VirtualTime:
    """A monotonic clock, a CPU clock and a sleep that moves the clock (no real waiting)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.cpu = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def cpu_clock(self) -> float:
        return self.cpu

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def limiter(vt: VirtualTime, **kwargs: float) -> RequestLimiter:
    config = LimitConfig(**kwargs)  # type: ignore[arg-type]
    return RequestLimiter(config, clock=vt, cpu_clock=vt.cpu_clock, sleep=vt.sleep)


async def test_requests_beyond_the_in_flight_cap_are_refused_after_a_pause() -> None:
    vt = VirtualTime()
    lim = limiter(vt, max_in_flight=2, reject_delay=0.5, max_rejecting=1)
    assert await lim.admit() is None
    assert await lim.admit() is None

    assert await lim.admit() == Refusal("busy", close=False)
    assert vt.slept == [0.5]
    assert lim.refused == {"busy": 1, "budget": 0}

    lim.release(0.001)
    assert await lim.admit() is None  # room again once one is done


async def test_past_max_rejecting_a_refusal_is_immediate_and_closes_the_connection() -> None:
    vt = VirtualTime()
    lim = limiter(vt, max_in_flight=1, reject_delay=0.5, max_rejecting=1)
    assert await lim.admit() is None
    gate = asyncio.Event()

    async def held_sleep(seconds: float) -> None:
        await gate.wait()

    lim._sleep = held_sleep  # the first refusal holds its pause while the next one arrives
    first = asyncio.ensure_future(lim.admit())
    await asyncio.sleep(0)
    assert await lim.admit() == Refusal("busy", close=True)
    gate.set()
    assert await first == Refusal("busy", close=False)


async def test_an_empty_cpu_bucket_makes_requests_wait_for_the_refill() -> None:
    vt = VirtualTime()
    lim = limiter(vt, cpu_share=0.1, burst=0.05, overhead=0.0, max_wait=2.0)
    assert await lim.admit() is None
    lim.release(0.15)  # 0.15 s of CPU from a 0.05 s bucket: 0.1 s owed

    assert await lim.admit() is None
    # 0.1 s owed at 0.1 s a second: about one second of sleeping, at no cost.
    assert sum(vt.slept) == pytest.approx(1.0, abs=0.01)
    assert lim.tokens() > 0


async def test_a_request_that_cannot_get_budget_within_max_wait_is_refused() -> None:
    vt = VirtualTime()
    lim = limiter(vt, cpu_share=0.01, burst=0.01, overhead=0.0, max_wait=1.0)
    assert await lim.admit() is None
    lim.release(1.0)  # 100 s of refill owed

    assert await lim.admit() == Refusal("budget", close=False)
    assert sum(vt.slept) == pytest.approx(1.0)
    assert lim.in_flight == 0
    assert lim.refused["budget"] == 1


def test_a_request_is_charged_its_cpu_and_the_overhead() -> None:
    vt = VirtualTime()
    lim = limiter(vt, overhead=0.001, burst=1.0)
    lim.in_flight = 1
    lim.release(0.004)
    assert lim.cpu_seconds == pytest.approx(0.005)
    assert lim.tokens() == pytest.approx(0.995)
    assert lim.describe()["served"] == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"max_in_flight": 0},
        {"cpu_share": 0.0},
        {"cpu_share": 1.5},
        {"burst": 0.0},
        {"max_wait": -1.0},
        {"max_rejecting": -1},
    ],
)
def test_nonsense_limits_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LimitConfig(**bad)  # type: ignore[arg-type]


# On the wire ----------------------------------------------------------------------------------


@dataclass
class Served:
    base: str
    limiters: Limiters


def deps_for(limits: ServerLimits, health: LoopHealth) -> tuple[ServerDeps, Readiness]:
    registry = CollectorRegistry()
    readiness = Readiness(("only",), metrics=SelfMetrics(registry))
    readiness.mark_done("only")
    registry.register(health)
    deps = ServerDeps(
        registry=registry,
        readiness=readiness,
        cache=_EmptyCache(),
        workloads=WorkloadSnapshot,
        capabilities=dict,
        config=dict,
        tasks=list,
        health=health,
        limits=limits,
    )
    return deps, readiness


class _EmptyCache:
    def last_sample(self, metric: str, entity: str, /) -> None:
        return None

    def entities(self, metric: str | None = None, /) -> list[str]:
        return []

    def last_values(self, keys: Sequence[SeriesKey], since: float, /) -> list[float | None]:
        return [None for _ in keys]

    def has_series(self, metric: str, /) -> bool:
        return False

    def aggregate(self, metric: str, entity: str, start: float, end: float, /) -> None:
        return None

    def stats(self) -> dict[str, int]:
        return {}


@contextlib.asynccontextmanager
async def serve(limits: ServerLimits, health: LoopHealth) -> AsyncIterator[Served]:
    deps, _ = deps_for(limits, health)
    app = build_app(deps)
    handle = await start_server(app, "127.0.0.1", 0)
    try:
        yield Served(f"http://127.0.0.1:{handle.port}", app[LIMITERS])
    finally:
        await handle.stop()


async def until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(5.0):
        while not check():  # noqa: ASYNC110 - polls the limiter, which has no event to wait on
            await asyncio.sleep(0.001)


@pytest.fixture
async def starved() -> AsyncIterator[Served]:
    """A server whose reads get one request in flight and almost no CPU budget."""
    reads = LimitConfig(max_in_flight=1, cpu_share=1e-6, burst=1e-9, max_wait=0.2, reject_delay=0.0)
    async with serve(ServerLimits(reads=reads, probes=PROBE_LIMITS), LoopHealth()) as served:
        yield served


async def test_beyond_the_limits_requests_get_503_with_retry_after_and_probes_still_answer(
    starved: Served,
) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(starved.base + "/debug") as resp:
            assert resp.status == 200  # the first one spends the whole bucket

        async def get(path: str) -> tuple[int, str | None, str]:
            async with session.get(starved.base + path) as resp:
                return resp.status, resp.headers.get("Retry-After"), await resp.text()

        # One waits for budget (then gives up), the other finds no room at all.
        waiting = asyncio.ensure_future(get("/metrics"))
        await until(lambda: starved.limiters.reads.in_flight == 1)
        busy = await get("/debug/config")
        budget = await waiting
        health = await get("/healthz")

    assert busy[:2] == (503, "1")
    assert "too many requests in flight" in busy[2]
    assert budget[:2] == (503, "1")
    assert "budget" in budget[2]
    assert health == (200, None, "ok")


async def test_readyz_names_the_loops_that_are_behind_and_the_gauges_say_so() -> None:
    now = [5000.0]
    health = LoopHealth(clock=lambda: now[0])
    collect_done: list[float | None] = [None]
    health.watch("daemon", "collect", 1.0, lambda: collect_done[0])
    book = QoSBook(clock=lambda: now[0])
    health.watch_rounds("qos", book, {"cpusuppress": 1.0, "memoryevict": 2.0}, prefix="qos/")

    async with serve(ServerLimits(), health) as served, aiohttp.ClientSession() as session:

        async def readyz() -> tuple[int, str]:
            async with session.get(served.base + "/readyz") as resp:
                return resp.status, await resp.text()

        async def gauges() -> dict[str, float]:
            async with session.get(served.base + "/metrics") as resp:
                text = await resp.text()
            return {
                line.split('name="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("koordlet_loop_behind{")
            }

        assert await readyz() == (200, "ok")  # just started: nothing is due yet

        now[0] += 3.5  # collect (1 s) and cpusuppress (1 s) have no round in 3 intervals
        book.round_started("memoryevict")
        book.round_done("memoryevict", 0.01, None)
        status, text = await readyz()
        assert status == 503
        assert "collect" in text
        assert "qos/cpusuppress" in text
        assert "memoryevict" not in text
        assert (await gauges()) == {
            "collect": 1.0,
            "qos/cpusuppress": 1.0,
            "qos/memoryevict": 0.0,
        }

        collect_done[0] = now[0]
        book.round_done("cpusuppress", 0.01, ValueError("a failed round still completed"))
        assert await readyz() == (200, "ok")


def test_a_loop_is_judged_from_its_last_round_or_from_when_it_was_watched() -> None:
    now = [100.0]
    health = LoopHealth(clock=lambda: now[0])
    done: list[float | None] = [None]
    health.watch("daemon", "collect", 2.0, lambda: done[0])

    now[0] = 106.0
    assert [st.behind for st in health.states()] == [False]  # exactly 3 intervals: not yet
    now[0] = 106.5
    (state,) = health.behind()
    assert (state.name, state.age) == ("collect", 6.5)
    done[0] = 105.0
    assert health.behind() == []
    assert health.as_json()[0]["round_age_s"] == 1.5
