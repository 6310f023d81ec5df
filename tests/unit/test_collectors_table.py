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
    "sysresource",
]


def test_the_table_lists_every_collector_in_execution_order_with_system_last() -> None:
    assert list(COLLECTORS) == ORDER


def test_each_collector_carries_its_table_name_and_configured_interval(
    fake_host: FakeHost,
) -> None:
    cfg = KoordletConfig(
        node_name="n", collect=CollectConfig(res_used_interval=2.0, node_cpu_info_interval=30.0)
    )

    collectors = build_collectors(CollectorContext(host=fake_host.host, config=cfg))

    assert [c.name for c in collectors] == ORDER
    assert {c.name: c.interval for c in collectors} == {
        name: 30.0 if name == "nodeinfo" else 2.0 for name in ORDER
    }


def test_without_a_configuration_koordinator_defaults_apply(fake_host: FakeHost) -> None:
    collectors = build_collectors(CollectorContext(host=fake_host.host, config=None))

    assert {c.name: c.interval for c in collectors}["nodeinfo"] == 60.0
    assert {c.name: c.interval for c in collectors}["podresource"] == 1.0


def test_disabled_collectors_are_left_out_and_unknown_names_refused(fake_host: FakeHost) -> None:
    ctx = CollectorContext(host=fake_host.host, config=None)

    names = [c.name for c in build_collectors(ctx, disabled={"pagecache", "nodeinfo"})]

    assert names == [n for n in ORDER if n not in {"pagecache", "nodeinfo"}]
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
