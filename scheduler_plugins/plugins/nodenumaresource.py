"""NodeNUMAResource: CPU orchestration (cpusets for LSE/LSR pods) and NUMA alignment.

Koordinator's semantics (``pkg/scheduler/plugins/nodenumaresource``), re-implemented:

- **Who gets a cpuset.** A pod labelled ``koordinator.sh/qosClass`` LSE or LSR with priority
  class koord-prod; its CPU request must be whole cores (``the requested CPUs must be integer``
  otherwise). Its bind policy is ``requiredCPUBindPolicy``, else ``preferredCPUBindPolicy`` of
  the ``scheduling.koordinator.sh/resource-spec`` annotation, else the args'
  ``defaultCPUBindPolicy`` (FullPCPUs); ``preferredCPUExclusivePolicy`` (PCPULevel,
  NUMANodeLevel) keeps it apart from other exclusive pods.
- **Node CPU bind policy** (label ``node.koordinator.sh/cpu-bind-policy``, or the kubelet's
  static policy with ``full-pcpus-only`` in the NRT's ``kubelet.koordinator.sh/cpu-manager-
  policy``): FullPCPUsOnly needs a multiple of the threads per core
  (``node(s) requested cpus not multiple cpus per core``) and forces FullPCPUs; SpreadByPCPUs
  forces spreading; a pod whose *required* policy differs is rejected
  (``node(s) cpu bind policy conflicts with pod's required cpu bind policy``).
- **NUMA topology policy** (label ``node.koordinator.sh/numa-topology-policy``, else the NRT's
  ``topologyPolicies``): None, BestEffort, Restricted, SingleNUMANode, as the kubelet's topology
  manager at pod scope: among the sets of NUMA nodes that can hold the pod's cpu and memory now,
  the narrowest is chosen; Restricted needs it to be as narrow as the node's capacity allows,
  SingleNUMANode needs one NUMA node (``node(s) NUMA Topology policy not match``). Nodes with a
  policy place every pod (cpuset or not) on NUMA nodes.
- **CPU topology.** From the NodeResourceTopology (``node.koordinator.sh/cpu-topology``); a pod
  that needs a cpuset cannot go to a node without one (``node(s) invalid CPU Topology``). Free
  CPUs are all CPUs less the kubelet's reserved CPUs, the kubelet's pinned pods
  (``node.koordinator.sh/pod-cpu-allocs``) and the cpusets of the pods' resource-status.
  Too few: ``not enough cpus available to satisfy request``.
- **Score.** ``scoringStrategy`` LeastAllocated (default) or MostAllocated over cpu and memory
  (weights 1), at NUMA level on the chosen NUMA nodes for nodes with a NUMA policy, at node
  level otherwise. The plugin takes no part for pods without a cpuset when no candidate node
  has a NUMA policy.
- **Reserve** returns ``scheduling.koordinator.sh/resource-status``: ``{"cpuset": "0-3",
  "numaNodeResources": [{"node": 0, "resources": {"cpu": "4", "memory": "8Gi"}}]}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from apis.cpulist import format_cpulist
from apis.extension import ANNOTATION_RESOURCE_STATUS
from apis.quantity import format_bytes, format_cpu
from scheduler_plugins.framework import Cycle, Plugin, ReserveError
from scheduler_plugins.plugins.numaplacement import (
    ERR_INVALID_CPU_TOPOLOGY,
    HINT_NO_CPU_TOPOLOGY,
    HINT_NO_NRT,
    MOST_ALLOCATED,
    NodeState,
    NUMAArgs,
    Placement,
    PodNeed,
    compute_placement,
    node_state,
    parse_args,
    pod_need,
    resource_score,
)
from scheduler_plugins.plugins.numaplacement import (
    NAME as NAME,
)
from scheduler_plugins.snapshot import NodeInfo, PodInfo

_NO_CPU_TOPOLOGY = ERR_INVALID_CPU_TOPOLOGY + HINT_NO_CPU_TOPOLOGY
_NO_NRT = ERR_INVALID_CPU_TOPOLOGY + HINT_NO_NRT
"""The reasons of a node without a CPU topology, built once (a cpu-binding pod fails on
thousands of nodes)."""
_PLACEMENT_MEMO_SIZE = 16
"""Distinct pod needs remembered per node state."""


class NodeNUMAResource(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self, args: NUMAArgs | None = None) -> None:
        self.args = args or NUMAArgs()
        self._cache: dict[str, NodeState] = {}
        self._token: tuple[int, int] | None = None
        self._policy_nodes: frozenset[str] = frozenset()
        self._memo: dict[
            str, tuple[NodeState, dict[tuple[tuple[Any, ...], int, int], Placement | str | None]]
        ] = {}
        """Node name → (the state placements were computed on, placement by pod need)."""
        self._bindable_nodes: frozenset[str] = frozenset()
        """Nodes with a valid CPU topology (the only ones a cpu-binding pod can use)."""

    def warm(self, cycle: Cycle) -> None:
        """Precompute every node (the extender calls this after loading a snapshot)."""
        self._prepare(cycle)

    def _prepare(self, cycle: Cycle) -> frozenset[str]:
        """Refresh the per-node states of the nodes the snapshot's change log names (all after
        a new snapshot or a gap); the nodes with a NUMA policy."""
        snap = cycle.snapshot
        token = (id(snap), snap.generation)
        if token == self._token:
            return self._policy_nodes
        names = None
        if self._token is not None and self._token[0] == id(snap):
            names = snap.changed_since(self._token[1])
        if names is None:
            self._cache.clear()
            self._memo.clear()
            states = [(name, self._state(cycle, node)) for name, node in snap.nodes.items()]
            self._policy_nodes = frozenset(name for name, st in states if st.numa_policy)
            self._bindable_nodes = frozenset(
                name for name, st in states if st.topo is not None and st.topo.valid
            )
        else:
            policy = set(self._policy_nodes)
            bindable = set(self._bindable_nodes)
            for name in names:
                self._cache.pop(name, None)  # its pods or its NRT changed
                self._memo.pop(name, None)
                node = snap.nodes.get(name)
                st = self._state(cycle, node) if node is not None else None
                if st is not None and st.numa_policy:
                    policy.add(name)
                else:
                    policy.discard(name)
                if st is not None and st.topo is not None and st.topo.valid:
                    bindable.add(name)
                else:
                    bindable.discard(name)
            self._policy_nodes = frozenset(policy)
            self._bindable_nodes = frozenset(bindable)
        self._token = token
        return self._policy_nodes

    # -- node state ---------------------------------------------------------------------------

    def _state(self, cycle: Cycle, node: NodeInfo) -> NodeState:
        nrt = cycle.snapshot.topologies.get(node.name)
        cached = self._cache.get(node.name)
        if cached is not None and cached.generation == node.generation:
            return cached
        state = node_state(node, nrt, self.args)
        self._cache[node.name] = state
        return state

    # -- placement ------------------------------------------------------------------------

    def _place(
        self, cycle: Cycle, pod: PodInfo, node: NodeInfo, need: PodNeed | None = None
    ) -> Placement | str | None:
        """The placement on ``node``, a rejection reason, or ``None`` (nothing to place).

        A placement depends only on the node's state and on what the pod needs (its
        :class:`PodNeed` and its cpu and memory requests), so it is remembered per node state:
        pods alike (a Deployment's replicas) are placed once per node until that node changes."""
        if need is None:
            need = self._need(cycle, pod)
        state = self._state(cycle, node)
        if not need.bind and not state.numa_policy:
            return None
        requests = pod.requests
        key = (need.key, requests.get("cpu", 0), requests.get("memory", 0))
        memo = self._memo.get(node.name)
        if memo is None or memo[0] is not state:
            memo = (state, {})
            self._memo[node.name] = memo
        elif key in memo[1]:
            return memo[1][key]
        placed = compute_placement(need, state, pod)
        if len(memo[1]) >= _PLACEMENT_MEMO_SIZE:
            memo[1].clear()
        memo[1][key] = placed
        return placed

    def _need(self, cycle: Cycle, pod: PodInfo) -> PodNeed:
        key = f"{NAME}/need/{pod.uid}"
        need = cycle.data.get(key)
        if need is None:
            need = pod_need(pod, self.args)
            cycle.data[key] = need
        assert isinstance(need, PodNeed)
        return need

    def _placements(self, cycle: Cycle) -> dict[str, Placement | str | None]:
        return cycle.data.setdefault(f"{NAME}/placements", {})  # type: ignore[no-any-return]

    # -- steps ------------------------------------------------------------------------------

    def pre_filter(self, cycle: Cycle, pod: PodInfo) -> str | None:
        return self._need(cycle, pod).error

    def possible_nodes(self, cycle: Cycle, pod: PodInfo) -> frozenset[str] | None:
        """A cpu-binding pod can only land on a node with a valid CPU topology."""
        if not self._need(cycle, pod).bind:
            return None
        self._prepare(cycle)
        return self._bindable_nodes

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        need = self._need(cycle, pod)
        policy_nodes = self._prepare(cycle)
        out: dict[str, str] = {}
        if not need.bind and not policy_nodes:
            return out
        placements = self._placements(cycle)
        bind = need.bind
        # a pod that binds cpus fails at once on a node without a valid CPU topology
        bindable = self._bindable_nodes if bind else frozenset()
        topologies = cycle.snapshot.topologies
        for node, name in zip(nodes, cycle.names_only(nodes), strict=True):
            if bind:
                if name not in bindable:
                    reason = _NO_CPU_TOPOLOGY if name in topologies else _NO_NRT
                    placements[name] = out[name] = reason
                    continue
            elif name not in policy_nodes:
                continue
            placed = self._place(cycle, pod, node, need)
            placements[name] = placed
            if isinstance(placed, str):
                out[name] = placed
        return out

    def score_nodes(
        self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]
    ) -> dict[str, int] | None:
        need = self._need(cycle, pod)
        policy_nodes = self._prepare(cycle)
        if not need.bind and (not policy_nodes or not any(n.name in policy_nodes for n in nodes)):
            return None
        placements = self._placements(cycle)
        most = self.args.scoring_strategy == MOST_ALLOCATED
        weights = {r: w for r, w in self.args.resource_weights.items() if w > 0}
        wsum = sum(weights.values()) or 1
        out: dict[str, int] = {}
        for node in nodes:
            placed = placements.get(node.name)
            if placed is None and node.name not in placements:
                placed = self._place(cycle, pod, node)
            total = 0
            if isinstance(placed, Placement) and placed.numa_nodes:
                state = self._state(cycle, node)
                for r, w in weights.items():
                    alloc = sum(state.numa_alloc.get(n, {}).get(r, 0) for n in placed.numa_nodes)
                    used = sum(state.numa_used.get(n, {}).get(r, 0) for n in placed.numa_nodes)
                    total += w * resource_score(used + pod.requests.get(r, 0), alloc, most)
            else:
                for r, w in weights.items():
                    alloc = node.allocatable.get(r, 0)
                    used = node.requested.get(r, 0) + pod.requests.get(r, 0)
                    total += w * resource_score(used, alloc, most)
            out[node.name] = total // wsum
        return out

    def reserve(self, cycle: Cycle, pod: PodInfo, node: NodeInfo) -> dict[str, str]:
        placed = self._place(cycle, pod, node)
        if placed is None:
            return {}
        if isinstance(placed, str):
            raise ReserveError(f"{NAME}: {placed}")
        status: dict[str, Any] = {}
        if placed.cpus:
            status["cpuset"] = format_cpulist(placed.cpus)
        if placed.per_numa:
            status["numaNodeResources"] = [
                {
                    "node": n,
                    "resources": {
                        r: (format_cpu(v / 1000) if r == "cpu" else format_bytes(v))
                        for r, v in sorted(res.items())
                    },
                }
                for n, res in sorted(placed.per_numa.items())
            ]
        if not status:
            return {}
        return {ANNOTATION_RESOURCE_STATUS: json.dumps(status, separators=(",", ":"))}


def build(args: Mapping[str, Any] | None, source: str) -> NodeNUMAResource:
    """Factory for the plugin table."""
    return NodeNUMAResource(parse_args(args, source))
