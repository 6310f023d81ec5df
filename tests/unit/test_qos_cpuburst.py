"""CPU burst: Koordinator's arithmetic in tables, the token bucket, and rounds on a fake host."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import pytest

from apis.extension import KubeQOS, QoSClass
from apis.slo_strategies import CPUBurstPolicy
from koordlet.collectors.nodeinfo import node_info_dict
from koordlet.errors import HostError, WritesRefusedError
from koordlet.executor import CgroupWriter, WriteResult
from koordlet.metriccache import series
from koordlet.metriccache.store import MetricCache
from koordlet.qos.cpuburst import CPUBurst, pod_settings
from koordlet.qos.cpuburstrules import (
    BurstLimiter,
    BurstSettings,
    NodeState,
    Op,
    adjust_by_node,
    base_quota_us,
    ceil_quota_us,
    container_op,
    next_quota,
    node_state,
    safe_burst_us,
    share_pool_ratio,
    static_burst_us,
)
from koordlet.qos.framework import QoSBook, StrategyContext
from koordlet.statesinformer.model import ContainerInfo, PodInfo, WorkloadSnapshot
from koordlet.system.knobs import knob
from koordlet.system.topology import read_cpu_topology
from tests.fakehost import FakeHost, container_id
from tests.strategyrig import config, in_force

AUTO = BurstSettings(policy="auto")


@pytest.mark.parametrize(
    ("limit", "settings", "expected"),
    [
        (2000, AUTO, 2000000),  # 2 cores x 1000% (the default) x 100 ms
        (2000, BurstSettings(policy="auto", cpu_burst_percent=100), 200000),
        (500, BurstSettings(policy="cpuBurstOnly", cpu_burst_percent=300), 150000),
        (2000, BurstSettings(policy="cfsQuotaBurstOnly"), 0),  # CPU burst off: 0
        (2000, BurstSettings(policy="none"), 0),
        (0, AUTO, 0),  # unlimited container
    ],
)
def test_static_burst_is_limit_times_percent_of_a_period(
    limit: int, settings: BurstSettings, expected: int
) -> None:
    assert static_burst_us(limit, settings) == expected


def test_burst_is_capped_at_the_current_quota_unless_unlimited() -> None:
    big = BurstSettings(policy="auto", cpu_burst_percent=300)
    assert safe_burst_us(1000, big, 100000) == 100000
    assert safe_burst_us(1000, big, None) == 300000


@pytest.mark.parametrize(
    ("op", "current", "expected"),
    [
        (Op.UP, 100000, 120000),
        (Op.UP, 280000, 300000),  # ceiling: 300% of base
        (Op.DOWN, 200000, 160000),
        (Op.DOWN, 110000, 100000),  # never below the base
        (Op.RESET, 250000, 100000),
        (Op.REMAIN, 150000, 150000),
    ],
)
def test_quota_scales_by_steps_within_base_and_ceiling(op: Op, current: int, expected: int) -> None:
    base = base_quota_us(1000)
    assert next_quota(op, current, base, ceil_quota_us(base, AUTO)) == expected


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [
        (0.5, NodeState.OVERLOAD),
        (0.46, NodeState.COOLING),  # 90% of 50% = 45%
        (0.44, NodeState.IDLE),
        (None, NodeState.UNKNOWN),
    ],
)
def test_node_state_from_share_pool_usage(ratio: float | None, expected: NodeState) -> None:
    assert node_state(ratio, 50) is expected


@pytest.mark.parametrize(
    ("state", "op", "expected"),
    [
        (NodeState.OVERLOAD, Op.UP, Op.DOWN),
        (NodeState.OVERLOAD, Op.REMAIN, Op.DOWN),
        (NodeState.OVERLOAD, Op.RESET, Op.RESET),
        (NodeState.COOLING, Op.UP, Op.REMAIN),
        (NodeState.UNKNOWN, Op.UP, Op.REMAIN),
        (NodeState.UNKNOWN, Op.DOWN, Op.DOWN),
        (NodeState.IDLE, Op.UP, Op.UP),
    ],
)
def test_node_state_overrides_the_containers_wish(state: NodeState, op: Op, expected: Op) -> None:
    assert adjust_by_node(state, op) is expected


def test_container_op_follows_policy_bucket_and_throttling() -> None:
    assert container_op(BurstSettings(policy="cpuBurstOnly"), True, 0.5) is Op.RESET
    assert container_op(AUTO, False, 0.5) is Op.DOWN
    assert container_op(AUTO, True, 0.2) is Op.UP
    assert container_op(AUTO, True, 0.0) is Op.REMAIN
    assert container_op(AUTO, True, None) is Op.REMAIN


def _pod(uid: str, qos: QoSClass, request: int | None = None) -> PodInfo:
    return PodInfo(uid, uid, "ns", qos, KubeQOS.BURSTABLE, f"kubepods/pod{uid}",
                   cpu_request_milli=request)  # fmt: skip


def test_share_pool_excludes_exclusive_pods_and_be_usage() -> None:
    pods = [_pod("a", QoSClass.LSR, 2000), _pod("b", QoSClass.BE), _pod("c", QoSClass.LS)]
    used = {"a": 1.5, "b": 1.0, "c": 1.0}
    # pool = 8 - 2 = 6 CPUs; usage = 4.5 - 1.5 - 1.0 = 2.0 (LS pod and system stay in)
    assert share_pool_ratio(4.5, 8, pods, used) == pytest.approx(2.0 / 6)
    assert share_pool_ratio(1.0, 2, [_pod("a", QoSClass.LSE, 2000)], {}) == 1.0


def test_token_bucket_drains_over_the_limit_and_refills_when_idle() -> None:
    limiter = BurstLimiter(10, 300, now=0.0, rng=lambda: 0.0)  # capacity 2000, starts empty
    assert limiter.capacity == 2000
    assert not limiter.allow(1.0, 100)  # nothing saved yet
    assert limiter.allow(3.0, 50)  # 2 s x 50 saved
    assert limiter.tokens == 100
    assert limiter.allow(3.9, 200)  # 0 whole seconds: no change (upstream truncates)
    assert not limiter.allow(4.9, 200)  # 1 s x 100 drained
    limiter.allow(1000.0, 0)
    assert limiter.tokens == 2000  # clamped at the capacity
    assert limiter.expired(1021.0)  # unused for more than 2 x period


def test_settings_merge_pod_annotation_over_the_nodes() -> None:
    node = BurstSettings(policy=CPUBurstPolicy.AUTO, cfs_quota_burst_percent=200)
    pod = _pod("p", QoSClass.LS)
    annotated = replace(pod, annotations={"koordinator.sh/cpuBurst": '{"cpuBurstPercent": 200}'})
    s = pod_settings(annotated, node)
    assert (s.policy, s.cpu_burst_percent, s.cfs_quota_burst_percent) == ("auto", 200, 200)
    assert pod_settings(pod, node) is node
    bad = replace(pod, annotations={"koordinator.sh/cpuBurst": '{"cpuBurstPercent": 0}'})
    assert pod_settings(bad, node) is node  # out of the CRD's range: the node's settings


# Rounds on a fake host ------------------------------------------------------------------------

NOW = 10_000.0


@dataclass
class Rig:
    fake: FakeHost
    cache: MetricCache
    strategy: CPUBurst
    slo: dict[str, Any]
    pod: str
    container: str
    cid: str
    clock: SimpleNamespace

    def read(self, name: str, rel: str) -> Any:
        k = knob(name)
        return k.decode(self.fake.read(k.controller, rel, k.file_for(self.fake.version) or ""),
                        self.fake.version)  # fmt: skip

    def metrics(self, node: float, throttled: float, at: float) -> None:
        self.cache.append(
            at,
            [
                series.Sample(series.SeriesKey(series.NODE_CPU_USAGE, series.NODE), node),
                series.Sample(
                    series.SeriesKey(
                        series.CONTAINER_CPU_THROTTLED_RATIO, f"container/ab-1/{self.cid}"
                    ),
                    throttled,
                ),
            ],
        )


@pytest.fixture
async def rig(fake_host: FakeHost) -> AsyncIterator[Rig]:
    fake = fake_host
    cid = container_id("ls")
    pod, [cont] = fake.add_pod("ab-1", KubeQOS.BURSTABLE, [("containerd", cid)])
    quota_text = "100000" if fake.version.value == "v1" else "100000 100000"
    for rel in (pod, cont):
        fake.write("cpu", rel, knob("cpu_cfs_quota").file_for(fake.version) or "", quota_text)
        fake.write("cpu", rel, knob("cpu_burst").file_for(fake.version) or "", "0")
    main = ContainerInfo(cid, "main", "containerd", cont)
    info = PodInfo(
        "ab-1", "web", "ns", QoSClass.LS, KubeQOS.BURSTABLE, pod, (main,), cpu_limit_milli=1000
    )
    clock = SimpleNamespace(now=NOW)
    cache = MetricCache(clock=lambda: clock.now)
    cache.set_info("node_info", node_info_dict(read_cpu_topology(fake.paths)))
    slo: dict[str, Any] = {"policy": "auto"}
    writer = CgroupWriter(fake.host)
    writer.start()
    ctx = StrategyContext(
        host=lambda: fake.host,
        config=config(),
        cache=cache,
        executor=writer,
        workloads=lambda: WorkloadSnapshot(pods={"ab-1": info}),
        node_slo=lambda: in_force(cpuBurstStrategy=dict(slo)),
        book=QoSBook(clock=lambda: clock.now),
    )
    try:
        yield Rig(fake, cache, CPUBurst(ctx, rng=lambda: 0.0), slo, pod, cont, cid, clock)
    finally:
        await asyncio.to_thread(writer.stop)


async def test_cpu_burst_writes_limit_times_percent_to_container_and_pod(rig: Rig) -> None:
    await rig.strategy.reconcile()
    assert rig.read("cpu_burst", rig.container) == 100000
    assert rig.read("cpu_burst", rig.pod) == 100000
    rig.slo["policy"] = "none"
    await rig.strategy.reconcile()
    assert rig.read("cpu_burst", rig.container) == 0


async def test_one_snapshot_kept_for_rounds_still_follows_settings_limits_and_pods(
    rig: Rig,
) -> None:
    # the targets are kept while the snapshot is the same object: each change still shows
    ctx = rig.strategy._ctx
    pod = ctx.workloads().pods["ab-1"]
    box = {"snapshot": WorkloadSnapshot(pods={"ab-1": pod})}
    strategy = CPUBurst(replace(ctx, workloads=lambda: box["snapshot"]), rng=lambda: 0.0)

    def burst_gauge() -> list[float]:
        families = {f.name: f for f in strategy.collect()}
        return [s.value for s in families["koordlet_container_scaled_cfs_burst_us"].samples]

    await strategy.reconcile()
    assert rig.read("cpu_burst", rig.container) == 100000  # 1 core x 1000%, capped at the quota
    rig.slo["cpuBurstPercent"] = 50  # the node's settings, same snapshot
    await strategy.reconcile()
    assert rig.read("cpu_burst", rig.container) == 50000
    assert burst_gauge() == [50000.0]
    main = replace(pod.containers[0], cpu_limit_milli=500)  # a new snapshot: a new limit
    box["snapshot"] = WorkloadSnapshot(pods={"ab-1": replace(pod, containers=(main,))})
    await strategy.reconcile()
    assert rig.read("cpu_burst", rig.container) == 25000
    box["snapshot"] = WorkloadSnapshot()  # the pod is gone: its gauge too
    await strategy.reconcile()
    assert burst_gauge() == []


async def test_throttled_container_on_idle_node_gets_its_quota_scaled_up(rig: Rig) -> None:
    rig.metrics(node=0.5, throttled=0.3, at=NOW)  # pool 0.5 / 4 = 12.5% < 45%: idle
    await rig.strategy.reconcile()
    assert rig.read("cpu_cfs_quota", rig.container) == 120000
    assert rig.read("cpu_cfs_quota", rig.pod) == 120000
    samples = {f.name: f.samples for f in rig.strategy.collect()}
    assert samples["koordlet_container_scaled_cfs_quota_us"][0].value == 120000


async def test_overloaded_share_pool_scales_quota_back_down(rig: Rig) -> None:
    rig.metrics(node=0.5, throttled=0.3, at=NOW)
    await rig.strategy.reconcile()
    assert rig.read("cpu_cfs_quota", rig.container) == 120000
    rig.cache.append(
        NOW + 0.5, [series.Sample(series.SeriesKey(series.NODE_CPU_USAGE, series.NODE), 3.9)]
    )
    rig.cache.append(
        NOW + 1, [series.Sample(series.SeriesKey(series.NODE_CPU_USAGE, series.NODE), 3.9)]
    )
    # avg over the window (0.5, 3.9, 3.9) / 4 = 69% >= 50%: overload, scale down to >= base.
    rig.clock.now = NOW + 1
    await rig.strategy.reconcile()
    assert rig.read("cpu_cfs_quota", rig.container) == 100000
    assert rig.read("cpu_cfs_quota", rig.pod) == 100000


async def test_stale_node_usage_never_scales_up(rig: Rig) -> None:
    rig.metrics(node=0.5, throttled=0.3, at=NOW - 5)
    await rig.strategy.reconcile()
    assert rig.read("cpu_cfs_quota", rig.container) == 100000


def _quota_text(fake: FakeHost, quota: int | None) -> str:
    if fake.version.value == "v1":
        return "-1" if quota is None else str(quota)
    return f"{'max' if quota is None else quota} 100000"


@dataclass
class MultiRig:
    fake: FakeHost
    cache: MetricCache
    strategy: CPUBurst
    pod: str
    small: str
    big: str
    cids: tuple[str, str]

    def read(self, name: str, rel: str) -> Any:
        k = knob(name)
        return k.decode(self.fake.read(k.controller, rel, k.file_for(self.fake.version) or ""),
                        self.fake.version)  # fmt: skip


async def _multi_rig(
    fake: FakeHost,
    limits: tuple[int | None, int | None],
    pod_quota: int | None,
    quotas: tuple[int | None, int | None],
) -> tuple[MultiRig, CgroupWriter]:
    """A two-container LS pod with limits ``limits`` and the cgroup quotas given."""
    cids = (container_id("small"), container_id("big"))
    pod, conts = fake.add_pod("cc-1", KubeQOS.BURSTABLE, [("containerd", c) for c in cids])
    quota_file = knob("cpu_cfs_quota").file_for(fake.version) or ""
    burst_file = knob("cpu_burst").file_for(fake.version) or ""
    for rel, quota in ((pod, pod_quota), *zip(conts, quotas, strict=True)):
        fake.write("cpu", rel, quota_file, _quota_text(fake, quota))
        fake.write("cpu", rel, burst_file, "0")
    containers = tuple(
        ContainerInfo(cid, name, "containerd", rel, cpu_limit_milli=limit)
        for cid, name, rel, limit in zip(cids, ("small", "big"), conts, limits, strict=True)
    )
    total = None if None in limits else sum(x or 0 for x in limits)
    info = PodInfo(
        "cc-1", "multi", "ns", QoSClass.LS, KubeQOS.BURSTABLE, pod, containers,
        cpu_limit_milli=total,
    )  # fmt: skip
    cache = MetricCache(clock=lambda: NOW)
    cache.set_info("node_info", node_info_dict(read_cpu_topology(fake.paths)))
    cache.append(
        NOW,
        [
            series.Sample(series.SeriesKey(series.NODE_CPU_USAGE, series.NODE), 0.2),
            *(
                series.Sample(
                    series.SeriesKey(series.CONTAINER_CPU_THROTTLED_RATIO, f"container/cc-1/{c}"),
                    0.5,
                )
                for c in cids
            ),
        ],
    )
    writer = CgroupWriter(fake.host)
    writer.start()
    ctx = StrategyContext(
        host=lambda: fake.host,
        config=config(),
        cache=cache,
        executor=writer,
        workloads=lambda: WorkloadSnapshot(pods={"cc-1": info}),
        node_slo=lambda: in_force(cpuBurstStrategy={"policy": "auto"}),
        book=QoSBook(clock=lambda: NOW),
    )
    strategy = CPUBurst(ctx, rng=lambda: 0.0)
    return MultiRig(fake, cache, strategy, pod, conts[0], conts[1], cids), writer


async def test_each_container_scales_from_its_own_limit_and_the_pod_by_the_sum(
    fake_host: FakeHost,
) -> None:
    rig, writer = await _multi_rig(fake_host, (500, 2000), 250000, (50000, 200000))
    try:
        await rig.strategy.reconcile()
    finally:
        await asyncio.to_thread(writer.stop)
    # Throttled on an idle node: each scales up 1.2 x from its own base.
    assert rig.read("cpu_cfs_quota", rig.small) == 60000
    assert rig.read("cpu_cfs_quota", rig.big) == 240000
    assert rig.read("cpu_cfs_quota", rig.pod) == 250000 + 10000 + 40000
    # CPU burst: each container's limit x 1000 % (the default), capped at its new quota; the pod
    # took the last container's burst with its quota change (upstream's rule).
    assert rig.read("cpu_burst", rig.small) == 60000
    assert rig.read("cpu_burst", rig.big) == 240000
    assert rig.read("cpu_burst", rig.pod) == 240000


async def test_quota_burst_starts_from_the_real_quota_left_by_an_earlier_run(
    fake_host: FakeHost,
) -> None:
    # An earlier run scaled the small container to 90000 (its ceiling is 150000): it goes on
    # from there (x 1.2 = 108000), not from its 50000 base.
    rig, writer = await _multi_rig(fake_host, (500, 2000), 290000, (90000, 200000))
    try:
        await rig.strategy.reconcile()
    finally:
        await asyncio.to_thread(writer.stop)
    assert rig.read("cpu_cfs_quota", rig.small) == 108000
    assert rig.read("cpu_cfs_quota", rig.pod) == 290000 + 18000 + 40000


async def test_a_pod_with_an_unlimited_container_gets_container_writes_only(
    fake_host: FakeHost,
) -> None:
    rig, writer = await _multi_rig(fake_host, (500, None), None, (50000, None))
    try:
        await rig.strategy.reconcile()
    finally:
        await asyncio.to_thread(writer.stop)
    assert rig.read("cpu_cfs_quota", rig.small) == 60000
    assert rig.read("cpu_cfs_quota", rig.big) is None  # no limit: left alone
    assert rig.read("cpu_cfs_quota", rig.pod) is None  # unlimited pod: no pod quota
    assert rig.read("cpu_burst", rig.pod) == 0
    assert rig.read("cpu_burst", rig.small) == 60000  # capped at its scaled quota


async def test_a_round_is_stale_only_when_it_counted_a_stale_input(rig: Rig) -> None:
    # policy cpuBurstOnly needs no share pool: no stale round, whatever the node usage
    rig.slo["policy"] = "cpuBurstOnly"
    await rig.strategy.reconcile()
    book = rig.strategy._ctx.book
    state = book.describe("cpuburst")
    assert state["stale_rounds"] == 0
    assert state["last_round"]["stale"] is False
    # quota burst with no node usage: the round is stale and counted
    rig.slo["policy"] = "auto"
    await rig.strategy.reconcile()
    state = book.describe("cpuburst")
    assert state["stale_rounds"] == 1
    assert state["last_round"]["stale"] is True


async def test_quota_moves_log_at_debug_with_turns_and_a_summary_at_info(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.strategy.summary_interval = 3.0
    with caplog.at_level("DEBUG", logger="koordlet.qos.cpuburst"):
        for i in range(5):  # throttled on an idle node: five scale-ups
            rig.clock.now = NOW + i
            rig.metrics(node=0.5, throttled=0.3, at=NOW + i)
            await rig.strategy.reconcile()
    info = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    debug = [r.getMessage() for r in caplog.records if r.levelname == "DEBUG"]
    assert len([m for m in info if "quota scaled up" in m]) == 1  # the turn
    assert len([m for m in debug if "quota scaled up" in m]) >= 2  # the following steps
    assert any("quota scale-ups and 0 scale-downs in the last 3s" in m for m in info)
    assert not [r for r in caplog.records if "None" in r.getMessage()]


class RefusingWriter(CgroupWriter):
    """The real writer, but the kernel refuses the writes of one cgroup (``EINVAL``)."""

    def __init__(self, fake: FakeHost, refused: str) -> None:
        super().__init__(fake.host)
        self.refused = refused

    def _apply(
        self, k: Any, rel_dir: str, value: object, strategy: str, reason: str
    ) -> WriteResult:
        if rel_dir == self.refused:
            raise HostError(f"{rel_dir}/{k.name}: writing {value!r} failed: Invalid argument")
        return super()._apply(k, rel_dir, value, strategy, reason)


async def test_a_refused_quota_write_is_that_containers_alone_and_the_round_reports_it(
    fake_host: FakeHost, caplog: pytest.LogCaptureFixture
) -> None:
    rig, writer = await _multi_rig(fake_host, (500, 2000), 250000, (50000, 200000))
    await asyncio.to_thread(writer.stop)
    refusing = RefusingWriter(fake_host, rig.big)
    refusing.start()
    ctx = replace(rig.strategy._ctx, executor=refusing)
    strategy = CPUBurst(ctx, rng=lambda: 0.0)
    caplog.set_level(logging.WARNING, logger="koordlet.qos.cpuburst")
    try:
        for _ in range(3):
            with pytest.raises(WritesRefusedError, match="Invalid argument"):
                await strategy.reconcile()
    finally:
        await asyncio.to_thread(refusing.stop)

    assert rig.read("cpu_cfs_quota", rig.small) > 50000  # the other container went on
    assert rig.read("cpu_burst", rig.small) > 0
    assert rig.read("cpu_cfs_quota", rig.big) == 200000
    report = ctx.book.last_report("cpuburst")
    assert report is not None
    assert "writes refused" in report.result
    refused = report.detail["refused"]
    assert {v["count"] for v in refused.values()} == {3}
    warnings = [r for r in caplog.records if r.name == "koordlet.qos.cpuburst"]
    assert len(warnings) == len(refused)  # each refused write logged once, not each round
