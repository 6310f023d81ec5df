"""ElasticQuota's tree and runtime calculation, re-implemented from Koordinator
(``pkg/scheduler/plugins/elasticquota/core``: ``runtime_quota_calculator.go``,
``group_quota_manager.go``).

- **The tree** (:func:`parse_quotas`): ElasticQuotas linked by
  ``quota.scheduling.koordinator.sh/parent``, one tree per ElasticQuotaProfile (see the plugin's
  docstring); :func:`quota_of` finds a pod's quota.
- **Request** of a quota: what its pods (assigned and pending) and its children request, capped
  at its max (``getLimitRequestNoLock``).
- **Runtime** (:func:`redistribute`, per resource, from the parent's runtime down; the roots
  share their tree's total): each child first gets its *guaranteed* amount, ``max(min,
  guarantee)``; a child asking for no more than that gets what it asks, or all of it when it does
  not lend (``allow-lent-resource: "false"``). The children's guaranteed amounts are kept even
  when together they exceed the parent's total; only a positive remainder is shared out, among
  the children asking for more, in proportion to their shared weights, capped at what each
  asks, and what the capped ones leave over is shared again among the rest until nothing is left
  or nobody asks. Each share is whole (GPUs, milli-cores, bytes) and the shares of one pass sum
  to what is shared, by the largest-remainder (Hamilton) method upstream uses
  (``computeHamiltonDeltas`` in ``runtime_quota_calculator.go``): ``w * left // sum(w)`` each,
  then one more unit to the children with the largest remainders ``w * left % sum(w)``, ties by
  quota name. 81 GPUs over 13 equal children are 6 each and 7 for the first three by name:
  nothing is lost to rounding (an earlier upstream rounded each share half up and lost or
  double-gave units, which :func:`redistribute` no longer does).
- **Guarantee** (``guarantee``, with Koordinator's ``ElasticQuotaGuaranteeUsage`` feature gate):
  a quota's guarantee is ``max(min, allocated)``, ``allocated`` being what its pods use (for a
  parent, its children's guarantees summed), and quotas do not lend: what a tenant already uses
  is never taken back by the runtime calculation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from apis.records import frozen
from apis.scheduling_keys import (
    ANNOTATION_QUOTA_NAMESPACES,
    ANNOTATION_QUOTA_SHARED_WEIGHT,
    ANNOTATION_QUOTA_TOTAL_RESOURCE,
    LABEL_PREEMPTIBLE,
    LABEL_QUOTA_ALLOW_LENT,
    LABEL_QUOTA_IS_PARENT,
    LABEL_QUOTA_NAME,
    LABEL_QUOTA_PARENT,
    LABEL_QUOTA_TREE_ID,
)
from scheduler_plugins.errors import InputError
from scheduler_plugins.objectfields import ResourceList, parse_resource_list
from scheduler_plugins.plugins.quotaprofile import QuotaProfile, pool_total
from scheduler_plugins.snapshot import PodInfo, Snapshot

LABEL_PARENT = LABEL_QUOTA_PARENT
LABEL_IS_PARENT = LABEL_QUOTA_IS_PARENT
LABEL_TREE_ID = LABEL_QUOTA_TREE_ID
LABEL_ALLOW_LENT = LABEL_QUOTA_ALLOW_LENT
ANNOTATION_SHARED_WEIGHT = ANNOTATION_QUOTA_SHARED_WEIGHT
ANNOTATION_NAMESPACES = ANNOTATION_QUOTA_NAMESPACES
ANNOTATION_TOTAL_RESOURCE = ANNOTATION_QUOTA_TOTAL_RESOURCE
ROOT = "koordinator-root-quota"


@frozen
class QuotaNode:
    """One child in one resource dimension (``quotaNode``)."""

    name: str
    request: int
    """What it asks, capped at its max."""
    weight: int
    """Its shared weight."""
    min: int
    guarantee: int = 0
    allow_lent: bool = True


def redistribute(total: int, nodes: Sequence[QuotaNode]) -> dict[str, int]:
    """The children's runtimes out of their parent's ``total`` (``quotaTree.redistribution``)."""
    runtime: dict[str, int] = {}
    left = total
    hungry: list[QuotaNode] = []
    for n in nodes:
        guaranteed = max(n.min, n.guarantee)
        if n.request > guaranteed:
            hungry.append(n)
            runtime[n.name] = guaranteed
        else:
            runtime[n.name] = n.request if n.allow_lent else guaranteed
        left -= runtime[n.name]
    while left > 0 and hungry:
        weight_sum = sum(n.weight for n in hungry)
        if weight_sum <= 0:
            break
        still: list[QuotaNode] = []
        spare = 0
        for n, delta in zip(hungry, hamilton_shares(left, hungry), strict=True):
            runtime[n.name] += delta
            if runtime[n.name] < n.request:
                still.append(n)
            else:
                spare += runtime[n.name] - n.request
                runtime[n.name] = n.request
        left, hungry = spare, still
    return runtime


def hamilton_shares(total: int, nodes: Sequence[QuotaNode]) -> list[int]:
    """``total`` split over ``nodes`` in proportion to their weights, in whole units that sum to
    ``total`` (the weights' sum positive): the largest-remainder method of upstream's
    ``computeHamiltonDeltas``. Python's integers are exact at any size, as upstream's 128-bit
    arithmetic is for bytes."""
    weight_sum = sum(n.weight for n in nodes)
    base = [n.weight * total // weight_sum for n in nodes]
    residual = total - sum(base)
    by_remainder = sorted(
        range(len(nodes)), key=lambda i: (-(nodes[i].weight * total % weight_sum), nodes[i].name)
    )
    for i in by_remainder[:residual]:
        base[i] += 1
    return base


@dataclass(slots=True)
class Quota:
    """One ElasticQuota in the tree."""

    name: str
    namespace: str
    parent: str
    tree: str
    min: ResourceList
    max: ResourceList
    weight: ResourceList
    allow_lent: bool
    namespaces: tuple[str, ...]
    total: ResourceList | None = None
    """A root's own total (its profile's pool, or ``total-resource``); ``None``: the cluster."""
    profile: str = ""
    """The ElasticQuotaProfile (``namespace/name``) whose tree this quota is in; ``""``: none."""
    children: list[str] = field(default_factory=list)
    request: ResourceList = field(default_factory=dict)
    used: ResourceList = field(default_factory=dict)
    non_preemptible_used: ResourceList = field(default_factory=dict)
    runtime: ResourceList = field(default_factory=dict)
    guarantee: ResourceList = field(default_factory=dict)
    """``max(min, allocated)`` with ``ElasticQuotaGuaranteeUsage``; empty otherwise."""


def parse_quotas(
    snapshot: Snapshot,
    profiles: Sequence[QuotaProfile] = (),
    totals: Mapping[str, ResourceList] | None = None,
) -> dict[str, Quota]:
    """The snapshot's ElasticQuotas with their tree links, arranged in one tree per profile
    (``totals``: each profile's pool total by profile key, computed when not given)."""
    quotas: dict[str, Quota] = {}
    for name, obj in snapshot.quotas.items():
        where = f"ElasticQuota {name}"
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        ann = meta.get("annotations") or {}
        spec = obj.get("spec") or {}
        qmax = parse_resource_list(spec.get("max"), where, "spec.max")
        shared_weight = _annotated_resources(ann, ANNOTATION_SHARED_WEIGHT, where)
        weight = dict(qmax) if shared_weight is None else shared_weight
        namespaces: tuple[str, ...] = ()
        if ann.get(ANNOTATION_NAMESPACES):
            try:
                namespaces = tuple(str(n) for n in json.loads(ann[ANNOTATION_NAMESPACES]))
            except (ValueError, TypeError) as err:
                raise InputError(where, ANNOTATION_NAMESPACES, f"bad JSON list: {err}") from err
        total = _annotated_resources(ann, ANNOTATION_TOTAL_RESOURCE, where)
        quotas[name] = Quota(
            name=name,
            namespace=str(meta.get("namespace") or "default"),
            parent=str(labels.get(LABEL_PARENT) or ROOT),
            tree=str(labels.get(LABEL_TREE_ID) or ""),
            min=parse_resource_list(spec.get("min"), where, "spec.min"),
            max=qmax,
            weight=weight,
            allow_lent=str(labels.get(LABEL_ALLOW_LENT, "true")).lower() != "false",
            namespaces=namespaces,
            total=total,
        )
    for p in profiles:
        total = (totals or {}).get(p.key)
        if total is None:
            total = pool_total(p, snapshot.nodes.values())
        root = quotas.get(p.quota_name)
        if root is None:  # the profile controller would have created it
            root = quotas[p.quota_name] = Quota(
                name=p.quota_name,
                namespace=p.namespace,
                parent=ROOT,
                tree="",
                min=dict(total),
                max=dict(total),
                weight=dict(total),
                allow_lent=True,
                namespaces=(),
            )
        root.parent = ROOT
        root.tree = p.tree_id or root.tree or f"profile:{p.key}"
        root.profile = p.key
        root.total = dict(total)
    for q in quotas.values():
        if q.parent in quotas:
            quotas[q.parent].children.append(q.name)
    if profiles:
        by_tree = {quotas[p.quota_name].tree: p.key for p in profiles}
        for q in quotas.values():
            if q.profile:
                continue
            top, seen = q, {q.name}
            while top.parent in quotas and top.parent not in seen and not top.profile:
                seen.add(top.parent)
                top = quotas[top.parent]
            if top.profile:
                q.tree, q.profile = top.tree, top.profile
            elif q.tree in by_tree:
                q.profile = by_tree[q.tree]
    return quotas


def _annotated_resources(ann: Mapping[str, str], key: str, where: str) -> ResourceList | None:
    """The resource list that annotation ``key`` holds as JSON; None when it is absent or
    empty."""
    if not ann.get(key):
        return None
    try:
        return parse_resource_list(json.loads(ann[key]), where, key)
    except ValueError as err:
        raise InputError(where, key, f"bad JSON: {err}") from err


def quota_of(pod: PodInfo, quotas: Mapping[str, Quota]) -> str | None:
    """The pod's quota name, or ``None``."""
    name = pod.labels.get(LABEL_QUOTA_NAME)
    if name:
        return name
    for q in quotas.values():
        if pod.namespace in q.namespaces:
            return q.name
    in_ns = [q.name for q in quotas.values() if q.namespace == pod.namespace]
    return in_ns[0] if len(in_ns) == 1 else None


def tally(
    snapshot: Snapshot, quotas: Mapping[str, Quota]
) -> dict[str, tuple[ResourceList, ResourceList, ResourceList]]:
    """Per quota, its own pods' (requested, used, non-preemptible used): the costly pass over
    every pod, done once per snapshot generation."""
    out: dict[str, tuple[ResourceList, ResourceList, ResourceList]] = {}
    for pod in snapshot.all_pods():
        name = quota_of(pod, quotas)
        if name is None or name not in quotas:
            continue
        req, used, nonp = out.setdefault(name, ({}, {}, {}))
        for r, v in pod.requests.items():
            req[r] = req.get(r, 0) + v
            if pod.node_name:
                used[r] = used.get(r, 0) + v
                if pod.labels.get(LABEL_PREEMPTIBLE) == "false":
                    nonp[r] = nonp.get(r, 0) + v
    return out


def compute_runtime(
    snapshot: Snapshot,
    quotas: dict[str, Quota],
    extra: PodInfo | None,
    tallies: Mapping[str, tuple[ResourceList, ResourceList, ResourceList]] | None = None,
    *,
    guarantee_usage: bool = False,
) -> None:
    """Fill ``request``, ``used``, ``guarantee`` and ``runtime`` of every quota (``extra``: the
    incoming pod, counted in its quota's request unless the snapshot already has it;
    ``guarantee_usage``: Koordinator's ``ElasticQuotaGuaranteeUsage``)."""
    if tallies is None:
        tallies = tally(snapshot, quotas)
    for name, (req, used, nonp) in tallies.items():
        q = quotas[name]
        q.request, q.used, q.non_preemptible_used = dict(req), dict(used), dict(nonp)
    if extra is not None and not extra.node_name and extra.uid not in snapshot.pending_pods:
        own = quotas.get(quota_of(extra, quotas) or "")
        if own is not None:
            for r, v in extra.requests.items():
                own.request[r] = own.request.get(r, 0) + v

    def gather(name: str) -> None:  # children's requests and usage add up in the parent
        q = quotas[name]
        for child in q.children:
            gather(child)
            for r, v in quotas[child].request.items():
                q.request[r] = q.request.get(r, 0) + v
            for r, v in quotas[child].used.items():
                q.used[r] = q.used.get(r, 0) + v
        for r in list(q.request):
            if r in q.max:
                q.request[r] = min(q.request[r], q.max[r])

    def guarantee(name: str) -> ResourceList:  # allocated: own use, or children's guarantees
        q = quotas[name]
        allocated: ResourceList = {}
        if q.children:
            for child in q.children:
                for r, v in guarantee(child).items():
                    allocated[r] = allocated.get(r, 0) + v
        else:
            allocated = dict(q.used)
        q.guarantee = {r: max(allocated.get(r, 0), q.min.get(r, 0)) for r in {*allocated, *q.min}}
        q.allow_lent = False  # what is allocated stays with the quota
        return q.guarantee

    roots = [q.name for q in quotas.values() if q.parent not in quotas]
    for name in roots:
        gather(name)
        if guarantee_usage:
            guarantee(name)
    cluster: ResourceList | None = None

    def assign(total: ResourceList, names: list[str]) -> None:
        resources = {r for n in names for r in quotas[n].max} | {
            r for n in names for r in quotas[n].min
        }
        for r in resources:
            children = [
                QuotaNode(
                    n,
                    quotas[n].request.get(r, 0),
                    quotas[n].weight.get(r, 0),
                    quotas[n].min.get(r, 0),
                    quotas[n].guarantee.get(r, 0),
                    quotas[n].allow_lent,
                )
                for n in names
            ]
            for n, v in redistribute(total.get(r, 0), children).items():
                quotas[n].runtime[r] = v
        for n in names:
            if quotas[n].children:
                assign(quotas[n].runtime, quotas[n].children)

    by_tree: dict[str, list[str]] = {}
    for name in roots:
        by_tree.setdefault(quotas[name].tree, []).append(name)
    for names in by_tree.values():
        total = next((quotas[n].total for n in names if quotas[n].total is not None), None)
        if total is None:
            if cluster is None:
                cluster = {}
                for node in snapshot.nodes.values():
                    for r, v in node.allocatable.items():
                        cluster[r] = cluster.get(r, 0) + v
            total = cluster
        assign(total, names)
