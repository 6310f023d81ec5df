"""ClusterColocationProfiles and what they do to a pod on creation (the mutating webhook).

A profile (``config.koordinator.sh/v1alpha1``) matches a pod when its ``namespaceSelector``
matches the labels of the pod's namespace and its ``selector`` the pod's labels (an absent or
empty selector matches everything). Matching profiles apply in name order, each in turn:
``labels`` and ``annotations`` merged in, ``schedulerName``, the ``koordinator.sh/qosClass``
label from ``qosClass``, ``priorityClassName`` with ``spec.priority`` set to that PriorityClass's
value, the ``koordinator.sh/priority`` label from ``koordinatorPriority``, and ``patch`` applied
as a strategic merge patch. Last, a pod whose priority falls in the batch band (5000..5999) has
the ``cpu`` and ``memory`` of every container's and init container's requests and limits (and of
its overhead) moved to ``kubernetes.io/batch-cpu`` (milli-cores) and ``kubernetes.io/batch-memory``
(bytes), one in the mid band (7000..7999) to ``kubernetes.io/mid-cpu`` and
``kubernetes.io/mid-memory``; a translated resource that has only a request (or only a limit)
gets the other set to the same value. The answer is an RFC 6902 JSON patch from the pod as
received to the pod as mutated.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from apis.configuration import LabelSelector, SelectorRequirement
from apis.errors import FieldError
from apis.extension import LABEL_POD_PRIORITY, LABEL_POD_QOS, QoSClass
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY
from apis.priority import PRIORITY_BATCH, PRIORITY_MID, priority_class_of
from apis.quantity import int_value, milli_value
from kubeclient.writes import apply_merge_patch
from manager.errors import ManagerError

logger = logging.getLogger(__name__)


TRANSLATED: Mapping[str, Mapping[str, str]] = {
    PRIORITY_BATCH: {"cpu": BATCH_CPU, "memory": BATCH_MEMORY},
    PRIORITY_MID: {"cpu": MID_CPU, "memory": MID_MEMORY},
}
"""Priority class → native resource → the colocation resource it becomes."""


class ProfileError(ManagerError, FieldError, ValueError):
    """A ClusterColocationProfile that cannot be used: ``source`` names the profile
    (``clustercolocationprofile NAME``), ``field`` the path inside it (``spec.qosClass``)."""


@dataclass(frozen=True, slots=True)
class Profile:
    """One ClusterColocationProfile, parsed."""

    name: str
    """``metadata.name``: profiles apply in this order."""
    namespace_selector: LabelSelector | None = None
    """``spec.namespaceSelector`` (None or empty: every namespace)."""
    selector: LabelSelector | None = None
    """``spec.selector`` (None or empty: every pod)."""
    qos_class: str = ""
    """``spec.qosClass``: ``LSE``, ``LSR``, ``LS``, ``BE`` or ``SYSTEM``."""
    priority_class_name: str = ""
    """``spec.priorityClassName``: a PriorityClass whose value becomes ``spec.priority``."""
    koordinator_priority: int | None = None
    """``spec.koordinatorPriority``: the ``koordinator.sh/priority`` label."""
    scheduler_name: str = ""
    """``spec.schedulerName``."""
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """``spec.labels``, merged into the pod's."""
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """``spec.annotations``, merged into the pod's."""
    patch: Mapping[str, Any] | None = None
    """``spec.patch``: a strategic merge patch of the pod."""

    def matches(self, pod_labels: Mapping[str, str], ns_labels: Mapping[str, str] | None) -> bool:
        """Whether the profile applies (``ns_labels`` None: the namespace was not looked up,
        which is only allowed when the namespace selector is empty)."""
        if not _empty(self.namespace_selector):
            assert self.namespace_selector is not None
            if ns_labels is None or not self.namespace_selector.matches(ns_labels):
                return False
        return _empty(self.selector) or (
            self.selector is not None and self.selector.matches(pod_labels)
        )

    @property
    def needs_namespace(self) -> bool:
        """Whether matching needs the labels of the pod's namespace."""
        return not _empty(self.namespace_selector)


def _empty(sel: LabelSelector | None) -> bool:
    return sel is None or (not sel.match_labels and not sel.match_expressions)


def _selector(raw: object, source: str, where: str) -> LabelSelector | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ProfileError("must be an object", source=source, field=where)
    labels = raw.get("matchLabels") or {}
    exprs = []
    for i, e in enumerate(raw.get("matchExpressions") or ()):
        op = e.get("operator") if isinstance(e, Mapping) else None
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ProfileError(
                f"unknown {op!r}", source=source, field=f"{where}.matchExpressions[{i}].operator"
            )
        exprs.append(SelectorRequirement(str(e.get("key")), op, tuple(e.get("values") or ())))
    return LabelSelector(
        MappingProxyType({str(k): str(v) for k, v in labels.items()}), tuple(exprs)
    )


def _str_map(raw: object, source: str, where: str) -> Mapping[str, str]:
    if raw is None:
        return MappingProxyType({})
    if not isinstance(raw, Mapping) or not all(isinstance(v, str) for v in raw.values()):
        raise ProfileError("must be a map of strings", source=source, field=where)
    return MappingProxyType(dict(raw))


def parse_profile(obj: Mapping[str, Any]) -> Profile:
    """A ClusterColocationProfile object; raises :class:`ProfileError`."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    spec = obj.get("spec") or {}
    source = f"clustercolocationprofile {name}"
    qos = spec.get("qosClass") or ""
    if qos and qos not in {q.value for q in QoSClass if q.value}:
        raise ProfileError(f"unknown QoS class {qos!r}", source=source, field="spec.qosClass")
    prio = spec.get("koordinatorPriority")
    if prio is not None and (isinstance(prio, bool) or not isinstance(prio, int)):
        raise ProfileError("must be an integer", source=source, field="spec.koordinatorPriority")
    patch = spec.get("patch")
    if patch is not None and not isinstance(patch, Mapping):
        raise ProfileError("must be an object", source=source, field="spec.patch")
    return Profile(
        name=name,
        namespace_selector=_selector(
            spec.get("namespaceSelector"), source, "spec.namespaceSelector"
        ),
        selector=_selector(spec.get("selector"), source, "spec.selector"),
        qos_class=str(qos),
        priority_class_name=str(spec.get("priorityClassName") or ""),
        koordinator_priority=prio,
        scheduler_name=str(spec.get("schedulerName") or ""),
        labels=_str_map(spec.get("labels"), source, "spec.labels"),
        annotations=_str_map(spec.get("annotations"), source, "spec.annotations"),
        patch=patch,
    )


def parse_profiles(objs: Sequence[Mapping[str, Any]]) -> list[Profile]:
    """Every usable profile in name order; a bad one is logged and left out."""
    out = []
    for obj in objs:
        try:
            out.append(parse_profile(obj))
        except ProfileError as err:
            logger.warning("ignoring %s", err)
    return sorted(out, key=lambda p: p.name)


def apply_profile(pod: dict[str, Any], profile: Profile, priority_value: int | None) -> None:
    """Apply one profile to ``pod`` in place (``priority_value``: the value of the profile's
    PriorityClass, looked up by the caller)."""
    meta = pod.setdefault("metadata", {})
    spec = pod.setdefault("spec", {})
    if profile.labels:
        meta["labels"] = {**(meta.get("labels") or {}), **profile.labels}
    if profile.annotations:
        meta["annotations"] = {**(meta.get("annotations") or {}), **profile.annotations}
    if profile.scheduler_name:
        spec["schedulerName"] = profile.scheduler_name
    if profile.qos_class:
        meta["labels"] = {**(meta.get("labels") or {}), LABEL_POD_QOS: profile.qos_class}
    if profile.priority_class_name:
        spec["priorityClassName"] = profile.priority_class_name
        spec["priority"] = priority_value
    if profile.koordinator_priority is not None:
        meta["labels"] = {
            **(meta.get("labels") or {}),
            LABEL_POD_PRIORITY: str(profile.koordinator_priority),
        }
    if profile.patch:
        patched = apply_merge_patch(pod, profile.patch, merge_named_lists=True)
        pod.clear()
        pod.update(patched)


def _translate_list(resources: dict[str, Any], names: Mapping[str, str]) -> None:
    for native, extended in names.items():
        if native not in resources:
            continue
        value = resources.pop(native)
        resources[extended] = str(milli_value(value) if native == "cpu" else int_value(value))


def translate_resources(pod: dict[str, Any]) -> None:
    """Move cpu and memory to the batch or mid resources of the pod's priority band, in place."""
    names = TRANSLATED.get(priority_class_of((pod.get("spec") or {}).get("priority")))
    if names is None:
        return
    spec = pod["spec"]
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or ():
            res = container.setdefault("resources", {})
            requests = dict(res.get("requests") or {})
            limits = dict(res.get("limits") or {})
            _translate_list(requests, names)
            _translate_list(limits, names)
            for extended in names.values():
                if extended in requests and extended not in limits:
                    limits[extended] = requests[extended]
                elif extended in limits and extended not in requests:
                    requests[extended] = limits[extended]
            if requests or "requests" in res:
                res["requests"] = requests
            if limits or "limits" in res:
                res["limits"] = limits
    if spec.get("overhead"):
        overhead = dict(spec["overhead"])
        _translate_list(overhead, names)
        spec["overhead"] = overhead


def mutate(
    pod: Mapping[str, Any],
    profiles: Sequence[Profile],
    *,
    namespace_labels: Mapping[str, str] | None,
    priority_values: Mapping[str, int],
) -> tuple[dict[str, Any], list[str]]:
    """The pod after every matching profile (in name order) and the resource translation, and
    the names of the profiles applied. ``priority_values``: PriorityClass name → value for every
    ``priorityClassName`` of the profiles (a missing one is a :class:`ProfileError`)."""
    out = copy.deepcopy(dict(pod))
    labels = (out.get("metadata") or {}).get("labels") or {}
    matched = [p for p in profiles if p.matches(labels, namespace_labels)]
    if not matched:
        return out, []
    for profile in matched:
        value = None
        if profile.priority_class_name:
            value = priority_values.get(profile.priority_class_name)
            if value is None:
                raise ProfileError(
                    f"PriorityClass {profile.priority_class_name!r} not found",
                    source=f"clustercolocationprofile {profile.name}",
                    field="spec.priorityClassName",
                )
        apply_profile(out, profile, value)
    translate_resources(out)
    return out, [p.name for p in matched]


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
