"""NodeResourcesFit: the pod's requests fit the node's allocatable, batch and mid included.

kube-scheduler's NodeResourcesFit (``pkg/scheduler/framework/plugins/noderesources/fit.go``):

- **Filter** over every resource the pod requests: ``cpu``, ``memory``, extended resources
  (which is how Koordinator's ``kubernetes.io/batch-cpu``, ``batch-memory``, ``mid-cpu`` and
  ``mid-memory`` requests are checked against what koord-manager wrote on the node) and one more
  pod. ``requested + request > allocatable`` rejects with kube-scheduler's words,
  ``Insufficient kubernetes.io/batch-cpu``, or ``Too many pods`` when the node's pod count is
  full. Resources the Reservation plugin holds for this pod's owner on the node count as free for
  it, and what they hold for others counts as used (:data:`RESERVATION_ADJUST_KEY`).
- **Score** (``scoringStrategy``, default ``LeastAllocated`` over cpu and memory, weight 1
  each): per resource ``(allocatable - requested) * 100 // allocatable`` (``MostAllocated``:
  ``requested * 100 // allocatable``), with cpu and memory counted as kube-scheduler scores them
  (a container without a request counts 100m cpu and 200 MiB), weighted mean over the resources
  the node has. Default weight 1. The extender's table runs the filter only
  (:func:`build_filter_only`): there kube-scheduler scores resources itself.

Resources named ``koordinator.sh/gpu-*`` and ``nvidia.com/gpu`` are left to DeviceShare, which
places them on a device.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

from apis.scheduling_keys import DEVICE_RESOURCES
from scheduler_plugins.args import ArgsReader
from scheduler_plugins.framework import MAX_NODE_SCORE, RESERVATION_ADJUST_KEY, Cycle, Plugin
from scheduler_plugins.plugins.nodecache import Changes, NodeMemo
from scheduler_plugins.snapshot import NodeInfo, PodInfo

NAME = "NodeResourcesFit"
ERR_TOO_MANY_PODS = "Too many pods"
"""kube-scheduler's reason when the node's ``pods`` allocatable is full."""
LEAST_ALLOCATED = "LeastAllocated"
MOST_ALLOCATED = "MostAllocated"


class NodeResourcesFit(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(
        self,
        ignored: Sequence[str] = DEVICE_RESOURCES,
        *,
        strategy: str | None = LEAST_ALLOCATED,
        weights: Mapping[str, int] | None = None,
    ) -> None:
        self.ignored = frozenset(ignored)
        self.strategy = strategy
        """``scoringStrategy.type``; ``None``: filter only (the extender)."""
        self.weights = dict(weights or {"cpu": 1, "memory": 1})
        """``scoringStrategy.resources``: resource → weight."""
        self._scores: NodeMemo[int] = NodeMemo()
        """Scores per pod shape (what it requests of the weighted resources)."""
        self._changes = Changes()
        self._free: dict[str, tuple[list[int], list[str]]] = {}
        self._free_of: dict[str, dict[str, int]] = {}

    def warm(self, cycle: Cycle) -> None:
        """Index the snapshot (the extender calls this after loading one)."""
        self._prepare(cycle)
        for r in ("cpu", "memory", "pods"):
            self._index(cycle, r)

    def _prepare(self, cycle: Cycle) -> None:
        """Re-index the nodes the snapshot's change log names (everything after a new snapshot
        or a gap in the log)."""
        snap = cycle.snapshot
        names = self._changes.poll(snap)
        if names is None:
            self._free.clear()
            self._free_of.clear()
        else:
            for name in names:
                node = snap.nodes.get(name)
                for resource, (keys, names_sorted) in self._free.items():
                    of = self._free_of[resource]
                    old = of.pop(name, None)
                    if old is not None:
                        # equal keys keep their names sorted: bisect the run, not walk it
                        k = bisect_left(
                            names_sorted, name, bisect_left(keys, old), bisect_right(keys, old)
                        )
                        del keys[k]
                        del names_sorted[k]
                    if node is not None and (resource != "pods" or resource in node.allocatable):
                        free = node.allocatable.get(resource, 0) - node.requested.get(resource, 0)
                        k = bisect_left(
                            names_sorted, name, bisect_left(keys, free), bisect_right(keys, free)
                        )
                        keys.insert(k, free)
                        names_sorted.insert(k, name)
                        of[name] = free

    def _index(self, cycle: Cycle, resource: str) -> tuple[list[int], list[str]]:
        """Nodes sorted by what they have left of ``resource`` (``pods``: only nodes that
        declare a pod limit), built on first use and then kept up to date."""
        index = self._free.get(resource)
        if index is None:
            rows = sorted(
                (n.allocatable.get(resource, 0) - n.requested.get(resource, 0), n.name)
                for n in cycle.snapshot.nodes.values()
                if resource != "pods" or resource in n.allocatable
            )
            index = ([f for f, _ in rows], [name for _, name in rows])
            self._free[resource] = index
            self._free_of[resource] = {name: f for f, name in rows}
        return index

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        self._prepare(cycle)
        wanted = [(r, v) for r, v in pod.requests.items() if v > 0 and r not in self.ignored]
        wanted.append(("pods", 1))
        adjust: Mapping[str, Mapping[str, int]] = cycle.data.get(RESERVATION_ADJUST_KEY, {})
        prefixes = []
        for r, v in wanted:
            keys, names = self._index(cycle, r)
            prefixes.append((r, names, bisect_left(keys, v)))
        if sum(k for _, _, k in prefixes) > 2 * len(nodes):
            # more nodes fail somewhere than are asked about (a few nodes, a big pod): check
            # the nodes asked about one by one
            return self._check_each(nodes, wanted, adjust)
        candidates: set[str] | None = None
        if len(nodes) != len(cycle.snapshot.nodes):
            candidates = {n.name for n in nodes}
        out: dict[str, str] = {}
        for r, names, k in prefixes:
            for name in names[:k]:
                if (
                    name in out
                    or name in adjust
                    or (candidates is not None and name not in candidates)
                ):
                    continue
                out[name] = _insufficient(r)
        # nodes where a Reservation changes what is free for this pod: checked one by one
        for name, extra in adjust.items():
            node = cycle.snapshot.nodes.get(name)
            if node is None or name in out or (candidates is not None and name not in candidates):
                continue
            for r, v in wanted:
                if r == "pods" and r not in node.allocatable:
                    continue
                free = node.allocatable.get(r, 0) - node.requested.get(r, 0) + extra.get(r, 0)
                if v > free:
                    out[name] = _insufficient(r)
                    break
        return out

    @staticmethod
    def _check_each(
        nodes: Sequence[NodeInfo],
        wanted: Sequence[tuple[str, int]],
        adjust: Mapping[str, Mapping[str, int]],
    ) -> dict[str, str]:
        out: dict[str, str] = {}
        for node in nodes:
            extra = adjust.get(node.name, {})
            alloc, requested = node.allocatable, node.requested
            for r, v in wanted:
                if r == "pods" and r not in alloc:
                    continue
                if v > alloc.get(r, 0) - requested.get(r, 0) + extra.get(r, 0):
                    out[node.name] = _insufficient(r)
                    break
        return out

    def might_help(
        self, cycle: Cycle, pod: PodInfo, node: NodeInfo, victims: Sequence[PodInfo]
    ) -> bool:
        """Whether the node's allocatable holds the pod once ``victims`` are gone."""
        extra: Mapping[str, int] = cycle.data.get(RESERVATION_ADJUST_KEY, {}).get(node.name, {})
        wanted = [(r, v) for r, v in pod.requests.items() if v > 0 and r not in self.ignored]
        wanted.append(("pods", 1))
        for r, v in wanted:
            if r == "pods" and r not in node.allocatable:
                continue
            freed = len(victims) if r == "pods" else sum(p.requests.get(r, 0) for p in victims)
            free = node.allocatable.get(r, 0) - node.requested.get(r, 0) + extra.get(r, 0)
            if v > free + freed:
                return False
        return True

    def score_nodes(
        self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]
    ) -> dict[str, int] | None:
        if self.strategy is None:
            return None
        weights = [(r, w) for r, w in self.weights.items() if w > 0]
        nz_cpu, nz_mem = pod.non_zero
        want = tuple(
            nz_cpu if r == "cpu" else nz_mem if r == "memory" else pod.requests.get(r, 0)
            for r, _ in weights
        )
        return self._scores.values(want, nodes, lambda node: self._score(node, weights, want))

    def _score(
        self, node: NodeInfo, weights: Sequence[tuple[str, int]], want: Sequence[int]
    ) -> int:
        most = self.strategy == MOST_ALLOCATED
        alloc = node.allocatable
        total = wsum = 0
        for (r, w), v in zip(weights, want, strict=True):
            a = alloc.get(r, 0)
            if a <= 0:
                continue
            if r == "cpu":
                req = node.non_zero_requested[0] + v
            elif r == "memory":
                req = node.non_zero_requested[1] + v
            else:
                req = node.requested.get(r, 0) + v
            if most:
                s = min(req, a) * MAX_NODE_SCORE // a
            else:
                s = (a - req) * MAX_NODE_SCORE // a if req <= a else 0
            total += s * w
            wsum += w
        return total // wsum if wsum else 0


def _insufficient(resource: str) -> str:
    return ERR_TOO_MANY_PODS if resource == "pods" else f"Insufficient {resource}"


def parse_scoring(
    args: Mapping[str, Any] | None, source: str
) -> tuple[str, dict[str, int], tuple[str, ...]]:
    """``NodeResourcesFitArgs``: the scoring strategy, its resource weights and
    ``ignoredResources``. Raises :class:`~scheduler_plugins.errors.PluginArgsError`."""
    r = ArgsReader(args, source, NAME)
    strategy, weights = r.scoring_strategy(max_weight=100)
    ignored = r.args.get("ignoredResources") or []
    if not isinstance(ignored, list) or not all(isinstance(x, str) for x in ignored):
        raise r.fail("ignoredResources", "must be a list of resource names")
    return strategy, weights, tuple(ignored)


def build(args: Mapping[str, Any] | None, source: str) -> NodeResourcesFit:
    """Factory for the plugin table (``NodeResourcesFitArgs``)."""
    strategy, weights, ignored = parse_scoring(args, source)
    return NodeResourcesFit((*DEVICE_RESOURCES, *ignored), strategy=strategy, weights=weights)


def build_filter_only(args: Mapping[str, Any] | None, source: str) -> NodeResourcesFit:
    """Factory for the extender's table: the filter (batch, mid and reserved resources), no
    score (kube-scheduler's own NodeResourcesFit scores)."""
    _, _, ignored = parse_scoring(args, source)
    return NodeResourcesFit((*DEVICE_RESOURCES, *ignored), strategy=None)
