"""The pod annotation ``node.koordinator.sh/extended-resource-spec``, parsed once where it enters.

koord-manager's webhook copies each container's extended resources (``kubernetes.io/batch-cpu``,
``batch-memory``, ``mid-cpu``, ``mid-memory``) into this annotation, because a CRI request
carries the pod's annotations but not its spec (upstream ``apis/extension/resource.go``:
``AnnotationExtendedResourceSpec``, ``GetExtendedResourceSpec``). Upstream ignores a spec that
does not parse; here it raises :class:`~koordlet.runtimehooks.errors.BadPodInput` naming the
field, so the pod is left unchanged with a Warning Event instead of silently.

CPU quantities follow upstream's ``GetBatchMilliCPUFromResourceList``
(``pkg/util/resource.go``): a plain integer is milli-cores (``"1000"`` is one core), a fractional
one is cores (``"0.5"`` and ``"500m"`` are 500 milli-cores).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from types import MappingProxyType

from apis.extension import ANNOTATION_EXTENDED_RESOURCE_SPEC
from apis.quantity import Quantity, parse_quantity
from apis.records import frozen
from koordlet.runtimehooks.errors import BadPodInput

REASON = "InvalidExtendedResourceSpec"
"""The Warning Event reason for a malformed annotation."""


@frozen
class ContainerResources:
    """One container's extended resources, quantities as written (validated)."""

    requests: Mapping[str, Quantity]
    """Resource name -> quantity in base units (cores are not scaled: see :func:`milli_cpu`)."""
    limits: Mapping[str, Quantity]
    """Resource name -> quantity."""
    has_limits: bool
    """Whether the spec carried a ``limits`` object at all (upstream: a nil ``Limits`` makes the
    pod unlimited)."""


@frozen
class ExtendedResourceSpec:
    """The parsed annotation."""

    containers: Mapping[str, ContainerResources]
    """Container name -> its extended resources."""


def _quantities(raw: object, where: str) -> dict[str, Quantity]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise BadPodInput(REASON, where, f"must be an object of resource: quantity, got {raw!r}")
    out: dict[str, Quantity] = {}
    for name, text in raw.items():
        if not isinstance(text, str | int | float) or isinstance(text, bool):
            raise BadPodInput(REASON, f"{where}.{name}", f"not a quantity: {text!r}")
        try:
            value = parse_quantity(text)
        except ValueError as err:
            raise BadPodInput(REASON, f"{where}.{name}", str(err)) from err
        if value.amount < 0:
            raise BadPodInput(REASON, f"{where}.{name}", f"must not be negative: {text!r}")
        out[str(name)] = value
    return out


def parse_spec(annotations: Mapping[str, str]) -> ExtendedResourceSpec | None:
    """The spec in ``annotations``; None when the pod has no such annotation (or, as upstream,
    no ``containers``). Raises BadPodInput naming the field for anything malformed."""
    text = annotations.get(ANNOTATION_EXTENDED_RESOURCE_SPEC)
    if text is None:
        return None
    return _parse_text(text)


@functools.lru_cache(maxsize=1024)
def _parse_text(text: str) -> ExtendedResourceSpec | None:
    """The spec of one annotation text, kept: the reconciler asks for every container of every
    pod each round, and the spec is immutable (an error is not kept: it is raised again)."""
    key = ANNOTATION_EXTENDED_RESOURCE_SPEC
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise BadPodInput(REASON, key, f"not JSON: {err}") from err
    if not isinstance(doc, Mapping):
        raise BadPodInput(REASON, key, "must be a JSON object")
    raw = doc.get("containers")
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise BadPodInput(REASON, f"{key}: containers", "must be an object of container: spec")
    containers: dict[str, ContainerResources] = {}
    for name, spec in raw.items():
        where = f"{key}: containers.{name}"
        if not isinstance(spec, Mapping):
            raise BadPodInput(REASON, where, "must be an object with requests and limits")
        limits = spec.get("limits")
        containers[str(name)] = ContainerResources(
            requests=MappingProxyType(_quantities(spec.get("requests"), f"{where}.requests")),
            limits=MappingProxyType(_quantities(limits, f"{where}.limits")),
            has_limits=limits is not None,
        )
    return ExtendedResourceSpec(MappingProxyType(containers))


def milli_cpu(value: Quantity | None) -> int:
    """A batch/mid CPU quantity in milli-cores, -1 when absent: ``Quantity.Value()`` (rounded up)
    when the quantity is whole, else ``MilliValue()`` (upstream
    ``GetBatchMilliCPUFromResourceList``)."""
    if value is None:
        return -1
    whole, milli = value.int_value, value.milli_value
    return whole if whole * 1000 == milli else milli


def memory_bytes(value: Quantity | None) -> int:
    """A batch/mid memory quantity in bytes (``Quantity.Value()``, rounded up), -1 when absent."""
    if value is None:
        return -1
    return value.int_value
