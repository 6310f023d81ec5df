"""``TCNetworkQoS``: a new pod's ``net_cls.classid``, the HTB class of its QoS class.

Upstream: ``pkg/koordlet/runtimehooks/hooks/tc/tc_linux.go`` (``SetPodNetCls``) and
``netqos_tc.go``. While network QoS by tc is on (the NodeSLO has a ``resourceQOSStrategy`` with
``policies.netQOSPolicy: tc`` and LS or BE ``networkQOS.enable``, the same condition under which
the network QoS strategy ``koordlet.qos.netqos`` keeps its HTB tree), a pod with a
``koordinator.sh/qosClass`` gets the class id of its network class (:mod:`apis.netqos`: SYSTEM
``1:2``, LSE/LSR/LS ``1:3``, BE ``1:4``), which the tree's cgroup classifier matches. A pod
without the label is left to the qdisc's default class. A pod that the network QoS strategy gives
an HTB class of its own (a valid ``koordinator.sh/networkQOS`` egress limit, ours) gets that
class's id instead (``HookContext.pod_net_class_ids``: the strategy's rule over the inventory,
``apis.netqos.pod_class_minors``), so its cgroup is written once, with the id the strategy keeps.
A pod the inventory does not list yet (seen at its sandbox's creation before the informer's
event) gets its QoS class's id, and the strategy's next round moves it to its own class.

The hook writes the pod's cgroup at ``PreRunPodSandbox``, before any container exists: a new
cgroup takes its parent's class id (the kernel's ``cgrp_css_online``), so the containers inherit
it and the pod's first packets are classified. Running pods and their containers are the network
QoS strategy's (it writes the same values every round): the reconciler does not run this hook.
The class id lives in the cgroup v1 ``net_cls`` controller; where it is not mounted (or on cgroup
v2) the knob is unsupported, with the probe's reason, and nothing is done.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from apis.netqos import class_id_of, format_handle, pod_net_qos_class
from apis.pod_overrides import ANNOTATION_POD_NETWORK_QOS
from apis.slo_inforce import RESOURCE_QOS_STRATEGY, NodeSLOInForce
from apis.slo_qos import NetQOSPolicy
from koordlet.runtimehooks.model import Change, ContainerRequest, PodRequest, Resources

if TYPE_CHECKING:
    from koordlet.runtimehooks.table import HookContext

NAME = "TCNetworkQoS"
"""The gate's name (upstream's plugin is ``tcPlugin``)."""
KNOB = "net_cls_classid"


def tc_enabled(node_slo: NodeSLOInForce) -> bool:
    """Whether network QoS by tc is on (the network QoS strategy's condition)."""
    qos = node_slo.resource_qos_strategy
    enabled = qos.ls_class.network_qos.enable or qos.be_class.network_qos.enable
    tc = qos.policies.net_qos_policy is NetQOSPolicy.TC
    return RESOURCE_QOS_STRATEGY in node_slo.present and tc and enabled


class TCNetworkQoS:
    """The hook; ``supported(knob)`` says whether the kernel has ``net_cls.classid``."""

    def __init__(
        self,
        node_slo: Callable[[], NodeSLOInForce],
        supported: Callable[[str], bool],
        own_class_ids: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self._node_slo = node_slo
        self._supported = supported
        self._own_class_ids = own_class_ids

    def pod(self, req: PodRequest) -> Change | None:
        change = self._change(req.labels)
        own = self._own_class_ids().get(req.pod.uid) if change is not None else None
        if own is None:
            return change
        return Change(
            resources=Resources(net_cls_classid=own),
            reason=f"tc class {format_handle(own)} of its own ({ANNOTATION_POD_NETWORK_QOS})",
        )

    def container(self, req: ContainerRequest) -> Change | None:
        return None  # a container inherits its pod's class id at creation

    def _change(self, labels: Mapping[str, str]) -> Change | None:
        net_class = pod_net_qos_class(labels)
        if net_class is None or not self._supported(KNOB) or not tc_enabled(self._node_slo()):
            return None
        class_id = class_id_of(net_class)
        return Change(
            resources=Resources(net_cls_classid=class_id),
            reason=f"tc class {format_handle(class_id)} ({net_class.value})",
        )


def build(ctx: HookContext) -> TCNetworkQoS:
    """The table's factory (row ``TCNetworkQoS``)."""
    return TCNetworkQoS(ctx.node_slo, ctx.supported, ctx.pod_net_class_ids)
