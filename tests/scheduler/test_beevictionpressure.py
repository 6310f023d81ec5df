"""BEEvictionPressure (ours): BE pods are kept off a node whose koordlet is evicting BE pods, as
the koordlet's ``koordinator.sh/BEEvictionPressure`` condition says; other pods are not."""

from __future__ import annotations

from typing import Any

import pytest

from apis.extension import LABEL_POD_QOS
from apis.node_conditions import CONDITION_BE_EVICTION_PRESSURE
from scheduler_plugins.framework import Framework
from scheduler_plugins.plugins.beevictionpressure import (
    ERR_BE_EVICTION_PRESSURE,
    BEEvictionPressure,
)
from scheduler_plugins.snapshot import parse_node, parse_pod
from scheduler_plugins.table import PLUGINS
from tests.scheduler.builders import NOW, node, pod
from tests.scheduler.helpers import evaluate, snapshot_of


def pressured(name: str, status: str = "True") -> dict[str, Any]:
    n = node(name)
    n["status"]["conditions"] = [
        {"type": "Ready", "status": "True"},
        {"type": CONDITION_BE_EVICTION_PRESSURE, "status": status, "reason": "EvictingBEPods"},
    ]
    return n


BE = pod("be", labels={LABEL_POD_QOS: "BE"}, requests={"kubernetes.io/batch-cpu": "1000"})


@pytest.mark.parametrize(
    ("candidate", "status", "rejected"),
    [
        (BE, "True", True),
        (BE, "False", False),
        (pod("besteffort"), "True", True),  # no label, BestEffort: BE to the snapshot
        (pod("ls", labels={LABEL_POD_QOS: "LS"}, requests={"cpu": "1"}), "True", False),
        (pod("burstable", requests={"cpu": "1"}), "True", False),
    ],
)
def test_only_be_pods_are_kept_off_a_node_under_be_eviction_pressure(
    candidate: dict[str, Any], status: str, rejected: bool
) -> None:
    result = evaluate(
        [pressured("n1", status), node("n2")], candidate, plugins=[BEEvictionPressure()]
    )
    assert result.nodes["n1"].reasons == ([ERR_BE_EVICTION_PRESSURE] if rejected else [])
    assert result.nodes["n2"].reasons == []


def test_the_default_framework_runs_the_filter() -> None:
    assert "BEEvictionPressure" in PLUGINS
    result = evaluate([pressured("n1"), node("n2", extra={"kubernetes.io/batch-cpu": "8000"})], BE)
    assert ERR_BE_EVICTION_PRESSURE in result.nodes["n1"].reasons


def test_a_node_updated_into_and_out_of_pressure_is_seen_by_the_next_pod() -> None:
    # the plugin keeps the pressured nodes between cycles: a Node update (the informer's
    # upsert) must reach it, for every node and for a subset of them
    snap = snapshot_of(node("n1"), node("n2"), node("n3"))
    fw = Framework([BEEvictionPressure()])
    be = parse_pod(BE, "pod")

    def failing(names: list[str] | None) -> dict[str, list[str]]:
        result = fw.evaluate(snap, be, now=NOW, node_names=names, all_verdicts=True)
        return {name: r.reasons for name, r in result.nodes.items() if r.reasons}

    assert failing(None) == {}
    snap.upsert_node(parse_node(pressured("n2"), "test", "n2"))
    assert failing(None) == {"n2": [ERR_BE_EVICTION_PRESSURE]}
    assert failing(["n2", "n3"]) == {"n2": [ERR_BE_EVICTION_PRESSURE]}
    assert failing(["n1", "n3"]) == {}
    snap.upsert_node(parse_node(pressured("n2", "False"), "test", "n2"))
    assert failing(None) == {}
    assert failing(["n2"]) == {}
