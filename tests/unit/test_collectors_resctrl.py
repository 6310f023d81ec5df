"""The resctrl monitoring collector on a fake host carrying the golden resctrl mount of a
two-socket Xeon: LLC occupancy summed over L3 domains, bandwidth as counter deltas per second,
seeding and re-seeding, ``Unavailable`` domains and hosts without RDT."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from koordlet.collectors.framework import CollectorContext, CollectResult
from koordlet.collectors.resctrlmon import INFO_KEY, NAME, ResctrlMonCollector
from koordlet.collectors.runner import TickState
from koordlet.collectors.table import build_collectors
from koordlet.config import CollectConfig, KoordletConfig
from koordlet.metriccache import series as s
from koordlet.metriccache.store import MetricCache
from koordlet.server.exporter import KoordletExporter
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.resctrl import MBM_TOTAL, resctrl_root
from tests.fakehost import FakeHost

GOLDEN = Path(__file__).parent.parent / "golden" / "resctrl"
LS = s.resctrl_group_entity("LS")
BE = s.resctrl_group_entity("BE")
LS0, LS1 = s.resctrl_domain_entity("LS", 0), s.resctrl_domain_entity("LS", 1)
GiB = 1 << 30


@pytest.fixture
def rdt(fake_host: FakeHost) -> Path:
    """The fake host with the Xeon's cpuinfo and the golden resctrl mount; returns the mount."""
    shutil.copy(GOLDEN / "cpuinfo.xeon-6148", fake_host.paths.proc("cpuinfo"))
    root = Path(resctrl_root(fake_host.paths))
    shutil.copytree(GOLDEN / "fs", root)
    return root


def golden_value(group: str, cache_id: int, event: str) -> int:
    return int((GOLDEN / "fs" / group / "mon_data" / f"mon_L3_{cache_id:02d}" / event).read_text())


def put(root: Path, group: str, cache_id: int, event: str, value: int | str) -> None:
    (root / group / "mon_data" / f"mon_L3_{cache_id:02d}" / event).write_text(f"{value}\n")


def step(collector: ResctrlMonCollector, now: float) -> CollectResult:
    return collector.collect(TickState(now, WorkloadSnapshot()))


def values(result: CollectResult) -> dict[tuple[str, str], float]:
    return {(x.key.metric, x.key.entity): x.value for x in result.samples}


def test_llc_occupancy_is_reported_per_domain_and_summed_per_group(
    fake_host: FakeHost, rdt: Path
) -> None:
    got = values(step(ResctrlMonCollector(fake_host.host), 100.0))

    ls = [golden_value("LS", i, "llc_occupancy") for i in (0, 1)]
    assert got[(s.RESCTRL_DOMAIN_LLC_OCCUPANCY, LS0)] == ls[0]
    assert got[(s.RESCTRL_DOMAIN_LLC_OCCUPANCY, LS1)] == ls[1]
    assert got[(s.RESCTRL_LLC_OCCUPANCY, LS)] == sum(ls)
    for group in ("LSR", "BE"):
        entity = s.resctrl_group_entity(group)
        expected = sum(golden_value(group, i, "llc_occupancy") for i in (0, 1))
        assert got[(s.RESCTRL_LLC_OCCUPANCY, entity)] == expected


def test_the_first_step_only_seeds_bandwidth_but_keeps_the_raw_counters(
    fake_host: FakeHost, rdt: Path
) -> None:
    got = values(step(ResctrlMonCollector(fake_host.host), 100.0))

    assert got[(s.RESCTRL_DOMAIN_MBM_TOTAL_BYTES, LS0)] == golden_value("LS", 0, "mbm_total_bytes")
    assert got[(s.RESCTRL_DOMAIN_MBM_LOCAL_BYTES, LS1)] == golden_value("LS", 1, "mbm_local_bytes")
    assert not any(metric.endswith("_bandwidth") for metric, _ in got)


def test_bandwidth_is_the_counter_delta_per_second_per_domain_and_summed(
    fake_host: FakeHost, rdt: Path
) -> None:
    collector = ResctrlMonCollector(fake_host.host)
    step(collector, 100.0)
    for cache_id, grown in ((0, 6 * GiB), (1, 2 * GiB)):
        base = golden_value("LS", cache_id, "mbm_total_bytes")
        put(rdt, "LS", cache_id, "mbm_total_bytes", base + grown)
        local = golden_value("LS", cache_id, "mbm_local_bytes")
        put(rdt, "LS", cache_id, "mbm_local_bytes", local + grown // 2)

    got = values(step(collector, 102.0))

    assert got[(s.RESCTRL_DOMAIN_MBM_TOTAL_BANDWIDTH, LS0)] == 3 * GiB
    assert got[(s.RESCTRL_DOMAIN_MBM_TOTAL_BANDWIDTH, LS1)] == 1 * GiB
    assert got[(s.RESCTRL_MBM_TOTAL_BANDWIDTH, LS)] == 4 * GiB
    assert got[(s.RESCTRL_MBM_LOCAL_BANDWIDTH, LS)] == 2 * GiB
    assert got[(s.RESCTRL_MBM_TOTAL_BANDWIDTH, BE)] == 0.0  # counters did not move


def test_a_counter_that_went_backwards_reseeds_and_hides_the_group_sum_once(
    fake_host: FakeHost, rdt: Path
) -> None:
    collector = ResctrlMonCollector(fake_host.host)
    step(collector, 100.0)
    put(rdt, "LS", 1, "mbm_total_bytes", 1000)  # the group was recreated: a new RMID

    reset = values(step(collector, 101.0))
    put(rdt, "LS", 1, "mbm_total_bytes", 1000 + GiB)
    after = values(step(collector, 102.0))

    assert (s.RESCTRL_DOMAIN_MBM_TOTAL_BANDWIDTH, LS1) not in reset
    assert (s.RESCTRL_MBM_TOTAL_BANDWIDTH, LS) not in reset
    assert reset[(s.RESCTRL_DOMAIN_MBM_TOTAL_BANDWIDTH, LS0)] == 0.0
    assert after[(s.RESCTRL_DOMAIN_MBM_TOTAL_BANDWIDTH, LS1)] == GiB
    assert after[(s.RESCTRL_MBM_TOTAL_BANDWIDTH, LS)] == GiB


def test_an_unavailable_domain_is_skipped_with_the_reason_and_no_partial_sum(
    fake_host: FakeHost, rdt: Path
) -> None:
    collector = ResctrlMonCollector(fake_host.host)
    put(rdt, "BE", 1, "llc_occupancy", "Unavailable")

    result = step(collector, 100.0)
    got = values(result)

    key = "BE/mon_L3_01/llc_occupancy"
    assert "Unavailable" in result.unsupported[key]
    assert result.unsupported[key].startswith(str(rdt / "BE" / "mon_data" / "mon_L3_01"))
    assert (s.RESCTRL_LLC_OCCUPANCY, BE) not in got
    assert got[(s.RESCTRL_DOMAIN_LLC_OCCUPANCY, s.resctrl_domain_entity("BE", 0))] == (
        golden_value("BE", 0, "llc_occupancy")
    )
    assert (s.RESCTRL_LLC_OCCUPANCY, LS) in got


def test_an_errored_counter_drops_its_seed(fake_host: FakeHost, rdt: Path) -> None:
    collector = ResctrlMonCollector(fake_host.host)
    step(collector, 100.0)
    put(rdt, "LS", 0, "mbm_local_bytes", "Error")
    errored = step(collector, 101.0)
    put(rdt, "LS", 0, "mbm_local_bytes", golden_value("LS", 0, "mbm_local_bytes") + GiB)

    got = values(step(collector, 102.0))

    assert "Error" in errored.unsupported["LS/mon_L3_00/mbm_local_bytes"]
    assert (s.RESCTRL_DOMAIN_MBM_LOCAL_BANDWIDTH, LS0) not in got  # re-seeded, not bridged


def test_missing_groups_are_listed_as_absent(fake_host: FakeHost, rdt: Path) -> None:
    shutil.rmtree(rdt / "LSR")

    result = step(ResctrlMonCollector(fake_host.host), 100.0)

    assert result.info[INFO_KEY] == {
        "present": ["LS", "BE"],
        "absent": ["LSR"],
        "events": ["llc_occupancy", "mbm_total_bytes", "mbm_local_bytes"],
    }
    assert not any(e.startswith(s.resctrl_group_entity("LSR")) for _, e in values(result))


def test_an_event_the_kernel_does_not_list_is_reported_and_not_read(
    fake_host: FakeHost, rdt: Path
) -> None:
    (rdt / "info" / "L3_MON" / "mon_features").write_text("llc_occupancy\nmbm_total_bytes\n")

    result = step(ResctrlMonCollector(fake_host.host), 100.0)

    assert result.unsupported["mbm_local_bytes"].startswith("mbm_local_bytes not listed in")
    assert not any(metric.endswith("mbm_local_bytes") for metric, _ in values(result))


def test_a_host_without_rdt_reports_only_the_missing_flag(fake_host: FakeHost) -> None:
    result = step(ResctrlMonCollector(fake_host.host), 100.0)

    assert not result.samples
    assert "flags lack cqm_llc" in result.unsupported["resctrl"]


def test_the_factory_takes_the_resctrl_interval_with_koordinators_default(
    fake_host: FakeHost,
) -> None:
    on = CollectConfig(enable_resctrl_collector=True)
    default = KoordletConfig(node_name="n", collect=on)
    own = KoordletConfig(node_name="n", collect=dataclasses.replace(on, resctrl_interval=3.0))

    def interval(cfg: KoordletConfig) -> float:
        built = build_collectors(CollectorContext(fake_host.host, cfg))
        return next(c.interval for c in built if c.name == NAME)

    assert interval(default) == 1.0
    assert interval(own) == 3.0


def test_the_exporter_serves_upstreams_families_per_cache_domain(
    fake_host: FakeHost, rdt: Path
) -> None:
    collector = ResctrlMonCollector(fake_host.host)
    cache = MetricCache(clock=lambda: 102.0)
    cache.append(100.0, step(collector, 100.0).samples)
    base = golden_value("BE", 1, "mbm_total_bytes")
    put(rdt, "BE", 1, "mbm_total_bytes", base + 2 * GiB)
    cache.append(102.0, step(collector, 102.0).samples)
    exporter = KoordletExporter(
        cache, WorkloadSnapshot, node_name="n1", collect_interval=1.0, clock=lambda: 102.0
    )

    families = {f.name: f for f in exporter.collect()}

    def sample(family: str, **labels: str) -> float:
        got = [x.value for x in families[family].samples if x.labels == {"node": "n1", **labels}]
        assert len(got) == 1, (family, labels)
        return got[0]

    llc = sample("koordlet_resctrl_llc_occupancy", cache_id="1", qos="LS")
    assert llc == golden_value("LS", 1, "llc_occupancy")
    raw = sample("koordlet_resctrl_memory_bandwidth", cache_id="1", qos="BE", mb_type=MBM_TOTAL)
    assert raw == base + 2 * GiB
    rate = "koordlet_resctrl_memory_bandwidth_bytes_per_second"
    assert sample(rate, cache_id="1", qos="BE", mb_type=MBM_TOTAL) == GiB
    assert sample(rate, cache_id="0", qos="LSR", mb_type="mbm_local_bytes") == 0.0
    assert len(families["koordlet_resctrl_llc_occupancy"].samples) == 3 * 2
