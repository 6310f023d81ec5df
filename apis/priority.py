"""Koordinator's priority classes and the ``spec.priority`` bands that define them.

Upstream ``apis/extension/priority.go``: ``koord-prod`` is priority 9000-9999, ``koord-mid``
7000-7999, ``koord-batch`` 5000-5999, ``koord-free`` 3000-3999; a value outside every band has
no Koordinator class (``""``). Which source wins for a pod (the ``koordinator.sh/priority-class``
label, ``spec.priority``, or the QoS default) is each component's rule; the bands are only here.
"""

from __future__ import annotations

from enum import StrEnum


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


def priority_class_of(priority: object) -> str:
    """The class whose band holds ``priority`` (a ``spec.priority`` value); ``""`` when it is in
    none, absent, or not an integer."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        return ""
    for name, low, high in PRIORITY_BANDS:
        if low <= priority <= high:
            return name
    return ""
