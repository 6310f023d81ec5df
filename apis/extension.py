"""Koordinator's QoS classes, Kubernetes QoS classes, and the label, annotation and resource keys.

Names and values are Koordinator's contract (``apis/extension`` upstream): a pod labelled for
the Go koordlet means the same to ours.
"""

from __future__ import annotations

from enum import StrEnum

DOMAIN_PREFIX = "koordinator.sh/"

LABEL_POD_QOS = DOMAIN_PREFIX + "qosClass"
"""Pod label carrying the Koordinator QoS class (``LSE``, ``LSR``, ``LS``, ``BE``, ``SYSTEM``)."""
LABEL_POD_PRIORITY_CLASS = DOMAIN_PREFIX + "priority-class"
"""Pod label carrying the Koordinator priority class (``koord-prod`` and friends)."""


class QoSClass(StrEnum):
    """Koordinator's QoS classes, highest first."""

    LSE = "LSE"
    LSR = "LSR"
    LS = "LS"
    BE = "BE"
    SYSTEM = "SYSTEM"
    NONE = ""


class KubeQOS(StrEnum):
    """Kubernetes' own QoS classes (``status.qosClass``)."""

    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BESTEFFORT = "BestEffort"


KUBE_QOS_TO_QOS: dict[KubeQOS, QoSClass] = {
    KubeQOS.GUARANTEED: QoSClass.LSR,
    KubeQOS.BURSTABLE: QoSClass.LS,
    KubeQOS.BESTEFFORT: QoSClass.BE,
}
"""The default Koordinator class of a pod that carries no ``koordinator.sh/qosClass`` label, as
the kubelet-free discovery uses it (Guaranteed→LSR, Burstable→LS, BestEffort→BE)."""
