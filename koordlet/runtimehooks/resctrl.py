"""``Resctrl``: a new container's threads into its QoS class's resctrl group, as soon as they exist.

Koordinator's resctrl QoS strategy keeps one control group per class under ``/sys/fs/resctrl``
(``LSR`` for LSE and LSR pods, ``LS``, ``BE``; ``koordlet.qos.resctrl``), sets their cache ways and
memory bandwidth, and moves the threads of the pods of a class whose ``resctrlQOS`` is on into
its group at every round. Between a container's start and that round its threads run in the
default group, with the whole cache. This hook closes that window: at ``PostStartContainer`` (the
proxy's and NRI's; the container's threads exist from then on) the koordlet moves them into the
group, through the same resctrl writer, audited and dry-run like every write.

The class is the pod's ``koordinator.sh/qosClass``, else its Kubernetes QoS's (Guaranteed LSR,
Burstable LS, BestEffort BE). Nothing happens while the NodeSLO has no ``resourceQOSStrategy``,
for a class whose ``resctrlQOS`` is off, for SYSTEM pods, or for pods carrying
``node.koordinator.sh/resctrl`` (a pod-level group of their own, which this koordlet does not
create: upstream's pod-level resctrl engine; the strategy leaves them alone as well). Without
resctrl on the host the move is reported unsupported once and skipped. The periodic placement,
and the groups' schemata, remain the strategy's: the reconciler does not run this hook.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from apis.extension import ANNOTATION_POD_RESCTRL, KUBE_QOS_TO_QOS, LABEL_POD_QOS, QoSClass
from apis.slo_inforce import RESOURCE_QOS_STRATEGY, NodeSLOInForce
from apis.slo_qos import ResctrlQOSConfig
from koordlet.runtimehooks.cgroupparent import kube_qos_of
from koordlet.runtimehooks.model import Change, ContainerRequest, PodRequest

NAME = "Resctrl"
"""Upstream's plugin name."""
GROUP_OF_CLASS: Mapping[str, str] = {
    QoSClass.LSE: "LSR",
    QoSClass.LSR: "LSR",
    QoSClass.LS: "LS",
    QoSClass.BE: "BE",
}
"""Control group of each class: Koordinator's ``LSRResctrlGroup``, ``LSResctrlGroup``,
``BEResctrlGroup`` (the names ``koordlet.system.resctrl.RESCTRL_GROUPS`` lists)."""


class Resctrl:
    """The hook."""

    def __init__(self, node_slo: Callable[[], NodeSLOInForce]) -> None:
        self._node_slo = node_slo

    def pod(self, req: PodRequest) -> Change | None:
        return None

    def container(self, req: ContainerRequest) -> Change | None:
        node_slo = self._node_slo()
        if RESOURCE_QOS_STRATEGY not in node_slo.present:
            return None
        if ANNOTATION_POD_RESCTRL in req.pod_annotations:
            return None
        qos = req.pod_labels.get(LABEL_POD_QOS, "")
        cls = qos or KUBE_QOS_TO_QOS[kube_qos_of(req.pod_cgroup_parent)]
        group = GROUP_OF_CLASS.get(cls)
        if group is None:
            return None
        strategy = node_slo.resource_qos_strategy
        config: ResctrlQOSConfig = {
            "LSR": strategy.lsr_class.resctrl_qos,
            "LS": strategy.ls_class.resctrl_qos,
            "BE": strategy.be_class.resctrl_qos,
        }[group]
        if not config.enable:
            return None
        return Change(resctrl_group=group, reason=f"{cls}: resctrl group {group}")
