"""Koordinator's priority classes, the ``spec.priority`` bands that define them, and the one rule
for which source gives a pod its class.

Upstream ``apis/extension/priority.go``: ``koord-prod`` is priority 9000-9999, ``koord-mid``
7000-7999, ``koord-batch`` 5000-5999, ``koord-free`` 3000-3999; a value outside every band has
no Koordinator class (``""``, ``DefaultPriorityClass``).

A pod's class, with upstream's names (``priority.go`` and ``priority_utils.go``):

- :func:`pod_priority_class_raw` (``GetPodPriorityClassRaw``): the ``koordinator.sh/priority-class``
  label when the pod has it, whatever it holds (an unknown name is no class, and ``spec.priority``
  is then not consulted); else the band of ``spec.priority``. What the webhook's rules compare.
- :func:`pod_priority_class_with_default` (``GetPodPriorityClassWithDefault``): the raw class,
  else the default of the pod's QoS class (:func:`priority_class_with_qos`,
  ``GetPodPriorityClassWithQoS``: SYSTEM, LSE, LSR, LS: ``koord-prod``; BE: ``koord-batch``).
  What the koordlet's states informer and NodeMetric report, the manager's batch and mid
  formulas, the scheduler's load-aware plugin and the descheduler's LowNodeLoad use.

Every component calls these; none spells its own precedence. docs/apis.md has the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from apis.extension import LABEL_POD_PRIORITY_CLASS, QoSClass


class PriorityClass(StrEnum):
    """Koordinator's priority classes (``PriorityClass`` upstream)."""

    PROD = "koord-prod"
    MID = "koord-mid"
    BATCH = "koord-batch"
    FREE = "koord-free"
    NONE = ""


PRIORITY_PROD = PriorityClass.PROD.value
PRIORITY_MID = PriorityClass.MID.value
PRIORITY_BATCH = PriorityClass.BATCH.value
PRIORITY_FREE = PriorityClass.FREE.value

PRIORITY_PROD_VALUE_MIN, PRIORITY_PROD_VALUE_MAX = 9000, 9999
PRIORITY_MID_VALUE_MIN, PRIORITY_MID_VALUE_MAX = 7000, 7999
PRIORITY_BATCH_VALUE_MIN, PRIORITY_BATCH_VALUE_MAX = 5000, 5999
PRIORITY_FREE_VALUE_MIN, PRIORITY_FREE_VALUE_MAX = 3000, 3999

PRIORITY_BANDS: tuple[tuple[str, int, int], ...] = (
    (PRIORITY_PROD, PRIORITY_PROD_VALUE_MIN, PRIORITY_PROD_VALUE_MAX),
    (PRIORITY_MID, PRIORITY_MID_VALUE_MIN, PRIORITY_MID_VALUE_MAX),
    (PRIORITY_BATCH, PRIORITY_BATCH_VALUE_MIN, PRIORITY_BATCH_VALUE_MAX),
    (PRIORITY_FREE, PRIORITY_FREE_VALUE_MIN, PRIORITY_FREE_VALUE_MAX),
)
"""(priority class, lowest value, highest value), highest class first."""

PRIORITY_DEFAULT_VALUES: dict[str, int] = {
    PRIORITY_PROD: 9500,
    PRIORITY_MID: 7500,
    PRIORITY_BATCH: 5500,
    PRIORITY_FREE: 3500,
    "": 0,
}
"""Koordinator's default priority value of each class (used to rank host applications)."""


_KNOWN_NAMES = frozenset((PRIORITY_PROD, PRIORITY_MID, PRIORITY_BATCH, PRIORITY_FREE))

_PROD_QOS = frozenset((QoSClass.SYSTEM, QoSClass.LSE, QoSClass.LSR, QoSClass.LS))


def priority_class_of(priority: object) -> str:
    """The class whose band holds ``priority`` (a ``spec.priority`` value); ``""`` when it is in
    none, absent, or not an integer (upstream's ``getPriorityClassByPriority``)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        return ""
    for name, low, high in PRIORITY_BANDS:
        if low <= priority <= high:
            return name
    return ""


def priority_class_by_name(name: object) -> str:
    """``GetPodPriorityClassByName``: ``name`` when it is one of the four classes, else ``""``."""
    return name if isinstance(name, str) and name in _KNOWN_NAMES else ""


def pod_priority_class_raw(labels: Mapping[str, str] | None, priority: object) -> str:
    """``GetPodPriorityClassRaw``: the ``koordinator.sh/priority-class`` label when present (an
    unknown or empty value gives ``""``, not the band), else the band of ``spec.priority``
    (``priority``: the raw ``spec.priority`` value, ``None`` when unset)."""
    if labels:
        label = labels.get(LABEL_POD_PRIORITY_CLASS)
        if label is not None:
            return priority_class_by_name(label)
    return priority_class_of(priority)


def priority_class_with_qos(qos: object) -> str:
    """``GetPodPriorityClassWithQoS``: the class a pod of QoS class ``qos`` has when nothing
    names one: ``koord-prod`` for SYSTEM, LSE, LSR and LS, ``koord-batch`` for BE, else ``""``.
    A derivation of the default only: a ``koord-mid`` pod may well be LS."""
    if qos in _PROD_QOS:
        return PRIORITY_PROD
    if qos == QoSClass.BE:
        return PRIORITY_BATCH
    return ""


def pod_priority_class_with_default(
    labels: Mapping[str, str] | None, priority: object, qos: object
) -> str:
    """``GetPodPriorityClassWithDefault``: :func:`pod_priority_class_raw`, else
    :func:`priority_class_with_qos` of ``qos``, the pod's QoS class with its default
    (``GetPodQoSClassWithDefault``: the ``koordinator.sh/qosClass`` label, else Guaranteed LSR,
    Burstable LS, BestEffort BE)."""
    return pod_priority_class_raw(labels, priority) or priority_class_with_qos(qos)
