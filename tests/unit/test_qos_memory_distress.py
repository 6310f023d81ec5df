"""Memory eviction's distress trigger: the rates over the window, the hysteresis, the sampler on
the on-demand read, whole rounds that evict BE pods below the usage threshold, and the PSI
trigger armed only where the start-up probe found it works."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from koordlet.collectors.noderesource import MEMORY_DISTRESS, DistressReading
from koordlet.collectors.runner import CollectorRunner
from koordlet.config import QoSConfig
from koordlet.errors import HostError, ParseError
from koordlet.events.source import PressureEventSource
from koordlet.metriccache.store import MetricCache
from koordlet.qos.distress import (
    PSI_FULL,
    RECLAIM,
    DistressConfig,
    DistressMonitor,
    Hysteresis,
    RateWindow,
)
from koordlet.qos.evictor import REASON_MEMORY, REASON_MEMORY_DISTRESS
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.cgroups import CgroupVersion
from koordlet.system.probe import Capabilities, Capability
from koordlet.system.procfs import VmStat, parse_vmstat
from tests.fakehost import FakeHost, golden
from tests.unit.test_qos_memoryevict import BE_AND_LS, Gates, GiB, make_rig

# /proc/vmstat -----------------------------------------------------------------------------------


def test_vmstat_sums_each_reclaimer_once_from_this_hosts_file() -> None:
    text = golden("proc/vmstat")
    values = dict(line.split() for line in text.splitlines())
    got = parse_vmstat(text.encode(), "/proc/vmstat")
    reclaimers = ("kswapd", "direct", "khugepaged", "proactive")
    assert got.pgscan == sum(int(values.get(f"pgscan_{r}", 0)) for r in reclaimers)
    assert got.pgsteal == sum(int(values.get(f"pgsteal_{r}", 0)) for r in reclaimers)
    assert got.refault == sum(int(v) for k, v in values.items() if k.startswith("workingset_ref"))


def test_vmstat_leaves_out_the_lru_split_and_the_throttle_count_and_reads_pre_4_8_zones() -> None:
    data = (
        b"pgscan_kswapd 100\npgscan_direct 20\npgscan_direct_throttle 7\npgscan_anon 60\n"
        b"pgscan_file 60\npgsteal_kswapd 90\npgsteal_direct 10\n"
        b"pgscan_kswapd_normal 5\npgscan_direct_dma32 1\nworkingset_refault_file 3\n"
    )
    assert parse_vmstat(data, "v") == VmStat(pgscan=126, pgsteal=100, pgscan_direct=21, refault=3)


@pytest.mark.parametrize(
    ("data", "match"),
    [(b"nr_free_pages 1\n", "no pgscan"), (b"pgscan_kswapd x\n", "not a number")],
)
def test_a_vmstat_without_reclaim_counters_or_with_a_bad_number_is_refused(
    data: bytes, match: str
) -> None:
    with pytest.raises(ParseError, match=match):
        parse_vmstat(data, "/proc/vmstat")


async def test_the_on_demand_read_gives_the_fake_trees_counters(fake_host: FakeHost) -> None:
    fake_host.set_pressure("memory", 5_000, 1_500)
    fake_host.set_vmstat(pgscan_kswapd=40, pgscan_direct=2, pgsteal_kswapd=30)
    runner = CollectorRunner([], MetricCache(), WorkloadSnapshot, host=fake_host.host)
    got = await runner.read_now(MEMORY_DISTRESS)
    assert (got.psi_some_us, got.psi_full_us, got.psi_error) == (5_000, 1_500, "")
    assert (got.vmstat.pgscan, got.vmstat.pgsteal, got.vmstat.pgscan_direct) == (42, 30, 2)


async def test_without_psi_the_read_says_why_and_still_gives_the_reclaim_counters(
    fake_host: FakeHost,
) -> None:
    os.remove(fake_host.paths.proc("pressure", "memory"))
    runner = CollectorRunner([], MetricCache(), WorkloadSnapshot, host=fake_host.host)
    got = await runner.read_now(MEMORY_DISTRESS)
    assert got.psi_full_us is None
    assert "pressure/memory" in got.psi_error
    assert got.vmstat.pgscan == 0


# Rates and hysteresis ---------------------------------------------------------------------------


def test_a_rate_needs_half_a_window_and_then_spans_the_window() -> None:
    w = RateWindow(1.0)
    assert w.add(0.0, 0) is None
    assert w.add(0.4, 400) is None  # 0.4 s < half the window
    assert w.add(0.5, 500) == pytest.approx(1000.0)
    w.add(1.0, 1000)
    # 1.5 s: the readings kept reach back to 0.5 s (one at or before the cutoff), not to 0
    assert w.add(1.5, 1000) == pytest.approx(500.0)


def test_a_counter_that_goes_backwards_starts_the_window_over() -> None:
    w = RateWindow(1.0)
    w.add(0.0, 1000)
    w.add(0.6, 2000)
    assert w.add(0.7, 10) is None
    assert w.add(1.3, 610) == pytest.approx(1000.0)


def test_hysteresis_turns_on_at_on_after_sustain_and_off_only_below_off() -> None:
    h = Hysteresis(on=10.0, off=4.0, sustain=0.2)
    assert h.update(12.0, 0.0) is False  # above, not yet sustained
    assert h.update(8.0, 0.1) is False  # dipped under on: the sustain starts over
    assert h.update(12.0, 0.2) is False
    assert h.update(11.0, 0.4) is True
    assert h.active
    assert h.since == 0.4
    assert h.update(5.0, 0.5) is False  # between off and on: stays on
    assert h.active
    assert h.update(3.9, 0.6) is False
    assert not h.active
    assert h.update(12.0, 0.7) is False  # needs the sustain again
    assert h.update(None, 1.0) is False
    assert not h.active


def reading(at: float, full_us: int | None, pgscan: int = 0) -> DistressReading:
    return DistressReading(at, VmStat(pgscan, 0, 0), 0, full_us, "" if full_us is not None else "x")


def test_the_monitor_turns_on_for_psi_full_over_the_window_and_says_why() -> None:
    cfg = DistressConfig(psi_full_on=10.0, psi_full_off=5.0, window=0.5)
    turned = []
    m = DistressMonitor(cfg, lambda: asyncio.sleep(0, reading(0, 0)), lambda: turned.append(1))
    assert set(m.signals) == {PSI_FULL}
    assert not m.observe(reading(0.0, 0))
    assert not m.observe(reading(0.25, 10_000))  # 4% over 0.25 s, under half a window: no rate
    assert m.observe(reading(0.5, 60_000))  # 60 ms of full stall in 0.5 s: 12%
    assert m.active
    assert m.why() == "memory PSI full 12.0% >= 10% over 0.5s"
    assert not m.observe(reading(1.0, 90_000))  # 6% since 0.5 s: still on (above off)
    assert m.active
    assert not m.observe(reading(1.5, 100_000))  # 2%: off
    assert not m.active
    assert m.why() == ""


def test_the_reclaim_signal_reads_pages_scanned_per_second() -> None:
    cfg = DistressConfig(reclaim_on=10_000, reclaim_off=2_000, window=1.0)
    m = DistressMonitor(cfg, lambda: asyncio.sleep(0, reading(0, 0)), lambda: None)
    assert set(m.signals) == {RECLAIM}
    m.observe(reading(0.0, 0, pgscan=1_000))
    assert m.observe(reading(1.0, 0, pgscan=13_000))
    assert m.why() == "reclaim 12000 pages/s >= 10000 over 1s"
    assert m.describe()["signals"][RECLAIM]["value"] == 12_000.0


def test_without_psi_the_psi_signal_is_reported_unsupported_and_stays_off() -> None:
    cfg = DistressConfig(psi_full_on=10.0, psi_full_off=5.0)
    m = DistressMonitor(cfg, lambda: asyncio.sleep(0, reading(0, 0)), lambda: None)
    for at in (0.0, 0.5, 1.0):
        assert not m.observe(reading(at, None))
    assert m.unsupported == {PSI_FULL: "x"}


def test_the_configuration_off_of_zero_is_half_the_on_threshold() -> None:
    q = QoSConfig(memory_distress_psi_full_on=10.0, memory_distress_reclaim_on=5000.0)
    cfg = DistressConfig.of(q)
    assert (cfg.psi_full_off, cfg.reclaim_off, cfg.enabled) == (5.0, 2500.0, True)
    assert not DistressConfig.of(QoSConfig()).enabled


async def test_a_failing_read_is_logged_once_and_turns_the_signals_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def failing() -> DistressReading:
        raise HostError("/proc/vmstat: missing")

    m = DistressMonitor(DistressConfig(psi_full_on=1.0, psi_full_off=0.5), failing, lambda: None)
    m.signals[PSI_FULL].active = True
    await m.step()
    await m.step()
    assert not m.active
    assert m.errors == 2
    assert caplog.text.count("reading the counters failed") == 1


# Whole rounds -----------------------------------------------------------------------------------


class Feed:
    """Distress readings a test hands out one per sample."""

    def __init__(self) -> None:
        self.at = 0.0
        self.full_us = 0
        self.pgscan = 0

    async def __call__(self) -> DistressReading:
        return reading(self.at, self.full_us, self.pgscan)

    def storm(self, seconds: float, full_fraction: float) -> None:
        self.at += seconds
        self.full_us += int(seconds * full_fraction * 1e6)


QOS = QoSConfig(memory_distress_psi_full_on=10.0, memory_distress_window=0.5)


async def test_a_storm_below_the_usage_threshold_evicts_the_first_be_pod_at_once() -> None:
    feed = Feed()
    rig = make_rig(BE_AND_LS, qos=QOS, distress=feed, fresh=(int(5 * GiB), 10 * GiB))
    rig.sample(5 * GiB, {1: 3 * GiB, 2: GiB // 10, 3: GiB // 10})  # 50% < 70%
    await rig.strategy.round("tick")
    assert rig.backend.evicted == []
    monitor = rig.strategy.distress
    assert monitor is not None
    await monitor.step()  # the first reading
    feed.storm(0.5, 0.3)  # 30% of the time fully stalled
    await monitor.step()
    for _ in range(500):
        if rig.backend.evicted:
            break
        await asyncio.sleep(0.01)
    assert rig.backend.evicted == ["ns/p1"]  # one victim, the largest BE pod
    report = rig.ctx.book.last_report("memoryevict")
    assert report is not None
    assert report.inputs["trigger"] == "distress"
    assert report.inputs["distress"] == "memory PSI full 30.0% >= 10% over 0.5s"
    [entry] = [e for e in rig.audit.recent() if e.kind == "evict"]
    assert entry.reason.startswith(REASON_MEMORY_DISTRESS)
    assert "on memory distress" in entry.reason
    assert rig.evictor.metrics.evicted == {REASON_MEMORY_DISTRESS: 1}
    await rig.strategy.close()


async def test_while_distress_stays_on_each_round_after_the_cool_down_takes_one_more() -> None:
    feed = Feed()
    rig = make_rig(BE_AND_LS, qos=QOS, distress=feed)
    monitor = rig.strategy.distress
    assert monitor is not None
    await monitor.step()
    feed.storm(0.5, 0.3)
    await monitor.step()
    rig.sample(5 * GiB, {1: 3 * GiB, 2: GiB // 5, 3: GiB // 10})
    await rig.strategy.round("tick")
    assert rig.backend.evicted == ["ns/p1"]
    rig.clock.now += rig.strategy.cool_time
    feed.storm(0.5, 0.07)  # 7%: below on, above off (5%): still on
    await monitor.step()
    rig.sample(5 * GiB, {2: GiB // 5, 3: GiB // 10})
    await rig.strategy.round("tick")
    assert rig.backend.evicted == ["ns/p1", "ns/p2"]
    rig.clock.now += rig.strategy.cool_time
    feed.storm(0.5, 0.01)  # 1%: off
    await monitor.step()
    rig.sample(5 * GiB, {3: GiB // 10})
    await rig.strategy.round("tick")
    assert rig.backend.evicted == ["ns/p1", "ns/p2"]
    await rig.strategy.close()


async def test_above_the_usage_threshold_the_usage_need_and_reason_win() -> None:
    feed = Feed()
    rig = make_rig(BE_AND_LS, qos=QOS, distress=feed)
    monitor = rig.strategy.distress
    assert monitor is not None
    await monitor.step()
    feed.storm(0.5, 0.5)
    await monitor.step()
    rig.sample(8 * GiB, {1: GiB, 2: GiB, 3: GiB})  # 80%: release down to 68%
    await rig.strategy.round("tick")
    assert len(rig.backend.evicted) == 2
    assert rig.evictor.metrics.evicted == {REASON_MEMORY: 2}


async def test_the_trigger_needs_the_be_task_gate_and_says_so() -> None:
    rig = make_rig(BE_AND_LS, qos=QOS, distress=Feed(), gates=Gates("MemoryEvict", be=False))
    assert rig.strategy.distress is None
    assert rig.strategy.describe()["distress"] == (
        "configured but feature gate BEMemoryEvict is off"
    )


async def test_the_sampler_task_runs_on_its_interval_and_stops_on_close() -> None:
    feed = Feed()
    qos = QoSConfig(memory_distress_psi_full_on=10.0, memory_distress_interval=0.01)
    rig = make_rig(BE_AND_LS, qos=qos, distress=feed)
    rig.sample(4 * GiB, {1: GiB})
    await rig.strategy.reconcile()
    monitor = rig.strategy.distress
    assert monitor is not None
    names = {t.get_name() for t in asyncio.all_tasks()}
    assert "qos/memoryevict-distress" in names
    for _ in range(500):
        if monitor.samples >= 3:
            break
        await asyncio.sleep(0.01)
    assert monitor.samples >= 3
    await rig.strategy.close()
    assert "qos/memoryevict-distress" not in {t.get_name() for t in asyncio.all_tasks()}


# Arming only what the host supports -------------------------------------------------------------


def caps(supported: bool, reason: str) -> Capabilities:
    return Capabilities(
        [Capability("psi_trigger", supported, reason, "/proc/pressure/memory")], CgroupVersion.V2
    )


async def test_psi_is_not_armed_when_the_probe_found_triggers_unsupported() -> None:
    from tests.unit.test_qos_memoryevict import FakeEvents

    events = FakeEvents()
    rig = make_rig(
        BE_AND_LS,
        events=events,
        version=CgroupVersion.V2,
        capabilities=caps(False, "/proc/pressure/memory is not on procfs: not probed"),
    )
    for _ in range(3):
        rig.sample(4 * GiB, {1: GiB})
        await rig.strategy.reconcile()
    assert events.watches == []
    assert rig.strategy.describe()["watch_unsupported"] == (
        "psi_trigger unsupported: /proc/pressure/memory is not on procfs: not probed"
    )
    await rig.strategy.close()


async def test_a_pressure_file_epoll_refuses_is_unsupported_not_an_error(tmp_path: Path) -> None:
    fake = tmp_path / "memory"
    fake.write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    source = PressureEventSource(privileged=False)
    try:
        for _ in range(2):  # every round: a False, never a raise
            assert not await source.watch_psi(str(fake), "some", 100_000, 2_000_000, "w")
        assert "cannot be watched" in source.unsupported["w"]
        assert source.watches == ()
    finally:
        source.close()
