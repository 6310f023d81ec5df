"""ElasticQuota: tenants share the cluster by quota trees with min, max and shared weight.

Koordinator's semantics (``pkg/scheduler/plugins/elasticquota``), re-implemented:

- **Which quota.** The pod's label ``quota.scheduling.koordinator.sh/name``; else the quota
  whose annotation ``quota.scheduling.koordinator.sh/namespaces`` (a JSON list) names the pod's
  namespace; else the one ElasticQuota in the pod's namespace. A pod with no quota passes.
- **The tree.** ``quota.scheduling.koordinator.sh/parent`` names the parent (absent: the root);
  ``quota.scheduling.koordinator.sh/tree-id`` separates trees. ``spec.min`` and ``spec.max`` bound a
  quota; ``quota.scheduling.koordinator.sh/shared-weight`` (a JSON ResourceList, default: max)
  weighs its share of what is left; ``quota.scheduling.koordinator.sh/allow-lent-resource``
  ``"false"`` keeps its min even when it asks for less.
- **Several trees** (:mod:`~scheduler_plugins.plugins.quotaprofile`). An ElasticQuotaProfile
  makes its ``quotaName`` the root of a tree over the nodes its ``nodeSelector`` picks: the
  tree's total is their allocatable times ``resourceRatio``, every quota under that root (or
  labelled with the tree's id) belongs to it, and its pods fail on other nodes with
  ``node(s) didn't match Pod's node affinity/selector``. A root outside any profile with
  ``quota.scheduling.koordinator.sh/total-resource`` gets that total; every other tree shares
  the whole cluster's allocatable.
- **Runtime quota.** A quota's *request* is what its pods (assigned and pending, the incoming pod
  included) and its children request, capped at its max. From the top, a parent's runtime (its
  tree's total for a root) goes first to each child's guaranteed part
  (``min(request, min)``, or ``min`` when it does not lend), then what is left to the children
  still asking, in proportion to their shared weights, capped at their request, repeated until
  nothing is left or nobody asks. Integer amounts are split exactly (largest remainders, then
  name order), so the children's runtimes add up to what the parent had.
- **PreFilter.** ``used + request > runtime`` on a resource the quota declares rejects the pod:
  ``Insufficient quotas, quotaName: ..., runtime: ..., used: ..., pod's request: ...,
  exceedDimensions: [cpu]``; a non-preemptible pod (label
  ``quota.scheduling.koordinator.sh/preemptible: "false"``) must also fit with the other
  non-preemptible pods within ``min``. With ``enableCheckParentQuota`` (ElasticQuotaArgs, default
  false as in Koordinator) the pod must also fit ``used + request <= runtime`` in every ancestor,
  reported with the ancestor's name.
- **Used** is re-counted from the snapshot's pods whenever the snapshot changes (a pod added,
  bound, assumed, forgotten, relabelled or deleted): a quota's used is its assigned pods'
  requests plus its descendants' used, so a tree's counts always add up.

Not done: quota-aware preemption, ``quota.scheduling.koordinator.sh/runtime`` status write-back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apis.scheduling_keys import ANNOTATION_QUOTA_NAMESPACES as ANNOTATION_NAMESPACES
from apis.scheduling_keys import ANNOTATION_QUOTA_SHARED_WEIGHT as ANNOTATION_SHARED_WEIGHT
from apis.scheduling_keys import ANNOTATION_QUOTA_TOTAL_RESOURCE as ANNOTATION_TOTAL_RESOURCE
from apis.scheduling_keys import LABEL_PREEMPTIBLE, LABEL_QUOTA_NAME
from apis.scheduling_keys import LABEL_QUOTA_ALLOW_LENT as LABEL_ALLOW_LENT
from apis.scheduling_keys import LABEL_QUOTA_PARENT as LABEL_PARENT
from apis.scheduling_keys import LABEL_QUOTA_TREE_ID as LABEL_TREE_ID
from scheduler_plugins.args import ArgsReader
from scheduler_plugins.errors import InputError
from scheduler_plugins.framework import Cycle, Plugin
from scheduler_plugins.plugins.quotaprofile import (
    ERR_POOL,
    QuotaProfile,
    parse_profiles,
    pool_nodes,
    pool_total,
    profiles_of,
)
from scheduler_plugins.snapshot import (
    NodeInfo,
    PodInfo,
    ResourceList,
    Snapshot,
    parse_resource_list,
)

NAME = "ElasticQuota"
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
    total: ResourceList | None = None
    """A root's own total (its profile's pool, or ``total-resource``); ``None``: the cluster."""
    profile: str = ""
    """The ElasticQuotaProfile (``namespace/name``) whose tree this quota is in; ``""``: none."""
    children: list[str] = field(default_factory=list)
    request: ResourceList = field(default_factory=dict)
    used: ResourceList = field(default_factory=dict)
    non_preemptible_used: ResourceList = field(default_factory=dict)
    runtime: ResourceList = field(default_factory=dict)


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
        total: ResourceList | None = None
        if ann.get(ANNOTATION_TOTAL_RESOURCE):
            try:
                total = parse_resource_list(
                    json.loads(ann[ANNOTATION_TOTAL_RESOURCE]), where, ANNOTATION_TOTAL_RESOURCE
                )
            except ValueError as err:
                raise InputError(where, ANNOTATION_TOTAL_RESOURCE, f"bad JSON: {err}") from err
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
    cluster: ResourceList | None = None

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
        total = next((quotas[n].total for n in names if quotas[n].total is not None), None)
        if total is None:
            if cluster is None:
                cluster = {}
                for node in snapshot.nodes.values():
                    for r, v in node.allocatable.items():
                        cluster[r] = cluster.get(r, 0) + v
            total = cluster
        assign(total, names)


def _fmt(rl: Mapping[str, int], keys: list[str]) -> str:
    return "{" + ", ".join(f"{k}: {rl.get(k, 0)}" for k in keys) + "}"


class ElasticQuota(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(
        self,
        *,
        check_parent: bool = False,
        profiles: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.check_parent = check_parent
        """``enableCheckParentQuota``."""
        self._given = parse_profiles(profiles) if profiles is not None else None
        self._token: tuple[int, int] | None = None
        self._tallies: dict[str, tuple[ResourceList, ResourceList, ResourceList]] = {}
        self._profiles: list[QuotaProfile] = []
        self._pools: dict[str, set[str]] = {}
        self._totals: dict[str, ResourceList] = {}

    def _refresh(self, snap: Snapshot) -> None:
        """Re-read profiles and pools when the snapshot changed (tallies are re-counted with
        the quotas in :meth:`pre_filter`)."""
        profiles = self._given if self._given is not None else profiles_of(snap)
        nodes = snap.nodes.values()
        self._profiles = profiles
        self._pools = {p.key: pool_nodes(p, nodes) for p in profiles}
        self._totals = {p.key: pool_total(p, nodes) for p in profiles}

    def pre_filter(self, cycle: Cycle, pod: PodInfo) -> str | None:
        snap = cycle.snapshot
        token = (id(snap), snap.generation)
        if token != self._token:
            self._refresh(snap)
        if not snap.quotas and not self._profiles:
            return None
        quotas = parse_quotas(snap, self._profiles, self._totals)
        if token != self._token:
            self._tallies = tally(snap, quotas)
            self._token = token
        name = quota_of(pod, quotas)
        if name is None or name not in quotas:
            return None
        compute_runtime(snap, quotas, pod, self._tallies)
        q = quotas[name]
        if q.profile:
            cycle.data[f"{NAME}/pool/{pod.uid}"] = self._pools.get(q.profile, set())
        chain = [q]
        if self.check_parent:
            seen = {q.name}
            while chain[-1].parent in quotas and chain[-1].parent not in seen:
                seen.add(chain[-1].parent)
                chain.append(quotas[chain[-1].parent])
        for level in chain:
            keys = sorted(r for r in pod.requests if r in level.max or r in level.min)
            exceed = [
                r for r in keys if level.used.get(r, 0) + pod.requests[r] > level.runtime.get(r, 0)
            ]
            if exceed:
                return (
                    f"Insufficient quotas, quotaName: {level.name}, "
                    f"runtime: {_fmt(level.runtime, keys)}, used: {_fmt(level.used, keys)}, "
                    f"pod's request: {_fmt(pod.requests, keys)}, "
                    f"exceedDimensions: [{', '.join(exceed)}]"
                )
        keys = sorted(r for r in pod.requests if r in q.max or r in q.min)
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

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        pool: set[str] | None = cycle.data.get(f"{NAME}/pool/{pod.uid}")
        if pool is None:
            return {}
        return {n.name: ERR_POOL for n in nodes if n.name not in pool}


def build(args: Mapping[str, Any] | None, source: str) -> ElasticQuota:
    """Factory for the plugin table (``ElasticQuotaArgs``: ``enableCheckParentQuota``)."""
    reader = ArgsReader(args, source, NAME)
    return ElasticQuota(check_parent=reader.boolean("enableCheckParentQuota", False))
