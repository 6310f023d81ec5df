"""The collector runner: shared memoized tick, guarded steps, intervals, storing the results."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil
import pytest
from prometheus_client import CollectorRegistry

from apis.extension import KubeQOS
from koordlet.collectors.framework import CollectorContext, CollectResult, Tick
from koordlet.collectors.noderesource import NODE_MEMORY
from koordlet.collectors.runner import CollectorRunner, TickState, ticks_per_step
from koordlet.collectors.table import build_collectors
from koordlet.config import KoordletConfig
from koordlet.errors import CgroupGoneError, ConfigError, HostError
from koordlet.metriccache import MetricCache
from koordlet.metriccache import series as s
from koordlet.metriccache.series import Sample, SeriesKey
from koordlet.selfmetrics import SelfMetrics
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system import cgroupstats
from koordlet.system.cgroups import CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.cgroupstats import read_file_bytes
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths
from tests.fakehost import FakeHost, container_id

EMPTY = WorkloadSnapshot()
PATHS = HostPaths()


class StepCollector:
    """A collector whose step is a plain function of the tick."""

    def __init__(
        self, name: str, step: Callable[[Tick], CollectResult], interval: float = 1.0
    ) -> None:
        self.name = name
        self.interval = interval
        self.step = step
        self.ticks: list[float] = []

    def collect(self, tick: Tick) -> CollectResult:
        self.ticks.append(tick.now)
        return self.step(tick)


def emit(metric: str, value: float, entity: str = s.NODE) -> Callable[[Tick], CollectResult]:
    return lambda tick: CollectResult(samples=[Sample(SeriesKey(metric, entity), value)])


def fail(tick: Tick) -> CollectResult:
    raise RuntimeError("broken collector")


def runner(
    collectors: Sequence[StepCollector],
    cache: MetricCache | None = None,
    *,
    base_interval: float = 1.0,
    read: Callable[[str], bytes] = read_file_bytes,
    recorder: SelfMetrics | None = None,
) -> CollectorRunner:
    return CollectorRunner(
        collectors,
        cache or MetricCache(clock=lambda: 100.0),
        lambda: EMPTY,
        base_interval=base_interval,
        read=read,
        recorder=recorder,
    )


def test_a_failing_collector_is_recorded_and_the_others_still_store_their_samples(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = MetricCache(clock=lambda: 100.0)
    r = runner(
        [
            StepCollector("first", emit(s.NODE_CPU_USAGE, 1.0)),
            StepCollector("broken", fail),
            StepCollector("last", emit(s.NODE_MEMORY_USAGE, 2.0)),
        ],
        cache,
    )

    with caplog.at_level(logging.DEBUG, logger="koordlet.collectors.runner"):
        for now in (98.0, 99.0):
            r.apply(r.run_tick(now))

    report = r.run_tick(100.0)
    assert list(report.errors) == ["broken"]
    assert isinstance(report.errors["broken"], RuntimeError)
    assert cache.last_sample(s.NODE_CPU_USAGE, s.NODE) == (99.0, 1.0)
    assert cache.last_sample(s.NODE_MEMORY_USAGE, s.NODE) == (99.0, 2.0)
    assert r.failing == {"broken"}
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 1  # once with its traceback, not once per tick
    assert errors[0].exc_info is not None


def test_a_collector_that_recovers_is_logged_once_as_working_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outcomes = [fail, emit(s.NODE_CPU_USAGE, 1.0)]
    flaky = StepCollector("flaky", lambda tick: outcomes.pop(0)(tick))
    r = runner([flaky])

    with caplog.at_level(logging.INFO, logger="koordlet.collectors.runner"):
        r.apply(r.run_tick(1.0))
        r.apply(r.run_tick(2.0))

    assert r.failing == frozenset()
    assert [rec.getMessage() for rec in caplog.records][-1] == "collector flaky works again"


def test_two_collectors_reading_one_file_in_a_tick_cost_one_read(tmp_path: Path) -> None:
    path = tmp_path / "memory.stat"
    path.write_bytes(b"anon 1\n")
    reads: Counter[str] = Counter()

    def counting(p: str) -> bytes:
        reads[p] += 1
        return read_file_bytes(p)

    def read_it(tick: Tick) -> CollectResult:
        return CollectResult(
            samples=[Sample(SeriesKey(s.NODE_CPU_USAGE, s.NODE), len(tick.read(str(path))))]
        )

    r = runner([StepCollector("a", read_it), StepCollector("b", read_it)], read=counting)
    report = r.run_tick(1.0)
    assert reads[str(path)] == 1
    assert report.reads == 1

    r.run_tick(2.0)
    assert reads[str(path)] == 2  # a new tick reads afresh


def test_a_vanished_file_is_tried_once_per_tick_and_raises_each_time(tmp_path: Path) -> None:
    gone = str(tmp_path / "pod" / "cpu.stat")
    attempts: Counter[str] = Counter()

    def counting(p: str) -> bytes:
        attempts[p] += 1
        return read_file_bytes(p)

    tick = TickState(1.0, EMPTY, read=counting)
    for _ in range(2):
        with pytest.raises(CgroupGoneError):
            tick.read(gone)

    assert attempts[gone] == 1


def test_the_default_reader_memoizes_reads_and_gone_files_and_reads_big_files_whole(
    tmp_path: Path,
) -> None:
    small = tmp_path / "cpuacct.usage"
    small.write_bytes(b"123\n")
    big = tmp_path / "big"
    content = b"".join(b"key%06d %d\n" % (i, i) for i in range(5000))
    assert len(content) > cgroupstats.READ_BUFFER
    big.write_bytes(content)
    gone = str(tmp_path / "pod" / "cpu.stat")
    tick = TickState(1.0, EMPTY)  # read_file_bytes, taken inline

    assert tick.read(str(small)) == b"123\n"
    small.write_bytes(b"456\n")
    assert tick.read(str(small)) == b"123\n"  # the tick's one read
    assert tick.read(str(big)) == content
    for _ in range(2):
        with pytest.raises(CgroupGoneError, match=r"cpu\.stat"):
            tick.read(gone)
    with pytest.raises(HostError) as info:
        tick.read(str(tmp_path))  # a directory: EISDIR, not a cgroup race
    assert not isinstance(info.value, CgroupGoneError)
    assert tick.reads == 4
    assert TickState(2.0, EMPTY).read(str(small)) == b"456\n"  # a new tick reads afresh


def test_tick_last_gives_the_latest_published_value_of_a_series() -> None:
    key = SeriesKey(s.POD_CPU_USAGE, "pod/a")
    tick = TickState(1.0, EMPTY)
    tick.publish([Sample(key, 1.0), Sample(SeriesKey(s.NODE_CPU_USAGE, s.NODE), 4.0)])
    tick.publish([Sample(key, 2.0)])
    assert tick.last(s.POD_CPU_USAGE, "pod/a") == 2.0
    tick.publish([Sample(key, 3.0)])
    assert tick.last(s.POD_CPU_USAGE, "pod/a") == 3.0
    assert tick.last(s.NODE_CPU_USAGE, s.NODE) == 4.0
    assert tick.last(s.POD_CPU_USAGE, "pod/b") is None


def test_tick_last_sees_earlier_collectors_of_the_tick_but_not_later_ones() -> None:
    seen: dict[str, float | None] = {}

    def look(tick: Tick) -> CollectResult:
        seen["cpu"] = tick.last(s.NODE_CPU_USAGE, s.NODE)
        seen["memory"] = tick.last(s.NODE_MEMORY_USAGE, s.NODE)
        return CollectResult()

    r = runner(
        [
            StepCollector("cpu", emit(s.NODE_CPU_USAGE, 3.0)),
            StepCollector("look", look),
            StepCollector("memory", emit(s.NODE_MEMORY_USAGE, 5.0)),
        ]
    )
    r.run_tick(100.0)

    assert seen == {"cpu": 3.0, "memory": None}


@pytest.mark.parametrize(
    ("interval", "base", "every"),
    [(1.0, 1.0, 1), (2.5, 1.0, 3), (60.0, 1.0, 60), (0.5, 1.0, 1), (3.0, 1.5, 2), (0.0, 1.0, 1)],
)
def test_intervals_are_rounded_up_to_whole_base_ticks(
    interval: float, base: float, every: int
) -> None:
    assert ticks_per_step(interval, base) == every


def test_a_collector_runs_at_its_first_tick_then_every_rounded_interval() -> None:
    slow = StepCollector("slow", lambda tick: CollectResult(), interval=2.5)
    fast = StepCollector("fast", lambda tick: CollectResult())
    r = runner([fast, slow])

    for now in range(7):
        r.run_tick(1000.0 + now)

    assert r.every("slow") == 3
    assert slow.ticks == [1000.0, 1003.0, 1006.0]
    assert len(fast.ticks) == 7


def test_a_slightly_late_tick_does_not_push_a_collector_back_a_whole_period() -> None:
    slow = StepCollector("slow", lambda tick: CollectResult(), interval=2.0)
    r = runner([slow])

    for now in (0.0, 1.0, 1.98, 3.0, 4.1):
        r.run_tick(now)

    assert slow.ticks == [0.0, 1.98, 4.1]


def test_apply_stores_samples_at_the_tick_time_and_info_by_name() -> None:
    cache = MetricCache(clock=lambda: 100.0)
    info = StepCollector("info", lambda tick: CollectResult(info={"node_info": {"cpus": 4}}))
    r = runner([StepCollector("cpu", emit(s.NODE_CPU_USAGE, 0.75)), info], cache)

    r.apply(r.run_tick(99.5))

    assert cache.last_sample(s.NODE_CPU_USAGE, s.NODE) == (99.5, 0.75)
    assert cache.get_info("node_info") == {"cpus": 4}


def test_step_durations_and_failures_feed_the_self_metrics() -> None:
    registry = CollectorRegistry()
    r = runner(
        [StepCollector("ok", emit(s.NODE_CPU_USAGE, 1.0)), StepCollector("broken", fail)],
        recorder=SelfMetrics(registry),
    )

    for now in (1.0, 2.0):
        r.apply(r.run_tick(now))

    def value(name: str, collector: str) -> float | None:
        return registry.get_sample_value(name, {"component": "collector", "name": collector})

    assert value("koordlet_step_duration_seconds_count", "ok") == 2
    assert value("koordlet_step_errors_total", "broken") == 2
    assert value("koordlet_step_errors_total", "ok") is None


def test_unsupported_sources_are_reported_and_logged_once_until_they_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    states = [{"numa": "no NUMA"}, {"numa": "no NUMA"}, {}]
    r = runner([StepCollector("node", lambda tick: CollectResult(unsupported=states.pop(0)))])

    with caplog.at_level(logging.INFO, logger="koordlet.collectors.runner"):
        r.apply(r.run_tick(1.0))
        r.apply(r.run_tick(2.0))
        assert r.unsupported == {"node/numa": "no NUMA"}
        r.apply(r.run_tick(3.0))

    assert r.unsupported == {}
    assert [rec.getMessage() for rec in caplog.records] == [
        "collector source node/numa unsupported: no NUMA",
        "collector source node/numa available again",
    ]


def test_a_bad_base_interval_or_duplicate_names_are_configuration_errors() -> None:
    with pytest.raises(ConfigError, match="res_used_interval"):
        runner([], base_interval=0.0)
    with pytest.raises(ConfigError, match="duplicate"):
        runner([StepCollector("a", fail), StepCollector("a", fail)])


def test_two_ticks_of_the_whole_table_give_consistent_node_pod_and_system_usage(
    fake_host: FakeHost,
) -> None:
    uid = "3c2b1a09-8f7e-4d6c-9b5a-493827161504"
    pod_rel, _ = fake_host.add_pod(uid, KubeQOS.BURSTABLE, [("containerd", container_id("c"))])
    snap = WorkloadSnapshot(pods=KubepodsSource(fake_host.host).list_pods(), generation=1)
    cache = MetricCache(clock=lambda: 101.0)
    collectors = build_collectors(
        CollectorContext(host=fake_host.host, config=KoordletConfig(node_name="test"))
    )
    r = CollectorRunner(collectors, cache, lambda: snap)
    fake_host.set_cpu_usage(pod_rel, 10_000_000_000)
    r.apply(r.run_tick(100.0))

    fake_host.advance_proc_stat(user=200, system=100, idle=100)  # 3 cores busy over 1 s
    fake_host.set_cpu_usage(pod_rel, 11_000_000_000)  # 1 core of it is the pod
    report = r.run_tick(101.0)
    r.apply(report)

    assert report.errors == {}
    assert cache.last(s.NODE_CPU_USAGE, s.NODE) == pytest.approx(3.0)
    assert cache.last(s.POD_CPU_USAGE, s.pod_entity(uid)) == pytest.approx(1.0)
    assert cache.last(s.SYSTEM_CPU_USAGE, s.SYSTEM) == pytest.approx(2.0)
    node_memory = cache.last(s.NODE_MEMORY_USAGE, s.NODE)
    pod_memory = cache.last(s.POD_MEMORY_USAGE, s.pod_entity(uid))
    assert node_memory is not None
    assert pod_memory is not None
    assert cache.last(s.SYSTEM_MEMORY_USAGE, s.SYSTEM) == node_memory - pod_memory
    assert cache.get_info("node_info") is not None


# On-demand reads ---------------------------------------------------------------------------------


def on_demand_runner(fake_host: FakeHost, cache: MetricCache, now: list[float]) -> CollectorRunner:
    return CollectorRunner(
        [StepCollector("node", emit(s.NODE_MEMORY_USAGE, 1.0))],
        cache,
        lambda: EMPTY,
        host=fake_host.host,
        clock=lambda: now[0],
    )


async def test_an_on_demand_read_returns_the_value_and_stores_its_samples_at_once(
    fake_host: FakeHost,
) -> None:
    fake_host.set_meminfo(MemTotal=8 << 20, MemFree=3 << 20, MemAvailable=5 << 20)
    cache = MetricCache(clock=lambda: 100.0)
    r = on_demand_runner(fake_host, cache, [99.5])

    meminfo = await r.read_now(NODE_MEMORY)

    assert (meminfo.mem_total, meminfo.used) == (8 << 30, 3 << 30)  # kB in the file
    assert cache.last_sample(s.NODE_MEMORY_USAGE, s.NODE) == (99.5, float(3 << 30))
    assert cache.last_sample(s.NODE_MEMORY_WITH_PAGE_CACHE, s.NODE) == (99.5, float(5 << 30))


async def test_during_a_tick_in_flight_fresh_samples_wait_for_its_apply_and_stay_newest(
    fake_host: FakeHost,
) -> None:
    fake_host.set_meminfo(MemTotal=8 << 20, MemFree=3 << 20, MemAvailable=6 << 20)
    cache = MetricCache(clock=lambda: 100.0)
    now = [99.0]
    r = on_demand_runner(fake_host, cache, now)

    report = r.run_tick(98.0)  # in flight until apply: the cache must not be written now
    await r.read_now(NODE_MEMORY)  # at 99.0
    assert cache.last_sample(s.NODE_MEMORY_USAGE, s.NODE) is None
    r.apply(report)

    assert cache.last_sample(s.NODE_MEMORY_USAGE, s.NODE) == (99.0, float(2 << 30))
    older = r.run_tick(99.5)
    now[0] = 99.2  # a read stamped before the tick that is in flight
    await r.read_now(NODE_MEMORY)
    r.apply(older)
    assert cache.last_sample(s.NODE_MEMORY_USAGE, s.NODE) == (99.5, 1.0)  # the tick's, newer


def remove_meminfo(fake: FakeHost) -> None:
    Path(fake.host.paths.proc("meminfo")).unlink()


async def test_a_failing_on_demand_read_raises_and_stores_nothing(fake_host: FakeHost) -> None:
    cache = MetricCache(clock=lambda: 100.0)
    r = on_demand_runner(fake_host, cache, [99.0])
    remove_meminfo(fake_host)

    with pytest.raises(HostError, match="meminfo: missing"):
        await r.read_now(NODE_MEMORY)
    assert cache.series_count() == 0
    with pytest.raises(RuntimeError, match="without a host"):
        await runner([]).read_now(NODE_MEMORY)


async def test_the_on_demand_node_memory_matches_this_machines_kernel() -> None:
    cache = MetricCache()
    r = CollectorRunner(
        [],
        cache,
        lambda: EMPTY,
        host=Host(
            PATHS, detect_layout(PATHS, version=CgroupVersion.V1, driver=CgroupDriver.CGROUPFS)
        ),
    )

    meminfo = await r.read_now(NODE_MEMORY)

    assert meminfo.mem_total == psutil.virtual_memory().total
    assert cache.last(s.NODE_MEMORY_USAGE, s.NODE) == float(meminfo.used)
