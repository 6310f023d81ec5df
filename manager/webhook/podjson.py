"""A pod as Go's ``json.Marshal`` writes it, and RFC 6902 patches between two pods.

Upstream's webhook answers ``PatchResponseFromRaw(json.Marshal(original), json.Marshal(mutated))``:
both sides pass through Go's types, so a quantity is written as ``String()`` prints it
(``"1000"`` as ``"1k"``) and an untouched one yields no operation. :func:`marshal_quantities`
does that to the quantities of a pod's resources (containers' and init containers' requests and
limits, ``overhead``); the server diffs the two pods after it, and a profile's ``patch`` applies
to the pod after it, as upstream merges the patch into ``json.Marshal(pod)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apis.quantity import go_text


def _marshal_list(resources: Any) -> None:
    if isinstance(resources, dict):
        for name, value in resources.items():
            if isinstance(value, str | int | float) and not isinstance(value, bool):
                try:
                    resources[name] = go_text(value)
                except ValueError:
                    continue  # not a quantity: the API server refuses it, not us


def marshal_quantities(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` with every resource quantity written as Go writes it (in place; returned)."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return pod
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or ():
            resources = container.get("resources") if isinstance(container, dict) else None
            if isinstance(resources, dict):
                _marshal_list(resources.get("requests"))
                _marshal_list(resources.get("limits"))
    _marshal_list(spec.get("overhead"))
    return pod


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def json_patch(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """RFC 6902 operations that turn ``old`` into ``new`` (lists of changed length replaced)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        ops: list[dict[str, Any]] = [
            {"op": "remove", "path": f"{path}/{_escape(str(key))}"} for key in old if key not in new
        ]
        for key, value in new.items():
            sub = f"{path}/{_escape(str(key))}"
            if key not in old:
                ops.append({"op": "add", "path": sub, "value": value})
            else:
                ops.extend(json_patch(old[key], value, sub))
        return ops
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [
            op
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            for op in json_patch(a, b, f"{path}/{i}")
        ]
    if old == new and type(old) is type(new):
        return []
    return [{"op": "replace", "path": path or "", "value": new}]
