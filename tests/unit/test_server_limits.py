"""The server's request limits and the protective loops' health behind /readyz.

The limiter's arithmetic runs on a virtual clock; its effect on the wire is checked on a real
aiohttp server with real clients (503 and ``Retry-After`` beyond the limits, probes answered
apart), without asserting on how long anything took. The ``/debug/ui`` page and its views are
reads like the rest, and the page's own polling stays inside the default limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from apis.extension import KubeQOS, QoSClass
from apis.slo_inforce import NodeSLOInForce
from koordlet.config import CollectConfig, KoordletConfig
from koordlet.metriccache import MetricCache
from koordlet.metriccache import series as series_names
from koordlet.metriccache.series import Sample, SeriesKey
from koordlet.qos.framework import QoSBook
from koordlet.selfmetrics import Readiness, SelfMetrics
from koordlet.server import ServerDeps, build_app, start_server
from koordlet.server.app import LIMITERS, PROBE_LIMITS, Limiters, ServerLimits
from koordlet.server.health import LoopHealth
from koordlet.server.limiter import LimitConfig, LimiterFamilies, Refusal, RequestLimiter
from koordlet.server.summary import UiDeps, thresholds_of
from koordlet.server.ui import load_page
from koordlet.statesinformer.model import PodInfo, WorkloadSnapshot


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


async def test_the_limiter_families_count_served_refused_and_charged_by_class() -> None:
    vt = VirtualTime()
    reads = limiter(vt, max_in_flight=1, reject_delay=0.0, overhead=0.0)
    probes = limiter(vt, overhead=0.0)
    assert await reads.admit() is None
    assert await reads.admit() == Refusal("busy", close=False)
    reads.release(0.25)
    assert await probes.admit() is None
    probes.release(0.5)

    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in LimiterFamilies({"reads": reads, "probes": probes}).collect()
        for s in family.samples
    }
    assert samples == {
        ("koordlet_http_requests_served_total", (("class", "probes"),)): 1.0,
        ("koordlet_http_requests_served_total", (("class", "reads"),)): 1.0,
        ("koordlet_http_requests_limited_total", (("class", "probes"), ("reason", "budget"))): 0,
        ("koordlet_http_requests_limited_total", (("class", "probes"), ("reason", "busy"))): 0,
        ("koordlet_http_requests_limited_total", (("class", "reads"), ("reason", "budget"))): 0,
        ("koordlet_http_requests_limited_total", (("class", "reads"), ("reason", "busy"))): 1.0,
        ("koordlet_http_request_cpu_seconds_total", (("class", "probes"),)): 0.5,
        ("koordlet_http_request_cpu_seconds_total", (("class", "reads"),)): 0.25,
    }


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


def ui_deps(points: Callable[[str, str, float, float], list[tuple[float, float]]]) -> UiDeps:
    config = KoordletConfig(node_name="node-a", collect=CollectConfig(res_used_interval=1.0))
    return UiDeps(
        config=config,
        thresholds=thresholds_of(NodeSLOInForce),
        node_info=lambda: None,
        points=points,
    )


@contextlib.asynccontextmanager
async def serve(
    limits: ServerLimits, health: LoopHealth, ui: UiDeps | None = None
) -> AsyncIterator[Served]:
    deps, _ = deps_for(limits, health)
    app = build_app(deps, ui)
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


async def test_metrics_serves_the_limiters_counters(starved: Served) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            async with session.get(starved.base + "/healthz") as resp:
                assert resp.status == 200
        async with session.get(starved.base + "/metrics") as resp:
            assert resp.status == 200  # the first read spends the whole bucket
            text = await resp.text()
        async with session.get(starved.base + "/debug/config") as resp:
            assert resp.status == 503
    families = {f.name: f for f in text_string_to_metric_families(text)}
    served = {s.labels["class"]: s.value for s in families["koordlet_http_requests_served"].samples}
    assert served == {"probes": 3.0, "reads": 0.0}  # the scrape itself was still in flight
    limited = families["koordlet_http_requests_limited"].samples
    assert {(s.labels["class"], s.labels["reason"]) for s in limited} == {
        ("reads", "busy"),
        ("reads", "budget"),
        ("probes", "busy"),
        ("probes", "budget"),
    }
    assert starved.limiters.reads.refused == {"busy": 0, "budget": 1}


async def test_the_ui_page_and_its_views_are_served_under_the_read_limits() -> None:
    reads = LimitConfig(max_in_flight=8, cpu_share=1e-6, burst=1e-9, max_wait=0.05, reject_delay=0)
    limits = ServerLimits(reads=reads, probes=PROBE_LIMITS)
    async with (
        serve(limits, LoopHealth(), ui_deps(lambda *_: [])) as served,
        aiohttp.ClientSession() as session,
    ):
        async with session.get(served.base + "/debug/ui") as resp:
            assert resp.status == 200  # the first one spends the whole bucket
        for path in ("/debug/summary", "/debug/series?metric=a&group=qos", "/debug/ui"):
            async with session.get(served.base + path) as resp:
                assert (resp.status, resp.headers.get("Retry-After")) == (503, "1"), path
        async with session.get(served.base + "/readyz") as resp:
            assert resp.status == 200
    assert served.limiters.reads.refused == {"busy": 0, "budget": 3}


UI_PODS = 200
UI_WINDOW_S = 600


def page_fetches() -> tuple[list[str], list[str]]:
    """What ``ui.html`` asks for each poll: the ``/debug/series`` queries of its charts and the
    other ``/debug`` paths it fetches beside them (read from the page, not copied)."""
    page = load_page()[0].decode()
    feeds = re.findall(r'"(metric=\w+&(?:entity|group)=\w+)"', page)
    others = re.findall(r'getJSON\("(/debug/(?:qos|audit)[^"]*)"\)', page)
    assert len(feeds) >= 8, feeds
    assert len(others) == 3, others
    return feeds, others


async def test_the_pages_own_polling_is_never_refused_under_the_default_limits() -> None:
    """One browser tab on a 200-pod node with the cache full (600 s of pod samples): a first poll
    with whole windows (the costliest: the class charts sum 240,000 samples), then one with the
    short windows the page asks for afterwards, each over 6 connections, Chromium's limit per
    host. Nothing is refused: the first poll costs about 0.1 s of CPU here, within the bucket's
    burst and the 2 s an admitted request may wait for the 10 % refill."""
    now = 1_700_000_000.0
    cache = MetricCache(clock=lambda: now)
    classes = [QoSClass.LS, QoSClass.LS, QoSClass.BE, QoSClass.LSR]
    pods = {
        f"u{i}": PodInfo(
            uid=f"u{i}",
            name=f"p{i}",
            namespace="ns",
            qos=classes[i % 4],
            kube_qos=KubeQOS.BURSTABLE,
            cgroup_dir=f"kubepods/podu{i}",
        )
        for i in range(UI_PODS)
    }
    metrics = (series_names.POD_CPU_USAGE, series_names.POD_MEMORY_USAGE)
    for k in range(UI_WINDOW_S):
        cache.append(
            now - UI_WINDOW_S + 1 + k,
            [
                Sample(SeriesKey(m, series_names.pod_entity(u)), 1.0 + k)
                for u in pods
                for m in metrics
            ],
        )
    deps, _ = deps_for(ServerLimits(), LoopHealth())
    snapshot = WorkloadSnapshot(pods=pods)
    deps = replace(deps, cache=cache, workloads=lambda: snapshot, clock=lambda: now)
    app = build_app(deps, ui_deps(cache.points))
    handle = await start_server(app, "127.0.0.1", 0)
    feeds, others = page_fetches()
    base = f"http://127.0.0.1:{handle.port}"
    statuses: list[int] = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=6)) as session:

            async def get(path: str) -> None:
                async with session.get(base + path) as resp:
                    await resp.read()
                    statuses.append(resp.status)

            for window in (UI_WINDOW_S, 6):
                await get("/debug/summary")
                queries = [f"/debug/series?{q}&window={window}&step=2" for q in feeds]
                await asyncio.gather(*(get(path) for path in [*queries, *others]))
    finally:
        await handle.stop()
    reads = app[LIMITERS].reads
    assert reads.refused == {"busy": 0, "budget": 0}
    assert len(statuses) == 2 * (1 + len(feeds) + len(others))
    assert set(statuses) <= {200, 404}  # 404: this server has no audit log or QoS manager
    assert statuses.count(200) == 2 * (1 + len(feeds))


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
