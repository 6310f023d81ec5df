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

Cost: the per-pod counts need every node once; how many pods of a (namespace, selector) a node
holds is kept per node until that node changes, so replicas of one workload pay a dict lookup a
node.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apis.wellknown import LABEL_HOSTNAME, TAINT_EFFECT_NO_EXECUTE, TAINT_EFFECT_NO_SCHEDULE
from scheduler_plugins.constraints import SpreadConstraint, first_untolerated
from scheduler_plugins.framework import MAX_NODE_SCORE, Cycle, Plugin
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

_CountKey = tuple[str, LabelSelector]


@dataclass(slots=True)
class _FilterState:
    constraints: tuple[SpreadConstraint, ...]
    counts: list[dict[str, int]]
    """Per constraint: domain value → matching pods."""
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


def has_keys(labels: Mapping[str, str], constraints: Sequence[SpreadConstraint]) -> bool:
    """``nodeLabelsMatchSpreadConstraints``."""
    return all(c.topology_key in labels for c in constraints)


class PodTopologySpread(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self) -> None:
        self._counts: dict[_CountKey, dict[str, tuple[NodeInfo, int, int]]] = {}

    # -- counting -------------------------------------------------------------------------

    def count(self, node: NodeInfo, namespace: str, selector: LabelSelector) -> int:
        """Matching pods on ``node`` (``countPodsMatchSelector``), kept until the node changes."""
        key = (namespace, selector)
        memo = self._counts.get(key)
        if memo is None:
            if len(self._counts) >= MEMO_SELECTORS:
                del self._counts[next(iter(self._counts))]
            memo = self._counts[key] = {}
        hit = memo.get(node.name)
        if hit is not None and hit[0] is node and hit[1] == node.generation:
            return hit[2]
        n = sum(
            1
            for p in node.pods.values()
            if p.namespace == namespace
            and not p.constraints.terminating
            and selector.matches(p.labels)
        )
        memo[node.name] = (node, node.generation, n)
        return n

    @staticmethod
    def _included(pod: PodInfo, node: NodeInfo, c: SpreadConstraint) -> bool:
        """``matchNodeInclusionPolicies``."""
        pc = pod.constraints
        if c.honor_affinity and not pc.matches_node(node.name, node.labels):
            return False
        return not (
            c.honor_taints and first_untolerated(node.taints, pc.tolerations, _TAINT_EFFECTS)
        )

    def _filter_state(self, cycle: Cycle, pod: PodInfo) -> _FilterState | None:
        key = f"{NAME}/filter/{pod.uid}"
        if key in cycle.data:
            state: _FilterState | None = cycle.data[key]
            return state
        hard = tuple(c for c in pod.constraints.spread if c.hard)
        state = None
        if hard:
            state = _FilterState(hard, [{} for _ in hard], [set() for _ in hard])
            for node in cycle.snapshot.nodes.values():
                labels = node.labels
                if not has_keys(labels, hard):
                    continue
                for i, c in enumerate(hard):
                    if not self._included(pod, node, c):
                        continue
                    value = labels[c.topology_key]
                    counts = state.counts[i]
                    counts[value] = counts.get(value, 0) + self.count(
                        node, pod.namespace, c.selector
                    )
                    state.included[i].add(node.name)
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
        ignored = {n.name for n in nodes if not has_keys(n.labels, soft)}
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
        counts: list[dict[str, int]] = [dict.fromkeys(w, 0) for w in wanted]
        if any(wanted):
            for node in cycle.snapshot.nodes.values():
                if not has_keys(node.labels, soft):
                    continue
                for i, c in enumerate(soft):
                    if c.topology_key == LABEL_HOSTNAME:
                        continue
                    value = node.labels[c.topology_key]
                    if value in counts[i] and self._included(pod, node, c):
                        counts[i][value] += self.count(node, pod.namespace, c.selector)
        raw: dict[str, int] = {}
        for n in scored:
            total = 0.0
            for i, c in enumerate(soft):
                if c.topology_key == LABEL_HOSTNAME:
                    cnt = self.count(n, pod.namespace, c.selector)
                else:
                    cnt = counts[i][n.labels[c.topology_key]]
                total += cnt * weights[i] + (c.max_skew - 1)
            raw[n.name] = _go_round(total)
        out = dict.fromkeys((n.name for n in nodes), 0)
        if raw:
            low, high = min(raw.values()), max(raw.values())
            for name, s in raw.items():
                out[name] = (
                    MAX_NODE_SCORE if high == 0 else MAX_NODE_SCORE * (high + low - s) // high
                )
        return out


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
