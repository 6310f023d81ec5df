"""Network QoS: the HTB class ids, the net_cls class id of each QoS class, and the bandwidth units.

Koordinator's ``tc`` network QoS (``pkg/koordlet/runtimehooks/hooks/tc``, ``tc_linux.go`` and
``netqos_tc.go``; ``apis/extension/netqos.go``) shapes a node's egress with one HTB tree on the
node's interface and puts each pod's sockets in a class through the pod cgroup's
``net_cls.classid``::

    qdisc htb 1:  default 2
    └── class 1:1  root    rate = ceil = total
        ├── class 1:2  SYSTEM  prio 1  rate = total - LS request - BE request  ceil = total
        ├── class 1:3  LS      prio 2  rate = LS egressRequest   ceil = LS egressLimit
        └── class 1:4  BE      prio 3  rate = BE egressRequest   ceil = BE egressLimit

A class id is ``major << 16 | minor`` (``1:4`` is ``0x10004`` = 65540); the same number is what
``net_cls.classid`` holds (the kernel shows it in decimal), so the classifier maps a socket's
cgroup straight to its class. Unclassified traffic (no ``net_cls.classid``) falls into the
default class, SYSTEM. The runtime hook that sets ``net_cls.classid`` at container creation and
the netqos strategy that keeps it on running pods both take the value from :func:`class_id_of`.

Which class a pod belongs to is decided by its ``koordinator.sh/qosClass`` label only, as
upstream's ``GetNetQoSClassByAttrs``: SYSTEM → SYSTEM; LSE, LSR, LS → LS; BE → BE; a pod without
the label is left alone (its traffic goes to the default class).

Bandwidths are bits per second. ``networkQOS`` requests and limits are an int (percent of the
node's total, 0..100) or a quantity string (``"50M"``: 50 Mbit/s); upstream's tc plugin turns the
quantity's value into an HTB rate in bits (``NewHtbClass`` divides it by 8 for the kernel's
bytes), whatever the CRD's description says about bytes. The node's total is, in order: the Node
annotation ``node.koordinator.sh/network-bandwidth`` (a quantity in bit/s, upstream's
``AnnotationNodeBandwidth``), the NodeSLO's ``systemStrategy.totalNetworkBandwidth`` when not 0,
else the interface's link speed (``/sys/class/net/<if>/speed``, Mbit/s).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from apis.extension import LABEL_POD_QOS, NODE_DOMAIN_PREFIX, QoSClass
from apis.quantity import parse_quantity
from apis.slo import SchemaError

ANNOTATION_NODE_NETWORK_BANDWIDTH = NODE_DOMAIN_PREFIX + "network-bandwidth"
"""Node annotation: the node's total network bandwidth, a quantity in bit/s (``1000M``);
upstream's ``AnnotationNodeBandwidth`` (``apis/extension/node_qos.go``). It wins over the
NodeSLO's ``totalNetworkBandwidth``."""

HTB_MAJOR = 1
"""Major number of the koordlet's HTB qdisc and of every class in it (``MAJOR_ID``)."""
QDISC_HANDLE = HTB_MAJOR << 16
"""The HTB root qdisc, ``1:`` (``0x10000``)."""
ROOT_CLASS_MINOR = 1
"""``1:1``: the class every QoS class borrows from; rate = ceil = the node's total."""


class NetQoSClass(StrEnum):
    """The three classes of the HTB tree (upstream's ``NetQoSClass`` names)."""

    SYSTEM = "system_class"
    LS = "ls_class"
    BE = "be_class"


CLASS_MINOR: Mapping[NetQoSClass, int] = MappingProxyType(
    {NetQoSClass.SYSTEM: 2, NetQoSClass.LS: 3, NetQoSClass.BE: 4}
)
"""Minor number of each class (``SYSTEM_CLASS_MINOR_ID``, ``LS_...``, ``BE_...``)."""
CLASS_PRIO: Mapping[NetQoSClass, int] = MappingProxyType(
    {NetQoSClass.SYSTEM: 1, NetQoSClass.LS: 2, NetQoSClass.BE: 3}
)
"""HTB priority of each class: a lower one is offered spare bandwidth first (``*_CLASS_PRIO``)."""
DEFAULT_CLASS = NetQoSClass.SYSTEM
"""Where unclassified traffic goes (the qdisc's ``default``)."""

NET_QOS_OF_CLASS: Mapping[QoSClass, NetQoSClass] = MappingProxyType(
    {
        QoSClass.SYSTEM: NetQoSClass.SYSTEM,
        QoSClass.LSE: NetQoSClass.LS,
        QoSClass.LSR: NetQoSClass.LS,
        QoSClass.LS: NetQoSClass.LS,
        QoSClass.BE: NetQoSClass.BE,
    }
)
"""Koordinator QoS class → network class (``GetPodNetQoSClassByName``)."""


def class_handle(minor: int) -> int:
    """The tc handle ``1:<minor>`` as a number (``major << 16 | minor``)."""
    if not 0 <= minor <= 0xFFFF:
        raise ValueError(f"class minor {minor} outside 0..65535")
    return QDISC_HANDLE | minor


def class_id_of(net_class: NetQoSClass) -> int:
    """The class id of ``net_class``: its HTB handle and the ``net_cls.classid`` its pods get
    (``1:4`` → 65540)."""
    return class_handle(CLASS_MINOR[net_class])


def format_handle(handle: int) -> str:
    """``0x10004`` → ``"1:4"``, as tc prints a class id (hex minor)."""
    return f"{handle >> 16:x}:{handle & 0xFFFF:x}"


def net_qos_class(qos: QoSClass) -> NetQoSClass | None:
    """The network class of a Koordinator QoS class; None for ``QoSClass.NONE``."""
    return NET_QOS_OF_CLASS.get(qos)


def pod_net_qos_class(labels: Mapping[str, str]) -> NetQoSClass | None:
    """The network class of a pod from its labels: ``koordinator.sh/qosClass`` only; None when
    absent or not a class (upstream's ``GetNetQoSClassByAttrs``)."""
    value = labels.get(LABEL_POD_QOS)
    if value is None:
        return None
    try:
        return net_qos_class(QoSClass(value))
    except ValueError:
        return None


def bandwidth_bps(value: int | str, total_bps: int, *, field: str = "") -> int:
    """A ``networkQOS`` request or limit in bit/s: an int is a percent of ``total_bps``
    (0..100), a string a quantity in bit/s. :class:`~apis.slo.SchemaError` (a ``ValueError``)
    naming ``field`` otherwise."""
    if isinstance(value, bool):
        raise SchemaError(f"{value!r} is not a percent or a quantity", field=field)
    if isinstance(value, int):
        if not 0 <= value <= 100:
            raise SchemaError(f"percent {value} outside 0..100", field=field)
        return total_bps * value // 100
    try:
        bps = parse_quantity(value).int_value
    except ValueError as err:
        raise SchemaError(f"{value!r} is not a quantity such as '50M': {err}", field=field) from err
    if bps < 0:
        raise SchemaError(f"{value!r} is negative", field=field)
    return bps


def node_bandwidth_bps(annotations: Mapping[str, str]) -> int | None:
    """The node's ``node.koordinator.sh/network-bandwidth`` in bit/s; None when absent.
    :class:`~apis.slo.SchemaError` (a ``ValueError``) naming the annotation when it is not a
    positive quantity."""
    text = annotations.get(ANNOTATION_NODE_NETWORK_BANDWIDTH)
    if text is None:
        return None
    source = f"annotation {ANNOTATION_NODE_NETWORK_BANDWIDTH}={text!r}"
    try:
        bps = parse_quantity(text).int_value
    except ValueError as err:
        raise SchemaError(f"is not a quantity: {err}", source=source) from err
    if bps <= 0:
        raise SchemaError("is not > 0", source=source)
    return bps
