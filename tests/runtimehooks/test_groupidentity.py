"""GroupIdentity: upstream's bvt rule (``hooks/groupidentity/rule_test.go``:
``Test_bvtPlugin_parseRule``, ``Test_bvtPlugin_ruleUpdateCb``), and cpu.idle where the kernel
has no group identity."""

from __future__ import annotations

from typing import Any

import pytest

from apis.extension import LABEL_POD_QOS, KubeQOS
from koordlet.runtimehooks.groupidentity import MECH_BVT, MECH_IDLE, GroupIdentity
from koordlet.runtimehooks.model import HookPoint, PodMeta, PodRequest
from tests.strategyrig import in_force

POD = PodMeta("p", "default", "11111111-2222-3333-4444-555555555555")
PARENTS = {
    KubeQOS.GUARANTEED: "/kubepods/pod1",
    KubeQOS.BURSTABLE: "/kubepods/burstable/pod1",
    KubeQOS.BESTEFFORT: "/kubepods/besteffort/pod1",
}


def classes(lsr: tuple[bool, int], ls: tuple[bool, int], be: tuple[bool, int]) -> dict[str, Any]:
    def one(cfg: tuple[bool, int]) -> dict[str, Any]:
        return {"cpuQOS": {"enable": cfg[0], "groupIdentity": cfg[1]}}

    return {"lsrClass": one(lsr), "lsClass": one(ls), "beClass": one(be)}


def hook(raw: dict[str, Any], *knobs: str) -> GroupIdentity:
    slo = in_force(resourceQOSStrategy=raw)
    return GroupIdentity(lambda: slo, lambda knob: knob in knobs)


def bvt_of(h: GroupIdentity, qos: str, kube_qos: KubeQOS) -> int | None:
    labels = {LABEL_POD_QOS: qos} if qos else {}
    change = h.pod(PodRequest(HookPoint.PRE_RUN_POD_SANDBOX, POD, labels, {}, PARENTS[kube_qos]))
    return None if change is None else change.resources.cpu_bvt_warp_ns


# upstream's parseRule rows: (LSR, LS, BE) -> pod values by class, pod values by Kubernetes QoS
# (Guaranteed, Burstable, BestEffort), the QoS cgroups' values
@pytest.mark.parametrize(
    ("case", "raw", "by_class", "by_kube", "dirs"),
    [
        ("normal", classes((True, 2), (True, 2), (True, -1)), (2, 2, -1), (2, 2, -1), (0, 2, -1)),
        ("lsr disabled", classes((False, 0), (True, 2), (True, -1)), (0, 2, -1), (2, 2, -1),
         (0, 2, -1)),
        ("lsr and ls disabled", classes((False, 0), (False, 0), (True, -1)), (0, 0, -1),
         (0, 0, -1), (0, 0, -1)),
        ("all disabled", classes((False, 0), (False, 0), (False, 0)), (0, 0, 0), (0, 0, 0),
         (0, 0, 0)),
    ],
)  # fmt: skip
def test_bvt_values_as_upstreams_rule_table(
    case: str,
    raw: dict[str, Any],
    by_class: tuple[int, int, int],
    by_kube: tuple[int, int, int],
    dirs: tuple[int, int, int],
) -> None:
    h = hook(raw, MECH_BVT, MECH_IDLE)
    kube = (KubeQOS.GUARANTEED, KubeQOS.BURSTABLE, KubeQOS.BESTEFFORT)
    # a labelled pod takes its class's value whatever its Kubernetes QoS ("use koord qos")
    got = tuple(bvt_of(h, q, KubeQOS.GUARANTEED) for q in ("LSR", "LS", "BE"))
    assert got == by_class, case
    assert tuple(bvt_of(h, "", k) for k in kube) == by_kube, case
    got_dirs = []
    for k in kube:
        change = h.kube_qos(k)
        assert change is not None
        got_dirs.append(change.resources.cpu_bvt_warp_ns)
    assert tuple(got_dirs) == dirs, case


def test_upstreams_callback_rows_for_each_pod_kind() -> None:
    # Test_bvtPlugin_ruleUpdateCb: LSR 0 (off), LS 2, BE -1
    h = hook(classes((False, 0), (True, 2), (True, -1)), MECH_BVT)
    rows = {
        ("LSR", KubeQOS.GUARANTEED): 0,
        ("LS", KubeQOS.GUARANTEED): 2,
        ("LS", KubeQOS.BURSTABLE): 2,
        ("BE", KubeQOS.BESTEFFORT): -1,
        ("", KubeQOS.GUARANTEED): 2,
        ("", KubeQOS.BURSTABLE): 2,
        ("", KubeQOS.BESTEFFORT): -1,
    }
    assert {key: bvt_of(h, *key) for key in rows} == rows


def test_without_group_identity_the_pod_gets_cpu_idle_by_its_class() -> None:
    raw = {
        **classes((True, 2), (True, 2), (True, -1)),
        "lsClass": {"cpuQOS": {"enable": True, "groupIdentity": 2, "schedIdle": 1}},
        "beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1, "schedIdle": 1}},
    }
    h = hook(raw, MECH_IDLE)  # a mainline kernel: cpu.idle, no cpu.bvt_warp_ns

    def idle(qos: str, kube_qos: KubeQOS) -> int | None:
        labels = {LABEL_POD_QOS: qos} if qos else {}
        req = PodRequest(HookPoint.PRE_RUN_POD_SANDBOX, POD, labels, {}, PARENTS[kube_qos])
        change = h.pod(req)
        assert change is None or change.resources.cpu_bvt_warp_ns is None
        return None if change is None else change.resources.cpu_idle

    assert idle("BE", KubeQOS.BESTEFFORT) == 1  # schedIdle 1
    assert idle("", KubeQOS.BESTEFFORT) == 1
    assert idle("LS", KubeQOS.BURSTABLE) == 1  # schedIdle 1
    assert idle("LSR", KubeQOS.GUARANTEED) == 0
    assert idle("SYSTEM", KubeQOS.GUARANTEED) == 0
    # never on the QoS cgroups, where the kubelet writes cpu.shares (koordinator#2732)
    assert all(h.kube_qos(k) is None for k in KubeQOS)
    # BE CPU QoS off: back to 0
    off = hook(classes((True, 2), (True, 2), (False, -1)), MECH_IDLE)
    change = off.pod(PodRequest(HookPoint.PRE_RUN_POD_SANDBOX, POD, {LABEL_POD_QOS: "BE"}, {},
                                PARENTS[KubeQOS.BESTEFFORT]))  # fmt: skip
    assert change is not None
    assert change.resources.cpu_idle == 0


def test_with_neither_knob_nothing_is_changed_and_core_sched_policy_never_writes_bvt() -> None:
    raw = classes((True, 2), (True, 2), (True, -1))
    assert bvt_of(hook(raw), "LS", KubeQOS.BURSTABLE) is None
    be_idle = {"beClass": {"cpuQOS": {"enable": True, "schedIdle": 1}}}
    core = hook({**raw, **be_idle, "policies": {"cpuPolicy": "coreSched"}}, MECH_BVT, MECH_IDLE)
    change = core.pod(PodRequest(HookPoint.PRE_RUN_POD_SANDBOX, POD, {LABEL_POD_QOS: "BE"}, {},
                                 PARENTS[KubeQOS.BESTEFFORT]))  # fmt: skip
    assert change is not None
    assert change.resources.cpu_bvt_warp_ns is None
    assert change.resources.cpu_idle == 1
