"""CoreSched: upstream's group rule (``hooks/coresched/rule.go`` ``parseRuleForNodeSLO``,
``helper.go`` ``getPodEnabledAndGroup``), the cookie cache against a fake kernel (this kernel
has no ``CONFIG_SCHED_CORE``), and the real kernel's answer reported as unsupported."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import pytest

from apis.extension import (
    LABEL_CORE_SCHED_GROUP_ID,
    LABEL_CORE_SCHED_POLICY,
    LABEL_POD_QOS,
    KubeQOS,
)
from apis.slo_strategies import ResourceQOSStrategy
from koordlet.errors import HostError
from koordlet.runtimehooks import cookies
from koordlet.runtimehooks.coresched import target
from koordlet.runtimehooks.model import CoreSchedTarget
from tests.strategyrig import in_force

UID = "11111111-2222-3333-4444-555555555555"


def strategy(
    lsr: bool, ls: bool, be: bool, *, expeller: bool = False, policy: str = "coreSched"
) -> ResourceQOSStrategy:
    def cls(on: bool) -> dict[str, Any]:
        return {"cpuQOS": {"enable": on, "coreExpeller": expeller and on}}

    raw = {"policies": {"cpuPolicy": policy}, "lsrClass": cls(lsr), "lsClass": cls(ls),
           "beClass": cls(be)}  # fmt: skip
    return in_force(resourceQOSStrategy=raw).resource_qos_strategy


@pytest.mark.parametrize(
    ("case", "rule", "labels", "kube_qos", "want"),
    [
        ("group from the label", strategy(True, True, True),
         {LABEL_POD_QOS: "LS", LABEL_CORE_SCHED_GROUP_ID: "g1"}, KubeQOS.BURSTABLE,
         CoreSchedTarget("g1", True)),
        ("no label: the node's shared group", strategy(True, True, True), {LABEL_POD_QOS: "BE"},
         KubeQOS.BESTEFFORT, CoreSchedTarget("", True)),
        ("exclusive: the pod's own group", strategy(True, True, True),
         {LABEL_POD_QOS: "LS", LABEL_CORE_SCHED_POLICY: "exclusive"}, KubeQOS.BURSTABLE,
         CoreSchedTarget(UID, True)),
        ("policy none: off for the pod", strategy(True, True, True),
         {LABEL_POD_QOS: "LS", LABEL_CORE_SCHED_GROUP_ID: "g1", LABEL_CORE_SCHED_POLICY: "none"},
         KubeQOS.BURSTABLE, CoreSchedTarget("g1", False)),
        ("its class off", strategy(True, False, True), {LABEL_POD_QOS: "LS"}, KubeQOS.BURSTABLE,
         CoreSchedTarget("", False)),
        ("expeller: a group of its own", strategy(True, True, True, expeller=True),
         {LABEL_POD_QOS: "LSR", LABEL_CORE_SCHED_GROUP_ID: "g1"}, KubeQOS.GUARANTEED,
         CoreSchedTarget("g1-expeller", True)),
        ("Guaranteed without class: LSR's", strategy(True, False, False), {}, KubeQOS.GUARANTEED,
         CoreSchedTarget("", True)),
        ("Guaranteed without class, LSR off: LS's", strategy(False, True, False), {},
         KubeQOS.GUARANTEED, CoreSchedTarget("", True)),
        ("policy groupIdentity: off everywhere", strategy(True, True, True, policy="groupIdentity"),
         {LABEL_POD_QOS: "LS"}, KubeQOS.BURSTABLE, CoreSchedTarget("", False)),
        ("SYSTEM: never touched", strategy(True, True, True), {LABEL_POD_QOS: "SYSTEM"},
         KubeQOS.GUARANTEED, None),
    ],
)  # fmt: skip
def test_groups_as_upstreams_rule(
    case: str, rule: Any, labels: dict[str, str], kube_qos: KubeQOS, want: Any
) -> None:
    assert target(rule, labels, kube_qos, UID) == want, case


class FakeKernel:
    """Core scheduling as the kernel keeps it, per thread group (one thread each here)."""

    def __init__(self) -> None:
        self.cookie: dict[int, int] = {}
        self.dead: set[int] = set()
        self._next = itertools.count(0x1000)
        self.calls: list[tuple[str, int]] = []

    def spawn(self, *pids: int) -> None:
        for pid in pids:
            self.cookie[pid] = 0

    def get(self, pid: int) -> int:
        if pid in self.dead or pid not in self.cookie:
            raise HostError(f"thread {pid} is gone")
        return self.cookie[pid]

    def create(self, pid: int) -> None:
        self.calls.append(("create", pid))
        self.cookie[pid] = next(self._next)

    def assign(self, source: int, pids: Iterable[int]) -> list[int]:
        value = self.get(source)
        failed = []
        for pid in pids:
            self.calls.append(("assign", pid))
            if pid in self.dead:
                failed.append(pid)
            else:
                self.cookie[pid] = value
        return failed

    def clear(self, pids: Iterable[int]) -> list[int]:
        for pid in pids:
            self.calls.append(("clear", pid))
            self.cookie[pid] = 0
        return []


def test_containers_of_one_group_share_one_cookie_and_other_groups_get_their_own() -> None:
    kernel = FakeKernel()
    kernel.spawn(10, 11, 20, 30)
    manager = cookies.CookieManager(kernel)
    first = manager.update("pod-a/c1", "g1", True, [10, 11])
    assert first is not None
    assert first.created
    assert first.assigned == 2
    assert kernel.cookie[10] == kernel.cookie[11] != 0
    second = manager.update("pod-b/c1", "g1", True, [20])
    assert second is not None
    assert not second.created
    assert second.assigned == 1
    assert kernel.cookie[20] == kernel.cookie[10]
    other = manager.update("pod-c/c1", "g2", True, [30])
    assert other is not None
    assert other.created
    assert kernel.cookie[30] not in (0, kernel.cookie[10])
    # again, unchanged: no prctl that changes anything
    kernel.calls.clear()
    again = manager.update("pod-b/c1", "g1", True, [20])
    assert again is not None
    assert again.assigned == 0
    assert kernel.calls == []
    assert manager.groups() == {"g1": (kernel.cookie[10], 3), "g2": (kernel.cookie[30], 1)}


def test_a_group_whose_threads_all_exited_gets_a_new_cookie() -> None:
    kernel = FakeKernel()
    kernel.spawn(10, 20)
    manager = cookies.CookieManager(kernel)
    manager.update("pod-a/c1", "g1", True, [10])
    old = kernel.cookie[10]
    kernel.dead.add(10)  # the only holder is gone: nobody to share the cookie from
    result = manager.update("pod-b/c1", "g1", True, [20])
    assert result is not None
    assert result.created
    assert kernel.cookie[20] not in (0, old)


def test_a_container_whose_pod_turned_it_off_gets_the_default_cookie_back() -> None:
    kernel = FakeKernel()
    kernel.spawn(10, 11, 40)
    manager = cookies.CookieManager(kernel)
    manager.update("pod-a/c1", "g1", True, [10, 11])
    result = manager.update("pod-a/c1", "g1", False, [10, 11])
    assert result is not None
    assert result.cleared == 2
    assert kernel.cookie[10] == kernel.cookie[11] == 0
    assert manager.groups() == {}
    # a container never given a cookie is not touched (no prctl at all)
    kernel.calls.clear()
    assert manager.update("pod-z/c1", "g1", False, [40]) is None
    assert kernel.calls == []


def test_this_kernel_reports_core_scheduling_unsupported_with_prctls_error() -> None:
    why = cookies.probe()
    with open("/proc/kallsyms") as f:
        has_core_sched = any(" sched_core_share_pid" in line for line in f)
    if has_core_sched:
        assert why == ""
    else:
        assert "CONFIG_SCHED_CORE" in why
        assert "EINVAL" in why
