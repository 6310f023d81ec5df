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
- **Matching.** A reservation matches a pod when one of its owners does, it is not
  ``spec.unschedulable``, and, when the pod has the annotation
  ``scheduling.koordinator.sh/reservation-affinity`` (JSON: ``name``, ``reservationSelector``
  (labels that must all match), ``requiredDuringSchedulingIgnoredDuringExecution.
  reservationSelectorTerms`` (ORed terms of ANDed ``matchExpressions`` over the reservation's
  labels, In/NotIn/Exists/DoesNotExist/Gt/Lt)), the reservation satisfies it. Pending
  reservations (no ``status.nodeName`` or phase not ``Available``) never match.
- **allocatePolicy.** Default (unset) and ``Aligned``: the pod takes the reservation's remainder
  first and the node's free resources for the rest. ``Restricted``: on the resources the
  reservation reserves (or those listed in its ``scheduling.koordinator.sh/reservation-restricted-
  options`` annotation, ``{"resources": [...]}``) the pod must fit within what the reservation
  has left (``Reservation(s) Insufficient cpu``), otherwise that reservation is no use to it.
- **Affinity is required.** A pod with reservation affinity fails on nodes without a matching
  reservation (``node(s) no reservations match reservation affinity``) and on nodes where none
  of them can take it (the Restricted reasons, else ``node(s) no reservation(s) to meet the
  requirements``).
- **PreFilter** tells NodeResourcesFit, per node with active reservations, what they hold for
  others (less free) and what the best matching one holds for this pod (more free).
- **Score** 100 on nodes where a matching reservation can take the pod, 0 elsewhere; the plugin
  takes no part for pods no reservation matches.
- **Reserve** picks that reservation (the one with the least left that the pod fits whole:
  pack; when none does, the one with the most left, the node supplying the rest) and returns
  ``scheduling.koordinator.sh/reservation-allocated: {"name": ..., "uid": ...}``; the pod, once
  assumed with the annotation, counts against it.

- **Reserve pods.** A Pending reservation is scheduled by the standalone scheduler as its reserve
  pod (``scheduler_plugins/reservations.py``): it never matches nor consumes a reservation, and
  what the Available ones hold on a node counts as used for it, as for any other pod.

Not done: the allocate-policy conflict check, reservation taints and tolerations,
``reservation-order``, preemption.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any

from apis.duration import parse_duration
from apis.records import frozen
from apis.scheduling_keys import (
    ANNOTATION_RESERVATION_AFFINITY,
    ANNOTATION_RESERVATION_ALLOCATED,
    ANNOTATION_RESTRICTED_OPTIONS,
)
from scheduler_plugins.errors import InputError
from scheduler_plugins.framework import RESERVATION_ADJUST_KEY, Cycle, Plugin
from scheduler_plugins.objectfields import (
    ResourceList,
    optional_time,
    parse_resource_list,
)
from scheduler_plugins.reservations import is_reserve_pod
from scheduler_plugins.selectors import raw_label_selector_matches
from scheduler_plugins.snapshot import NodeInfo, PodInfo, Snapshot

NAME = "Reservation"
DEFAULT_TTL_S = 24 * 3600.0
POLICY_DEFAULT = ""
POLICY_ALIGNED = "Aligned"
POLICY_RESTRICTED = "Restricted"
ERR_AFFINITY = "node(s) no reservations match reservation affinity"
ERR_NO_RESERVATION_FITS = "node(s) no reservation(s) to meet the requirements"
REASON_PREFIX = "Reservation(s) "


@frozen
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
    labels: dict[str, str] = field(default_factory=dict)
    """``metadata.labels`` (what reservation affinity selects on)."""
    policy: str = POLICY_DEFAULT
    """``spec.allocatePolicy``."""
    restricted: frozenset[str] = frozenset()
    """Resources the Restricted policy confines to the reservation."""
    unschedulable: bool = False
    """``spec.unschedulable``: takes no new pods."""

    def restricted_shortfall(self, request: Mapping[str, int]) -> list[str]:
        """Resources on which a Restricted reservation cannot take ``request`` (sorted)."""
        if self.policy != POLICY_RESTRICTED:
            return []
        return sorted(
            r
            for r in self.restricted
            if request.get(r, 0) > 0 and request[r] > self.remaining.get(r, 0)
        )


def _allocated_to(pod: PodInfo) -> str:
    raw = pod.annotations.get(ANNOTATION_RESERVATION_ALLOCATED)
    if not raw:
        return ""
    try:
        loaded = json.loads(raw)
    except ValueError:
        return ""
    return str(loaded.get("name") or "") if isinstance(loaded, dict) else ""


@frozen
class _Held:
    """What one Available Reservation object says, parsed once (see :class:`ReservationCache`)."""

    name: str
    uid: str
    node: str
    deadline: float | None
    """When it stops holding (``spec.expires``, else ``creationTimestamp + spec.ttl``)."""
    allocatable: ResourceList
    allocated: ResourceList
    """``status.allocated`` (what counts as used when no assigned pod names it)."""
    current_owners: bool
    owners: tuple[dict[str, Any], ...]
    allocate_once: bool
    labels: dict[str, str]
    policy: str
    restricted: frozenset[str]
    unschedulable: bool


def _parse_held(name: str, obj: Mapping[str, Any]) -> _Held | None:
    """The held resources of a Reservation; ``None`` unless it is Available on a node."""
    where = f"Reservation {name}"
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    node = str(status.get("nodeName") or "")
    if status.get("phase") != "Available" or not node:
        return None
    deadline = optional_time(spec.get("expires"), where, "spec.expires")
    if deadline is None:
        created = optional_time(meta.get("creationTimestamp"), where, "metadata.creationTimestamp")
        try:
            ttl = parse_duration(str(spec["ttl"])) if spec.get("ttl") is not None else DEFAULT_TTL_S
        except ValueError:
            ttl = DEFAULT_TTL_S
        if ttl > 0 and created is not None:
            deadline = created + ttl
    allocatable = parse_resource_list(status.get("allocatable"), where, "status.allocatable")
    if not allocatable:
        template = (spec.get("template") or {}).get("spec") or {}
        for c in template.get("containers") or []:
            req = parse_resource_list(
                ((c or {}).get("resources") or {}).get("requests"), where, "spec.template"
            )
            for r, v in req.items():
                allocatable[r] = allocatable.get(r, 0) + v
    ann = meta.get("annotations") or {}
    restricted = frozenset(allocatable)
    if ann.get(ANNOTATION_RESTRICTED_OPTIONS):
        try:
            listed = json.loads(ann[ANNOTATION_RESTRICTED_OPTIONS]).get("resources") or []
        except (ValueError, AttributeError) as err:
            raise InputError(where, ANNOTATION_RESTRICTED_OPTIONS, f"bad JSON: {err}") from err
        restricted = frozenset(str(r) for r in listed if str(r) in allocatable) or restricted
    return _Held(
        name=name,
        uid=str(meta.get("uid") or name),
        node=node,
        deadline=deadline,
        allocatable=allocatable,
        allocated=parse_resource_list(status.get("allocated"), where, "status.allocated"),
        current_owners=bool(status.get("currentOwners")),
        owners=tuple(o for o in spec.get("owners") or [] if isinstance(o, dict)),
        allocate_once=spec.get("allocateOnce", True) is not False,
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        policy=str(spec.get("allocatePolicy") or POLICY_DEFAULT),
        restricted=restricted,
        unschedulable=bool(spec.get("unschedulable", False)),
    )


def _used_on(node: NodeInfo) -> dict[str, tuple[ResourceList, int]]:
    """Requests and number of the node's pods by the reservation they consume."""
    out: dict[str, tuple[ResourceList, int]] = {}
    for pod in node.pods.values():
        name = _allocated_to(pod)
        if name:
            bucket, count = out.get(name, ({}, 0))
            for r, v in pod.requests.items():
                bucket[r] = bucket.get(r, 0) + v
            out[name] = (bucket, count + 1)
    return out


class ReservationCache:
    """:func:`active_reservations` kept cheap per pod: what owner pods consume is re-counted
    only on the nodes the snapshot's change log names (every node after a new snapshot or an
    ``ALL`` change), and each Reservation object is parsed once (until replaced)."""

    def __init__(self) -> None:
        self._snap_id: int | None = None
        self._generation = 0
        self._used_by_node: dict[str, dict[str, tuple[ResourceList, int]]] = {}
        self._used: dict[str, ResourceList] = {}
        self._pods: dict[str, int] = {}
        """Assigned pods consuming each reservation (a name drops out of ``_used`` at 0)."""
        self._held: dict[str, tuple[Mapping[str, Any], _Held | None]] = {}
        self._result: dict[str, list[ActiveReservation]] | None = None
        """The last answer, reused while nothing it depends on changed."""
        self._holding: dict[str, ResourceList] = {}
        """Per node of the last answer: minus what its reservations hold."""
        self._key: tuple[int, int] = (0, -1)
        """``(id(snapshot), reservation_generation)`` of the last answer."""
        self._valid: tuple[float, float] = (0.0, -1.0)
        """The clock span in which the last answer holds (until the next deadline)."""
        self._interest: frozenset[str] = frozenset()
        """Nodes of the reservations read: a change there may change the answer."""

    def _add(self, per_name: Mapping[str, tuple[ResourceList, int]], sign: int) -> None:
        for name, (req, count) in per_name.items():
            bucket = self._used.setdefault(name, {})
            for r, v in req.items():
                bucket[r] = bucket.get(r, 0) + sign * v
            left = self._pods.get(name, 0) + sign * count
            if left > 0:
                self._pods[name] = left
            else:
                self._pods.pop(name, None)
                self._used.pop(name, None)

    def _refresh_used(self, snapshot: Snapshot) -> bool:
        """Bring the owner pods' counts up to date; whether the answer may have changed."""
        names = None
        if self._snap_id == id(snapshot):
            names = snapshot.changed_since(self._generation)
        dirty = names is None or not names.isdisjoint(self._interest)
        if names is None:
            self._used_by_node.clear()
            self._used.clear()
            self._pods.clear()
            for node in snapshot.nodes.values():
                found = _used_on(node)
                if found:
                    self._used_by_node[node.name] = found
                    self._add(found, 1)
        else:
            for name in names:
                old = self._used_by_node.pop(name, None)
                if old:
                    self._add(old, -1)
                info = snapshot.nodes.get(name)
                found = _used_on(info) if info is not None else {}
                if found:
                    self._used_by_node[name] = found
                    self._add(found, 1)
                if (old or found) and old != found:
                    dirty = True
        self._snap_id = id(snapshot)
        self._generation = snapshot.generation
        return dirty

    def holding(self) -> dict[str, ResourceList]:
        """Per node of the last :meth:`active` answer, minus what its reservations hold (what
        NodeResourcesFit takes off the node's free resources for a pod that owns none)."""
        return self._holding

    def active(self, snapshot: Snapshot, now: float) -> dict[str, list[ActiveReservation]]:
        """Active reservations by node (the same answer, not to be changed, while nothing it
        depends on changed: owner pods, Reservation objects, nodes, the next deadline)."""
        dirty = self._refresh_used(snapshot)
        key = (id(snapshot), snapshot.reservation_generation)
        lo, hi = self._valid
        if not dirty and self._result is not None and key == self._key and lo <= now < hi:
            return self._result
        if len(self._held) > 2 * len(snapshot.reservations) + 16:
            self._held = {k: v for k, v in self._held.items() if k in snapshot.reservations}
        out: dict[str, list[ActiveReservation]] = {}
        for name, obj in snapshot.reservations.items():
            cached = self._held.get(name)
            if cached is None or cached[0] is not obj:
                cached = (obj, _parse_held(name, obj))
                self._held[name] = cached
            h = cached[1]
            if h is None or h.node not in snapshot.nodes:
                continue
            if h.deadline is not None and now >= h.deadline:
                continue
            consumed = self._used.get(name)
            if consumed is None:
                consumed = h.allocated
            out.setdefault(h.node, []).append(
                ActiveReservation(
                    name=name,
                    uid=h.uid,
                    node=h.node,
                    remaining={r: max(v - consumed.get(r, 0), 0) for r, v in h.allocatable.items()},
                    owners=h.owners,
                    has_owner=bool(consumed) or h.current_owners,
                    allocate_once=h.allocate_once,
                    labels=h.labels,
                    policy=h.policy,
                    restricted=h.restricted,
                    unschedulable=h.unschedulable,
                )
            )
        upcoming = [
            h.deadline
            for _, h in self._held.values()
            if h is not None and h.deadline is not None and h.deadline > now
        ]
        holding: dict[str, ResourceList] = {}
        for node, rs in out.items():
            delta: ResourceList = {}
            for r in rs:
                for res, v in r.remaining.items():
                    delta[res] = delta.get(res, 0) - v
            holding[node] = delta
        self._result, self._holding, self._key = out, holding, key
        self._valid = (now, min(upcoming, default=float("inf")))
        self._interest = frozenset(h.node for _, h in self._held.values() if h is not None)
        return out


def active_reservations(snapshot: Snapshot, now: float) -> dict[str, list[ActiveReservation]]:
    """Active reservations by node (uncached; the plugin keeps a :class:`ReservationCache`)."""
    return ReservationCache().active(snapshot, now)


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
        return raw_label_selector_matches(selector, pod.labels)
    return False


def _requirement_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One ``NodeSelectorRequirement`` over a reservation's labels."""
    key, op = str(expr.get("key") or ""), expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    value = labels.get(key)
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


@frozen
class ReservationAffinity:
    """The pod's ``scheduling.koordinator.sh/reservation-affinity``."""

    name: str
    """A reservation named directly (the other fields are then ignored)."""
    selector: dict[str, str]
    """``reservationSelector``: labels that must all match."""
    terms: tuple[dict[str, Any], ...]
    """``requiredDuringSchedulingIgnoredDuringExecution.reservationSelectorTerms`` (ORed)."""

    def matches(self, r: ActiveReservation) -> bool:
        """Whether ``r`` satisfies the affinity."""
        if self.name:
            return r.name == self.name
        if any(r.labels.get(k) != v for k, v in self.selector.items()):
            return False
        return not self.terms or any(_term_matches(t, r) for t in self.terms)


def _term_matches(term: Mapping[str, Any], r: ActiveReservation) -> bool:
    """One ``reservationSelectorTerm``: its expressions over the labels, its fields over the
    name, all ANDed."""
    fields = {"metadata.name": r.name}
    return all(
        _requirement_matches(e, r.labels) for e in term.get("matchExpressions") or []
    ) and all(_requirement_matches(e, fields) for e in term.get("matchFields") or [])


def reservation_affinity(pod: PodInfo) -> ReservationAffinity | None:
    """The pod's reservation affinity, ``None`` without the annotation. Raises
    :class:`InputError` for bad JSON."""
    if ANNOTATION_RESERVATION_AFFINITY not in pod.annotations:
        return None
    raw = pod.annotations[ANNOTATION_RESERVATION_AFFINITY]
    where = f"metadata.annotations[{ANNOTATION_RESERVATION_AFFINITY}]"
    try:
        loaded = json.loads(raw) if raw else {}
    except ValueError as err:
        raise InputError(f"Pod {pod.key}", where, f"bad JSON: {err}") from err
    if not isinstance(loaded, dict):
        raise InputError(f"Pod {pod.key}", where, "must be a JSON object")
    required = loaded.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    selector = loaded.get("reservationSelector") or {}
    terms = required.get("reservationSelectorTerms") if isinstance(required, dict) else None
    return ReservationAffinity(
        name=str(loaded.get("name") or ""),
        selector={str(k): str(v) for k, v in selector.items()}
        if isinstance(selector, dict)
        else {},
        terms=tuple(t for t in terms or [] if isinstance(t, dict)),
    )


def _fits(request: Mapping[str, int], remaining: Mapping[str, int]) -> bool:
    return all(request.get(r, 0) <= v for r, v in remaining.items() if r in request)


class Reservation(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self) -> None:
        self.cache = ReservationCache()

    def _matches(self, cycle: Cycle, pod: PodInfo) -> dict[str, list[ActiveReservation]]:
        key = f"{NAME}/matches/{pod.uid}"
        found: dict[str, list[ActiveReservation]] | None = cycle.data.get(key)
        if found is None:
            found = {}
            if is_reserve_pod(pod):  # a reservation never uses another one
                cycle.data[key] = found
                return found
            for node, rs in cycle.data.get(f"{NAME}/active", {}).items():
                affinity = cycle.data.get(f"{NAME}/affinity/{pod.uid}")
                mine = [
                    r
                    for r in rs
                    if not (r.allocate_once and r.has_owner)
                    and not r.unschedulable
                    and any(owner_matches(o, pod) for o in r.owners)
                    and (affinity is None or affinity.matches(r))
                ]
                if mine:
                    found[node] = mine
            cycle.data[key] = found
        return found

    def pre_filter(self, cycle: Cycle, pod: PodInfo) -> str | None:
        try:
            affinity = None if is_reserve_pod(pod) else reservation_affinity(pod)
        except InputError as err:
            return str(err)
        if not cycle.snapshot.reservations:
            return None if affinity is None else ERR_AFFINITY
        active = self.cache.active(cycle.snapshot, cycle.now)
        cycle.data[f"{NAME}/active"] = active
        cycle.data[f"{NAME}/affinity/{pod.uid}"] = affinity
        mine = self._matches(cycle, pod)
        if affinity is not None and not mine:
            return ERR_AFFINITY
        holding = self.cache.holding()
        adjust = holding  # shared while this pod owns none: nobody writes to it
        for node, rs in mine.items():
            best = self._best(rs, pod)
            if best is not None:
                if adjust is holding:
                    adjust = dict(holding)
                delta = dict(holding[node])
                for res, v in best.remaining.items():
                    delta[res] = delta.get(res, 0) + v
                adjust[node] = delta
        cycle.data[RESERVATION_ADJUST_KEY] = adjust
        return None

    @staticmethod
    def _best(candidates: Sequence[ActiveReservation], pod: PodInfo) -> ActiveReservation | None:
        usable = [r for r in candidates if not r.restricted_shortfall(pod.requests)]
        fitting = [r for r in usable if _fits(pod.requests, r.remaining)]
        if fitting:
            return min(fitting, key=lambda r: (sum(r.remaining.values()), r.name))
        if not usable:
            return None
        return max(usable, key=lambda r: (sum(r.remaining.values()), r.name))

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        if cycle.data.get(f"{NAME}/affinity/{pod.uid}") is None:
            return {}
        mine = self._matches(cycle, pod)
        if not mine:
            return {}  # the pre-filter rejected the pod on every node
        out: dict[str, str] = {}
        for n in nodes:
            rs = mine.get(n.name)
            if not rs:
                out[n.name] = ERR_AFFINITY
            elif self._best(rs, pod) is None:
                short = sorted({x for r in rs for x in r.restricted_shortfall(pod.requests)})
                out[n.name] = (
                    ", ".join(f"{REASON_PREFIX}Insufficient {x}" for x in short)
                    or ERR_NO_RESERVATION_FITS
                )
        return out

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
