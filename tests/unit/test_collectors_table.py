"""The collector table: one row per collector holds its order, gate, switch, interval and the
families it exports with their max age; building honours every column."""

from __future__ import annotations

import dataclasses

import pytest

from apis.extension import KubeQOS
from koordlet.collectors.framework import CollectorContext, CollectorSpec
from koordlet.collectors.runner import CollectorRunner
from koordlet.collectors.table import COLLECTORS, build_collectors, export_max_ages
from koordlet.config import CollectConfig, KoordletConfig
from koordlet.errors import ConfigError
from koordlet.features import KOORDLET_FEATURES, parse_feature_gates
from koordlet.metriccache import MetricCache
from koordlet.server.exporter import FAMILIES
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import WorkloadSnapshot
from tests.fakehost import FakeHost, container_id

ORDER = [
    "noderesource",
    "nodeinfo",
    "nodestorage",
    "podresource",
    "podthrottled",
    "pagecache",
    "hostapplication",
    "beresource",
    "coldmemory",
    "resctrlmon",
    "sysresource",
    "cpi",
    "psi",
    "gpu",
]
GATED = {"coldmemory", "cpi", "gpu", "nodestorage", "psi", "resctrlmon"}
"""Behind feature gates or switches that are off by default, as upstream."""
RUNNING = [name for name in ORDER if name not in GATED]
DEFAULTS = KoordletConfig(node_name="n")
UID = "5d4c3b2a-1f0e-4d9c-8b7a-695847362514"


def test_the_table_lists_every_collector_in_execution_order_with_system_last() -> None:
    assert [spec.name for spec in COLLECTORS] == ORDER


def test_every_gate_is_a_koordlet_feature_gate_that_upstream_leaves_off() -> None:
    gates = {spec.name: spec.gate for spec in COLLECTORS if spec.gate}

    assert gates == {
        "coldmemory": "ColdPageCollector",
        "cpi": "CPICollector",
        "nodestorage": "BlkIOReconcile",
        "psi": "PSICollector",
        "gpu": "Accelerators",
    }
    assert all(not KOORDLET_FEATURES[gate].default for gate in gates.values())


def test_every_exported_family_is_fed_by_exactly_one_row() -> None:
    claimed = [family for spec in COLLECTORS for family in spec.families]

    assert sorted(claimed) == sorted(f.name for f in FAMILIES)


def test_each_default_collector_emits_only_the_series_of_the_families_its_row_claims(
    fake_host: FakeHost,
) -> None:
    fake_host.add_pod(UID, KubeQOS.BESTEFFORT, [("containerd", container_id("c"))])
    snap = WorkloadSnapshot(pods=KubepodsSource(fake_host.host).list_pods(), generation=1)
    series_of = {f.name: {src.series for src in f.sources} for f in FAMILIES}
    rows = {spec.name: spec for spec in COLLECTORS}
    runner = CollectorRunner(
        build_collectors(CollectorContext(fake_host.host, DEFAULTS)), MetricCache(), lambda: snap
    )
    emitted: dict[str, set[str]] = {}
    for now in (100.0, 101.0):  # the second tick yields the counters' rates
        for step in runner.run_tick(now).steps:
            assert step.result is not None, (step.name, step.error)
            names = {sample.key.metric for sample in step.result.all_samples()}
            emitted.setdefault(step.name, set()).update(names)

    for name, metrics in emitted.items():
        claimed = set().union(*(series_of[f] for f in rows[name].families))
        assert metrics <= claimed, (name, metrics - claimed)
    assert {name for name, metrics in emitted.items() if metrics} == set(RUNNING) - {
        "nodeinfo",  # info only
        "hostapplication",  # none declared
    }


def test_each_collector_carries_its_table_name_and_configured_interval(
    fake_host: FakeHost,
) -> None:
    cfg = KoordletConfig(
        node_name="n", collect=CollectConfig(res_used_interval=2.0, node_cpu_info_interval=30.0)
    )

    collectors = build_collectors(CollectorContext(host=fake_host.host, config=cfg))

    assert [c.name for c in collectors] == RUNNING
    assert {c.name: c.interval for c in collectors} == {
        name: 30.0 if name == "nodeinfo" else 2.0 for name in RUNNING
    }


def test_koordinators_defaults_apply_to_a_default_configuration(fake_host: FakeHost) -> None:
    collectors = build_collectors(CollectorContext(host=fake_host.host, config=DEFAULTS))

    assert {c.name: c.interval for c in collectors}["nodeinfo"] == 60.0
    assert {c.name: c.interval for c in collectors}["podresource"] == 1.0


def test_disabled_collectors_are_left_out_and_unknown_names_refused(fake_host: FakeHost) -> None:
    ctx = CollectorContext(host=fake_host.host, config=DEFAULTS)

    names = [c.name for c in build_collectors(ctx, disabled={"pagecache", "nodeinfo"})]

    assert names == [n for n in RUNNING if n not in {"pagecache", "nodeinfo"}]
    with pytest.raises(ConfigError, match="pagecach"):
        build_collectors(ctx, disabled={"pagecach"})


def test_a_table_that_names_a_collector_twice_is_refused(fake_host: FakeHost) -> None:
    ctx = CollectorContext(host=fake_host.host, config=DEFAULTS)

    with pytest.raises(ConfigError, match="duplicate"):
        build_collectors(ctx, (*COLLECTORS, COLLECTORS[0]))


def test_a_gated_row_runs_only_when_its_feature_gate_is_on(fake_host: FakeHost) -> None:
    pagecache = next(spec for spec in COLLECTORS if spec.name == "pagecache")
    table = (dataclasses.replace(pagecache, gate="PSICollector"),)
    on = KoordletConfig(node_name="n", feature_gates=parse_feature_gates("PSICollector=true"))

    without = build_collectors(CollectorContext(fake_host.host, DEFAULTS), table)
    with_gate = build_collectors(CollectorContext(fake_host.host, on), table)

    assert without == []
    assert [c.name for c in with_gate] == ["pagecache"]


def test_gated_and_switched_collectors_run_at_their_own_intervals_when_enabled(
    fake_host: FakeHost,
) -> None:
    cfg = KoordletConfig(
        node_name="n",
        collect=CollectConfig(
            psi_interval=7.0,
            cold_page_interval=3.0,
            enable_resctrl_collector=True,
            resctrl_interval=4.0,
        ),
        feature_gates=parse_feature_gates("PSICollector=true,ColdPageCollector=true"),
    )

    collectors = {c.name: c for c in build_collectors(CollectorContext(fake_host.host, cfg))}

    assert "cpi" not in collectors  # CPICollector stays off
    assert collectors["psi"].interval == 7.0
    assert collectors["coldmemory"].interval == 3.0
    assert collectors["resctrlmon"].interval == 4.0


def test_resctrl_monitoring_is_off_unless_its_switch_is_on(fake_host: FakeHost) -> None:
    off = build_collectors(CollectorContext(fake_host.host, DEFAULTS))

    assert "resctrlmon" not in [c.name for c in off]


def test_slow_collectors_keep_their_families_exported_for_one_of_their_own_intervals() -> None:
    collect = CollectConfig(
        res_used_interval=2.0, psi_interval=10.0, cpi_interval=60.0, cold_page_interval=5.0
    )

    ages = export_max_ages(COLLECTORS, collect)

    assert ages["koordlet_node_psi"] == ages["koordlet_container_psi"] == 14.0  # 10 + 2 ticks
    assert ages["koordlet_container_cpi"] == 64.0  # a window a minute, give or take a tick
    assert ages["koordlet_pod_memory_cold_page_bytes"] == 15.0  # 3 of its intervals
    # all eight cold-memory families, the host applications' hot page cache one included
    assert ages["koordlet_host_application_memory_with_hot_page_cache_bytes"] == 15.0
    assert ages["koordlet_resctrl_llc_occupancy"] == 6.0  # 3 base ticks: it runs every tick
    assert "koordlet_pod_used_cpu_cores" not in ages  # the exporter's default (3 base ticks)


def test_a_row_sets_the_interval_and_must_build_a_collector_of_its_own_name(
    fake_host: FakeHost,
) -> None:
    ctx = CollectorContext(fake_host.host, DEFAULTS)
    mine = dataclasses.replace(COLLECTORS[0], interval=lambda c: 5.0, families=())
    misnamed = CollectorSpec("one", COLLECTORS[0].factory, lambda c: 5.0, "none")

    (built,) = build_collectors(ctx, (mine,))

    assert built.interval == 5.0
    assert export_max_ages((mine,), DEFAULTS.collect) == {}
    with pytest.raises(ConfigError, match="'one' built a collector named 'noderesource'"):
        build_collectors(ctx, (misnamed,))
