"""ElasticQuota: tenants share the cluster by quota trees with min, max and shared weight.

Koordinator's semantics (``pkg/scheduler/plugins/elasticquota``), re-implemented:

- **Which quota.** The pod's label ``quota.scheduling.koordinator.sh/name``; else the quota
  whose annotation ``quota.scheduling.koordinator.sh/namespaces`` (a JSON list) names the pod's
  namespace; else the one ElasticQuota in the pod's namespace. A pod with no quota passes.
- **The tree.** ``quota.scheduling.koordinator.sh/parent`` names the parent (absent: the root);
  ``quota.scheduling.koordinator.sh/tree-id`` separates trees (ElasticQuotaProfiles make one tree
  per node pool; here every tree shares the whole cluster). ``spec.min`` and ``spec.max`` bound a
  quota; ``quota.scheduling.koordinator.sh/shared-weight`` (a JSON ResourceList, default: max)
  weighs its share of what is left; ``quota.scheduling.koordinator.sh/allow-lent-resource``
  ``"false"`` keeps its min even when it asks for less.
- **Runtime quota.** A quota's *request* is what its pods (assigned and pending, the incoming pod
  included) and its children request, capped at its max. From the top, a parent's runtime (the
  cluster's allocatable for the root) goes first to each child's guaranteed part
  (``min(request, min)``, or ``min`` when it does not lend), then what is left to the children
  still asking, in proportion to their shared weights, capped at their request, repeated until
  nothing is left or nobody asks. Integer amounts are split exactly (largest remainders, then
  name order), so the children's runtimes add up to what the parent had.
- **PreFilter.** ``used + request > runtime`` on a resource the quota declares rejects the pod:
  ``Insufficient quotas, quotaName: ..., runtime: ..., used: ..., pod's request: ...,
  exceedDimensions: [cpu]``; a non-preemptible pod (label
  ``quota.scheduling.koordinator.sh/preemptible: "false"``) must also fit with the other
  non-preemptible pods within ``min``.

Not done: ElasticQuotaProfile node selection (a tree's total is the whole cluster), the
parent-quota check (``enableCheckParentQuota``), quota-aware preemption.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler_plugins.args import ArgsReader
from scheduler_plugins.errors import InputError
from scheduler_plugins.framework import Cycle, Plugin
from scheduler_plugins.snapshot import (
    LABEL_PREEMPTIBLE,
    LABEL_QUOTA_NAME,
    PodInfo,
    ResourceList,
    Snapshot,
    parse_resource_list,
)

NAME = "ElasticQuota"
LABEL_PARENT = "quota.scheduling.koordinator.sh/parent"
LABEL_IS_PARENT = "quota.scheduling.koordinator.sh/is-parent"
LABEL_TREE_ID = "quota.scheduling.koordinator.sh/tree-id"
LABEL_ALLOW_LENT = "quota.scheduling.koordinator.sh/allow-lent-resource"
ANNOTATION_SHARED_WEIGHT = "quota.scheduling.koordinator.sh/shared-weight"
ANNOTATION_NAMESPACES = "quota.scheduling.koordinator.sh/namespaces"
ROOT = "koordinator-root-quota"


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
    children: list[str] = field(default_factory=list)
    request: ResourceList = field(default_factory=dict)
    used: ResourceList = field(default_factory=dict)
    non_preemptible_used: ResourceList = field(default_factory=dict)
    runtime: ResourceList = field(default_factory=dict)


def parse_quotas(snapshot: Snapshot) -> dict[str, Quota]:
    """The snapshot's ElasticQuotas with their tree links."""
    quotas: dict[str, Quota] = {}
    for name, obj in snapshot.quotas.items():
        where = f"ElasticQuota {name}"
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        ann = meta.get("annotations") or {}
        spec = obj.get("spec") or {}
        qmax = parse_resource_list(spec.get("max"), where, "spec.max")
        weight = dict(qmax)
        if ann.get(ANNOTATION_SHARED_WEIGHT):
            try:
                weight = parse_resource_list(
                    json.loads(ann[ANNOTATION_SHARED_WEIGHT]), where, ANNOTATION_SHARED_WEIGHT
                )
            except ValueError as err:
                raise InputError(where, ANNOTATION_SHARED_WEIGHT, f"bad JSON: {err}") from err
        namespaces: tuple[str, ...] = ()
        if ann.get(ANNOTATION_NAMESPACES):
            try:
                namespaces = tuple(str(n) for n in json.loads(ann[ANNOTATION_NAMESPACES]))
            except (ValueError, TypeError) as err:
                raise InputError(where, ANNOTATION_NAMESPACES, f"bad JSON list: {err}") from err
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
        )
    for q in quotas.values():
        if q.parent in quotas:
            quotas[q.parent].children.append(q.name)
    return quotas


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


def distribute(
    total: int, asks: Mapping[str, int], guaranteed: Mapping[str, int], weights: Mapping[str, int]
) -> dict[str, int]:
    """Split ``total`` exactly: guaranteed parts first, then the rest by weight up to each ask."""
    names = sorted(asks)
    out = dict.fromkeys(names, 0)
    base = {n: guaranteed.get(n, 0) for n in names}
    base_sum = sum(base.values())
    if base_sum > total:  # min oversubscribed: share what there is in proportion to the mins
        return _split(total, {n: base[n] for n in names}, {n: base[n] for n in names})
    out.update(base)
    left = total - base_sum
    while left > 0:
        hungry = {n: asks[n] - out[n] for n in names if asks[n] > out[n] and weights.get(n, 0) > 0}
        if not hungry:
            break
        share = _split(left, {n: weights.get(n, 0) for n in hungry}, hungry)
        given = sum(share.values())
        if given == 0:
            break
        for n, v in share.items():
            out[n] += v
        left -= given
    return out


def _split(amount: int, weights: Mapping[str, int], caps: Mapping[str, int]) -> dict[str, int]:
    """``amount`` in proportion to ``weights``, each capped at ``caps``, integers adding up to
    at most ``amount`` (largest remainders first, then name order)."""
    wsum = sum(weights.values())
    if wsum <= 0:
        return dict.fromkeys(weights, 0)
    out = {n: min(amount * w // wsum, caps[n]) for n, w in weights.items()}
    rest = amount - sum(out.values())
    order = sorted(weights, key=lambda n: (-(amount * weights[n] % wsum), n))
    for n in order:
        if rest <= 0:
            break
        if out[n] < caps[n]:
            out[n] += 1
            rest -= 1
    return out


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
) -> None:
    """Fill ``request``, ``used`` and ``runtime`` of every quota (``extra``: the incoming pod,
    counted in its quota's request unless the snapshot already has it)."""
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

    roots = [q.name for q in quotas.values() if q.parent not in quotas]
    for name in roots:
        gather(name)
    cluster: ResourceList = {}
    for node in snapshot.nodes.values():
        for r, v in node.allocatable.items():
            cluster[r] = cluster.get(r, 0) + v

    def assign(total: ResourceList, names: list[str]) -> None:
        resources = {r for n in names for r in quotas[n].max} | {
            r for n in names for r in quotas[n].min
        }
        for r in resources:
            asks = {n: quotas[n].request.get(r, 0) for n in names}
            guaranteed = {
                n: quotas[n].min.get(r, 0)
                if not quotas[n].allow_lent
                else min(quotas[n].min.get(r, 0), asks[n])
                for n in names
            }
            weights = {n: quotas[n].weight.get(r, 0) for n in names}
            for n, v in distribute(total.get(r, 0), asks, guaranteed, weights).items():
                quotas[n].runtime[r] = v
        for n in names:
            if quotas[n].children:
                assign(quotas[n].runtime, quotas[n].children)

    by_tree: dict[str, list[str]] = {}
    for name in roots:
        by_tree.setdefault(quotas[name].tree, []).append(name)
    for names in by_tree.values():
        assign(cluster, names)


def _fmt(rl: Mapping[str, int], keys: list[str]) -> str:
    return "{" + ", ".join(f"{k}: {rl.get(k, 0)}" for k in keys) + "}"


class ElasticQuota(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self) -> None:
        self._token: tuple[int, int] | None = None
        self._tallies: dict[str, tuple[ResourceList, ResourceList, ResourceList]] = {}

    def pre_filter(self, cycle: Cycle, pod: PodInfo) -> str | None:
        snap = cycle.snapshot
        if not snap.quotas:
            return None
        quotas = parse_quotas(snap)
        name = quota_of(pod, quotas)
        if name is None or name not in quotas:
            return None
        token = (id(snap), snap.generation)
        if token != self._token:
            self._tallies = tally(snap, quotas)
            self._token = token
        compute_runtime(snap, quotas, pod, self._tallies)
        q = quotas[name]
        keys = sorted(r for r in pod.requests if r in q.max or r in q.min)
        exceed = [r for r in keys if q.used.get(r, 0) + pod.requests[r] > q.runtime.get(r, 0)]
        if exceed:
            return (
                f"Insufficient quotas, quotaName: {name}, runtime: {_fmt(q.runtime, keys)}, "
                f"used: {_fmt(q.used, keys)}, pod's request: {_fmt(pod.requests, keys)}, "
                f"exceedDimensions: [{', '.join(exceed)}]"
            )
        if pod.labels.get(LABEL_PREEMPTIBLE) == "false":
            exceed = [
                r
                for r in keys
                if q.non_preemptible_used.get(r, 0) + pod.requests[r] > q.min.get(r, 0)
            ]
            if exceed:
                return (
                    f"Insufficient non-preemptible quotas, quotaName: {name}, "
                    f"min: {_fmt(q.min, keys)}, "
                    f"nonPreemptibleUsed: {_fmt(q.non_preemptible_used, keys)}, "
                    f"pod's request: {_fmt(pod.requests, keys)}, "
                    f"exceedDimensions: [{', '.join(exceed)}]"
                )
        return None


def build(args: Mapping[str, Any] | None, source: str) -> ElasticQuota:
    """Factory for the plugin table (``ElasticQuotaArgs`` are read but not used yet)."""
    ArgsReader(args, source, NAME)
    return ElasticQuota()
