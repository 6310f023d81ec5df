"""Reading the fields of API objects as the scheduler's parsers do, each bad field an
:class:`~scheduler_plugins.errors.InputError` naming it: maps (copied, or as they are), lists and
string maps,
``ResourceList`` quantities, RFC 3339 times.

Resource values are integers in Koordinator's ``getResourceValue`` units: ``cpu`` in milli-cores
(``Quantity.MilliValue()``), every other resource by ``Quantity.Value()``: bytes for memory,
milli-cores for ``kubernetes.io/batch-cpu`` and ``kubernetes.io/mid-cpu`` (which Koordinator
writes as plain integers of milli-cores), counts for ``pods`` and devices.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apis.quantity import resource_value
from apis.timestamp import TimestampError, parse_time
from scheduler_plugins.errors import InputError

ResourceList = dict[str, int]


def parse_resource_list(raw: Any, source: str, where: str) -> ResourceList:
    """A ``ResourceList`` mapping (``{"cpu": "500m", "memory": "1Gi"}``) in integer units."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InputError(source, where, f"must be a map of resource quantities, got {raw!r}")
    out: ResourceList = {}
    for name, quantity in raw.items():
        try:
            out[str(name)] = resource_value(str(name), quantity)
        except (ValueError, TypeError) as err:
            raise InputError(source, f"{where}.{name}", f"not a quantity: {quantity!r}") from err
    return out


def add_into(total: ResourceList, extra: Mapping[str, int], sign: int = 1) -> None:
    """``total += sign * extra``, resource by resource."""
    for name, value in extra.items():
        total[name] = total.get(name, 0) + sign * value


def optional_time(raw: Any, source: str, where: str) -> float | None:
    """A ``metav1.Time`` field (:func:`apis.timestamp.parse_time`) in epoch seconds; ``None``
    when absent or empty. Raises :class:`InputError`."""
    if raw is None or raw == "":
        return None
    try:
        return parse_time(raw)
    except TimestampError as err:
        raise InputError(source, where, err.message) from err


def as_map(raw: Any, source: str, where: str) -> dict[str, Any]:
    """A map field (a copy; ``{}`` when absent)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InputError(source, where, f"must be a map, got {type(raw).__name__}")
    return dict(raw)


def as_object(raw: Any, source: str, where: str) -> Mapping[str, Any]:
    """An object field as it is (no copy; ``{}`` when absent)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InputError(source, where, f"must be an object, got {type(raw).__name__}")
    return raw


def as_list(raw: Any, source: str, where: str) -> list[Any]:
    """A list field (``[]`` when absent)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InputError(source, where, f"must be a list, got {type(raw).__name__}")
    return raw


def as_str_map(raw: Any, source: str, where: str) -> dict[str, str]:
    """A map field as strings (labels, annotations)."""
    return {str(k): str(v) for k, v in as_map(raw, source, where).items()}
