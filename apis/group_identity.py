"""Group identity (``cpu.bvt_warp_ns``) by QoS class, from the NodeSLO's ``resourceQOSStrategy``.

One rule for the two writers of the value: the ``GroupIdentity`` runtime hook and its reconciler
(:mod:`koordlet.runtimehooks.groupidentity`) and the cgroup reconcile strategy
(:mod:`koordlet.qos.cgplan`), as upstream's ``bvtRule.getPodBvtValue`` and
``getKubeQOSDirBvtValue`` (pkg/koordlet/runtimehooks/hooks/groupidentity/rule.go) read it.
"""

from __future__ import annotations

from apis.extension import KubeQOS, QoSClass
from apis.slo_qos import CPUQOSConfig, ResourceQOSStrategy


def pod_group_identity(strategy: ResourceQOSStrategy, qos: str, kube_qos: KubeQOS) -> int:
    """A pod's value: its class's (LSR, LS, BE); without one, by its Kubernetes QoS (BestEffort
    BE's, Burstable LS's, Guaranteed LSR's while LSR CPU QoS is on, else LS's while LS's is on,
    else 0)."""
    if qos == QoSClass.LSR:
        return strategy.lsr_class.cpu_qos.group_identity
    if qos == QoSClass.LS:
        return strategy.ls_class.cpu_qos.group_identity
    if qos == QoSClass.BE:
        return strategy.be_class.cpu_qos.group_identity
    if kube_qos is KubeQOS.BESTEFFORT:
        return strategy.be_class.cpu_qos.group_identity
    if kube_qos is KubeQOS.BURSTABLE:
        return strategy.ls_class.cpu_qos.group_identity
    if strategy.lsr_class.cpu_qos.enable:
        return strategy.lsr_class.cpu_qos.group_identity
    if strategy.ls_class.cpu_qos.enable:
        return strategy.ls_class.cpu_qos.group_identity
    return CPUQOSConfig().group_identity


def kube_qos_group_identity(strategy: ResourceQOSStrategy, kube_qos: KubeQOS) -> int:
    """A Kubernetes QoS cgroup's value: besteffort BE's, burstable LS's, the kubepods root 0."""
    if kube_qos is KubeQOS.BESTEFFORT:
        return strategy.be_class.cpu_qos.group_identity
    if kube_qos is KubeQOS.BURSTABLE:
        return strategy.ls_class.cpu_qos.group_identity
    return CPUQOSConfig().group_identity
