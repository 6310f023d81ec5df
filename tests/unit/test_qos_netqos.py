"""Network QoS arithmetic: the node's total (annotation, NodeSLO, link speed, in upstream's order
of precedence: ``AnnotationNodeBandwidth`` wins over ``totalNetworkBandwidth``) and the HTB classes
upstream's ``EnsureClasses`` builds (root at the total; SYSTEM at the total minus the LS and BE
requests, ceil the total; LS and BE at request/limit), from the NodeSLO in force. The tree on a
real interface is in ``tests/integration/test_netqos_netns.py``."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from apis.extension import KubeQOS, QoSClass
from apis.netqos import (
    ANNOTATION_NODE_NETWORK_BANDWIDTH,
    POD_CLASS_MINORS,
    NetQoSClass,
    pod_class_minors,
)
from apis.pod_overrides import ANNOTATION_POD_NETWORK_QOS
from koordlet.executor.tc import MIN_RATE_BYTES, ClassPlan, TreeResult
from koordlet.qos.framework import StrategyContext
from koordlet.qos.netqos import (
    NAME,
    OFF_CHECKED,
    NetQoS,
    NetQoSConfigError,
    PodLimit,
    node_bandwidth,
    pod_classes,
    tree_classes,
)
from koordlet.qos.podwarnings import PodAnnotationWarnings
from koordlet.statesinformer.model import PodInfo, WorkloadSnapshot
from koordlet.system.paths import HostPaths
from koordlet.system.tc import Link
from tests.strategyrig import config, in_force

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


# koordinator.sh/networkQOS: a pod's own class (ours) -------------------------------------------


def test_a_pods_own_class_hangs_from_the_root_at_the_smaller_ceil_and_its_class_priority() -> None:
    got, _ = classes({"beClass": net(egressRequest=10, egressLimit="300M")})
    limits = [
        PodLimit("uid-a", "ns/a", NetQoSClass.BE, 50_000_000),
        PodLimit("uid-b", "ns/b", NetQoSClass.BE, 800_000_000, ingress_bps=10_000_000),
    ]
    plans, ids, notes = pod_classes(limits, tuple(got.values()))
    minors = pod_class_minors(["uid-a", "uid-b"])
    assert [(p.name, p.handle, p.parent, p.rate_bps, p.ceil_bps, p.prio) for p in plans] == [
        ("pod ns/a", 0x10000 | minors["uid-a"], 0x10001, 0, 50_000_000, 3),
        ("pod ns/b", 0x10000 | minors["uid-b"], 0x10001, 0, 300_000_000, 3),  # BE's ceil
    ]
    assert ids == {"uid-a": 0x10000 | minors["uid-a"], "uid-b": 0x10000 | minors["uid-b"]}
    assert notes == [
        "pod ns/b: koordinator.sh/networkQOS ingressLimit not enforced, HTB shapes egress only"
    ]
    assert plans[0].kernel().rate == MIN_RATE_BYTES  # guaranteed nothing


def test_pod_minors_are_stable_distinct_and_clear_of_the_qos_classes() -> None:
    uids = [f"{i:08x}-0000-4000-8000-000000000000" for i in range(500)]
    first = pod_class_minors(uids)
    assert first == pod_class_minors(list(reversed(uids)))
    assert len(set(first.values())) == len(uids)
    assert all(m in POD_CLASS_MINORS and m > 4 for m in first.values())
    # a new pod does not move the others unless it takes a slot they would probe to
    moved = pod_class_minors([*uids, "ffffffff-0000-4000-8000-000000000000"])
    assert sum(moved[u] != first[u] for u in uids) <= 1


def _netqos(pods: list[PodInfo], sink: Any) -> NetQoS:
    ctx = StrategyContext(
        host=lambda: None,  # type: ignore[arg-type,return-value]  # not reached
        config=config(),
        cache=None,  # type: ignore[arg-type]
        executor=None,  # type: ignore[arg-type]
        workloads=lambda: WorkloadSnapshot(pods={p.uid: p for p in pods}),
        node_slo=lambda: in_force(),
        pod_warnings=PodAnnotationWarnings(sink),
    )
    return NetQoS(ctx, interval=1.0)


def _pod(name: str, qos: QoSClass, value: str | None) -> PodInfo:
    ann = {} if value is None else {ANNOTATION_POD_NETWORK_QOS: value}
    return PodInfo(f"uid-{name}", name, "ns", qos, KubeQOS.BURSTABLE, f"kubepods/pod{name}",
                   annotations=ann)  # fmt: skip


def test_pod_limits_read_the_annotation_as_go_does_and_warn_once_for_a_bad_one() -> None:
    messages: list[str] = []

    class Sink:
        def warn(self, pod: PodInfo, reason: str, message: str) -> None:
            messages.append(message)

    pods = [
        _pod("a", QoSClass.BE, '{"EgressLimit": "20M", "IngressLimit": "1000"}'),  # Go's keys
        _pod("b", QoSClass.LS, '{"egressLimit": "fast"}'),
        _pod("c", QoSClass.LS, '{"ingressLimit": "5M"}'),  # nothing HTB can do
        _pod("d", QoSClass.NONE, '{"egressLimit": "5M"}'),  # not classified: left alone
        _pod("e", QoSClass.LS, None),
    ]
    strategy = _netqos(pods, Sink())
    limits = strategy._pod_limits()
    strategy._pod_limits()
    assert limits == [PodLimit("uid-a", "ns/a", NetQoSClass.BE, 20_000_000, 1000)]
    [message] = messages
    assert "annotation koordinator.sh/networkQOS ignored" in message
    assert "egressLimit 'fast'" in message


class _CountingTC:
    """Stands in for the rtnetlink writer: counts what a round asks the kernel."""

    def __init__(self, *, tree_there: bool = False) -> None:
        self.looks = 0
        self.tree_there = tree_there
        self.ensured = 0

    def default_link(self) -> Link:
        self.looks += 1
        return Link(2, "eth0")

    def remove(self, link: Link, *, strategy: str, reason: str) -> TreeResult:
        result = TreeResult(link.name)
        if self.tree_there:
            result.changes.append("qdisc root: htb 1: -> the kernel's default")
            self.tree_there = False
        return result

    def ensure(self, plan: Any, *, strategy: str, reason: str) -> TreeResult:
        self.ensured += 1
        self.tree_there = True
        return TreeResult(plan.link.name)


async def test_with_network_qos_off_the_kernel_is_asked_until_no_tree_is_left_then_not_again() -> (
    None
):
    slo = {"systemStrategy": {"totalNetworkBandwidth": "100M"}}
    on = in_force(slo, resourceQOSStrategy={"beClass": net(True)})
    off = in_force(slo, resourceQOSStrategy={"beClass": net(False)})
    current = [off]
    strategy = _netqos([], None)
    host = SimpleNamespace(paths=HostPaths())
    strategy._ctx = dataclasses.replace(
        strategy._ctx,
        node_slo=lambda: current[0],
        host=lambda: host,  # type: ignore[arg-type,return-value]
    )
    fake = _CountingTC(tree_there=True)  # left by an earlier koordlet
    strategy._tc = fake  # type: ignore[assignment]

    await strategy.reconcile()  # finds the old tree and removes it
    await strategy.reconcile()  # the kernel said there is none: not asked again
    await strategy.reconcile()
    assert (fake.looks, fake.tree_there) == (1, False)
    report = strategy._ctx.book._state(NAME).last_report
    assert report is not None
    assert OFF_CHECKED in report.detail["notes"]

    current[0] = on  # turned on: every round keeps the tree as planned
    await strategy.reconcile()
    await strategy.reconcile()
    assert (fake.looks, fake.ensured) == (3, 2)

    current[0] = off  # off again: one look takes it down, then none
    await strategy.reconcile()
    await strategy.reconcile()
    assert (fake.looks, fake.tree_there) == (4, False)
