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
for a class whose ``resctrlQOS`` is off, or for SYSTEM pods. A pod carrying
``node.koordinator.sh/resctrl`` (a control group of its own, upstream v1.6's pod-level resctrl;
:mod:`apis.pod_overrides`) has its new container's threads moved into ``koordlet-<uid>``
instead, whatever its class and the NodeSLO, as upstream's ``SetContainerResctrlResources``
gives the container that closid. The resctrl QoS strategy makes that group and writes its
schemata: until its first round since the pod appeared the group does not exist, and the threads
wait in the default group for that round (which places them). A value that does not parse keeps
the pod in its class's group; the strategy reports it (once). Without resctrl on the host the
move is reported unsupported once and skipped. The periodic placement, and the groups' schemata,
remain the strategy's: the reconciler does not run this hook.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from apis.extension import ANNOTATION_POD_RESCTRL, KUBE_QOS_TO_QOS, LABEL_POD_QOS
from apis.pod_overrides import RESCTRL_GROUP_PREFIX, AnnotationError, parse_pod_resctrl
from apis.slo_inforce import RESOURCE_QOS_STRATEGY, NodeSLOInForce
from apis.slo_qos import ResctrlQOSConfig
from koordlet.runtimehooks.cgroupparent import kube_qos_of
from koordlet.runtimehooks.model import Change, ContainerRequest, PodRequest
from koordlet.system.resctrl import GROUP_OF_CLASS

if TYPE_CHECKING:
    from koordlet.runtimehooks.table import HookContext

logger = logging.getLogger(__name__)

NAME = "Resctrl"
"""Upstream's plugin name."""


class Resctrl:
    """The hook."""

    def __init__(self, node_slo: Callable[[], NodeSLOInForce]) -> None:
        self._node_slo = node_slo

    def pod(self, req: PodRequest) -> Change | None:
        return None

    def container(self, req: ContainerRequest) -> Change | None:
        own = _own_group(req)
        if own is not None:
            return Change(resctrl_group=own, reason=f"{ANNOTATION_POD_RESCTRL}: group {own}")
        node_slo = self._node_slo()
        if RESOURCE_QOS_STRATEGY not in node_slo.present:
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


def _own_group(req: ContainerRequest) -> str | None:
    """``koordlet-<uid>`` for a pod whose ``node.koordinator.sh/resctrl`` parses; None without
    one, or when it does not parse (the strategy reports that once: not again per container)."""
    text = req.pod_annotations.get(ANNOTATION_POD_RESCTRL)
    if text is None or not req.pod.uid:
        return None
    try:
        parse_pod_resctrl(text)
    except AnnotationError as err:
        logger.debug("pod %s: %s; its class's group instead", req.pod, err)
        return None
    return RESCTRL_GROUP_PREFIX + req.pod.uid


def build(ctx: HookContext) -> Resctrl:
    """The table's factory (row ``Resctrl``)."""
    return Resctrl(ctx.node_slo)
