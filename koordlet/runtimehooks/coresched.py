"""``CoreSched``: which core scheduling cookie group each container's threads belong to.

Core scheduling (Linux >= 5.14, ``CONFIG_SCHED_CORE``) lets only threads with the same cookie
share a core's SMT siblings. Upstream: ``pkg/koordlet/runtimehooks/hooks/coresched/
{core_sched,rule,helper}.go``. With ``resourceQOSStrategy.policies.cpuPolicy: coreSched``, a
class whose ``cpuQOS.enable`` is on has core scheduling (LSE and LSR pods use LSR's; a pod
without a class its Kubernetes QoS's: Guaranteed LSR's when that is on, else LS's; Burstable LS's;
BestEffort BE's). For a pod that has it:

- its group is its label ``koordinator.sh/core-sched-group-id`` (empty when absent: every such
  pod of the node shares the one group), or its UID under ``koordinator.sh/core-sched-policy:
  exclusive``; ``-expeller`` is appended while its class has ``coreExpeller``, so that expellers
  never share a cookie with the pods they expel;
- ``core-sched-policy: none`` turns it off for the pod.

The hook decides (:class:`~koordlet.runtimehooks.model.CoreSchedTarget`); the koordlet's cookie
manager (:mod:`koordlet.runtimehooks.cookies`) applies it to the container's threads, at
``PostStartContainer`` and in the reconciler: the first container of a group gets a new cookie,
the others share it, and a container whose pod turned it off gets the default cookie (0) back.
SYSTEM pods are never touched (the koordlet itself runs with the default cookie). On a kernel
without core scheduling the manager reports it unsupported, with ``prctl``'s error, in
``/debug/capabilities``, and does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from apis.extension import (
    CORE_SCHED_POLICY_EXCLUSIVE,
    CORE_SCHED_POLICY_NONE,
    LABEL_CORE_SCHED_GROUP_ID,
    LABEL_CORE_SCHED_POLICY,
    LABEL_POD_QOS,
    KubeQOS,
    QoSClass,
)
from apis.records import frozen
from apis.slo_inforce import NodeSLOInForce
from apis.slo_qos import CPUQOSConfig, CPUQOSPolicy
from apis.slo_strategies import ResourceQOSStrategy
from koordlet.runtimehooks.cgroupparent import kube_qos_of
from koordlet.runtimehooks.model import Change, ContainerRequest, CoreSchedTarget, PodRequest

if TYPE_CHECKING:
    from koordlet.runtimehooks.table import HookContext

NAME = "CoreSched"
"""Upstream's plugin name."""
EXPELLER_SUFFIX = "-expeller"
"""Upstream's ``ExpellerGroupSuffix``."""


@frozen
class Param:
    """A class's core scheduling (upstream ``Param``)."""

    enabled: bool
    """``IsPodEnabled``: cpuPolicy coreSched and the class's CPU QoS on."""
    expeller: bool
    """``IsExpeller``: cpuPolicy coreSched and the class's ``coreExpeller``."""


def _param(cfg: CPUQOSConfig, core_sched: bool) -> Param:
    return Param(core_sched and cfg.enable, core_sched and cfg.core_expeller)


def pod_param(strategy: ResourceQOSStrategy, qos: str, kube_qos: KubeQOS) -> Param | None:
    """The pod's :class:`Param`; None for a SYSTEM pod (never touched)."""
    core_sched = strategy.policies.cpu_policy is CPUQOSPolicy.CORE_SCHED
    lsr = _param(strategy.lsr_class.cpu_qos, core_sched)
    ls = _param(strategy.ls_class.cpu_qos, core_sched)
    be = _param(strategy.be_class.cpu_qos, core_sched)
    if not (lsr.enabled or ls.enabled or be.enabled):
        return Param(False, False)  # the node-level switch (upstream ``Rule.enable``)
    by_class: Mapping[str, Param] = {
        QoSClass.LSE: lsr,
        QoSClass.LSR: lsr,
        QoSClass.LS: ls,
        QoSClass.BE: be,
    }
    if qos == QoSClass.SYSTEM:
        return None
    if qos in by_class:
        return by_class[qos]
    return {
        KubeQOS.GUARANTEED: lsr if lsr.enabled else ls,
        KubeQOS.BURSTABLE: ls,
        KubeQOS.BESTEFFORT: be,
    }[kube_qos]


def target(
    strategy: ResourceQOSStrategy,
    labels: Mapping[str, str],
    kube_qos: KubeQOS,
    pod_uid: str,
) -> CoreSchedTarget | None:
    """Upstream ``getPodEnabledAndGroup``; None for a SYSTEM pod."""
    param = pod_param(strategy, labels.get(LABEL_POD_QOS, ""), kube_qos)
    if param is None:
        return None
    group = labels.get(LABEL_CORE_SCHED_GROUP_ID, "")
    enabled = param.enabled
    policy = labels.get(LABEL_CORE_SCHED_POLICY, "")
    if policy == CORE_SCHED_POLICY_EXCLUSIVE:
        group = pod_uid
    elif policy == CORE_SCHED_POLICY_NONE:
        enabled = False
    if param.expeller:
        group += EXPELLER_SUFFIX
    return CoreSchedTarget(group, enabled)


class CoreSched:
    """The hook."""

    def __init__(self, node_slo: Callable[[], NodeSLOInForce]) -> None:
        self._node_slo = node_slo

    def pod(self, req: PodRequest) -> Change | None:
        return None

    def node_inputs(self) -> object:
        """What :meth:`container` reads besides the request: the strategy."""
        return self._node_slo().resource_qos_strategy

    def container(self, req: ContainerRequest) -> Change | None:
        strategy = self._node_slo().resource_qos_strategy
        goal = target(strategy, req.pod_labels, kube_qos_of(req.pod_cgroup_parent), req.pod.uid)
        if goal is None:
            return None
        what = f"group {goal.group!r}" if goal.enabled else "default cookie"
        return Change(core_sched=goal, reason=f"core scheduling: {what}")


def build(ctx: HookContext) -> CoreSched:
    """The table's factory (row ``CoreSched``)."""
    return CoreSched(ctx.node_slo)
