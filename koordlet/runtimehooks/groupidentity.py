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

**The pod's own CPU QoS** (``koordinator.sh/cpuQOS``, :class:`apis.pod_overrides.PodCPUQoS`):
on a pod labelled LS, and only there, the annotation takes precedence over the class's value, as
upstream's ``SetPodBvtValue`` decides: with ``enable: true`` its ``groupIdentity`` (else the
class's), without ``enable`` 0; on ``cpu.idle`` kernels the pod is idle for ``schedIdle: 1`` or
the best-effort identity -1 and not idle for another identity or without ``enable``. Upstream
lets an LS pod become BE-like, never the reverse, and leaves LSR/LSE alone. A value that does not
parse leaves the pod on its class's value and is reported (``BadPodInput`` with that value as its
fallback: a Warning Event ``InvalidPodAnnotation``, once a pod in the reconciler); upstream fails
the hook instead, so its pod gets no identity at all.

Neither file: nothing is changed, and ``/debug/capabilities`` names the knobs' reasons. The pod
value is written at ``PreRunPodSandbox`` (the framework writes the pod cgroup) and by the
reconciler. While this hook's gate is on it is the only writer of pods' identity and
``cpu.idle``; the cgroup reconcile strategy applies the annotation only with the gate off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from apis.extension import KUBE_QOS_TO_QOS, LABEL_POD_QOS, KubeQOS, QoSClass
from apis.group_identity import kube_qos_group_identity, pod_group_identity
from apis.pod_overrides import (
    ANNOTATION_POD_CPU_QOS,
    INVALID_ANNOTATION_REASON,
    AnnotationError,
    PodCPUQoS,
    parse_pod_cpu_qos,
)
from apis.slo_inforce import NodeSLOInForce
from apis.slo_qos import CPUQOSPolicy
from apis.slo_strategies import ResourceQOSStrategy
from koordlet.runtimehooks.cgroupparent import kube_qos_of
from koordlet.runtimehooks.errors import BadPodInput
from koordlet.runtimehooks.model import Change, ContainerRequest, PodRequest, Resources

if TYPE_CHECKING:
    from koordlet.runtimehooks.table import HookContext

NAME = "GroupIdentity"
"""Upstream's plugin name."""
MECH_BVT = "cpu_bvt_warp_ns"
MECH_IDLE = "cpu_idle"
"""The mechanisms, by the knob each writes."""


pod_bvt = pod_group_identity
"""A pod's ``cpu.bvt_warp_ns`` (upstream ``bvtRule.getPodBvtValue``)."""
kube_qos_bvt = kube_qos_group_identity
"""A Kubernetes QoS cgroup's ``cpu.bvt_warp_ns`` (``getKubeQOSDirBvtValue``)."""


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
        if mech is None:
            return None
        qos = req.labels.get(LABEL_POD_QOS, "")
        kube_qos = kube_qos_of(req.cgroup_parent)
        if mech == MECH_BVT:
            value = pod_bvt(strategy, qos, kube_qos)
            change = Change(
                resources=Resources(cpu_bvt_warp_ns=value),
                reason=f"group identity of {qos or kube_qos}: {value}",
            )
            own = _own_cpu_qos(req, qos, change)
            if own is None:
                return change
            value = own.identity(value)
            return Change(
                resources=Resources(cpu_bvt_warp_ns=value),
                reason=f"{ANNOTATION_POD_CPU_QOS}: group identity {value}",
            )
        idle = pod_idle(strategy, qos, kube_qos)
        change = Change(
            resources=Resources(cpu_idle=idle), reason=f"cpu.idle of {qos or kube_qos}: {idle}"
        )
        own = _own_cpu_qos(req, qos, change)
        if own is None:
            return change
        idle = int(own.idle(bool(idle)))
        return Change(
            resources=Resources(cpu_idle=idle), reason=f"{ANNOTATION_POD_CPU_QOS}: cpu.idle {idle}"
        )

    def container(self, req: ContainerRequest) -> Change | None:
        return None

    def node_inputs(self) -> object:
        """What :meth:`pod` reads besides the request: the strategy and the mechanism."""
        strategy = self._node_slo().resource_qos_strategy
        return strategy, mechanism(strategy.policies.cpu_policy, self._supported)

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


def _own_cpu_qos(req: PodRequest, qos: str, class_change: Change) -> PodCPUQoS | None:
    """The pod's ``koordinator.sh/cpuQOS`` when it applies (an LS pod that carries one); a
    value that does not parse raises :class:`BadPodInput` with the class's change as fallback."""
    text = req.annotations.get(ANNOTATION_POD_CPU_QOS)
    if text is None or qos != QoSClass.LS:  # upstream: LS pods only, by their label
        return None
    try:
        return parse_pod_cpu_qos(text)
    except AnnotationError as err:
        raise BadPodInput(
            INVALID_ANNOTATION_REASON,
            err.annotation,
            f"{err.why}; the pod keeps its class's CPU QoS",
            fallback=class_change,
        ) from err


def build(ctx: HookContext) -> GroupIdentity:
    """The table's factory (row ``GroupIdentity``)."""
    return GroupIdentity(ctx.node_slo, ctx.supported)
