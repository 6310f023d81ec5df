"""Network QoS arithmetic: the node's total (annotation, NodeSLO, link speed, in upstream's order
of precedence: ``AnnotationNodeBandwidth`` wins over ``totalNetworkBandwidth``) and the HTB classes
upstream's ``EnsureClasses`` builds (root at the total; SYSTEM at the total minus the LS and BE
requests, ceil the total; LS and BE at request/limit), from the NodeSLO in force. The tree on a
real interface is in ``tests/integration/test_netqos_netns.py``."""

from __future__ import annotations

from typing import Any

import pytest

from apis.netqos import ANNOTATION_NODE_NETWORK_BANDWIDTH
from koordlet.executor.tc import MIN_RATE_BYTES, ClassPlan
from koordlet.qos.netqos import NetQoSConfigError, node_bandwidth, tree_classes
from tests.strategyrig import in_force

G = 1_000_000_000


def classes(raw: dict[str, Any], total: int = G) -> tuple[dict[str, ClassPlan], list[str]]:
    qos = in_force(resourceQOSStrategy=raw).resource_qos_strategy
    plans, notes = tree_classes(qos, total)
    return {p.name: p for p in plans}, notes


def net(enable: bool = True, **fields: Any) -> dict[str, Any]:
    return {"networkQOS": {"enable": enable, **fields}}


def test_the_tree_follows_upstreams_classes() -> None:
    got, notes = classes(
        {
            "lsClass": net(egressRequest=40, egressLimit=100),
            "beClass": net(egressRequest=30, egressLimit="500M"),
        }
    )
    rates = {n: (p.handle, p.parent, p.rate_bps, p.ceil_bps, p.prio) for n, p in got.items()}
    assert rates == {
        "root": (0x10001, 0x10000, G, G, 0),
        "system_class": (0x10002, 0x10001, 300_000_000, G, 1),
        "ls_class": (0x10003, 0x10001, 400_000_000, G, 2),
        "be_class": (0x10004, 0x10001, 300_000_000, 500_000_000, 3),
    }
    assert notes == []


def test_a_disabled_class_is_guaranteed_nothing_and_may_borrow_the_total() -> None:
    got, _ = classes({"beClass": net(egressRequest=10, egressLimit=20), "lsClass": net(False)})
    assert (got["ls_class"].rate_bps, got["ls_class"].ceil_bps) == (0, G)
    assert got["system_class"].rate_bps == 900_000_000
    # HTB refuses a zero rate: the kernel gets the floor.
    assert got["ls_class"].kernel().rate == MIN_RATE_BYTES


def test_the_crd_defaults_fill_an_enabled_class_without_numbers() -> None:
    got, _ = classes({"beClass": {"networkQOS": {"enable": True}}})
    assert (got["be_class"].rate_bps, got["be_class"].ceil_bps) == (0, G)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"beClass": net(egressLimit=150)}, r"beClass\.networkQOS\.egressLimit: percent 150"),
        ({"lsClass": net(egressRequest="fast")}, r"lsClass\.networkQOS\.egressRequest: 'fast'"),
        ({"beClass": net(ingressLimit=-3)}, r"beClass\.networkQOS\.ingressLimit: percent -3"),
        (
            {"lsClass": net(egressRequest=70), "beClass": net(egressRequest=40)},
            r"egressRequest of lsClass \(700000000\) and beClass \(400000000\) exceed",
        ),
    ],
)
def test_values_that_cannot_be_applied_are_refused_naming_the_field(
    raw: dict[str, Any], message: str
) -> None:
    with pytest.raises(NetQoSConfigError, match=message):
        classes(raw)


def test_odd_but_applicable_values_are_noted() -> None:
    got, notes = classes(
        {
            "beClass": net(egressRequest=20, egressLimit="5G", ingressLimit=50),
            "lsrClass": net(egressRequest=10),
        }
    )
    assert got["be_class"].ceil_bps == G
    assert any("egressLimit 5000000000 bit/s above" in n for n in notes)
    assert any("ingress*: not enforced" in n for n in notes)
    assert any("lsrClass.networkQOS not applied" in n for n in notes)


def test_a_limit_below_the_request_becomes_the_request_in_the_kernel() -> None:
    got, notes = classes({"beClass": net(egressRequest=30, egressLimit=10)})
    kernel = got["be_class"].kernel()
    assert kernel.ceil == kernel.rate == 300_000_000 // 8
    assert any("below egressRequest" in n for n in notes)


@pytest.mark.parametrize(
    ("annotations", "total", "link", "expected"),
    [
        ({ANNOTATION_NODE_NETWORK_BANDWIDTH: "10G"}, "1G", 100, (10 * G, "node annotation")),
        ({}, "1G", 100, (G, "systemStrategy.totalNetworkBandwidth")),
        ({}, "0", 25 * G, (25 * G, "link speed")),
        ({}, 0, 25 * G, (25 * G, "link speed")),
    ],
)
def test_the_total_comes_from_the_annotation_then_the_nodeslo_then_the_link(
    annotations: dict[str, str], total: int | str, link: int | None, expected: tuple[int, str]
) -> None:
    got = node_bandwidth(annotations, total, link)
    assert (got.bps, got.source) == expected


@pytest.mark.parametrize(
    ("annotations", "total", "message"),
    [
        ({ANNOTATION_NODE_NETWORK_BANDWIDTH: "fast"}, "0", "network-bandwidth='fast'"),
        ({}, "0", "bandwidth is unknown"),
        ({}, "-5M", "totalNetworkBandwidth: '-5M' is negative"),
    ],
)
def test_an_unknown_or_malformed_total_is_refused(
    annotations: dict[str, str], total: str, message: str
) -> None:
    with pytest.raises(NetQoSConfigError, match=message):
        node_bandwidth(annotations, total, None)
