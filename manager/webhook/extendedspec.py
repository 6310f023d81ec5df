"""The ``node.koordinator.sh/extended-resource-spec`` annotation, as upstream's pod mutating
webhook writes it on CREATE (``pkg/webhook/pod/mutating/extended_resource_spec.go``, with
``apis/extension/resource.go``: ``ExtendedResourceSpec``, ``SetExtendedResourceSpec``).

A CRI request carries a pod's annotations but not its spec, so the koordlet's BatchResource hook
reads the containers' extended resources from here (``koordlet/runtimehooks/extresources.py``).

- Each app container (``spec.containers``; init containers are left out, as upstream's
  ``TODO: count init containers``) whose requests or limits name one of :data:`SPEC_RESOURCES`
  gets an entry ``{"limits": {...}, "requests": {...}}`` of those resources alone, a side left
  out when it names none (``omitempty``).
- The text is Go's ``json.Marshal``: compact, keys sorted, each quantity as ``String()`` prints
  it (``apis.quantity.go_text``: ``"1000"`` is written ``"1k"``, ``"4Gi"`` stays ``"4Gi"``).
  ``{}`` when no container has any.
- The annotation is written unless the one already on the pod holds the same spec by
  ``reflect.DeepEqual``, which compares Go's representation: a side upstream's parse leaves
  nil against one it built empty, and quantities by :func:`apis.quantity.go_identity`, so
  ``"1000"`` is not ``"1k"``. A pod without resources and without the annotation is left
  alone; one without resources but with a non-empty annotation gets ``{}``.
- An annotation Go cannot decode (not JSON, a quantity that does not parse) is
  :class:`SpecError`: upstream's webhook then refuses the pod (500), and so does ours, naming
  the field.

:data:`SPEC_RESOURCES` adds ``kubernetes.io/mid-cpu`` and ``mid-memory`` to upstream's batch
pair: our BatchResource hook sizes mid pods from them (upstream writes no mid entries, so a pod
with only batch resources gets byte for byte upstream's annotation).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from apis.errors import FieldError
from apis.extension import ANNOTATION_EXTENDED_RESOURCE_SPEC
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY
from apis.quantity import GoIdentity, go_identity, go_text
from manager.errors import ManagerError

SPEC_RESOURCES = (BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY)
"""The resources the annotation carries (upstream: the first two)."""

Path = tuple[str, int, str, str]
"""Where a quantity sits in a pod: (``containers``, index, ``requests``/``limits``, resource)."""

Side = dict[str, GoIdentity] | None
"""One side of a container's entry as Go holds it: None where Go's map is nil."""


class SpecError(ManagerError, FieldError, ValueError):
    """An existing annotation Go's ``json.Unmarshal`` would refuse: ``source`` is the
    annotation, ``field`` the place in it."""


def _identity(pod_quantity: object, path: Path, made: Mapping[Path, GoIdentity]) -> GoIdentity:
    return made.get(path) or go_identity(pod_quantity)


def compute(
    pod: Mapping[str, Any], made: Mapping[Path, GoIdentity] | None = None
) -> tuple[dict[str, dict[str, dict[str, str]]], dict[str, tuple[Side, Side]]]:
    """The containers' entries as text (for the annotation) and as Go's representation (for the
    comparison). ``made``: quantities the profile translation built, whose representation is
    not that of their text (``NewQuantity(milli, DecimalSI)``)."""
    made = made or {}
    text: dict[str, dict[str, dict[str, str]]] = {}
    ident: dict[str, tuple[Side, Side]] = {}
    for i, container in enumerate((pod.get("spec") or {}).get("containers") or ()):
        resources = container.get("resources") or {}
        entry: dict[str, dict[str, str]] = {}
        sides: list[dict[str, GoIdentity]] = []
        for side in ("limits", "requests"):
            given = resources.get(side) or {}
            picked = {r: given[r] for r in SPEC_RESOURCES if r in given}
            sides.append(
                {r: _identity(q, ("containers", i, side, r), made) for r, q in picked.items()}
            )
            if picked:
                entry[side] = {r: go_text(q) for r, q in picked.items()}
        if entry:
            name = str(container.get("name") or "")
            text[name] = entry
            ident[name] = (sides[0], sides[1])  # Go builds both maps, empty or not
    return text, ident


def render(containers: Mapping[str, Mapping[str, Mapping[str, str]]]) -> str:
    """Go's ``json.Marshal`` of the spec: compact, sorted keys, ``containers`` omitted empty."""
    doc = {"containers": containers} if containers else {}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


# Reading an existing annotation as Go's json.Unmarshal does ------------------------------------
class _Obj(list[tuple[str, Any]]):
    """A JSON object with its keys in order and repeated keys kept (Go merges them)."""


def _pairs(raw: list[tuple[str, Any]]) -> _Obj:
    return _Obj(raw)


def _field(obj: _Obj, name: str) -> list[Any]:
    """The values decoded into a struct field, in document order: ``encoding/json`` takes every
    key equal to the field's name under Unicode case folding, each in turn."""
    return [v for k, v in obj if k.casefold() == name]


def _quantities(raw: Any, where: str) -> dict[str, GoIdentity] | None:
    if raw is None:
        return None
    if not isinstance(raw, _Obj):
        raise SpecError("must be an object of quantities", source=_SOURCE, field=where)
    out: dict[str, GoIdentity] = {}
    for name, value in raw:
        if value is None:  # Quantity.UnmarshalJSON: null is the zero quantity
            out[name] = ("i", 0, 0, "", None)
            continue
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise SpecError(f"not a quantity: {value!r}", source=_SOURCE, field=f"{where}.{name}")
        try:
            out[name] = go_identity(value)
        except ValueError as err:
            raise SpecError(str(err), source=_SOURCE, field=f"{where}.{name}") from err
    return out


def _merge(into: Side, more: Side) -> Side:
    """A repeated key decoded into the same map: null sets it nil, an object adds its keys."""
    if more is None:
        return None
    return more if into is None else {**into, **more}


_SOURCE = f"annotation {ANNOTATION_EXTENDED_RESOURCE_SPEC}"


def parse_existing(text: str) -> dict[str, tuple[Side, Side]] | None:
    """The spec of an annotation as Go decodes it: None for no ``containers`` (nil), else
    container → (limits, requests), each None when absent or null. Raises :class:`SpecError`."""
    try:
        doc = json.loads(text, object_pairs_hook=_pairs)
    except ValueError as err:
        raise SpecError(f"not JSON: {err}", source=_SOURCE, field="") from err
    if doc is None:
        return None
    if not isinstance(doc, _Obj):
        raise SpecError("must be a JSON object", source=_SOURCE, field="")
    containers: dict[str, tuple[Side, Side]] | None = None
    for raw in _field(doc, "containers"):
        if raw is None:
            containers = None
            continue
        if not isinstance(raw, _Obj):
            raise SpecError("must be an object", source=_SOURCE, field="containers")
        containers = {} if containers is None else containers
        for name, spec in raw:
            where = f"containers.{name}"
            if spec is not None and not isinstance(spec, _Obj):
                raise SpecError("must be an object", source=_SOURCE, field=where)
            limits: Side = None
            requests: Side = None
            for value in _field(spec or _Obj(), "limits"):
                limits = _merge(limits, _quantities(value, f"{where}.limits"))
            for value in _field(spec or _Obj(), "requests"):
                requests = _merge(requests, _quantities(value, f"{where}.requests"))
            containers[name] = (limits, requests)
    return containers


def mutate(pod: dict[str, Any], made: Mapping[Path, GoIdentity] | None = None) -> bool:
    """Write the annotation on ``pod`` in place unless the existing one is DeepEqual to it;
    whether it was written. Raises :class:`SpecError` for an annotation Go cannot decode."""
    text, ident = compute(pod, made)
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    existing = annotations.get(ANNOTATION_EXTENDED_RESOURCE_SPEC)
    current = None if existing is None else parse_existing(existing)
    if (ident or None) == current:
        return False
    meta = pod.setdefault("metadata", {})
    meta["annotations"] = {**annotations, ANNOTATION_EXTENDED_RESOURCE_SPEC: render(text)}
    return True
