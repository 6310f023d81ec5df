"""Memory eviction: Koordinator's arithmetic and victim order as tables, and whole rounds against
the metric cache, the evictor and a recording backend (plus the pressure-event wiring)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from apis.extension import KubeQOS, QoSClass
from koordlet.collectors.noderesource import DistressReading
from koordlet.config import QoSConfig
from koordlet.events.watches import EventKind, PressureEvent
from koordlet.executor.audit import AuditLog
from koordlet.metriccache import series
from koordlet.metriccache.store import MetricCache
from koordlet.qos.evictor import (
    ANNOTATION_EVICTION_POLICY,
    ANNOTATION_EVICTION_PRIORITY,
    LABEL_EVICTION_ENABLED,
    LABEL_POD_PRIORITY,
    REASON_MEMORY,
    Evictor,
    Victim,
)
from koordlet.qos.evicttask import (
    TARGET_USED,
    Candidate,
    EvictTask,
    allocatable_release,
    by_priority,
    plan,
)
from koordlet.qos.framework import QoSBook, StrategyContext
from koordlet.qos.memoryevict import MemoryEvict
from koordlet.qos.memoryrules import order_be, release_by_used, settings_of, used_thresholds
from koordlet.qos.memorywatch import WATCH_NAME
from koordlet.qos.shared import InvalidThreshold, eviction_policy_allowed
from koordlet.statesinformer.model import PodInfo, WorkloadSnapshot
from koordlet.system.cgroups import CgroupDriver, CgroupLayout, CgroupVersion
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths
from koordlet.system.probe import Capabilities
from tests.strategyrig import config, in_force

GiB = 1 << 30


def pod(
    n: int,
    qos: QoSClass = QoSClass.BE,
    *,
    priority: int | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    request: int | None = None,
    extended: dict[str, int] | None = None,
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
        labels=labels or {},
        annotations=annotations or {},
        memory_request_bytes=request,
        extended_requests=extended or {},
    )


# Tables ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("threshold", "lower", "expected"),
    [(70, None, (70, 68)), (70, 60, (70, 60)), (0, None, (0, -2)), (100, 99, (100, 99))],
)
def test_the_lower_bound_defaults_to_the_threshold_minus_two(
    threshold: int, lower: int | None, expected: tuple[int, int]
) -> None:
    assert used_thresholds(threshold, lower) == expected


@pytest.mark.parametrize(("threshold", "lower"), [(None, None), (-1, None), (70, 70), (70, 80)])
def test_thresholds_upstream_refuses_skip_the_task(
    threshold: int | None, lower: int | None
) -> None:
    with pytest.raises(InvalidThreshold):
        used_thresholds(threshold, lower)


@pytest.mark.parametrize(
    ("used", "capacity", "threshold", "lower", "release"),
    [
        (700, 1000, 70, 68, 20),  # at the threshold: release down to the lower bound
        (699, 1000, 70, 68, 0),  # 69% < 70%
        (699.99, 1000, 70, 68, 0),  # usage floored to a whole byte and a whole percent
        (8.5 * GiB, 10 * GiB, 70, 60, 10 * GiB * 25 // 100),
        (10 * GiB, 10 * GiB, 70, 50, 5 * GiB),
        (GiB, 0, 70, 68, 0),  # unknown capacity: nothing
    ],
)
def test_release_by_used_threshold(
    used: float, capacity: int, threshold: int, lower: int, release: int
) -> None:
    assert release_by_used(used, capacity, threshold, lower) == release


@pytest.mark.parametrize(
    ("requested", "allocatable", "threshold", "lower", "release"),
    [
        (110, 100, 105, 100, 10),
        (105, 100, 105, 100, 0),  # the ratio must exceed the threshold
        (125 * GiB, 100 * GiB, 110, 100, 25 * GiB),
        (50, 0, 110, 100, 50),  # no allocatable: release every request
        (0, 100, 110, 100, 0),
    ],
)
def test_release_by_allocatable(
    requested: int, allocatable: int, threshold: int, lower: int, release: int
) -> None:
    got = allocatable_release({"x": requested}, {"x": allocatable}, threshold, lower)
    assert got.get("x", 0) == release


def _names(cands: list[Candidate]) -> list[str]:
    return [c.pod.name for c in cands]


def test_be_victims_go_by_priority_then_usage_then_name_descending() -> None:
    cands = [
        Candidate(pod(1, priority=5000), used=1 * GiB),
        Candidate(pod(2, priority=3000), used=1 * GiB),
        Candidate(pod(3, priority=5000), used=3 * GiB),
        Candidate(pod(4, priority=5000), used=0),
        Candidate(pod(5, priority=5000), used=0),
    ]
    assert _names(order_be(cands)) == ["p2", "p3", "p1", "p5", "p4"]


def test_be_victims_without_priority_compare_by_usage() -> None:
    cands = [
        Candidate(pod(1), used=1 * GiB),
        Candidate(pod(2, priority=1), used=2 * GiB),
        Candidate(pod(3), used=3 * GiB),
    ]
    assert _names(order_be(cands)) == ["p3", "p2", "p1"]


OPT_IN = {LABEL_EVICTION_ENABLED: "true"}


def test_priority_order_is_eviction_priority_then_priority_then_label_then_usage() -> None:
    used = {1: GiB, 2: GiB, 3: 2 * GiB, 4: 9 * GiB, 5: 0}
    pods = [
        pod(1, priority=5000, labels=OPT_IN),
        pod(2, priority=5000, labels={**OPT_IN, LABEL_POD_PRIORITY: "10"}),
        pod(3, priority=5000, labels={**OPT_IN, LABEL_POD_PRIORITY: "10"}),
        pod(4, priority=6000, labels=OPT_IN),
        pod(5, priority=7000, labels=OPT_IN, annotations={ANNOTATION_EVICTION_PRIORITY: "-1"}),
    ]
    ordered = by_priority(
        pods, "MemoryEvict", 9999, lambda p: Candidate(p, used[int(p.name[1:])]), "used"
    )
    assert _names(ordered) == ["p5", "p3", "p2", "p1", "p4"]


def test_priority_order_by_request_for_the_allocatable_task() -> None:
    pods = [pod(1, priority=5000, labels=OPT_IN), pod(2, priority=5000, labels=OPT_IN)]
    ordered = by_priority(
        pods, "MemoryAllocatableEvict", 5999, lambda p: Candidate(p, 0, int(p.name[1:])), "request"
    )
    assert _names(ordered) == ["p2", "p1"]


def test_plan_stops_once_covered_and_counts_pending_victims_as_released() -> None:
    ordered = [Candidate(pod(n), used=u) for n, u in ((1, 3), (2, 2), (3, 4), (4, 1))]

    def task(need: int) -> EvictTask:
        return EvictTask("BEMemoryEvict", "r", TARGET_USED, {"memory": need}, ordered,
                         lambda c: {"memory": c.used})  # fmt: skip

    pending = frozenset({ordered[0].key})
    got = plan([task(5)], pending)
    assert [(p.candidate.pod.name, p.pending) for p in got.picks] == [("p1", True), ("p2", False)]
    assert _names([p.candidate for p in got.victims]) == ["p2"]
    assert got.released == {TARGET_USED: {"memory": 5}}
    got = plan([task(8)], frozenset())
    assert (_names([p.candidate for p in got.victims]), got.released[TARGET_USED]) == (
        ["p1", "p2", "p3"],
        {"memory": 9},
    )


@pytest.mark.parametrize(
    ("annotation", "allowed"),
    [(None, True), ('["BEMemoryEvict"]', True), ('["CPUEvict"]', False), ("not json", False)],
)
def test_the_eviction_policy_annotation_restricts_features(
    annotation: str | None, allowed: bool
) -> None:
    p = pod(1, annotations={} if annotation is None else {ANNOTATION_EVICTION_POLICY: annotation})
    assert eviction_policy_allowed(p, "BEMemoryEvict") is allowed


def test_settings_merge_over_upstream_defaults() -> None:
    s = settings_of(
        in_force(resourceUsedThresholdWithBE={"enable": True}).resource_used_threshold_with_be
    )
    assert (s.enabled, s.threshold, s.lower) == (True, 70, None)
    assert settings_of(in_force().resource_used_threshold_with_be).enabled is False


# Rounds ----------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class RecordingBackend:
    name = "recording"

    def __init__(self) -> None:
        self.evicted: list[str] = []

    async def evict(self, victim: Victim, *, reason: str, message: str) -> str:
        self.evicted.append(victim.name)
        return "ok"


class Gates:
    """Feature gate stub: the named gates on; the BE task's gate (BEMemoryEvict) on unless
    ``be=False``."""

    def __init__(self, *on: str, be: bool = True) -> None:
        self.on = set(on) | ({"BEMemoryEvict"} if be else set())

    def enabled(self, name: str) -> bool:
        return name in self.on


@dataclass
class FakeEvents:
    unsupported: dict[str, str] = field(default_factory=dict)
    watches: list[tuple[str, Any]] = field(default_factory=list)
    unwatched: list[str] = field(default_factory=list)
    subscribers: list[Any] = field(default_factory=list)

    def subscribe(self, target: Any) -> Any:
        self.subscribers.append(target)
        return lambda: self.subscribers.remove(target)

    refuse_memcg: bool = False

    async def watch_memcg_threshold(self, folder: str, threshold: int, name: str) -> bool:
        self.watches.append(("memcg", (folder, threshold, name)))
        if self.refuse_memcg:
            self.unsupported[name] = "no cgroup.event_control"
            return False
        return True

    async def watch_psi(self, path: str, kind: str, stall: int, window: int, name: str) -> bool:
        self.watches.append(("psi", (path, kind, stall, window, name)))
        self.unsupported.pop(name, None)
        return True

    def unwatch(self, name: str) -> bool:
        self.unwatched.append(name)
        return True


@dataclass
class Rig:
    clock: Clock
    cache: MetricCache
    pods: dict[str, PodInfo]
    slo: dict[str, Any]
    backend: RecordingBackend
    evictor: Evictor
    audit: AuditLog
    ctx: StrategyContext
    strategy: MemoryEvict

    def sample(self, node_used: float, pod_used: dict[int, float]) -> None:
        self.clock.now += 1
        samples = [
            series.Sample(series.SeriesKey(series.NODE_MEMORY_USAGE, series.NODE), node_used)
        ]
        for n, used in pod_used.items():
            uid = f"00000000-0000-4000-8000-{n:012d}"
            entity = series.pod_entity(uid)
            samples.append(series.Sample(series.SeriesKey(series.POD_MEMORY_USAGE, entity), used))
            samples.append(
                series.Sample(series.SeriesKey(series.POD_MEMORY_WITH_PAGE_CACHE, entity), used)
            )
        self.cache.append(self.clock.now, samples)


def make_rig(
    pods: list[PodInfo],
    *,
    slo: dict[str, Any] | None = None,
    gates: Gates | None = None,
    dry: frozenset[str] = frozenset(),
    events: FakeEvents | None = None,
    version: CgroupVersion = CgroupVersion.V1,
    fresh: tuple[int, int] | None = None,
    allocatable: dict[str, int] | None = None,
    qos: QoSConfig | None = None,
    distress: Callable[[], Awaitable[DistressReading]] | None = None,
    capabilities: Capabilities | None = None,
) -> Rig:
    clock = Clock()
    cache = MetricCache(clock=clock)
    by_uid = {p.uid: p for p in pods}
    backend = RecordingBackend()
    audit = AuditLog(None, clock=clock)
    evictor = Evictor(backend, audit=audit, clock=clock, max_per_round=10)
    slo_box = {"enable": True, "memoryEvictThresholdPercent": 70, **(slo or {})}
    paths = HostPaths("/nonexistent/cgroup", "/nonexistent/proc", "/nonexistent/sys")
    host = Host(paths, CgroupLayout(paths, version, CgroupDriver.CGROUPFS, "kubepods"))
    ctx = StrategyContext(
        host=lambda: host,
        config=replace(config(gates or Gates()), qos=qos or QoSConfig()),
        capabilities=capabilities,
        cache=cache,
        executor=None,  # type: ignore[arg-type]  # eviction writes no cgroup file
        workloads=lambda: WorkloadSnapshot(pods=dict(by_uid)),
        node_slo=lambda: in_force(resourceUsedThresholdWithBE=dict(slo_box)),
        evictor=evictor,
        events=events,  # type: ignore[arg-type]
        audit=audit,
        dry_run_strategies=dry,
        book=QoSBook(clock=clock),
    )
    strategy = MemoryEvict(
        ctx,
        capacity=lambda: 10 * GiB,
        fresh_usage=(lambda: fresh) if fresh is not None else None,
        allocatable=lambda: allocatable,
        distress=distress,
        clock=clock,
    )
    return Rig(clock, cache, by_uid, slo_box, backend, evictor, audit, ctx, strategy)


BE_AND_LS = [pod(1), pod(2), pod(3), pod(4, QoSClass.LS), pod(5, QoSClass.LSR)]


async def test_be_pods_are_evicted_largest_first_until_usage_reaches_the_lower_bound() -> None:
    rig = make_rig(BE_AND_LS, slo={"memoryEvictLowerPercent": 60})
    # 75% used: release 10 GiB * (75 - 60) / 100 = 1.5 GiB
    rig.sample(7.5 * GiB, {1: 0.5 * GiB, 2: 1.2 * GiB, 3: 0.4 * GiB, 4: 4 * GiB, 5: 2 * GiB})
    await rig.strategy.reconcile()
    assert rig.backend.evicted == ["ns/p2", "ns/p1"]
    report = rig.ctx.book.describe("memoryevict")["last_round"]
    assert report["decision"] == "evict 2 pods"
    assert report["detail"]["BEMemoryEvict"]["need"] == {"memory": 10 * GiB * 15 // 100}
    assert [e.kind for e in rig.audit.recent()] == ["evict", "evict"]


async def test_nothing_is_evicted_below_the_threshold() -> None:
    rig = make_rig(BE_AND_LS)
    rig.sample(6.99 * GiB, {1: GiB, 2: GiB})
    await rig.strategy.reconcile()
    assert rig.backend.evicted == []
    assert rig.ctx.book.describe("memoryevict")["last_round"]["decision"] == "nothing to do"


async def test_ls_pods_are_never_victims_of_the_be_task_even_when_only_they_use_memory() -> None:
    rig = make_rig(BE_AND_LS)
    rig.sample(9.5 * GiB, {4: 6 * GiB, 5: 3 * GiB})
    await rig.strategy.reconcile()
    assert set(rig.backend.evicted) == {"ns/p1", "ns/p2", "ns/p3"}


async def test_a_stale_node_usage_skips_the_round_and_is_counted() -> None:
    rig = make_rig(BE_AND_LS)
    rig.sample(9.5 * GiB, {1: GiB})
    rig.clock.now += 2.5
    await rig.strategy.reconcile()
    assert rig.backend.evicted == []
    state = rig.ctx.book.describe("memoryevict")
    assert state["stale_rounds"] == 1
    assert state["last_round"]["stale"] is True


async def test_no_round_runs_during_the_cool_down_after_an_eviction() -> None:
    rig = make_rig(BE_AND_LS, slo={"memoryEvictLowerPercent": 68})
    rig.sample(7.5 * GiB, {1: 0.1 * GiB, 2: 0.2 * GiB, 3: 0.3 * GiB})
    await rig.strategy.reconcile()
    assert rig.backend.evicted == ["ns/p3", "ns/p2", "ns/p1"]
    rig.backend.evicted.clear()
    rig.sample(7.5 * GiB, {1: 0.1 * GiB, 2: 0.2 * GiB, 3: 0.3 * GiB})
    await rig.strategy.reconcile()
    assert rig.ctx.book.describe("memoryevict")["last_round"]["decision"].startswith("cool-down")
    rig.clock.now += 3
    rig.sample(7.5 * GiB, {1: 0.1 * GiB, 2: 0.2 * GiB, 3: 0.3 * GiB})
    await rig.strategy.reconcile()
    # past the cool-down; the three are within the dedupe window: pending, not evicted again
    assert rig.backend.evicted == []
    assert (
        rig.ctx.book.describe("memoryevict")["last_round"]["decision"] == "no victim left to evict"
    )


async def test_nodeslo_enable_false_disables_memory_eviction() -> None:
    rig = make_rig(BE_AND_LS, slo={"enable": False})
    rig.sample(9.9 * GiB, {1: GiB})
    await rig.strategy.reconcile()
    assert rig.backend.evicted == []
    assert rig.ctx.book.describe("memoryevict")["last_round"]["decision"] == "disabled in NodeSLO"


async def test_a_dry_run_strategy_decides_and_audits_without_evicting() -> None:
    rig = make_rig(BE_AND_LS, dry=frozenset({"memoryevict"}))
    rig.sample(9 * GiB, {1: 3 * GiB})
    outcomes = await rig.strategy.round("tick")
    assert outcomes[0].status == "dry_run"
    assert rig.backend.evicted == []
    entries = rig.audit.recent()
    assert entries
    assert all(e.kind == "decision" and e.dry_run for e in entries)
    assert entries[-1].reason.startswith(REASON_MEMORY)


async def test_the_priority_task_evicts_opted_in_pods_under_the_priority_threshold() -> None:
    opted = {LABEL_EVICTION_ENABLED: "true"}
    pods = [
        pod(1, QoSClass.LS, priority=5000, labels=opted),
        pod(2, QoSClass.LS, priority=9000, labels=opted),  # above the priority threshold
        pod(3, QoSClass.LS, priority=5000),  # not opted in
    ]
    rig = make_rig(pods, slo={"evictEnabledPriorityThreshold": 6000}, gates=Gates("MemoryEvict"))
    rig.sample(8 * GiB, {1: 2 * GiB, 2: 3 * GiB, 3: 3 * GiB})
    await rig.strategy.reconcile()
    assert rig.backend.evicted == ["ns/p1"]


async def test_the_priority_task_does_not_run_without_its_gate() -> None:
    opted = {LABEL_EVICTION_ENABLED: "true"}
    rig = make_rig(
        [pod(1, QoSClass.LS, priority=5000, labels=opted)],
        slo={"evictEnabledPriorityThreshold": 6000},
    )
    rig.sample(8 * GiB, {1: 2 * GiB})
    await rig.strategy.reconcile()
    assert rig.backend.evicted == []


async def test_the_allocatable_task_evicts_by_request_over_the_allocatable() -> None:
    opted = {LABEL_EVICTION_ENABLED: "true"}
    batch = "kubernetes.io/batch-memory"
    pods = [
        pod(1, priority=5500, labels=opted, extended={batch: 4 * GiB}),
        pod(2, priority=5500, labels=opted, extended={batch: 7 * GiB}),
        pod(3, priority=9500, labels=opted, request=9 * GiB),  # koord-prod: never counted
    ]
    slo = {
        "memoryAllocatableEvictThresholdPercent": 105,
        "memoryAllocatableEvictLowerPercent": 100,
        "allocatableEvictPriorityThreshold": 5999,
        "memoryEvictThresholdPercent": 99,
    }
    rig = make_rig(
        pods, slo=slo, gates=Gates("MemoryAllocatableEvict"), allocatable={batch: 10 * GiB}
    )
    rig.sample(5 * GiB, {1: GiB, 2: GiB, 3: GiB})
    await rig.strategy.reconcile()
    # 11 GiB of batch-memory requested of 10 GiB: release 1 GiB, the biggest request first
    assert rig.backend.evicted == ["ns/p2"]


async def test_an_event_round_reads_the_node_usage_now_instead_of_the_cache() -> None:
    rig = make_rig(BE_AND_LS, fresh=(int(9 * GiB), 10 * GiB))
    rig.sample(5 * GiB, {1: 3 * GiB, 2: GiB // 10, 3: GiB // 10})  # the cache says 50%
    await rig.strategy.round("tick")
    assert rig.backend.evicted == []
    await rig.strategy.round("event")
    assert rig.backend.evicted == ["ns/p1"]


async def test_v1_arms_a_kubepods_memcg_threshold_and_rearms_only_when_it_moves() -> None:
    events = FakeEvents()
    rig = make_rig(BE_AND_LS, events=events)
    rig.sample(4 * GiB, {1: 1 * GiB, 2: 1 * GiB})  # non-pod usage 2 GiB
    await rig.strategy.reconcile()
    folder = rig.ctx.host().layout.abs_dir("memory", "kubepods")
    # the node reaches 70% of 10 GiB when kubepods reaches 7 GiB - 2 GiB
    assert events.watches == [("memcg", (folder, int(7 * GiB - 2 * GiB), WATCH_NAME))]
    rig.sample(4.05 * GiB, {1: 1 * GiB, 2: 1 * GiB})  # moved by 0.5% of capacity
    await rig.strategy.reconcile()
    assert len(events.watches) == 1
    rig.sample(5 * GiB, {1: 1 * GiB, 2: 1 * GiB})
    await rig.strategy.reconcile()
    assert events.unwatched == [WATCH_NAME]
    assert events.watches[-1] == ("memcg", (folder, int(7 * GiB - 3 * GiB), WATCH_NAME))
    await rig.strategy.close()
    assert events.subscribers == []


async def test_v2_arms_a_psi_trigger_on_node_memory_pressure() -> None:
    events = FakeEvents()
    rig = make_rig(BE_AND_LS, events=events, version=CgroupVersion.V2)
    rig.sample(4 * GiB, {1: GiB})
    await rig.strategy.reconcile()
    path = rig.ctx.host().paths.proc("pressure", "memory")
    assert events.watches == [("psi", (path, "some", 100_000, 2_000_000, WATCH_NAME))]
    await rig.strategy.close()


async def test_a_pressure_event_runs_a_round_at_once() -> None:
    events = FakeEvents()
    rig = make_rig(BE_AND_LS, events=events, fresh=(int(9 * GiB), 10 * GiB))
    rig.sample(4 * GiB, {1: 3 * GiB, 2: GiB // 10, 3: GiB // 10})
    await rig.strategy.reconcile()
    assert rig.backend.evicted == []
    [subscriber] = events.subscribers
    subscriber(PressureEvent("someone-else", EventKind.PSI, 0.0))
    subscriber(PressureEvent(WATCH_NAME, EventKind.MEMCG_THRESHOLD, 0.0))
    for _ in range(500):
        if rig.backend.evicted:
            break
        await asyncio.sleep(0.01)
    assert rig.backend.evicted == ["ns/p1"]
    assert rig.strategy.event_rounds == 1
    await rig.strategy.close()


async def test_a_nodeslo_with_the_lower_bound_above_the_threshold_evicts_nobody() -> None:
    rig = make_rig(BE_AND_LS, slo={"memoryEvictLowerPercent": 80})
    rig.sample(9.5 * GiB, {1: GiB, 2: GiB, 3: GiB})
    await rig.strategy.reconcile()
    assert rig.backend.evicted == []
    # The section is rejected where it is read (its last good value, here the defaults, stays)
    rejected = rig.ctx.node_slo().rejected["resourceUsedThresholdWithBE"]
    assert rejected.error.field == "resourceUsedThresholdWithBE.memoryEvictLowerPercent"


async def test_a_host_that_refuses_memcg_thresholds_falls_back_to_psi_for_good() -> None:
    events = FakeEvents(refuse_memcg=True)
    rig = make_rig(BE_AND_LS, events=events)
    for _ in range(3):
        rig.sample(4 * GiB, {1: GiB})
        await rig.strategy.reconcile()
    assert [kind for kind, _ in events.watches] == ["memcg", "psi"]
    await rig.strategy.close()
