"""The kube-scheduler extender API on the wire: ``k8s.io/kube-scheduler/extender/v1``.

The Go types of that package carry no json tags, so ``encoding/json`` writes (and kube-scheduler
sends) the Go field names: ``Pod``, ``Nodes``, ``NodeNames``, ``PodName``, ``PodNamespace``,
``PodUID``, ``Node``, ``NodeNameToVictims``, ``NodeNameToMetaVictims``, ``Pods``, ``UID``,
``NumPDBViolations``; only the Kubernetes objects inside (``Pod``, the ``Nodes`` NodeList, a
victim's Pods) are camelCase. A pointer or map left nil is written as an explicit ``null``
(``"Nodes": null`` beside ``NodeNames`` with ``nodeCacheCapable: true``, ``"NodeNames": null``
beside a NodeList without it). Captured bodies: ``tests/golden/captures/``.

Reading is strict where the extender types are concerned: a key the type does not have (``pod``
included: Go's decoder would match it case-insensitively, but nothing kube-scheduler sends is
spelt that way, so it means a client speaking another dialect), a missing required field or a
value of the wrong type raises :class:`~scheduler_plugins.errors.InputError` naming the type
and the field. The Kubernetes objects inside are read as the rest of the scheduler reads them.

Answers use the exact Go names and write every field, as ``json.Marshal`` of the Go struct does:
``ExtenderFilterResult`` (``Nodes``, ``NodeNames``, ``FailedNodes``,
``FailedAndUnresolvableNodes``, ``Error``), ``HostPriorityList`` (``[{"Host", "Score"}]``),
``ExtenderBindingResult`` (``Error``), ``ExtenderPreemptionResult``
(``NodeNameToMetaVictims``, always by UID even when the request carried full victims: upstream's
``HTTPExtender.ProcessPreemption`` decodes only that field).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from apis.records import frozen
from scheduler_plugins.errors import InputError

MAX_EXTENDER_PRIORITY = 10
"""``extenderv1.MaxExtenderPriority``: prioritize answers 0..10."""

EXTENDER_ARGS = "ExtenderArgs"
BINDING_ARGS = "ExtenderBindingArgs"
PREEMPTION_ARGS = "ExtenderPreemptionArgs"

_ARGS_KEYS = ("Pod", "Nodes", "NodeNames")
_BINDING_KEYS = ("PodName", "PodNamespace", "PodUID", "Node")
_PREEMPTION_KEYS = ("Pod", "NodeNameToVictims", "NodeNameToMetaVictims")
_VICTIMS_KEYS = ("Pods", "NumPDBViolations")
_META_POD_KEYS = ("UID",)


@frozen
class ExtenderArgs:
    """``ExtenderArgs``: the pod and its candidate nodes, by name or in full."""

    pod: Mapping[str, Any]
    """``Pod``: the v1 Pod as kube-scheduler holds it."""
    node_names: list[str] | None
    """``NodeNames`` (``nodeCacheCapable: true``); ``None`` when the request carried a NodeList."""
    nodes: list[Mapping[str, Any]] | None
    """``Nodes.items`` (``nodeCacheCapable: false``); ``None`` when it carried names."""

    @property
    def names(self) -> list[str]:
        """The candidate node names, in the order sent."""
        if self.node_names is not None:
            return self.node_names
        return [str((n.get("metadata") or {}).get("name") or "") for n in self.nodes or ()]


@frozen
class BindingArgs:
    """``ExtenderBindingArgs``."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @property
    def key(self) -> str:
        """``namespace/name`` of the pod."""
        return f"{self.pod_namespace}/{self.pod_name}"


@frozen
class Victims:
    """``MetaVictims`` (or ``Victims`` reduced to UIDs): the pods to evict on one node."""

    uids: list[str]
    num_pdb_violations: int


@frozen
class PreemptionArgs:
    """``ExtenderPreemptionArgs``: the pod, and the victims by candidate node."""

    pod: Mapping[str, Any]
    victims: dict[str, Victims]


def _object(value: Any, source: str, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(source, field, f"must be an object, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
        list: "an array",
    }.get(type(value), "an object")


def _check_keys(body: Mapping[str, Any], allowed: Sequence[str], source: str, where: str) -> None:
    for key in body:
        if key in allowed:
            continue
        near = next((a for a in allowed if a.lower() == str(key).lower()), None)
        hint = (
            f" (the extender API's keys are Go field names: {near!r})"
            if near
            else f" (expected {', '.join(allowed)})"
        )
        raise InputError(source, f"{where}{key}", f"unknown field{hint}")


def _string(body: Mapping[str, Any], key: str, source: str) -> str:
    if key not in body:
        raise InputError(source, key, "missing")
    value = body[key]
    if not isinstance(value, str) or not value:
        raise InputError(source, key, f"must be a non-empty string, got {value!r}")
    return value


def _int(value: Any, source: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(source, field, f"must be an integer, got {value!r}")
    return value


def _pod(body: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    if body.get("Pod") is None:
        raise InputError(source, "Pod", "missing")
    return _object(body["Pod"], source, "Pod")


def parse_extender_args(body: Any) -> ExtenderArgs:
    """``ExtenderArgs`` (``/filter``, ``/prioritize``). Raises :class:`InputError`."""
    src = EXTENDER_ARGS
    body = _object(body, src, "")
    _check_keys(body, _ARGS_KEYS, src, "")
    pod = _pod(body, src)
    raw_names = body.get("NodeNames")
    raw_nodes = body.get("Nodes")
    if raw_names is not None and raw_nodes is not None:
        raise InputError(src, "Nodes", "both Nodes and NodeNames given (kube-scheduler sends one)")
    if raw_names is not None:
        if not isinstance(raw_names, list):
            raise InputError(src, "NodeNames", f"must be an array, got {_kind(raw_names)}")
        try:  # one C pass that stops at the first name not a string: 5,000 names are usual
            "".join(raw_names)
        except TypeError:
            i, bad = next((i, n) for i, n in enumerate(raw_names) if not isinstance(n, str))
            raise InputError(src, f"NodeNames[{i}]", f"must be a string, got {bad!r}") from None
        return ExtenderArgs(pod, raw_names, None)
    if raw_nodes is None:
        raise InputError(src, "NodeNames", "missing (neither Nodes nor NodeNames given)")
    node_list = _object(raw_nodes, src, "Nodes")
    items = node_list.get("items")
    if items is None:  # an empty v1.NodeList: Go writes "items": null
        return ExtenderArgs(pod, None, [])
    if not isinstance(items, list):
        raise InputError(src, "Nodes.items", f"must be an array, got {_kind(items)}")
    nodes = [_object(n, src, f"Nodes.items[{i}]") for i, n in enumerate(items)]
    return ExtenderArgs(pod, None, nodes)


def parse_binding_args(body: Any) -> BindingArgs:
    """``ExtenderBindingArgs`` (``/bind``). Raises :class:`InputError`."""
    src = BINDING_ARGS
    body = _object(body, src, "")
    _check_keys(body, _BINDING_KEYS, src, "")
    return BindingArgs(*(_string(body, k, src) for k in _BINDING_KEYS))


def _victims(raw: Any, src: str, where: str, full: bool) -> Victims:
    obj = _object(raw, src, where)
    _check_keys(obj, _VICTIMS_KEYS, src, f"{where}.")
    pods = obj.get("Pods")
    if pods is None:
        pods = []
    if not isinstance(pods, list):
        raise InputError(src, f"{where}.Pods", f"must be an array, got {_kind(pods)}")
    uids: list[str] = []
    for i, p in enumerate(pods):
        pwhere = f"{where}.Pods[{i}]"
        entry = _object(p, src, pwhere)
        if full:  # a v1.Pod: its metadata.uid
            uid = (_object(entry.get("metadata") or {}, src, f"{pwhere}.metadata")).get("uid")
            field = f"{pwhere}.metadata.uid"
        else:  # a MetaPod
            _check_keys(entry, _META_POD_KEYS, src, f"{pwhere}.")
            uid = entry.get("UID")
            field = f"{pwhere}.UID"
        if not isinstance(uid, str) or not uid:
            raise InputError(src, field, f"must be a non-empty string, got {uid!r}")
        uids.append(uid)
    pdb = _int(obj.get("NumPDBViolations", 0), src, f"{where}.NumPDBViolations")
    return Victims(uids, pdb)


def parse_preemption_args(body: Any) -> PreemptionArgs:
    """``ExtenderPreemptionArgs`` (``/preempt``): ``NodeNameToMetaVictims`` with
    ``nodeCacheCapable``, else ``NodeNameToVictims`` (full pods, read for their UIDs). Raises
    :class:`InputError`."""
    src = PREEMPTION_ARGS
    body = _object(body, src, "")
    _check_keys(body, _PREEMPTION_KEYS, src, "")
    pod = _pod(body, src)
    meta = body.get("NodeNameToMetaVictims")
    full = body.get("NodeNameToVictims")
    if meta is not None and full is not None:
        raise InputError(
            src, "NodeNameToVictims", "both NodeNameToVictims and NodeNameToMetaVictims given"
        )
    if meta is None and full is None:
        raise InputError(src, "NodeNameToMetaVictims", "missing (no victims map given)")
    key, raw = ("NodeNameToMetaVictims", meta) if meta is not None else ("NodeNameToVictims", full)
    by_node = _object(raw, src, key)
    victims = {
        str(node): _victims(v, src, f"{key}[{node}]", full=meta is None)
        for node, v in by_node.items()
    }
    return PreemptionArgs(pod, victims)


# -- answers ------------------------------------------------------------------------------------


def filter_result(
    args: ExtenderArgs | None,
    passing: Iterable[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    error: str = "",
) -> dict[str, Any]:
    """``ExtenderFilterResult``: the passing nodes as the request named them (``NodeNames``),
    or as it sent them (``Nodes``, the request's own objects echoed: kube-scheduler binds to
    the Node objects it decodes from here)."""
    nodes: dict[str, Any] | None = None
    names: list[str] | None = None
    if args is not None and args.nodes is not None:
        keep = set(passing)
        nodes = {
            "metadata": {},
            "items": [n for n in args.nodes if (n.get("metadata") or {}).get("name") in keep],
        }
    elif args is not None:
        names = list(passing)
    return {
        "Nodes": nodes,
        "NodeNames": names,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }


def host_priority_list(
    hosts: Sequence[str], totals: Mapping[str, int], divisor: int
) -> list[dict[str, Any]]:
    """``HostPriorityList``: each host's total (0 when it has none) divided by ``divisor``."""
    get = totals.get
    return [{"Host": host, "Score": get(host, 0) // divisor} for host in hosts]


def binding_result(error: str = "") -> dict[str, Any]:
    """``ExtenderBindingResult``."""
    return {"Error": error}


def preemption_result(victims: Mapping[str, Victims]) -> dict[str, Any]:
    """``ExtenderPreemptionResult``."""
    return {
        "NodeNameToMetaVictims": {
            node: {
                "Pods": [{"UID": uid} for uid in v.uids],
                "NumPDBViolations": v.num_pdb_violations,
            }
            for node, v in victims.items()
        }
    }


def error_body(message: str) -> dict[str, Any]:
    """The body of a non-200 answer (prioritize and preempt have no ``Error`` field:
    kube-scheduler reports the status code, the log has the message)."""
    return {"Error": message}
