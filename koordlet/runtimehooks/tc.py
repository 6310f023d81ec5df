"""``TCNetworkQoS``: each pod's ``net_cls.classid``, the HTB class of its QoS class.

Upstream: ``pkg/koordlet/runtimehooks/hooks/tc/tc_linux.go`` (``SetPodNetCls``) and
``netqos_tc.go``. While network QoS by tc is on (``resourceQOSStrategy.policies.netQOSPolicy:
tc`` and LS or BE ``networkQOS.enable``; :func:`apis.netqos.tc_enabled`), a pod with a
``koordinator.sh/qosClass`` gets the class id of its network class (:mod:`apis.netqos`: SYSTEM
``1:2``, LSE/LSR/LS ``1:3``, BE ``1:4``), which tc's cgroup filter on the NIC's HTB qdisc (the
network QoS strategy's) matches. A pod without the label is left to the qdisc's default class.

The pod's cgroup gets it at ``PreRunPodSandbox``, before any container exists: a new cgroup takes
its parent's class id (the kernel's ``cgrp_css_online``), so the containers inherit it. The
reconciler writes it into running pods and their containers (they do not follow a later change
of their parent). Per-pod bandwidth limits (the pod's own HTB class from its ``networkQOS``
annotation, upstream's ``needLimitInPodLevel``) are the network QoS strategy's, not this hook's.
The class id lives in the cgroup v1 ``net_cls`` controller: where it is not mounted (or on cgroup
v2) the knob is unsupported, with the probe's reason in ``/debug/capabilities``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from apis.extension import LABEL_POD_QOS, QoSClass
from apis.netqos import class_id_of, tc_enabled
from apis.slo_inforce import NodeSLOInForce
from koordlet.runtimehooks.model import Change, ContainerRequest, PodRequest, Resources

NAME = "TCNetworkQoS"
"""The gate's name (upstream's plugin is ``tcPlugin``)."""
KNOB = "net_cls_classid"


_CLASSES = {c.value: c for c in QoSClass if c is not QoSClass.NONE}


class TCNetworkQoS:
    """The hook; ``supported(knob)`` says whether the kernel has ``net_cls.classid``."""

    def __init__(
        self, node_slo: Callable[[], NodeSLOInForce], supported: Callable[[str], bool]
    ) -> None:
        self._node_slo = node_slo
        self._supported = supported

    def pod(self, req: PodRequest) -> Change | None:
        return self._change(req.labels)

    def container(self, req: ContainerRequest) -> Change | None:
        """The reconciler's (a container created after the pod inherits the pod's value)."""
        return self._change(req.pod_labels)

    def _change(self, labels: Mapping[str, str]) -> Change | None:
        qos = _CLASSES.get(labels.get(LABEL_POD_QOS, ""))
        if qos is None or not self._supported(KNOB):
            return None
        if not tc_enabled(self._node_slo().resource_qos_strategy):
            return None
        class_id = class_id_of(qos)
        if class_id is None:
            return None
        return Change(
            resources=Resources(net_cls_classid=class_id),
            reason=f"tc class {class_id >> 16}:{class_id & 0xFFFF} of {qos}",
        )
