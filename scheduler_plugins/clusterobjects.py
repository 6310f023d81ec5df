"""The core and policy objects the in-tree plugins and preemption read beside nodes and pods:
Namespaces (their labels, for affinity terms' ``namespaceSelector``), PersistentVolumeClaims and
PersistentVolumes (VolumeBinding's refusal of unbound claims, a bound volume's node affinity) and
PodDisruptionBudgets (preemption prefers victims whose budget allows the disruption).

Each is parsed once as it enters the snapshot; a bad field raises
:class:`~scheduler_plugins.errors.InputError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apis.records import frozen
from scheduler_plugins.errors import InputError
from scheduler_plugins.objectfields import as_object
from scheduler_plugins.selectors import (
    NOTHING,
    LabelSelector,
    NodeSelector,
    parse_label_selector,
    parse_node_selector,
)

CLAIM_BOUND = "Bound"


def _meta(obj: Mapping[str, Any], source: str, where: str) -> tuple[str, str]:
    meta = as_object(obj.get("metadata"), source, where + ".metadata")
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


@frozen
class ClaimInfo:
    """A PersistentVolumeClaim."""

    namespace: str
    name: str
    volume_name: str
    """``spec.volumeName``: the PersistentVolume it is bound to (empty: unbound)."""
    phase: str
    """``status.phase`` (``Pending``, ``Bound``, ``Lost``)."""
    deleting: bool
    """``metadata.deletionTimestamp`` is set."""

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def bound(self) -> bool:
        """Bound to a volume (``spec.volumeName`` set and phase ``Bound``)."""
        return bool(self.volume_name) and self.phase == CLAIM_BOUND


def parse_claim(obj: Mapping[str, Any], source: str, where: str) -> ClaimInfo:
    """A :class:`ClaimInfo` from a v1 PersistentVolumeClaim."""
    namespace, name = _meta(obj, source, where)
    spec = as_object(obj.get("spec"), source, where + ".spec")
    status = as_object(obj.get("status"), source, where + ".status")
    meta = as_object(obj.get("metadata"), source, where + ".metadata")
    return ClaimInfo(
        namespace=namespace,
        name=name,
        volume_name=str(spec.get("volumeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        deleting=meta.get("deletionTimestamp") is not None,
    )


@frozen
class VolumeInfo:
    """A PersistentVolume."""

    name: str
    node_affinity: NodeSelector | None
    """``spec.nodeAffinity.required``: the nodes that can reach the volume (``None``: every
    node)."""


def parse_volume(obj: Mapping[str, Any], source: str, where: str) -> VolumeInfo:
    """A :class:`VolumeInfo` from a v1 PersistentVolume."""
    _, name = _meta(obj, source, where)
    spec = as_object(obj.get("spec"), source, where + ".spec")
    affinity = as_object(spec.get("nodeAffinity"), source, where + ".spec.nodeAffinity")
    required = None
    if affinity.get("required") is not None:
        required = parse_node_selector(
            affinity["required"], source, where + ".spec.nodeAffinity.required"
        )
    return VolumeInfo(name, required)


@frozen
class DisruptionBudget:
    """A policy/v1 PodDisruptionBudget as preemption reads it."""

    namespace: str
    name: str
    selector: LabelSelector
    """``spec.selector``; an absent or empty one selects no pod (as kube-scheduler's
    preemption reads it)."""
    disruptions_allowed: int
    """``status.disruptionsAllowed``."""
    disrupted_pods: frozenset[str]
    """Names in ``status.disruptedPods`` (evictions the API server already counted)."""

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether a pod in ``namespace`` with ``labels`` is covered."""
        return namespace == self.namespace and bool(labels) and self.selector.matches(labels)


def parse_budget(obj: Mapping[str, Any], source: str, where: str) -> DisruptionBudget:
    """A :class:`DisruptionBudget` from a policy/v1 PodDisruptionBudget."""
    namespace, name = _meta(obj, source, where)
    spec = as_object(obj.get("spec"), source, where + ".spec")
    status = as_object(obj.get("status"), source, where + ".status")
    raw_selector = spec.get("selector")
    selector = NOTHING
    if raw_selector:  # nil and {} select nothing here
        selector = parse_label_selector(raw_selector, source, where + ".spec.selector")
        if not selector.requirements:
            selector = NOTHING
    allowed = status.get("disruptionsAllowed", 0)
    if isinstance(allowed, bool) or not isinstance(allowed, int):
        raise InputError(
            source, where + ".status.disruptionsAllowed", f"must be an integer, got {allowed!r}"
        )
    disrupted = as_object(status.get("disruptedPods"), source, where + ".status.disruptedPods")
    return DisruptionBudget(
        namespace, name, selector, allowed, frozenset(str(k) for k in disrupted)
    )


def parse_namespace_labels(obj: Mapping[str, Any], source: str, where: str) -> dict[str, str]:
    """A Namespace's labels."""
    meta = as_object(obj.get("metadata"), source, where + ".metadata")
    labels = as_object(meta.get("labels"), source, where + ".metadata.labels")
    return {str(k): str(v) for k, v in labels.items()}
