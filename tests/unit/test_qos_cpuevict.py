"""CPU eviction: Koordinator's satisfaction, coverage and threshold arithmetic and BE order as
tables, and whole rounds against the metric cache, the evictor and a recording backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from apis.extension import KubeQOS, QoSClass
from koordlet.executor.audit import AuditLog
from koordlet.metriccache import series
from koordlet.metriccache.store import MetricCache
from koordlet.qos.cpuevict import CPUEvict
from koordlet.qos.cpuevictrules import (
    be_usage_high_enough,
    order_be,
    release_by_satisfaction,
    release_by_used,
    satisfaction_bounds,
    window_covered,
    window_seconds,
)
from koordlet.qos.evictor import LABEL_EVICTION_ENABLED, REASON_BE_CPU_SATISFACTION, Evictor, Victim
from koordlet.qos.evicttask import Candidate, allocatable_release
from koordlet.qos.framework import QoSBook, StrategyContext
from koordlet.qos.shared import InvalidThreshold
from koordlet.statesinformer.model import PodInfo, WorkloadSnapshot
from tests.strategyrig import config, in_force

BATCH_CPU = "kubernetes.io/batch-cpu"


def pod(
    n: int,
    qos: QoSClass = QoSClass.BE,
    *,
    priority: int | None = None,
    request: int | None = None,
    labels: dict[str, str] | None = None,
) -> PodInfo:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    kube = KubeQOS.BESTEFFORT if qos is QoSClass.BE else KubeQOS.BURSTABLE
    return PodInfo(
        uid,
        f"p{n}",
        "ns",
        qos,
        kube,
        f"kubepods/besteffort/pod{uid}",
        priority=priority,
        cpu_request_milli=request,
        labels=labels or {},
        extended_requests={BATCH_CPU: request} if request and qos is QoSClass.BE else {},
    )


# Tables ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_milli", "limit", "lower", "upper", "release"),
    [
        (10_000, 3_000, 30, 60, 3_000),  # satisfaction 30% <= 30%: release 10000 * (0.6 - 0.3)
        (10_000, 3_100, 30, 60, 0),  # 31% > 30%: satisfied enough
        (10_000, 1_000, 40, 50, 4_000),
        (0, 1_000, 40, 50, 0),  # no BE request
        (8_000, 2_000, 25, 25, 0),  # at the upper bound: nothing to gain
    ],
)
def test_release_by_be_satisfaction(
    request_milli: float, limit: float, lower: int, upper: int, release: int
) -> None:
    assert release_by_satisfaction(request_milli, limit, lower, upper) == release


@pytest.mark.parametrize(
    ("usage", "limit", "threshold", "high"),
    [
        (9_000, 10_000, None, True),  # default 90%
        (8_999, 10_000, None, False),
        (500, 900, 90, True),  # a limit under one core always passes
        (5_000, 0, 90, False),
        (6_000, 10_000, 60, True),
    ],
)
def test_be_usage_must_be_high_against_its_limit(
    usage: float, limit: float, threshold: int | None, high: bool
) -> None:
    assert be_usage_high_enough(usage, limit, threshold) is high


@pytest.mark.parametrize(
    ("window", "interval", "count", "covered"),
    [(60, 1, 20, True), (60, 1, 19, False), (10, 1, 3, True), (10, 1, 2, False), (2, 1, 0, True)],
)
def test_the_window_must_be_covered_a_third(
    window: int, interval: float, count: int, covered: bool
) -> None:
    assert window_covered(window, interval, count) is covered


def test_the_window_is_twice_the_interval_unless_configured_longer() -> None:
    # upstream's cpuEvict: windowSeconds = 2 x interval, or the configured window when it
    # exceeds the interval
    assert window_seconds(1.0, None) == 2
    assert window_seconds(1.0, 60) == 60
    assert window_seconds(10.0, 5) == 20
    assert window_seconds(10.0, 15) == 15


@pytest.mark.parametrize(
    ("lower", "upper"), [(None, 50), (0, 50), (61, 80), (30, 100), (40, 30), (30, 0)]
)
def test_satisfaction_bounds_upstream_refuses(lower: int | None, upper: int | None) -> None:
    with pytest.raises(InvalidThreshold):
        satisfaction_bounds(lower, upper)


@pytest.mark.parametrize(
    ("used", "capacity", "threshold", "lower", "release"),
    [
        (3.2, 4000, 80, 78, 80),  # 80% of 4 cores: release down to 78%
        (3.19, 4000, 80, 78, 0),
        (3.6, 4000, 80, 70, 800),
    ],
)
def test_release_by_node_cpu_usage(
    used: float, capacity: int, threshold: int, lower: int, release: int
) -> None:
    assert release_by_used(used, capacity, threshold, lower) == release


def test_release_by_cpu_allocatable() -> None:
    assert allocatable_release({"c": 12_000}, {"c": 10_000}, 110, 100) == {"c": 2_000}
    assert allocatable_release({"c": 11_000}, {"c": 10_000}, 110, 100) == {}
    assert allocatable_release({"c": 500}, {"c": 0}, 110, 100) == {"c": 500}


def test_be_victims_go_by_priority_then_usage_over_request() -> None:
    cands = [
        Candidate(pod(1, priority=5000), used=500, request=1000),
        Candidate(pod(2, priority=5000), used=900, request=1000),
        Candidate(pod(3, priority=4000), used=100, request=1000),
        Candidate(pod(4), used=2000, request=1000),
    ]
    assert [c.pod.name for c in order_be(cands)] == ["p4", "p3", "p2", "p1"]


# Rounds ----------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class RecordingBackend:
    name = "recording"

    def __init__(self) -> None:
        self.evicted: list[tuple[str, str]] = []

    async def evict(self, victim: Victim, *, reason: str, message: str) -> str:
        self.evicted.append((victim.name, reason))
        return "ok"


class Gates:
    """Feature gate stub: the named gates on; the BE task's gate (BECPUEvict) on unless
    ``be=False``."""

    def __init__(self, *on: str, be: bool = True) -> None:
        self.on = set(on) | ({"BECPUEvict"} if be else set())

    def enabled(self, name: str) -> bool:
        return name in self.on


@dataclass
class Rig:
    clock: Clock
    cache: MetricCache
    backend: RecordingBackend
    ctx: StrategyContext
    strategy: CPUEvict

    def be(self, usage: float, request: float, limit: float, seconds: int = 1) -> None:
        for _ in range(seconds):
            self.clock.now += 1
            self.cache.append(
                self.clock.now,
                [
                    series.Sample(series.SeriesKey(series.BE_CPU_USAGE, series.BE), usage),
                    series.Sample(series.SeriesKey(series.BE_CPU_REQUEST, series.BE), request),
                    series.Sample(series.SeriesKey(series.BE_CPU_REAL_LIMIT, series.BE), limit),
                ],
            )

    def node(self, used: float, pods: dict[int, float], seconds: int = 1) -> None:
        for _ in range(seconds):
            self.clock.now += 1
            samples = [series.Sample(series.SeriesKey(series.NODE_CPU_USAGE, series.NODE), used)]
            for n, u in pods.items():
                entity = series.pod_entity(f"00000000-0000-4000-8000-{n:012d}")
                samples.append(series.Sample(series.SeriesKey(series.POD_CPU_USAGE, entity), u))
            self.cache.append(self.clock.now, samples)


SATISFACTION = {
    "enable": True,
    "cpuEvictBESatisfactionLowerPercent": 30,
    "cpuEvictBESatisfactionUpperPercent": 60,
    "cpuEvictTimeWindowSeconds": 9,
}


def make_rig(
    pods: list[PodInfo],
    slo: dict[str, Any],
    *,
    gates: Gates | None = None,
    be_allocatable: int | None = None,
) -> Rig:
    clock = Clock()
    cache = MetricCache(clock=clock)
    backend = RecordingBackend()
    evictor = Evictor(backend, clock=clock, audit=AuditLog(None, clock=clock))
    ctx = StrategyContext(
        host=lambda: None,  # type: ignore[arg-type,return-value]
        config=config(gates or Gates()),
        cache=cache,
        executor=None,  # type: ignore[arg-type]
        workloads=lambda: WorkloadSnapshot(pods={p.uid: p for p in pods}),
        node_slo=lambda: in_force(resourceUsedThresholdWithBE=slo),
        evictor=evictor,
        book=QoSBook(clock=clock),
    )
    strategy = CPUEvict(
        ctx,
        capacity_milli=lambda: 8000,
        be_allocatable_milli=lambda: be_allocatable,
        clock=clock,
    )
    clock.now += strategy.cool_time  # past the start-up cool-down
    return Rig(clock, cache, backend, ctx, strategy)


BE_PODS = [
    pod(1, request=4000, priority=5000),
    pod(2, request=4000, priority=5000),
    pod(3, request=2000, priority=5000),
    pod(4, QoSClass.LS, request=4000),
]


async def test_starved_be_pods_are_evicted_until_satisfaction_reaches_the_upper_bound() -> None:
    rig = make_rig(BE_PODS, SATISFACTION)
    rig.be(usage=2.9, request=10.0, limit=3.0, seconds=9)
    rig.node(0, {1: 1.9, 2: 3.0, 3: 0.1})
    await rig.strategy.reconcile()
    # satisfaction 3/10 = 30%: release 10000 * (0.6 - 0.3) = 3000 milli of BE requests
    assert rig.backend.evicted == [("ns/p2", REASON_BE_CPU_SATISFACTION)]
    detail = rig.ctx.book.describe("cpuevict")["last_round"]["detail"]["BECPUEvict"]
    assert detail["need"] == {BATCH_CPU: 3000}
    assert detail["victims"] == ["pod/" + BE_PODS[1].uid]


async def test_nothing_is_evicted_while_the_window_is_not_covered() -> None:
    rig = make_rig(BE_PODS, {**SATISFACTION, "cpuEvictTimeWindowSeconds": 60})
    rig.be(usage=2.9, request=10.0, limit=3.0, seconds=19)
    await rig.strategy.reconcile()
    assert rig.backend.evicted == []
    inputs = rig.ctx.book.describe("cpuevict")["last_round"]["inputs"]
    assert inputs["BECPUEvict"]["skipped"] == "window not covered"
    rig.be(usage=2.9, request=10.0, limit=3.0, seconds=1)
    rig.node(0, {1: 1.9, 2: 3.0, 3: 0.1})
    await rig.strategy.reconcile()
    assert [name for name, _ in rig.backend.evicted] == ["ns/p2"]


async def test_be_pods_that_do_not_use_their_limit_are_not_starved() -> None:
    rig = make_rig(BE_PODS, SATISFACTION)
    rig.be(usage=2.0, request=10.0, limit=3.0, seconds=9)  # 67% of the limit < 90%
    await rig.strategy.reconcile()
    assert rig.backend.evicted == []


async def test_the_smaller_of_the_window_and_the_current_release_wins() -> None:
    rig = make_rig(BE_PODS, SATISFACTION)
    rig.be(usage=1.0, request=10.0, limit=1.0, seconds=8)
    rig.be(usage=2.9, request=10.0, limit=3.0, seconds=1)  # now: satisfaction 30%
    await rig.strategy.reconcile()
    # window avg limit 1.22 cores: 10000 * (0.6 - 0.122) = 4777; now: 3000 -> 3000 wins
    detail = rig.ctx.book.describe("cpuevict")["last_round"]["detail"]["BECPUEvict"]
    assert detail["need"] == {BATCH_CPU: 3000}


async def test_stale_be_inputs_skip_the_round_and_are_counted() -> None:
    rig = make_rig(BE_PODS, SATISFACTION)
    rig.be(usage=2.9, request=10.0, limit=3.0, seconds=9)
    rig.clock.now += 3
    await rig.strategy.reconcile()
    assert rig.backend.evicted == []
    assert rig.ctx.book.describe("cpuevict")["stale_rounds"] == 1


async def test_nothing_is_evicted_in_the_cool_down_after_start_or_after_an_eviction() -> None:
    rig = make_rig(BE_PODS, SATISFACTION)
    rig.clock.now -= rig.strategy.cool_time  # back to start-up
    rig.be(usage=2.9, request=10.0, limit=3.0, seconds=9)
    await rig.strategy.reconcile()
    assert rig.backend.evicted == []
    rig.clock.now += rig.strategy.cool_time - 9
    rig.be(usage=2.9, request=10.0, limit=3.0, seconds=9)
    await rig.strategy.reconcile()
    assert len(rig.backend.evicted) == 1
    rig.be(usage=2.9, request=10.0, limit=3.0, seconds=5)
    await rig.strategy.reconcile()
    assert len(rig.backend.evicted) == 1
    assert rig.ctx.book.describe("cpuevict")["last_round"]["decision"].startswith("cool-down")


async def test_evict_by_allocatable_measures_satisfaction_against_be_allocatable() -> None:
    slo = {**SATISFACTION, "cpuEvictPolicy": "evictByAllocatable"}
    rig = make_rig(BE_PODS, slo, be_allocatable=2500)
    rig.be(usage=2.4, request=10.0, limit=6.0, seconds=9)  # real limit 60%: fine; allocatable 25%
    await rig.strategy.reconcile()
    # 10000 * (0.6 - 0.25) = 3500 milli
    detail = rig.ctx.book.describe("cpuevict")["last_round"]["detail"]["BECPUEvict"]
    assert detail["need"] == {BATCH_CPU: 3500}


async def test_the_used_threshold_task_evicts_opted_in_pods_by_usage() -> None:
    opted = {LABEL_EVICTION_ENABLED: "true"}
    pods = [
        pod(1, QoSClass.LS, priority=5000, labels=opted),
        pod(2, QoSClass.LS, priority=5000, labels=opted),
        pod(3, QoSClass.LS, priority=5000),
    ]
    slo = {
        "enable": True,
        "cpuEvictThresholdPercent": 80,
        "cpuEvictLowerPercent": 70,
        "evictEnabledPriorityThreshold": 6000,
    }
    rig = make_rig(pods, slo, gates=Gates("CPUEvict"))
    rig.node(7.2, {1: 0.5, 2: 1.0, 3: 4.0}, seconds=3)  # 90% of 8 cores: release 1600 milli
    await rig.strategy.reconcile()
    assert [name for name, _ in rig.backend.evicted] == ["ns/p2", "ns/p1"]


async def test_nodeslo_enable_false_disables_cpu_eviction() -> None:
    rig = make_rig(BE_PODS, {**SATISFACTION, "enable": False})
    rig.be(usage=2.9, request=10.0, limit=3.0, seconds=9)
    await rig.strategy.reconcile()
    assert rig.backend.evicted == []
