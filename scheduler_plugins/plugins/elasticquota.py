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
- **Runtime quota** (``quotatree.py``): a quota's *request* is what its pods (assigned and
  pending, the incoming pod included) and its children request, capped at its max. From the
  top, a parent's runtime (its tree's total for a root) goes first to each child's min (what it
  asks when it asks less and lends), kept even when the children's mins exceed the parent's
  total; only a positive remainder is shared among the children still asking, in proportion to
  their shared weights, capped at their request, again until nothing is left. With Koordinator's
  ``ElasticQuotaGuaranteeUsage`` feature gate (``guarantee_usage``) what a quota uses is
  guaranteed too (``guarantee = max(min, used)``) and no quota lends.
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

Preemption (``preemption.py``) reads the trees through :meth:`ElasticQuota.quotas_for`.

Not done: ``quota.scheduling.koordinator.sh/runtime`` status write-back, the overuse revoke
controller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apis.scheduling_keys import LABEL_PREEMPTIBLE
from scheduler_plugins.args import ArgsReader
from scheduler_plugins.framework import Cycle, Plugin
from scheduler_plugins.objectfields import ResourceList
from scheduler_plugins.plugins.quotaprofile import (
    ERR_POOL,
    QuotaProfile,
    parse_profiles,
    pool_nodes,
    pool_total,
    profiles_of,
)
from scheduler_plugins.plugins.quotatree import (
    Quota,
    compute_runtime,
    parse_quotas,
    quota_of,
    tally,
)
from scheduler_plugins.snapshot import NodeInfo, PodInfo, Snapshot

NAME = "ElasticQuota"


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
        guarantee_usage: bool = False,
    ) -> None:
        self.check_parent = check_parent
        """``enableCheckParentQuota``."""
        self.guarantee_usage = guarantee_usage
        """Koordinator's ``ElasticQuotaGuaranteeUsage`` feature gate."""
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

    def quotas_for(self, cycle: Cycle, pod: PodInfo) -> tuple[dict[str, Quota], str] | None:
        """The quota trees with their runtimes as ``pod`` sees them, and its quota's name;
        ``None`` for a pod without a quota."""
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
        compute_runtime(snap, quotas, pod, self._tallies, guarantee_usage=self.guarantee_usage)
        return quotas, name

    def pre_filter(self, cycle: Cycle, pod: PodInfo) -> str | None:
        found = self.quotas_for(cycle, pod)
        if found is None:
            return None
        quotas, name = found
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


def build_guaranteeing(args: Mapping[str, Any] | None, source: str) -> ElasticQuota:
    """Factory with ``ElasticQuotaGuaranteeUsage`` on (``--feature-gates``)."""
    reader = ArgsReader(args, source, NAME)
    return ElasticQuota(
        check_parent=reader.boolean("enableCheckParentQuota", False), guarantee_usage=True
    )
