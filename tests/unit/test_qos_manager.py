"""The QoS framework: staleness judgement, dry-run rule, reports and ``describe`` for /debug/qos,
on the real supervisor and metric cache."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from koordlet.config import CollectConfig
from koordlet.errors import ConfigError
from koordlet.features import FeatureGates
from koordlet.metriccache.series import Sample, SeriesKey
from koordlet.metriccache.store import MetricCache
from koordlet.qos.framework import QoSBook, StrategyContext, StrategyReport, StrategySpec
from koordlet.qos.inputs import fresh_last, max_input_age, read_last
from koordlet.qos.manager import QoSManager
from koordlet.selfmetrics import SelfMetrics
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.supervisor import Supervisor
from tests.strategyrig import config, in_force


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def sample(metric: str, value: float) -> Sample:
    return Sample(SeriesKey(metric, "node"), value)


def context(
    clock: Clock,
    *,
    interval: float = 1.0,
    book: QoSBook | None = None,
    gates: FeatureGates | None = None,
    **kw: Any,
) -> StrategyContext:
    cfg = dataclasses.replace(config(gates), collect=CollectConfig(res_used_interval=interval))
    return StrategyContext(
        host=lambda: None,  # type: ignore[arg-type,return-value]
        config=cfg,
        cache=MetricCache(clock=clock),
        executor=None,  # type: ignore[arg-type]
        workloads=WorkloadSnapshot,  # type: ignore[arg-type]
        node_slo=in_force,
        book=book or QoSBook(clock=clock),
        **kw,
    )


def row(name: str, factory: Any, *, gate: str = "", sections: tuple[str, ...] = ()) -> StrategySpec:
    return StrategySpec(name, factory, lambda q: 0.01, "test", gate=gate, sections=sections)


def test_an_input_older_than_twice_the_collection_interval_is_stale() -> None:
    clock = Clock()
    ctx = context(clock, interval=2.0)
    assert ctx.max_input_age == 4.0 == max_input_age(2.0)
    ctx.cache.append(clock.now - 3.9, [sample("node_cpu_usage", 3.0)])
    assert ctx.fresh_last("node_cpu_usage", "node") == 3.0
    clock.now += 0.2
    reading = ctx.read_last("node_cpu_usage", "node")
    assert not reading.fresh
    assert reading.value == 3.0
    assert reading.why_stale == "node_cpu_usage/node 4.1s old > 4s"
    assert ctx.fresh_last("node_cpu_usage", "node") is None


def test_an_absent_input_is_stale_and_says_so() -> None:
    clock = Clock()
    ctx = context(clock)
    reading = ctx.read_last("node_memory_usage", "node")
    assert (reading.fresh, reading.value, reading.why_stale) == (
        False,
        None,
        "node_memory_usage/node absent",
    )
    assert fresh_last(ctx.cache, "node_memory_usage", "node", 2.0, now=clock.now) is None


def test_a_sample_from_the_future_counts_as_fresh_not_negative_age() -> None:
    clock = Clock()
    cache = MetricCache(clock=clock)
    cache.append(clock.now + 5, [sample("node_cpu_usage", 1.0)])
    reading = read_last(cache, "node_cpu_usage", "node", max_age=2.0, now=clock.now)
    assert reading.fresh
    assert reading.age == 0.0


def test_a_window_aggregate_is_fresh_only_while_its_newest_sample_is() -> None:
    clock = Clock()
    ctx = context(clock)
    for i in range(10):
        ctx.cache.append(clock.now - 10 + i, [sample("node_cpu_usage", float(i))])
    agg = ctx.fresh_aggregate("node_cpu_usage", "node", 30.0)
    assert agg is not None
    assert agg.count == 10
    clock.now += 5
    assert ctx.fresh_aggregate("node_cpu_usage", "node", 30.0) is None


def test_stale_rounds_are_counted_in_the_metric_and_shown_per_strategy() -> None:
    registry = CollectorRegistry()
    metrics = SelfMetrics(registry)
    clock = Clock()
    ctx = context(clock, book=QoSBook(on_stale=metrics.stale_inputs, clock=clock))
    ctx.stale("cpusuppress", "node_cpu_usage/node absent")
    ctx.stale("cpusuppress", "node_cpu_usage/node 9.0s old > 2s")
    labels = {"strategy": "cpusuppress"}
    assert registry.get_sample_value("koordlet_qos_stale_inputs_total", labels) == 2.0
    described = ctx.book.describe("cpusuppress")
    assert (described["stale_rounds"], described["last_stale"]) == (
        2,
        "node_cpu_usage/node 9.0s old > 2s",
    )


def test_dry_run_is_global_or_per_strategy() -> None:
    clock = Clock()
    assert not context(clock).dry_run("cpusuppress")
    assert context(clock, dry_run_all=True).dry_run("anything")
    some = context(clock, dry_run_strategies=frozenset({"memoryevict"}))
    assert some.dry_run("memoryevict")
    assert not some.dry_run("cpusuppress")


class Probe:
    """A strategy that reports its rounds, fails when told."""

    def __init__(
        self, ctx: StrategyContext, name: str = "probe", fail: bool = False, interval: float = 0.01
    ) -> None:
        self.ctx = ctx
        self.name = name
        self.interval = interval
        self.fail = fail
        self.rounds = 0

    async def reconcile(self) -> None:
        self.rounds += 1
        if self.fail:
            raise RuntimeError("cannot read the inventory")
        reading = self.ctx.read_last("node_cpu_usage", "node")
        self.ctx.report(
            self.name,
            StrategyReport(
                {"node_cpu": reading.as_dict()},
                "nothing to do" if reading.fresh else "hold: stale inputs",
                stale=not reading.fresh,
            ),
        )


async def wait_for(predicate: Any) -> None:
    import asyncio

    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_describe_shows_each_strategy_s_last_inputs_decision_result_and_errors() -> None:
    clock = Clock()
    ctx = context(
        clock,
        dry_run_strategies=frozenset({"probe"}),
        gates=FeatureGates({"BECPUEvict": False}),
    )
    ctx.cache.append(clock.now, [sample("node_cpu_usage", 2.5)])
    built: dict[str, Probe] = {}

    def factory(name: str, fail: bool = False) -> Any:
        def make(c: StrategyContext, interval: float) -> Probe:
            built[name] = Probe(c, name, fail, interval)
            return built[name]

        return make

    registry = CollectorRegistry()
    supervisor = Supervisor(SelfMetrics(registry))
    manager = QoSManager(
        ctx,
        [
            row("probe", factory("probe")),
            row("broken", factory("broken", True)),
            row("cpuevict", factory("x"), gate="BECPUEvict"),
        ],
        supervisor,
    )
    manager.start()
    try:
        await wait_for(lambda: built["probe"].rounds >= 2 and built["broken"].rounds >= 2)
    finally:
        await manager.stop(2.0)
    # Stopped: describe from the book still answers, but no strategy runs.
    assert manager.describe()["strategies"] == {}
    assert manager.describe()["disabled"] == {"cpuevict": "feature gate BECPUEvict is off"}

    probe = ctx.book.describe("probe")
    assert probe["rounds"] >= 2
    assert probe["last_round"]["decision"] == "nothing to do"
    assert probe["last_round"]["inputs"]["node_cpu"]["value"] == 2.5
    assert probe["last_round"]["at"] == clock.now
    broken = ctx.book.describe("broken")
    assert broken["errors"] == broken["rounds"] >= 2
    assert broken["last_error"] == "RuntimeError: cannot read the inventory"
    # a round that raised before it reported: its failure is the last round, never an older one
    assert broken["last_round"]["decision"] == "no decision: the round failed before deciding"
    assert broken["last_round"]["result"] == "RuntimeError: cannot read the inventory"


async def test_describe_while_running_lists_interval_and_dry_run() -> None:
    clock = Clock()
    ctx = context(clock, dry_run_strategies=frozenset({"probe"}))
    supervisor = Supervisor(SelfMetrics(CollectorRegistry()))
    manager = QoSManager(
        ctx,
        [
            row(
                "probe",
                lambda c, i: Probe(c, interval=i),
                sections=("resourceUsedThresholdWithBE",),
            )
        ],
        supervisor,
    )
    manager.start()
    try:
        described = manager.describe()
    finally:
        await manager.stop(2.0)
    assert described["dry_run"] == {"all": False, "strategies": ["probe"]}
    assert described["max_input_age_s"] == 2.0
    assert described["strategies"]["probe"]["interval_s"] == 0.01
    assert described["strategies"]["probe"]["dry_run"] is True
    assert described["strategies"]["probe"]["nodeslo"] == {
        "resourceUsedThresholdWithBE": {"status": "ok"}
    }
    assert described["nodeslo"]["generation"] == 1


def test_a_factory_that_builds_a_misnamed_strategy_is_a_config_error() -> None:
    ctx = context(Clock())
    supervisor = Supervisor(SelfMetrics(CollectorRegistry()))
    manager = QoSManager(
        ctx, [row("cpusuppress", lambda c, i: Probe(c, "other", interval=i))], supervisor
    )
    with pytest.raises(ConfigError, match="named 'other'"):
        manager.start()


def test_a_report_is_json_ready_and_keeps_its_detail() -> None:
    report = StrategyReport({"a": 1}, "evict 1 pod", "dry run", detail={"victims": ["p"]})
    assert report.as_dict() == {
        "inputs": {"a": 1},
        "decision": "evict 1 pod",
        "result": "dry run",
        "stale": False,
        "detail": {"victims": ["p"]},
    }
