"""PodTopologySpread: spread matching pods evenly across topology domains (kube-scheduler's
in-tree plugin, ``pkg/scheduler/framework/plugins/podtopologyspread``).

For each ``topologySpreadConstraints[]`` entry the *matching pods* are the pods of the incoming
pod's namespace that the constraint's ``labelSelector`` (with ``matchLabelKeys``) selects, not
terminating; a *domain* is one value of ``topologyKey`` among the nodes counted: nodes that carry
every constraint's key, and, per constraint, match the pod's node affinity and selector
(``nodeAffinityPolicy: Honor``, the default) and, with ``nodeTaintsPolicy: Honor``, whose
``NoSchedule``/``NoExecute`` taints the pod tolerates.

- **Filter** (``whenUnsatisfiable: DoNotSchedule``). A node without the constraint's key:
  ``node(s) didn't match pod topology spread constraints (missing required label)`` (evicting
  pods cannot cure it). Otherwise ``skew = matching(node's domain) + self - min``, with ``self``
  1 when the incoming pod matches its own selector and ``min`` the fewest matching pods in any
  domain (0 when there are fewer domains than ``minDomains``); ``skew > maxSkew``:
  ``node(s) didn't match pod topology spread constraints``.
- **Score** (``ScheduleAnyway``). Over the nodes that passed the filters: nodes lacking a key are
  ignored (score 0); each constraint weighs ``log(domains + 2)`` (domains among those nodes; for
  ``kubernetes.io/hostname``, the nodes); a node's raw score is
  ``round(sum(matching(domain) * weight + maxSkew - 1))``, matching pods counted over every node
  of the domain (per node for hostname); then ``100 * (max + min - raw) // max`` (100 for all
  when ``max`` is 0), so the emptiest domains win. Default weight 2.

Not done: the cluster-level default constraints (``defaultConstraints``, ``defaultingType:
System``): a pod without constraints is not spread. Each constraint counts its own matching pods
(as kube-scheduler does since 1.30), and matching pods are counted by selector, not by owner.

Cost: the counts per domain over every node are kept per *aggregate* (namespace, selector,
topology key, the keys a node must carry, and the pod's node affinity and tolerations where the
inclusion policies read them) and updated for the nodes that change, so replicas of one workload
pay for the nodes changed since the last one; how many matching pods a node holds is kept per
node until it changes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apis.kubernetes_keys import LABEL_HOSTNAME, TAINT_EFFECT_NO_EXECUTE, TAINT_EFFECT_NO_SCHEDULE
from scheduler_plugins.constraints import SpreadConstraint, first_untolerated
from scheduler_plugins.framework import MAX_NODE_SCORE, Cycle, Plugin
from scheduler_plugins.plugins.nodecache import Changes, NodeMemo
from scheduler_plugins.selectors import LabelSelector
from scheduler_plugins.snapshot import NodeInfo, PodInfo

logger = logging.getLogger(__name__)

NAME = "PodTopologySpread"
ERR_CONSTRAINTS = "node(s) didn't match pod topology spread constraints"
"""``ErrReasonConstraintsNotMatch``."""
ERR_MISSING_LABEL = ERR_CONSTRAINTS + " (missing required label)"
"""``ErrReasonNodeLabelNotMatch``."""
_TAINT_EFFECTS = (TAINT_EFFECT_NO_SCHEDULE, TAINT_EFFECT_NO_EXECUTE)
MEMO_SELECTORS = 64
"""(namespace, selector) pairs whose per-node counts are kept."""


@dataclass(slots=True)
class _FilterState:
    constraints: tuple[SpreadConstraint, ...]
    counts: list[dict[str, int]]
    """Per constraint: domain value → matching pods (a copy the dry run of preemption edits)."""
    included: list[set[str]]
    """Per constraint: the nodes counted."""
    mins: list[int] = field(default_factory=list)

    def refresh_mins(self) -> None:
        self.mins = []
        for c, counts in zip(self.constraints, self.counts, strict=True):
            if len(counts) < c.min_domains:
                self.mins.append(0)
            else:
                self.mins.append(min(counts.values(), default=0))


@dataclass(slots=True)
class _Aggregate:
    """Matching pods per domain of one topology key, over the nodes a pod of one shape counts."""

    changes: Changes = field(default_factory=Changes)
    per_node: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Node counted → (its domain, its matching pods)."""
    values: dict[str, int] = field(default_factory=dict)
    """Domain → matching pods."""
    nodes_in: dict[str, int] = field(default_factory=dict)
    """Domain → nodes counted."""

    def drop(self, name: str) -> None:
        old = self.per_node.pop(name, None)
        if old is None:
            return
        value, n = old
        self.values[value] -= n
        left = self.nodes_in[value] - 1
        if left:
            self.nodes_in[value] = left
        else:
            del self.nodes_in[value]
            del self.values[value]

    def put(self, name: str, value: str, n: int) -> None:
        self.per_node[name] = (value, n)
        self.values[value] = self.values.get(value, 0) + n
        self.nodes_in[value] = self.nodes_in.get(value, 0) + 1


def has_keys(labels: Mapping[str, str], keys: Sequence[str]) -> bool:
    """``nodeLabelsMatchSpreadConstraints``: the node carries every key."""
    return all(k in labels for k in keys)


class PodTopologySpread(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self) -> None:
        self._counts: NodeMemo[int] = NodeMemo(MEMO_SELECTORS)
        self._aggregates: dict[tuple[Any, ...], _Aggregate] = {}

    # -- counting -------------------------------------------------------------------------

    def count(self, node: NodeInfo, namespace: str, selector: LabelSelector) -> int:
        """Matching pods on ``node`` (``countPodsMatchSelector``), kept until the node changes."""

        def compute(n: NodeInfo) -> int:
            return sum(
                1
                for p in n.pods.values()
                if p.namespace == namespace
                and not p.constraints.terminating
                and selector.matches(p.labels)
            )

        return self._counts.get((namespace, selector), node, compute)

    @staticmethod
    def _included(pod: PodInfo, node: NodeInfo, c: SpreadConstraint) -> bool:
        """``matchNodeInclusionPolicies``."""
        pc = pod.constraints
        if c.honor_affinity and not pc.matches_node(node.name, node.labels):
            return False
        return not (
            c.honor_taints and first_untolerated(node.taints, pc.tolerations, _TAINT_EFFECTS)
        )

    def _aggregate(
        self, cycle: Cycle, pod: PodInfo, c: SpreadConstraint, keys: tuple[str, ...]
    ) -> _Aggregate:
        """The counts per domain of ``c`` over the nodes carrying ``keys`` that ``pod``
        counts, brought up to date."""
        pc = pod.constraints
        key = (
            pod.namespace,
            c.selector,
            c.topology_key,
            keys,
            (pc.node_selector, pc.required) if c.honor_affinity else None,
            pc.tolerations if c.honor_taints else None,
        )
        agg = self._aggregates.get(key)
        if agg is None:
            if len(self._aggregates) >= MEMO_SELECTORS:
                del self._aggregates[next(iter(self._aggregates))]
            agg = self._aggregates[key] = _Aggregate()
        snap = cycle.snapshot
        names = agg.changes.poll(snap)
        if names is None:
            agg.per_node.clear()
            agg.values.clear()
            agg.nodes_in.clear()
            names = set(snap.nodes)
        for name in names:
            agg.drop(name)
            node = snap.nodes.get(name)
            if node is None or not has_keys(node.labels, keys) or not self._included(pod, node, c):
                continue
            agg.put(name, node.labels[c.topology_key], self.count(node, pod.namespace, c.selector))
        return agg

    def _filter_state(self, cycle: Cycle, pod: PodInfo) -> _FilterState | None:
        key = f"{NAME}/filter/{pod.uid}"
        if key in cycle.data:
            state: _FilterState | None = cycle.data[key]
            return state
        hard = tuple(c for c in pod.constraints.spread if c.hard)
        state = None
        if hard:
            keys = tuple(c.topology_key for c in hard)
            aggs = [self._aggregate(cycle, pod, c, keys) for c in hard]
            state = _FilterState(
                hard, [dict(a.values) for a in aggs], [set(a.per_node) for a in aggs]
            )
            state.refresh_mins()
        cycle.data[key] = state
        return state

    # -- filter ---------------------------------------------------------------------------

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        if not pod.constraints.spread:
            return {}
        state = self._filter_state(cycle, pod)
        if state is None:
            return {}
        selfs = [1 if c.selector.matches(pod.labels) else 0 for c in state.constraints]
        out: dict[str, str] = {}
        for node in nodes:
            labels = node.labels
            for i, c in enumerate(state.constraints):
                value = labels.get(c.topology_key)
                if value is None:
                    out[node.name] = ERR_MISSING_LABEL
                    break
                skew = state.counts[i].get(value, 0) + selfs[i] - state.mins[i]
                if skew > c.max_skew:
                    out[node.name] = ERR_CONSTRAINTS
                    break
        return out

    def unresolvable(self, reason: str) -> bool:
        return reason == ERR_MISSING_LABEL

    def _adjust(self, cycle: Cycle, pod: PodInfo, victim: PodInfo, node: NodeInfo, d: int) -> None:
        state = cycle.data.get(f"{NAME}/filter/{pod.uid}")
        if not isinstance(state, _FilterState) or victim.namespace != pod.namespace:
            return
        for i, c in enumerate(state.constraints):
            if node.name in state.included[i] and c.selector.matches(victim.labels):
                value = node.labels[c.topology_key]
                state.counts[i][value] = state.counts[i].get(value, 0) + d
        state.refresh_mins()

    def remove_pod(self, cycle: Cycle, pod: PodInfo, victim: PodInfo, node: NodeInfo) -> None:
        self._adjust(cycle, pod, victim, node, -1)

    def add_pod(self, cycle: Cycle, pod: PodInfo, victim: PodInfo, node: NodeInfo) -> None:
        self._adjust(cycle, pod, victim, node, 1)

    # -- score ----------------------------------------------------------------------------

    def score_nodes(
        self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]
    ) -> dict[str, int] | None:
        soft = tuple(c for c in pod.constraints.spread if not c.hard)
        if not soft or not nodes:
            return None
        soft_keys = tuple(c.topology_key for c in soft)
        if LABEL_HOSTNAME not in soft_keys:
            return self._score_by_domain(cycle, pod, soft, soft_keys, nodes)
        ignored = {n.name for n in nodes if not has_keys(n.labels, soft_keys)}
        scored = [n for n in nodes if n.name not in ignored]
        wanted: list[set[str]] = [set() for _ in soft]
        for n in scored:
            for i, c in enumerate(soft):
                if c.topology_key != LABEL_HOSTNAME:
                    wanted[i].add(n.labels[c.topology_key])
        weights = [
            math.log((len(scored) if c.topology_key == LABEL_HOSTNAME else len(wanted[i])) + 2)
            for i, c in enumerate(soft)
        ]
        counts: list[Mapping[str, int]] = [
            {}
            if c.topology_key == LABEL_HOSTNAME
            else self._aggregate(cycle, pod, c, soft_keys).values
            for c in soft
        ]
        raw: dict[str, int] = {}
        for n in scored:
            total = 0.0
            for i, c in enumerate(soft):
                if c.topology_key == LABEL_HOSTNAME:
                    cnt = self.count(n, pod.namespace, c.selector)
                else:
                    cnt = counts[i].get(n.labels[c.topology_key], 0)
                total += cnt * weights[i] + (c.max_skew - 1)
            raw[n.name] = _go_round(total)
        out = dict(cycle.names_of(nodes)[1])
        if raw:
            low, high = min(raw.values()), max(raw.values())
            for name, s in raw.items():
                out[name] = (
                    MAX_NODE_SCORE if high == 0 else MAX_NODE_SCORE * (high + low - s) // high
                )
        return out

    def _score_by_domain(
        self,
        cycle: Cycle,
        pod: PodInfo,
        soft: Sequence[SpreadConstraint],
        keys: tuple[str, ...],
        nodes: Sequence[NodeInfo],
    ) -> dict[str, int]:
        """:meth:`score_nodes` when no constraint spreads over hostnames: a node's score
        depends on its domains only, so it is computed once per domain (tuple of the nodes'
        values of ``keys``; ``None`` in it: the node lacks a key, is not scored and gets 0)."""
        if len(keys) == 1:
            key = keys[0]
            doms: list[Any] = [(n.labels.get(key),) for n in nodes]
        else:
            doms = [tuple(map(n.labels.get, keys)) for n in nodes]
        present = {d for d in set(doms) if None not in d}
        norm: dict[Any, int] = {d: 0 for d in set(doms) if None in d}
        if present:
            weights = [math.log(len({d[i] for d in present}) + 2) for i in range(len(soft))]
            counts = [self._aggregate(cycle, pod, c, keys).values for c in soft]
            raw: dict[Any, int] = {}
            for d in present:
                total = 0.0
                for i, c in enumerate(soft):
                    total += counts[i].get(d[i], 0) * weights[i] + (c.max_skew - 1)
                raw[d] = _go_round(total)
            low, high = min(raw.values()), max(raw.values())
            for d, s in raw.items():
                norm[d] = MAX_NODE_SCORE if high == 0 else MAX_NODE_SCORE * (high + low - s) // high
        names, _ = cycle.names_of(nodes)
        return dict(zip(names, map(norm.__getitem__, doms), strict=True))


def _go_round(x: float) -> int:
    """Go's ``math.Round`` (half away from zero) for non-negative ``x``."""
    return math.floor(x + 0.5)


def build(args: Mapping[str, Any] | None, source: str) -> PodTopologySpread:
    """Factory for the plugin table. ``PodTopologySpreadArgs.defaultConstraints`` are not
    supported: said once in the log, and pods without constraints are not spread."""
    if args and args.get("defaultConstraints"):
        logger.warning(
            "%s: PodTopologySpread defaultConstraints are not supported; "
            "pods without topologySpreadConstraints are not spread",
            source,
        )
    return PodTopologySpread()
