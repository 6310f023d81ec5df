"""``GroupIdentity``: a pod's CPU identity by its QoS class, by the best mechanism the kernel has.

Upstream: ``pkg/koordlet/runtimehooks/hooks/groupidentity/{bvt,rule,interceptor}.go``. From the
NodeSLO's ``resourceQOSStrategy`` in force (a class whose ``cpuQOS`` is off reads the disabled
values, group identity 0):

**Group identity** (``cpu.bvt_warp_ns``, Anolis kernels, ``cpuPolicy: groupIdentity``): a pod of
class LSR, LS or BE (label ``koordinator.sh/qosClass``) gets its class's ``groupIdentity``; any
other pod its Kubernetes QoS's (from its cgroup parent): BestEffort BE's, Burstable LS's,
Guaranteed LSR's while LSR CPU QoS is on, else LS's while LS CPU QoS is on, else 0. In the
reconciler the Kubernetes QoS cgroups get it too: besteffort BE's, burstable LS's, and the
kubepods root 0 (upstream: "until the kernel supports it").

**cpu.idle** (mainline Linux >= 5.15, where ``cpu.bvt_warp_ns`` is absent, or with ``cpuPolicy:
coreSched``): a pod is SCHED_IDLE (``cpu.idle = 1``) when its class's CPU QoS is on and asks for
it with ``schedIdle: 1`` (upstream's CoreSched rule, ``IsPodQOSCPUIdle``); otherwise 0. Only
pods: the QoS-class root cgroups are never made idle here, because the kernel refuses
``cpu.shares`` on an idle group and the kubelet writes the QoS cgroups' shares (koordinator#2732;
the besteffort cgroup's ``cpu.idle`` for the best-effort identity -1 stays the cgroup reconcile
strategy's). An idle pod has no weight, so its ``cpu.shares`` (BatchResource's) is not written.

Neither file: nothing is changed, and ``/debug/capabilities`` names the knobs' reasons. The pod
value is written at ``PreRunPodSandbox`` (the framework writes the pod cgroup) and by the
reconciler.
"""

from __future__ import annotations

from collections.abc import Callable

from apis.extension import KUBE_QOS_TO_QOS, LABEL_POD_QOS, KubeQOS, QoSClass
from apis.slo_inforce import NodeSLOInForce
from apis.slo_qos import CPUQOSConfig, CPUQOSPolicy
from apis.slo_strategies import ResourceQOSStrategy
from koordlet.runtimehooks.cgroupparent import kube_qos_of
from koordlet.runtimehooks.model import Change, ContainerRequest, PodRequest, Resources

NAME = "GroupIdentity"
"""Upstream's plugin name."""
MECH_BVT = "cpu_bvt_warp_ns"
MECH_IDLE = "cpu_idle"
"""The mechanisms, by the knob each writes."""


def pod_bvt(strategy: ResourceQOSStrategy, qos: str, kube_qos: KubeQOS) -> int:
    """A pod's ``cpu.bvt_warp_ns`` (upstream ``bvtRule.getPodBvtValue``)."""
    by_class = {
        QoSClass.LSR: strategy.lsr_class.cpu_qos.group_identity,
        QoSClass.LS: strategy.ls_class.cpu_qos.group_identity,
        QoSClass.BE: strategy.be_class.cpu_qos.group_identity,
    }
    if qos in by_class:
        return by_class[QoSClass(qos)]
    if kube_qos is KubeQOS.BESTEFFORT:
        return strategy.be_class.cpu_qos.group_identity
    if kube_qos is KubeQOS.BURSTABLE:
        return strategy.ls_class.cpu_qos.group_identity
    if strategy.lsr_class.cpu_qos.enable:
        return strategy.lsr_class.cpu_qos.group_identity
    if strategy.ls_class.cpu_qos.enable:
        return strategy.ls_class.cpu_qos.group_identity
    return CPUQOSConfig().group_identity


def kube_qos_bvt(strategy: ResourceQOSStrategy, kube_qos: KubeQOS) -> int:
    """A Kubernetes QoS cgroup's ``cpu.bvt_warp_ns`` (``getKubeQOSDirBvtValue``)."""
    if kube_qos is KubeQOS.BESTEFFORT:
        return strategy.be_class.cpu_qos.group_identity
    if kube_qos is KubeQOS.BURSTABLE:
        return strategy.ls_class.cpu_qos.group_identity
    return CPUQOSConfig().group_identity


def pod_idle(strategy: ResourceQOSStrategy, qos: str, kube_qos: KubeQOS) -> int:
    """A pod's ``cpu.idle`` (module docstring): its class by label, else by Kubernetes QoS."""
    by_class = {
        QoSClass.LSE: strategy.lsr_class.cpu_qos,
        QoSClass.LSR: strategy.lsr_class.cpu_qos,
        QoSClass.LS: strategy.ls_class.cpu_qos,
        QoSClass.BE: strategy.be_class.cpu_qos,
    }
    cls = qos if qos in by_class else KUBE_QOS_TO_QOS[kube_qos] if not qos else None
    if cls is None:
        return 0  # SYSTEM, or a label value Koordinator does not define
    cfg = by_class[QoSClass(cls)]
    return int(cfg.enable and cfg.sched_idle == 1)


def mechanism(policy: CPUQOSPolicy, supported: Callable[[str], bool]) -> str | None:
    """Which knob this kernel lets the hook write; None for neither."""
    if policy is CPUQOSPolicy.GROUP_IDENTITY and supported(MECH_BVT):
        return MECH_BVT
    if supported(MECH_IDLE):
        return MECH_IDLE
    return None


class GroupIdentity:
    """The hook; ``supported(knob)`` says whether the kernel has a knob (the start-up probe)."""

    def __init__(
        self, node_slo: Callable[[], NodeSLOInForce], supported: Callable[[str], bool]
    ) -> None:
        self._node_slo = node_slo
        self._supported = supported

    def pod(self, req: PodRequest) -> Change | None:
        strategy = self._node_slo().resource_qos_strategy
        mech = mechanism(strategy.policies.cpu_policy, self._supported)
        qos = req.labels.get(LABEL_POD_QOS, "")
        kube_qos = kube_qos_of(req.cgroup_parent)
        if mech == MECH_BVT:
            value = pod_bvt(strategy, qos, kube_qos)
            return Change(
                resources=Resources(cpu_bvt_warp_ns=value),
                reason=f"group identity of {qos or kube_qos}: {value}",
            )
        if mech == MECH_IDLE:
            idle = pod_idle(strategy, qos, kube_qos)
            return Change(
                resources=Resources(cpu_idle=idle),
                reason=f"cpu.idle of {qos or kube_qos}: {idle}",
            )
        return None

    def container(self, req: ContainerRequest) -> Change | None:
        return None

    def kube_qos(self, kube_qos: KubeQOS) -> Change | None:
        """The Kubernetes QoS cgroup's value (reconciler only; bvt only, module docstring)."""
        strategy = self._node_slo().resource_qos_strategy
        if mechanism(strategy.policies.cpu_policy, self._supported) != MECH_BVT:
            return None
        value = kube_qos_bvt(strategy, kube_qos)
        return Change(
            resources=Resources(cpu_bvt_warp_ns=value),
            reason=f"group identity of the {kube_qos} QoS cgroup: {value}",
        )
