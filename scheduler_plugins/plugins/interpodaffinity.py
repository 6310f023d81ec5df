"""InterPodAffinity: pod affinity and anti-affinity (kube-scheduler's in-tree plugin,
``pkg/scheduler/framework/plugins/interpodaffinity``).

A term is about the pods of its ``namespaces`` (or those whose namespace labels its
``namespaceSelector`` selects; neither: the pod's own namespace) that its ``labelSelector``
selects; it holds per *topology domain*: the nodes sharing the node's ``topologyKey`` value.

- **Filter**, in kube-scheduler's order:
  1. every required affinity term needs the node to carry its key and a pod matching *all* the
     terms in the node's domain: else ``node(s) didn't match pod affinity rules`` (evicting
     cannot cure it), except for the first pod of a group: when no pod anywhere matches and the
     pod matches its own terms, a node carrying the keys passes;
  2. a required anti-affinity term of the pod with a matching pod in the node's domain:
     ``node(s) didn't match pod anti-affinity rules``;
  3. a required anti-affinity term of an existing pod that matches the incoming pod, in the
     node's domain (symmetry): ``node(s) didn't satisfy existing pods anti-affinity rules``.
- **Score.** Per domain: + the weight of each preferred affinity term of the pod that an
  existing pod there matches, - for preferred anti-affinity; + 1 (``hardPodAffinityWeight``) for
  each required affinity term of an existing pod that the incoming pod matches, +/- the weights
  of existing pods' preferred terms it matches. A node scores the sum over its domains, mapped
  to 0..100 between the lowest and the highest node (all 0 when they are equal). A pod with no
  preferred terms in a cluster where no pod has affinity terms is not scored. Default weight 2.

Cost: the pods having affinity terms are indexed per node (updated for the nodes that change),
so a pod without terms costs one check when no existing pod has required anti-affinity; a pod
with terms counts, per node, the pods its terms match, kept until the node changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler_plugins.args import ArgsReader
from scheduler_plugins.constraints import AffinityTerm
from scheduler_plugins.framework import MAX_NODE_SCORE, Cycle, Plugin
from scheduler_plugins.plugins.nodecache import Changes, NodeMemo
from scheduler_plugins.snapshot import NodeInfo, PodInfo, Snapshot

NAME = "InterPodAffinity"
ERR_AFFINITY = "node(s) didn't match pod affinity rules"
"""``ErrReasonAffinityRulesNotMatch``."""
ERR_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
"""``ErrReasonAntiAffinityRulesNotMatch``."""
ERR_EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
"""``ErrReasonExistingAntiAffinityRulesNotMatch``."""
DEFAULT_HARD_POD_AFFINITY_WEIGHT = 1
MEMO_SHAPES = 16

Pair = tuple[str, str]


def term_matches(term: AffinityTerm, pod: PodInfo, snap: Snapshot) -> bool:
    """Whether ``pod`` is one of the pods ``term`` is about."""
    return term.matches(pod.namespace, pod.labels, snap.namespaces.get(pod.namespace, {}))


def matches_all(terms: tuple[AffinityTerm, ...], pod: PodInfo, snap: Snapshot) -> bool:
    """``podMatchesAllAffinityTerms`` (false for no terms)."""
    return bool(terms) and all(term_matches(t, pod, snap) for t in terms)


@dataclass(slots=True)
class _FilterState:
    existing_anti: dict[Pair, int]
    """Domains where an existing pod's required anti-affinity term matches the incoming pod."""
    affinity: dict[Pair, int]
    """Domains with pods matching all of the incoming pod's required affinity terms."""
    anti: dict[Pair, int]
    """Domains with pods matching one of its required anti-affinity terms."""


def _bump(counts: dict[Pair, int], node: NodeInfo, key: str, d: int) -> None:
    value = node.labels.get(key)
    if value is None:
        return
    pair = (key, value)
    n = counts.get(pair, 0) + d
    if n:
        counts[pair] = n
    else:
        counts.pop(pair, None)


class InterPodAffinity(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self, hard_pod_affinity_weight: int = DEFAULT_HARD_POD_AFFINITY_WEIGHT) -> None:
        self.hard_weight = hard_pod_affinity_weight
        self._changes = Changes()
        self._with_terms: dict[str, list[PodInfo]] = {}
        """Node → its pods that have any pod affinity or anti-affinity term."""
        self._with_anti: set[str] = set()
        """Nodes holding a pod with a required anti-affinity term."""
        self._memo: NodeMemo[Any] = NodeMemo(MEMO_SHAPES)
        """Per-node term counts and score contributions, per pod shape."""

    # -- the index of pods with terms -----------------------------------------------------

    def _prepare(self, snap: Snapshot) -> None:
        names = self._changes.poll(snap)
        if names is None:  # also a Namespace change: the memos match namespace labels
            self._with_terms.clear()
            self._with_anti.clear()
            self._memo.clear()
            names = set(snap.nodes)
        for name in names:
            self._with_terms.pop(name, None)
            self._with_anti.discard(name)
            node = snap.nodes.get(name)
            if node is None:
                continue
            pods = [p for p in node.pods.values() if p.constraints.has_pod_affinity]
            if pods:
                self._with_terms[name] = pods
                if any(p.constraints.anti_affinity for p in pods):
                    self._with_anti.add(name)

    # -- filter ---------------------------------------------------------------------------

    def _filter_state(self, cycle: Cycle, pod: PodInfo) -> _FilterState:
        key = f"{NAME}/filter/{pod.uid}"
        state: _FilterState | None = cycle.data.get(key)
        if state is not None:
            return state
        snap = cycle.snapshot
        state = _FilterState({}, {}, {})
        for name in self._with_anti:
            node = snap.nodes[name]
            for existing in self._with_terms[name]:
                for t in existing.constraints.anti_affinity:
                    if term_matches(t, pod, snap):
                        _bump(state.existing_anti, node, t.topology_key, 1)
        c = pod.constraints
        if c.affinity or c.anti_affinity:
            shape = ("filter", c.affinity, c.anti_affinity)

            def per_node(node: NodeInfo) -> tuple[int, tuple[int, ...]]:
                aff = 0
                anti = [0] * len(c.anti_affinity)
                for p in node.pods.values():
                    if c.affinity and matches_all(c.affinity, p, snap):
                        aff += 1
                    for j, t in enumerate(c.anti_affinity):
                        if term_matches(t, p, snap):
                            anti[j] += 1
                return aff, tuple(anti)

            for node in snap.nodes.values():
                if not node.pods:
                    continue
                aff, anti = self._memo.get(shape, node, per_node)
                if aff:
                    for t in c.affinity:
                        _bump(state.affinity, node, t.topology_key, aff)
                for j, t in enumerate(c.anti_affinity):
                    if anti[j]:
                        _bump(state.anti, node, t.topology_key, anti[j])
        cycle.data[key] = state
        return state

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        snap = cycle.snapshot
        self._prepare(snap)
        c = pod.constraints
        if not c.affinity and not c.anti_affinity and not self._with_anti:
            return {}
        state = self._filter_state(cycle, pod)
        first_of_group = (
            bool(c.affinity) and not state.affinity and matches_all(c.affinity, pod, snap)
        )
        out: dict[str, str] = {}
        for node in nodes:
            labels = node.labels
            if c.affinity:
                ok = True
                exist = True
                for t in c.affinity:
                    value = labels.get(t.topology_key)
                    if value is None:
                        ok = False
                        break
                    if state.affinity.get((t.topology_key, value), 0) <= 0:
                        exist = False
                if not ok or (not exist and not first_of_group):
                    out[node.name] = ERR_AFFINITY
                    continue
            if state.anti and any(
                state.anti.get((t.topology_key, labels.get(t.topology_key, "")), 0) > 0
                for t in c.anti_affinity
                if t.topology_key in labels
            ):
                out[node.name] = ERR_ANTI_AFFINITY
                continue
            if state.existing_anti and any(labels.get(k) == v for (k, v) in state.existing_anti):
                out[node.name] = ERR_EXISTING_ANTI_AFFINITY
        return out

    def unresolvable(self, reason: str) -> bool:
        return reason == ERR_AFFINITY

    def _adjust(self, cycle: Cycle, pod: PodInfo, victim: PodInfo, node: NodeInfo, d: int) -> None:
        state = cycle.data.get(f"{NAME}/filter/{pod.uid}")
        if not isinstance(state, _FilterState):
            return
        snap = cycle.snapshot
        for t in victim.constraints.anti_affinity:
            if term_matches(t, pod, snap):
                _bump(state.existing_anti, node, t.topology_key, d)
        c = pod.constraints
        if c.affinity and matches_all(c.affinity, victim, snap):
            for t in c.affinity:
                _bump(state.affinity, node, t.topology_key, d)
        for t in c.anti_affinity:
            if term_matches(t, victim, snap):
                _bump(state.anti, node, t.topology_key, d)

    def remove_pod(self, cycle: Cycle, pod: PodInfo, victim: PodInfo, node: NodeInfo) -> None:
        self._adjust(cycle, pod, victim, node, -1)

    def add_pod(self, cycle: Cycle, pod: PodInfo, victim: PodInfo, node: NodeInfo) -> None:
        self._adjust(cycle, pod, victim, node, 1)

    # -- score ----------------------------------------------------------------------------

    def _contributions(
        self, pod: PodInfo, node: NodeInfo, pods: Sequence[PodInfo], snap: Snapshot
    ) -> list[tuple[str, str, int]]:
        """``processExistingPod`` for each of ``pods`` on ``node``: (key, value, delta)."""
        c = pod.constraints
        labels = node.labels
        out: list[tuple[str, str, int]] = []

        def add(term: AffinityTerm, weight: int) -> None:
            value = labels.get(term.topology_key)
            if value is not None:
                out.append((term.topology_key, value, weight))

        if not labels:
            return out
        for existing in pods:
            ec = existing.constraints
            for t in c.preferred_affinity:
                if term_matches(t, existing, snap):
                    add(t, t.weight)
            for t in c.preferred_anti_affinity:
                if term_matches(t, existing, snap):
                    add(t, -t.weight)
            if self.hard_weight > 0:
                for t in ec.affinity:
                    if term_matches(t, pod, snap):
                        add(t, self.hard_weight)
            for t in ec.preferred_affinity:
                if term_matches(t, pod, snap):
                    add(t, t.weight)
            for t in ec.preferred_anti_affinity:
                if term_matches(t, pod, snap):
                    add(t, -t.weight)
        return out

    def score_nodes(
        self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]
    ) -> dict[str, int] | None:
        snap = cycle.snapshot
        self._prepare(snap)
        c = pod.constraints
        own = bool(c.preferred_affinity or c.preferred_anti_affinity)
        if not own and not self._with_terms:
            return None
        topology: dict[str, dict[str, int]] = {}
        if own:
            shape = (
                "score",
                pod.namespace,
                tuple(sorted(pod.labels.items())),
                c.preferred_affinity,
                c.preferred_anti_affinity,
            )
            items = [
                (
                    node,
                    self._memo.get(
                        shape,
                        node,
                        lambda n: self._contributions(pod, n, list(n.pods.values()), snap),
                    ),
                )
                for node in snap.nodes.values()
                if node.pods
            ]
        else:
            items = [
                (snap.nodes[name], self._contributions(pod, snap.nodes[name], pods, snap))
                for name, pods in self._with_terms.items()
            ]
        for _, contribs in items:
            for key, value, delta in contribs:
                values = topology.setdefault(key, {})
                values[value] = values.get(value, 0) + delta
        if not topology:
            return None
        raw = {}
        for node in nodes:
            s = 0
            for key, values in topology.items():
                v = node.labels.get(key)
                if v is not None:
                    s += values.get(v, 0)
            raw[node.name] = s
        low, high = min(raw.values()), max(raw.values())
        diff = high - low
        return {
            name: int(MAX_NODE_SCORE * ((s - low) / diff)) if diff > 0 else 0
            for name, s in raw.items()
        }


def build(args: Mapping[str, Any] | None, source: str) -> InterPodAffinity:
    """Factory for the plugin table (``InterPodAffinityArgs.hardPodAffinityWeight``, 0..100,
    default 1)."""
    r = ArgsReader(args, source, NAME)
    weight = r.integer("hardPodAffinityWeight", DEFAULT_HARD_POD_AFFINITY_WEIGHT, minimum=0)
    if weight > 100:
        raise r.fail("hardPodAffinityWeight", f"must be 0..100, got {weight}")
    return InterPodAffinity(weight)
