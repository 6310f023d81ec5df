"""Reservation: resources held on a node for the pods of named owners.

Koordinator's semantics (``pkg/scheduler/plugins/reservation``), re-implemented over the
snapshot:

- **Active.** A Reservation (``scheduling.koordinator.sh/v1alpha1``) in phase ``Available`` on
  ``status.nodeName``, not past ``spec.expires`` nor ``creationTimestamp + spec.ttl`` (default
  24 h; ``"0s"``: never). It holds ``status.allocatable`` (else the template's requests) less
  what its owners already use: the requests of pods annotated
  ``scheduling.koordinator.sh/reservation-allocated`` with its name, else ``status.allocated``.
  ``allocateOnce`` (default true) makes a reservation that has an owner unavailable to others.
- **Owners.** ``spec.owners[]``: ``object`` (namespace, name, uid), ``controller`` (the pod's
  controlling ownerReference: name, kind, namespace) or ``labelSelector`` (``matchLabels``,
  ``matchExpressions`` In/NotIn/Exists/DoesNotExist).
- **PreFilter** tells NodeResourcesFit, per node with active reservations, what they hold for
  others (less free) and what the best matching one holds for this pod (more free).
- **Score** 100 on nodes where a reservation of this pod's owners fits it, 0 elsewhere; the
  plugin takes no part for pods no reservation matches.
- **Reserve** picks that reservation (the one with the least left that fits: pack) and returns
  ``scheduling.koordinator.sh/reservation-allocated: {"name": ..., "uid": ...}``; the pod, once
  assumed with the annotation, counts against it.

Not done: ``allocatePolicy`` Restricted/Aligned, the pod's reservation-affinity annotation,
reservations that are still Pending (scheduling the reserve pod itself).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubeclient.units import parse_duration
from scheduler_plugins.framework import Cycle, Plugin
from scheduler_plugins.plugins.noderesourcesfit import RESERVATION_ADJUST_KEY
from scheduler_plugins.snapshot import (
    ANNOTATION_RESERVATION_ALLOCATED,
    NodeInfo,
    PodInfo,
    ResourceList,
    Snapshot,
    parse_resource_list,
    parse_time,
)

NAME = "Reservation"
DEFAULT_TTL_S = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class ActiveReservation:
    """A reservation that holds resources now."""

    name: str
    uid: str
    node: str
    remaining: ResourceList
    """What it still holds (allocatable less its owners' requests)."""
    owners: tuple[dict[str, Any], ...]
    has_owner: bool
    allocate_once: bool


def _allocated_to(pod: PodInfo) -> str:
    raw = pod.annotations.get(ANNOTATION_RESERVATION_ALLOCATED)
    if not raw:
        return ""
    try:
        loaded = json.loads(raw)
    except ValueError:
        return ""
    return str(loaded.get("name") or "") if isinstance(loaded, dict) else ""


def active_reservations(snapshot: Snapshot, now: float) -> dict[str, list[ActiveReservation]]:
    """Active reservations by node."""
    used: dict[str, ResourceList] = {}
    for info in snapshot.nodes.values():
        for pod in info.pods.values():
            name = _allocated_to(pod)
            if name:
                bucket = used.setdefault(name, {})
                for r, v in pod.requests.items():
                    bucket[r] = bucket.get(r, 0) + v
    out: dict[str, list[ActiveReservation]] = {}
    for name, obj in snapshot.reservations.items():
        where = f"Reservation {name}"
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        node = str(status.get("nodeName") or "")
        if status.get("phase") != "Available" or node not in snapshot.nodes:
            continue
        expires = parse_time(spec.get("expires"), where, "spec.expires")
        if expires is not None and now >= expires:
            continue
        created = parse_time(meta.get("creationTimestamp"), where, "metadata.creationTimestamp")
        try:
            ttl = parse_duration(str(spec["ttl"])) if spec.get("ttl") is not None else DEFAULT_TTL_S
        except ValueError:
            ttl = DEFAULT_TTL_S
        if expires is None and ttl > 0 and created is not None and now >= created + ttl:
            continue
        allocatable = parse_resource_list(status.get("allocatable"), where, "status.allocatable")
        if not allocatable:
            template = (spec.get("template") or {}).get("spec") or {}
            for c in template.get("containers") or []:
                req = parse_resource_list(
                    ((c or {}).get("resources") or {}).get("requests"), where, "spec.template"
                )
                for r, v in req.items():
                    allocatable[r] = allocatable.get(r, 0) + v
        consumed = used.get(name)
        if consumed is None:
            consumed = parse_resource_list(status.get("allocated"), where, "status.allocated")
        remaining = {r: max(v - consumed.get(r, 0), 0) for r, v in allocatable.items()}
        owners = tuple(o for o in spec.get("owners") or [] if isinstance(o, dict))
        out.setdefault(node, []).append(
            ActiveReservation(
                name=name,
                uid=str(meta.get("uid") or name),
                node=node,
                remaining=remaining,
                owners=owners,
                has_owner=bool(consumed) or bool(status.get("currentOwners")),
                allocate_once=spec.get("allocateOnce", True) is not False,
            )
        )
    return out


def _selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op = expr.get("key"), expr.get("operator")
        values = expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def owner_matches(owner: Mapping[str, Any], pod: PodInfo) -> bool:
    """Whether ``pod`` is one of the owners ``owner`` describes."""
    obj = owner.get("object")
    if isinstance(obj, dict):
        return (
            (not obj.get("name") or obj.get("name") == pod.name)
            and (obj.get("namespace") or "default") == pod.namespace
            and (not obj.get("uid") or obj.get("uid") == pod.uid)
        )
    ctrl = owner.get("controller")
    if isinstance(ctrl, dict):
        if ctrl.get("namespace") and ctrl.get("namespace") != pod.namespace:
            return False
        for ref in (pod.raw.get("metadata") or {}).get("ownerReferences") or []:
            if ref.get("controller") and ref.get("name") == ctrl.get("name"):
                return not ctrl.get("kind") or ctrl.get("kind") == ref.get("kind")
        return False
    selector = owner.get("labelSelector")
    if isinstance(selector, dict):
        return _selector_matches(selector, pod.labels)
    return False


def _fits(request: Mapping[str, int], remaining: Mapping[str, int]) -> bool:
    return all(request.get(r, 0) <= v for r, v in remaining.items() if r in request)


class Reservation(Plugin):
    """See the module docstring."""

    name = NAME

    def _matches(self, cycle: Cycle, pod: PodInfo) -> dict[str, list[ActiveReservation]]:
        key = f"{NAME}/matches/{pod.uid}"
        found: dict[str, list[ActiveReservation]] | None = cycle.data.get(key)
        if found is None:
            found = {}
            for node, rs in cycle.data.get(f"{NAME}/active", {}).items():
                mine = [
                    r
                    for r in rs
                    if not (r.allocate_once and r.has_owner)
                    and any(owner_matches(o, pod) for o in r.owners)
                ]
                if mine:
                    found[node] = mine
            cycle.data[key] = found
        return found

    def pre_filter(self, cycle: Cycle, pod: PodInfo) -> str | None:
        if not cycle.snapshot.reservations:
            return None
        active = active_reservations(cycle.snapshot, cycle.now)
        cycle.data[f"{NAME}/active"] = active
        mine = self._matches(cycle, pod)
        adjust: dict[str, ResourceList] = {}
        for node, rs in active.items():
            delta: ResourceList = {}
            for r in rs:
                for res, v in r.remaining.items():
                    delta[res] = delta.get(res, 0) - v
            best = self._best(mine.get(node, []), pod)
            if best is not None:
                for res, v in best.remaining.items():
                    delta[res] = delta.get(res, 0) + v
            adjust[node] = delta
        cycle.data[RESERVATION_ADJUST_KEY] = adjust
        return None

    @staticmethod
    def _best(candidates: Sequence[ActiveReservation], pod: PodInfo) -> ActiveReservation | None:
        fitting = [r for r in candidates if _fits(pod.requests, r.remaining)]
        if not fitting:
            return None
        return min(fitting, key=lambda r: (sum(r.remaining.values()), r.name))

    def score_nodes(
        self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]
    ) -> dict[str, int] | None:
        if not cycle.snapshot.reservations:
            return None
        mine = self._matches(cycle, pod)
        if not mine:
            return None
        return {
            n.name: 100 if self._best(mine.get(n.name, []), pod) is not None else 0 for n in nodes
        }

    def reserve(self, cycle: Cycle, pod: PodInfo, node: NodeInfo) -> dict[str, str]:
        if not cycle.snapshot.reservations:
            return {}
        if f"{NAME}/active" not in cycle.data:
            self.pre_filter(cycle, pod)
        best = self._best(self._matches(cycle, pod).get(node.name, []), pod)
        if best is None:
            return {}
        return {
            ANNOTATION_RESERVATION_ALLOCATED: json.dumps(
                {"name": best.name, "uid": best.uid}, separators=(",", ":")
            )
        }


def build(args: Mapping[str, Any] | None, source: str) -> Reservation:
    """Factory for the plugin table (no args)."""
    return Reservation()
