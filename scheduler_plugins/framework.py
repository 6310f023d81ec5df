"""The scheduling framework: filter, score, normalize, weigh, reserve, over a snapshot.

As kube-scheduler's framework does it, in one synchronous call per pod:

1. **PreFilter** per plugin: a pod-level verdict (a gang that is not complete, a quota that is
   full) rejects the pod on every node with that reason.
2. **Filter** per plugin over the nodes (a plugin sees all candidate nodes at once, so it can
   loop tightly over what it precomputed per node). ``all_verdicts`` (explain) runs every
   plugin on every node and keeps every reason; otherwise a node leaves the candidate list at its
   first failure, as the scheduler does.
3. **Score** per plugin over the feasible nodes; a plugin that has nothing to say about this pod
   (``None``, kube-scheduler's ``Skip``) takes no part. Each plugin's scores are normalized to
   0..100 and weighted: the node's rank is kube-scheduler's ``sum(weight * score)`` over the
   plugins that scored (:attr:`NodeResult.weighted`), shown as the weighted mean
   ``sum(weight * score) // sum(weight)`` on the 0..100 scale (:attr:`NodeResult.score`, what
   the extender answers), which orders nodes the same way.
4. **Reserve** on the chosen node: each plugin may return annotations to patch on the pod
   (NodeNUMAResource's ``scheduling.koordinator.sh/resource-status``); a failure unreserves the
   plugins already reserved, in reverse order.

Preemption (``preemption.py``) asks two more things of a plugin: whether one of its reasons can
be cured by evicting pods (:meth:`Plugin.unresolvable`, kube-scheduler's
``UnschedulableAndUnresolvable``), and, for plugins that precompute per pod over other pods
(PodTopologySpread, InterPodAffinity), to update that state when a pod is taken off a node or put
back (:meth:`Plugin.remove_pod`, :meth:`Plugin.add_pod`, kube-scheduler's PreFilterExtensions).

Plugins subclass :class:`Plugin`; nothing registers itself: ``table.PLUGINS`` lists them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import add, mul, not_
from typing import Any, ClassVar

from scheduler_plugins.errors import SchedulerError
from scheduler_plugins.evaluation import Evaluation, NodeResult
from scheduler_plugins.snapshot import NodeInfo, PodInfo, Snapshot

MAX_NODE_SCORE = 100
"""``framework.MaxNodeScore``."""
MIN_FEASIBLE_NODES_TO_FIND = 100
"""kube-scheduler's ``minFeasibleNodesToFind``: below this many nodes every node is filtered."""
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5
"""kube-scheduler's ``minFeasibleNodesPercentageToFind``: the adaptive percentage's floor."""
BASE_PERCENTAGE_OF_NODES_TO_SCORE = 50
"""The adaptive percentage at zero nodes, less one point per 125 nodes."""
ERR_NODE_NOT_FOUND = "node(s) not found"
"""The reason for a node name the snapshot does not know."""


def num_feasible_nodes_to_find(percentage: int, num_all_nodes: int) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops filtering
    (``percentageOfNodesToScore``): every node below 100 nodes or at 100 %; ``0`` is adaptive,
    ``50 - nodes / 125`` percent with a floor of 5 % (10 % of 5,000 nodes); never fewer than
    100 nodes."""
    if num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND or percentage >= 100:
        return num_all_nodes
    adaptive = percentage
    if adaptive <= 0:
        adaptive = BASE_PERCENTAGE_OF_NODES_TO_SCORE - num_all_nodes // 125
        adaptive = max(adaptive, MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
    return max(num_all_nodes * adaptive // 100, MIN_FEASIBLE_NODES_TO_FIND)


@dataclass(slots=True)
class Found:
    """What :meth:`Framework.find_feasible` found."""

    feasible: list[NodeInfo]
    """At most the wanted number of feasible nodes, in the order they were examined."""
    failures: dict[str, list[tuple[str, str]]]
    """``(plugin, reason)`` failures of the examined nodes, by node name (when some node was
    found, nodes a plugin ruled out beforehand, :meth:`Plugin.possible_nodes`, are left out;
    when none was, every node is there)."""
    processed: int
    """How many nodes were examined (the next search starts that far after this one)."""


class ReserveError(SchedulerError):
    """A plugin could not reserve what it promised at filter time."""


RESERVATION_ADJUST_KEY = "Reservation/adjust"
"""Cycle data shared by two plugins: node name → resources to add to what is free there for this
pod: what Reservations hold for others (negative) and what one of this pod's own holds
(positive); set by the Reservation plugin's pre-filter, read by NodeResourcesFit."""


@dataclass(slots=True)
class Cycle:
    """One scheduling cycle of one pod: the snapshot, the clock, and plugins' scratch data
    (``CycleState``)."""

    snapshot: Snapshot
    """What the plugins read."""
    now: float
    """Epoch seconds of this cycle (NodeMetric expiry, reservation expiry, gang timeouts)."""
    data: dict[str, Any] = field(default_factory=dict)
    """Per-plugin scratch, keyed by plugin name."""
    _names: tuple[Sequence[NodeInfo], list[str], dict[str, int] | None] | None = field(
        default=None, init=False, repr=False
    )

    def names_of(self, nodes: Sequence[NodeInfo]) -> tuple[list[str], dict[str, int]]:
        """The names of ``nodes`` in order, and each name mapped to 0 (copy it: ``dict(z)``
        copies in C what a comprehension over 5,000 nodes builds in Python), kept for the
        last ``nodes`` asked about (or told, :meth:`know_names`): the filters and the scoring
        plugins of a pod share them. Neither may be changed."""
        known = self._names
        if known is None or known[0] is not nodes:
            known = self._names = (nodes, [n.name for n in nodes], None)
        zeros = known[2]
        if zeros is None:
            zeros = dict.fromkeys(known[1], 0)
            self._names = (nodes, known[1], zeros)
        return known[1], zeros

    def names_only(self, nodes: Sequence[NodeInfo]) -> list[str]:
        """:meth:`names_of` without the zeros (not built until asked for). Not to be changed."""
        known = self._names
        if known is None or known[0] is not nodes:
            known = self._names = (nodes, [n.name for n in nodes], None)
        return known[1]

    def know_names(self, nodes: Sequence[NodeInfo], names: list[str]) -> None:
        """Tell :meth:`names_of` the names of ``nodes`` (``names[i]`` is ``nodes[i].name``),
        when the caller has them already (the extender's request, the filters' survivors):
        over thousands of nodes, not reading each node object again is what counts."""
        self._names = (nodes, names, None)


class Plugin:
    """A scheduling plugin. Override the steps the plugin implements; the defaults pass."""

    name: ClassVar[str] = ""
    """Koordinator's plugin name (``LoadAwareScheduling``)."""

    def pre_filter(self, cycle: Cycle, pod: PodInfo) -> str | None:
        """A reason to reject the pod on every node, or ``None``."""
        return None

    def filter(self, cycle: Cycle, pod: PodInfo, node: NodeInfo) -> str | None:
        """The reason ``node`` cannot run ``pod``, or ``None`` when it can."""
        return None

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        """Failure reasons by node name over ``nodes`` (absent: feasible)."""
        if type(self).filter is Plugin.filter:
            return {}  # a plugin without a node filter (pre-filter only) passes every node
        out: dict[str, str] = {}
        for node in nodes:
            reason = self.filter(cycle, pod, node)
            if reason is not None:
                out[node.name] = reason
        return out

    def possible_nodes(self, cycle: Cycle, pod: PodInfo) -> frozenset[str] | None:
        """Names of the only nodes this plugin's filter could pass for ``pod``, when it knows
        them cheaply (a cpu-binding pod needs a node with a CPU topology), else ``None``. A
        search for feasible nodes (:meth:`Framework.find_feasible`) skips the others; the
        filter itself must still reject them."""
        return None

    def score(self, cycle: Cycle, pod: PodInfo, node: NodeInfo) -> int | None:
        """The raw score of ``node``; ``None`` when the plugin does not score this pod."""
        return None

    def score_nodes(
        self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]
    ) -> dict[str, int] | None:
        """Raw scores by node name; ``None`` when the plugin does not score this pod."""
        if type(self).score is Plugin.score:
            return None
        out: dict[str, int] = {}
        for node in nodes:
            s = self.score(cycle, pod, node)
            if s is None:
                return None
            out[node.name] = s
        return out

    def normalize(self, scores: dict[str, int]) -> dict[str, int]:
        """Scores on the 0..100 scale. The default is for plugins that already score 0..100
        (as kube-scheduler takes a plugin without ScoreExtensions): they pass unchanged."""
        return scores

    def reserve(self, cycle: Cycle, pod: PodInfo, node: NodeInfo) -> dict[str, str]:
        """Hold what the pod gets on ``node``; annotations to patch on the pod. Raises
        :class:`ReserveError`."""
        return {}

    def unreserve(self, cycle: Cycle, pod: PodInfo, node: NodeInfo) -> None:
        """Undo :meth:`reserve`."""

    def unresolvable(self, reason: str) -> bool:
        """Whether evicting pods from the node cannot cure ``reason`` (kube-scheduler's
        ``UnschedulableAndUnresolvable``: a node selector, a taint); preemption skips such
        nodes. The default: evicting may help."""
        return False

    def might_help(
        self, cycle: Cycle, pod: PodInfo, node: NodeInfo, victims: Sequence[PodInfo]
    ) -> bool:
        """Whether this plugin could accept ``pod`` on ``node`` once ``victims`` are taken off
        it; a cheap check before preemption's dry run of the node. The default: perhaps."""
        return True

    def remove_pod(self, cycle: Cycle, pod: PodInfo, victim: PodInfo, node: NodeInfo) -> None:
        """``victim`` was taken off ``node`` while preemption tries it: update what
        :meth:`pre_filter` computed for ``pod``."""

    def add_pod(self, cycle: Cycle, pod: PodInfo, victim: PodInfo, node: NodeInfo) -> None:
        """Undo :meth:`remove_pod` (``victim`` is back on ``node``)."""


def default_normalize(scores: dict[str, int]) -> dict[str, int]:
    """kube-scheduler's ``DefaultNormalizeScore``: scale so the highest score is 100."""
    top = max(scores.values(), default=0)
    if top <= 0:
        return dict.fromkeys(scores, 0)
    return {n: s * MAX_NODE_SCORE // top for n, s in scores.items()}


class Framework:
    """Runs a list of plugins for a pod."""

    def __init__(self, plugins: Sequence[Plugin], weights: Mapping[str, int] | None = None) -> None:
        self.plugins = list(plugins)
        self.weights = {p.name: (weights or {}).get(p.name, 1) for p in self.plugins}

    def new_cycle(self, snapshot: Snapshot, now: float | None = None) -> Cycle:
        """A fresh :class:`Cycle` (``now`` defaults to the wall clock)."""
        return Cycle(snapshot, time.time() if now is None else now)

    def plugin(self, name: str) -> Plugin | None:
        """The plugin called ``name``, if this framework runs it."""
        return next((p for p in self.plugins if p.name == name), None)

    def pre_filter(self, cycle: Cycle, pod: PodInfo) -> tuple[str, str] | None:
        """The pre-filters in order: ``(plugin, reason)`` of the first that rejects the pod."""
        for plugin in self.plugins:
            reason = plugin.pre_filter(cycle, pod)
            if reason is not None:
                return plugin.name, reason
        return None

    def unresolvable(self, plugin: str, reason: str) -> bool:
        """Whether ``plugin``'s ``reason`` is one evicting pods cannot cure."""
        p = self.plugin(plugin)
        return p is not None and p.unresolvable(reason)

    def might_help(
        self, cycle: Cycle, pod: PodInfo, node: NodeInfo, victims: Sequence[PodInfo]
    ) -> bool:
        """Whether every plugin could accept ``pod`` on ``node`` once ``victims`` are gone, as
        far as their cheap checks tell (:meth:`Plugin.might_help`)."""
        return all(p.might_help(cycle, pod, node, victims) for p in self.plugins)

    def filter_nodes(
        self,
        cycle: Cycle,
        pod: PodInfo,
        nodes: Sequence[NodeInfo],
        *,
        all_verdicts: bool = False,
    ) -> tuple[list[NodeInfo], dict[str, list[tuple[str, str]]]]:
        """The feasible nodes, and ``(plugin, reason)`` failures by node name."""
        failures: dict[str, list[tuple[str, str]]] = {}
        if self._pre_filter(cycle, pod, nodes, failures, all_verdicts) and not all_verdicts:
            return [], failures
        candidates = self._run_filters(cycle, pod, nodes, failures, all_verdicts)
        return candidates, failures

    def _pre_filter(
        self,
        cycle: Cycle,
        pod: PodInfo,
        nodes: Sequence[NodeInfo],
        failures: dict[str, list[tuple[str, str]]],
        all_verdicts: bool,
    ) -> bool:
        """Run the plugins' pre-filters; one that rejects ``pod`` fails every node with its
        reason (in ``failures``). Whether any rejected; without ``all_verdicts``, the first
        rejection ends the run."""
        rejected = False
        for plugin in self.plugins:
            reason = plugin.pre_filter(cycle, pod)
            if reason is not None:
                rejected = True
                for n in nodes:
                    failures.setdefault(n.name, []).append((plugin.name, reason))
                if not all_verdicts:
                    break
        return rejected

    def _run_filters(
        self,
        cycle: Cycle,
        pod: PodInfo,
        nodes: Sequence[NodeInfo],
        failures: dict[str, list[tuple[str, str]]],
        all_verdicts: bool = False,
    ) -> list[NodeInfo]:
        """The node filters (no pre-filter) over ``nodes``: the feasible ones; ``failures``
        gets the rest."""
        candidates = list(nodes)
        # the survivors' names beside them: dropping the failed ones looks at the names only
        # (in C), not at thousands of node objects again; the scoring plugins reuse them
        names = cycle.names_only(nodes)
        for plugin in self.plugins:
            if not candidates:
                break
            failed = plugin.filter_nodes(cycle, pod, candidates)
            if not failed:
                continue
            pname = plugin.name
            if failures.keys().isdisjoint(failed):  # the usual case: first failures
                failures.update({name: [(pname, reason)] for name, reason in failed.items()})
            else:
                for name, reason in failed.items():
                    failures.setdefault(name, []).append((pname, reason))
            if not all_verdicts:
                keep = list(map(not_, map(failed.__contains__, names)))
                candidates = list(compress(candidates, keep))
                names = list(compress(names, keep))
        if all_verdicts:
            return [n for n in nodes if n.name not in failures]
        cycle.know_names(candidates, names)
        return candidates

    def first_failure(self, cycle: Cycle, pod: PodInfo, node: NodeInfo) -> str | None:
        """The node filters (no pre-filter) on one node: the first reason it fails, or
        ``None`` when it passes (preemption's dry run)."""
        failures: dict[str, list[tuple[str, str]]] = {}
        self._run_filters(cycle, pod, [node], failures)
        failed = failures.get(node.name)
        return failed[0][1] if failed else None

    def find_feasible(
        self,
        cycle: Cycle,
        pod: PodInfo,
        nodes: Sequence[NodeInfo],
        *,
        percentage: int = 100,
        start: int = 0,
    ) -> Found:
        """kube-scheduler's ``findNodesThatPassFilters`` with ``percentageOfNodesToScore``:
        examine ``nodes`` from index ``start`` on (wrapping around) and stop once
        :func:`num_feasible_nodes_to_find` feasible nodes are found. At 100 % (or under 100
        nodes) every node is examined, as :meth:`filter_nodes` does."""
        total = len(nodes)
        want = num_feasible_nodes_to_find(percentage, total)
        failures: dict[str, list[tuple[str, str]]] = {}
        if self._pre_filter(cycle, pod, nodes, failures, False):
            return Found([], failures, total)
        possible: frozenset[str] | None = None
        for plugin in self.plugins:
            only = plugin.possible_nodes(cycle, pod)
            if only is not None:
                possible = only if possible is None else possible & only
        found = self._search(cycle, pod, nodes, want, start, possible)
        if possible is not None and not found.feasible:
            # nothing fits: every node's own reasons, for the FailedScheduling Event
            every, failed = self.filter_nodes(cycle, pod, nodes)
            return Found(every, failed, total)
        return found

    def _search(
        self,
        cycle: Cycle,
        pod: PodInfo,
        nodes: Sequence[NodeInfo],
        want: int,
        start: int,
        possible: frozenset[str] | None,
    ) -> Found:
        """Filter ``nodes`` from ``start`` on until ``want`` are feasible, skipping nodes not in
        ``possible`` (no failures recorded for those)."""
        total = len(nodes)
        failures: dict[str, list[tuple[str, str]]] = {}
        if not total:
            return Found([], failures, 0)
        if want >= total:
            part = list(nodes) if possible is None else [n for n in nodes if n.name in possible]
            return Found(self._run_filters(cycle, pod, part, failures), failures, total)
        start %= total
        feasible: list[NodeInfo] = []
        processed = 0
        # Most nodes pass: a chunk 10 % over what is wanted usually holds enough. Nodes filtered
        # past the one that completes ``want`` are wasted work, and a short chunk costs only
        # one more, smaller round: 725 -> 618 nodes filtered per pod in bench.scheduler_scale.
        chunk = want + want // 10
        while processed < total:
            size = min(chunk, total - processed)
            lo = (start + processed) % total
            part = list(nodes[lo : lo + size])
            if len(part) < size:  # wrapped past the end
                part.extend(nodes[: size - len(part)])
            examined = part
            if possible is not None:
                part = [n for n in part if n.name in possible]
            passed = self._run_filters(cycle, pod, part, failures)
            if len(feasible) + len(passed) >= want:
                last = passed[want - len(feasible) - 1]
                feasible.extend(passed[: want - len(feasible)])
                cut = next(i for i, n in enumerate(examined) if n is last) + 1
                for n in examined[cut:]:  # examined past the last one needed: not processed
                    failures.pop(n.name, None)
                processed += cut
                break
            feasible.extend(passed)
            processed += size
            # the next chunk: what is still wanted at the pass rate seen so far, with margin
            rate = len(feasible) / processed
            missing = want - len(feasible)
            chunk = max(int(missing / rate * 1.2) + 1 if rate > 0 else 2 * size, 16)
        return Found(feasible, failures, processed)

    def filter(
        self,
        cycle: Cycle,
        pod: PodInfo,
        nodes: Sequence[NodeInfo],
        *,
        all_verdicts: bool = False,
    ) -> dict[str, NodeResult]:
        """Filter verdicts for ``nodes`` as :class:`NodeResult` objects."""
        _, failures = self.filter_nodes(cycle, pod, nodes, all_verdicts=all_verdicts)
        results: dict[str, NodeResult] = {}
        for n in nodes:
            failed = failures.get(n.name)
            if failed:
                results[n.name] = NodeResult(False, [r for _, r in failed], dict(failed))
            else:
                results[n.name] = NodeResult()
        return results

    def weighted_scores(
        self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]
    ) -> tuple[dict[str, dict[str, int]], dict[str, int], int]:
        """Normalized scores by plugin (only plugins that scored), kube-scheduler's weighted
        sums ``sum(weight * score)`` by node, and the sum of the weights that took part."""
        per_plugin: dict[str, dict[str, int]] = {}
        if not nodes:
            return per_plugin, {}, 0
        weighted: list[tuple[int, dict[str, int]]] = []
        for plugin in self.plugins:
            raw = plugin.score_nodes(cycle, pod, nodes)
            if raw is None:
                continue
            scores = plugin.normalize(raw)
            per_plugin[plugin.name] = scores
            weighted.append((self.weights[plugin.name], scores))
        weight_sum = sum(w for w, _ in weighted)
        uniform = 0  # plugins giving every node the same score shift all totals alike
        varying: list[tuple[int, dict[str, int]]] = []
        for w, scores in weighted:
            if not w or not scores:
                continue
            values = scores.values()
            low = min(values)
            if low == max(values):
                uniform += w * low
            else:
                varying.append((w, scores))
        totals: dict[str, int]
        if len(varying) == 1 and varying[0][0] == 1 and len(varying[0][1]) == len(nodes):
            totals = dict(varying[0][1])  # the usual extender case: one plugin scored
        else:
            names, _ = cycle.names_of(nodes)
            acc: list[int] = [uniform] * len(names)
            uniform = 0
            for w, scores in varying:
                if list(scores) == names:  # in node order, as plugins build them: add in C
                    acc = list(map(add, acc, map(mul, scores.values(), repeat(w))))
                else:
                    get = scores.get
                    acc = [t + w * get(name, 0) for name, t in zip(names, acc, strict=True)]
            totals = dict(zip(names, acc, strict=True))
        if uniform:
            totals = {name: t + uniform for name, t in totals.items()}
        return per_plugin, totals, weight_sum

    def score_nodes(
        self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]
    ) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
        """Normalized scores by plugin (only plugins that scored), and the weighted means
        (0..100)."""
        per_plugin, totals, weight_sum = self.weighted_scores(cycle, pod, nodes)
        if weight_sum <= 0:
            return per_plugin, dict.fromkeys(totals, 0)
        if weight_sum == 1:
            return per_plugin, totals
        return per_plugin, {name: t // weight_sum for name, t in totals.items()}

    def best_node(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> str:
        """The node of ``nodes`` (not empty) with the highest weighted sum (ties: the first)."""
        _, totals, _ = self.weighted_scores(cycle, pod, nodes)
        names, _ = cycle.names_of(nodes)
        if len(totals) == len(names) and totals.keys() >= set(names):
            return max(names, key=totals.__getitem__)  # the first of the highest
        best, top = names[0], totals.get(names[0], 0)
        for name in names:
            if totals.get(name, 0) > top:
                best, top = name, totals[name]
        return best

    def score(
        self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo], results: dict[str, NodeResult]
    ) -> list[str]:
        """Fill ``scores``, ``weighted`` and ``score`` of ``results`` for ``nodes``; the plugins
        that scored."""
        per_plugin, totals, weight_sum = self.weighted_scores(cycle, pod, nodes)
        for plugin, scores in per_plugin.items():
            for name, s in scores.items():
                results[name].scores[plugin] = s
        for name, total in totals.items():
            results[name].weighted = total
            results[name].score = total // weight_sum if weight_sum > 0 else 0
        return list(per_plugin)

    def resolve(
        self, snapshot: Snapshot, node_names: Sequence[str] | None
    ) -> tuple[list[NodeInfo], list[str]]:
        """The snapshot's nodes of ``node_names`` (default: all), and the names it lacks."""
        if node_names is None:
            return list(snapshot.nodes.values()), []
        got = list(map(snapshot.nodes.get, node_names))
        found = [n for n in got if n is not None]
        if len(found) == len(got):
            return found, []
        nodes: list[NodeInfo] = []
        missing: list[str] = []
        get = snapshot.nodes.get
        for name in node_names:
            node = get(name)
            if node is None:
                missing.append(name)
            else:
                nodes.append(node)
        return nodes, missing

    def evaluate(
        self,
        snapshot: Snapshot,
        pod: PodInfo,
        *,
        now: float | None = None,
        node_names: Sequence[str] | None = None,
        all_verdicts: bool = False,
        cycle: Cycle | None = None,
    ) -> Evaluation:
        """Filter then score ``pod`` over ``node_names`` (default: every node of the snapshot;
        unknown names are infeasible with reason ``node(s) not found``)."""
        cycle = cycle or self.new_cycle(snapshot, now)
        nodes, missing = self.resolve(snapshot, node_names)
        results = self.filter(cycle, pod, nodes, all_verdicts=all_verdicts)
        feasible = [n for n in nodes if results[n.name].feasible]
        scoring = self.score(cycle, pod, feasible, results)
        for name in missing:
            results[name] = NodeResult(False, [ERR_NODE_NOT_FOUND])
        return Evaluation(results, scoring)

    def reserve(self, cycle: Cycle, pod: PodInfo, node_name: str) -> dict[str, str]:
        """Reserve ``pod`` on ``node_name`` in every plugin and assume it in the snapshot;
        the annotations to patch on the pod. Raises :class:`ReserveError` after unreserving."""
        node = cycle.snapshot.nodes[node_name]
        done: list[Plugin] = []
        annotations: dict[str, str] = {}
        try:
            for plugin in self.plugins:
                annotations.update(plugin.reserve(cycle, pod, node))
                done.append(plugin)
        except ReserveError:
            for plugin in reversed(done):
                plugin.unreserve(cycle, pod, node)
            raise
        pod.annotations.update(annotations)
        cycle.snapshot.assume(pod, node_name)
        return annotations

    def unreserve(self, cycle: Cycle, pod: PodInfo, node_name: str) -> PodInfo | None:
        """Undo :meth:`reserve`: forget the pod in the snapshot (:meth:`Snapshot.forget`:
        pending again, unless it was deleted or seen bound meanwhile), then unreserve the
        plugins in reverse order (unless the node is gone); the pod to retry, or ``None``."""
        pending = cycle.snapshot.forget(pod)
        node = cycle.snapshot.nodes.get(node_name)
        if node is not None:
            for plugin in reversed(self.plugins):
                plugin.unreserve(cycle, pod, node)
        return pending
