"""The collector table: order, intervals from the configuration, disabling and gating."""

from __future__ import annotations

import pytest

from koordlet.collectors.framework import CollectorContext
from koordlet.collectors.table import COLLECTORS, build_collectors
from koordlet.config import CollectConfig, KoordletConfig
from koordlet.errors import ConfigError
from koordlet.features import parse_feature_gates
from tests.fakehost import FakeHost

ORDER = [
    "noderesource",
    "nodeinfo",
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
]
GATED = {"coldmemory", "cpi", "psi", "resctrlmon"}
"""Behind feature gates or switches that are off by default, as upstream."""
RUNNING = [name for name in ORDER if name not in GATED]


def test_the_table_lists_every_collector_in_execution_order_with_system_last() -> None:
    assert list(COLLECTORS) == ORDER


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


def test_without_a_configuration_koordinator_defaults_apply(fake_host: FakeHost) -> None:
    collectors = build_collectors(CollectorContext(host=fake_host.host, config=None))

    assert {c.name: c.interval for c in collectors}["nodeinfo"] == 60.0
    assert {c.name: c.interval for c in collectors}["podresource"] == 1.0


def test_disabled_collectors_are_left_out_and_unknown_names_refused(fake_host: FakeHost) -> None:
    ctx = CollectorContext(host=fake_host.host, config=None)

    names = [c.name for c in build_collectors(ctx, disabled={"pagecache", "nodeinfo"})]

    assert names == [n for n in RUNNING if n not in {"pagecache", "nodeinfo"}]
    with pytest.raises(ConfigError, match="pagecach"):
        build_collectors(ctx, disabled={"pagecach"})


def test_a_gated_collector_runs_only_when_its_feature_gate_is_on(fake_host: FakeHost) -> None:
    gates = {"pagecache": "PSICollector"}
    off = KoordletConfig(node_name="n")
    on = KoordletConfig(node_name="n", feature_gates=parse_feature_gates("PSICollector=true"))

    without = build_collectors(CollectorContext(fake_host.host, off), gates=gates)
    with_gate = build_collectors(CollectorContext(fake_host.host, on), gates=gates)

    assert "pagecache" not in [c.name for c in without]
    assert "pagecache" in [c.name for c in with_gate]


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
    off = build_collectors(CollectorContext(fake_host.host, KoordletConfig(node_name="n")))

    assert "resctrlmon" not in [c.name for c in off]
