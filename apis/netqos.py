"""Network QoS by tc: the HTB class ids of the QoS classes, which both sides must agree on.

The koordlet's network QoS strategy builds an HTB tree on the node's NIC and the runtime hooks
put each pod's cgroup into the class of its QoS class (``net_cls.classid``, which tc's cgroup
filter matches). Both take the ids from here. The scheme is Koordinator's
(``pkg/koordlet/runtimehooks/hooks/tc/tc_linux.go``: ``MAJOR_ID``, ``*_CLASS_MINOR_ID``,
``*_CLASS_PRIO``; ``netqos_tc.go``: ``GetPodNetQoSClassByName``):

==========  =========  ========  ====================================
handle      minor      prio      holds
==========  =========  ========  ====================================
``1:0``     0          -         the HTB qdisc (default class ``1:2``)
``1:1``     1          -         the root class
``1:2``     2          1         SYSTEM pods, and traffic of no pod
``1:3``     3          2         LSE, LSR and LS pods
``1:4``     4          3         BE pods
==========  =========  ========  ====================================

A class id is ``major << 16 | minor`` (``TC_H_MAKE``); ``net_cls.classid`` holds it as a decimal
number (``1:3`` is 65539), tc prints it as ``1:3`` and Koordinator's hex form is ``0x10003``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING

from apis.extension import QoSClass
from apis.slo_qos import NetQOSPolicy

if TYPE_CHECKING:
    from apis.slo_strategies import ResourceQOSStrategy

MAJOR_ID = 1
"""The HTB qdisc's major number."""
QDISC_MINOR_ID = 0
ROOT_CLASS_MINOR_ID = 1
SYSTEM_CLASS_MINOR_ID = 2
LS_CLASS_MINOR_ID = 3
BE_CLASS_MINOR_ID = 4

SYSTEM_CLASS_PRIO = 1
LS_CLASS_PRIO = 2
BE_CLASS_PRIO = 3
"""HTB priorities (lower is served first)."""


class NetQoSClass(StrEnum):
    """Koordinator's network QoS classes (upstream ``NetQoSClass``; the ipset names)."""

    SYSTEM = "system_class"
    LS = "ls_class"
    BE = "be_class"
    NONE = ""


NET_CLASS_OF_QOS: Mapping[QoSClass, NetQoSClass] = MappingProxyType(
    {
        QoSClass.SYSTEM: NetQoSClass.SYSTEM,
        QoSClass.LSE: NetQoSClass.LS,
        QoSClass.LSR: NetQoSClass.LS,
        QoSClass.LS: NetQoSClass.LS,
        QoSClass.BE: NetQoSClass.BE,
    }
)
"""A pod's network class by its ``koordinator.sh/qosClass`` label; a pod without the label has
none (upstream ``GetNetQoSClassByAttrs``) and is left to the qdisc's default class."""

MINOR_OF_NET_CLASS: Mapping[NetQoSClass, int] = MappingProxyType(
    {
        NetQoSClass.SYSTEM: SYSTEM_CLASS_MINOR_ID,
        NetQoSClass.LS: LS_CLASS_MINOR_ID,
        NetQoSClass.BE: BE_CLASS_MINOR_ID,
    }
)
"""The HTB class of each network class."""


def handle(major: int, minor: int) -> int:
    """``TC_H_MAKE(major << 16, minor)``: the 32-bit class id."""
    if not (0 <= major <= 0xFFFF and 0 <= minor <= 0xFFFF):
        raise ValueError(f"tc handle {major}:{minor} outside 16 bits each")
    return major << 16 | minor


def hex_class_id(major: int, minor: int) -> str:
    """Koordinator's hex spelling of a class id (``convertToHexClassId``: ``0x10003``)."""
    return f"0x{handle(major, minor):x}"


def class_id_of(qos: QoSClass) -> int | None:
    """The ``net_cls.classid`` of a pod of class ``qos``; None for a pod without a class."""
    net = NET_CLASS_OF_QOS.get(qos)
    return None if net is None else handle(MAJOR_ID, MINOR_OF_NET_CLASS[net])


def tc_enabled(strategy: ResourceQOSStrategy) -> bool:
    """Whether network QoS by tc is on: ``policies.netQOSPolicy`` is ``tc`` and a class (LS or
    BE, the two the HTB tree limits) has ``networkQOS.enable`` (upstream ``loadConfigFromNodeSlo``
    reads those two classes only)."""
    if strategy.policies.net_qos_policy is not NetQOSPolicy.TC:
        return False
    return strategy.ls_class.network_qos.enable or strategy.be_class.network_qos.enable
