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
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from apis.cpulist import format_cpulist, parse_cpulist
from apis.extension import ANNOTATION_RESOURCE_STATUS
from apis.priority import PRIORITY_PROD
from apis.quantity import format_bytes, format_cpu
from apis.scheduling_keys import (
    ANNOTATION_RESOURCE_SPEC,
    LABEL_NODE_CPU_BIND_POLICY,
    LABEL_NUMA_ALLOCATE_STRATEGY,
    LABEL_NUMA_TOPOLOGY_POLICY,
)
from scheduler_plugins.args import ArgsReader
from scheduler_plugins.errors import InputError
from scheduler_plugins.framework import Cycle, Plugin, ReserveError
from scheduler_plugins.plugins.cpuaccumulator import (
    FULL_PCPUS,
    SPREAD_BY_PCPUS,
    Topology,
    take_cpus,
)
from scheduler_plugins.snapshot import NodeInfo, PodInfo, ResourceList, parse_resource_list

NAME = "NodeNUMAResource"
ERR_NOT_MATCH_NUMA = "node(s) NUMA Topology policy not match"
ERR_INVALID_REQUESTED_CPUS = "the requested CPUs must be integer"
ERR_INVALID_CPU_TOPOLOGY = "node(s) invalid CPU Topology"
HINT_NO_NRT = " (the node has no NodeResourceTopology: is the koordlet running there?)"
"""Said after :data:`ERR_INVALID_CPU_TOPOLOGY` when the snapshot has no NRT for the node."""
HINT_NO_CPU_TOPOLOGY = (
    " (its NodeResourceTopology has no node.koordinator.sh/cpu-topology annotation)"
)
"""Said after :data:`ERR_INVALID_CPU_TOPOLOGY` when the NRT lacks the CPU topology."""
ERR_SMT_ALIGNMENT = "node(s) requested cpus not multiple cpus per core"
ERR_BIND_POLICY_CONFLICT = "node(s) cpu bind policy conflicts with pod's required cpu bind policy"
ERR_NOT_ENOUGH_CPUS = "not enough cpus available to satisfy request"


POLICY_NONE = ""
BEST_EFFORT = "BestEffort"
RESTRICTED = "Restricted"
SINGLE_NUMA_NODE = "SingleNUMANode"
_KUBELET_POLICIES = {
    "none": POLICY_NONE,
    "best-effort": BEST_EFFORT,
    "restricted": RESTRICTED,
    "single-numa-node": SINGLE_NUMA_NODE,
    "None": POLICY_NONE,
    "BestEffort": BEST_EFFORT,
    "Restricted": RESTRICTED,
    "SingleNUMANode": SINGLE_NUMA_NODE,
    "SingleNUMANodePodLevel": SINGLE_NUMA_NODE,
    "SingleNUMANodeContainerLevel": SINGLE_NUMA_NODE,
}
LEAST_ALLOCATED = "LeastAllocated"
MOST_ALLOCATED = "MostAllocated"
PCPU_LEVEL = "PCPULevel"
NUMA_NODE_LEVEL = "NUMANodeLevel"
_NUMA_RESOURCES = ("cpu", "memory")
_PLACEMENT_MEMO_SIZE = 16
"""Distinct pod needs remembered per node state."""


@dataclass(frozen=True, slots=True)
class NUMAArgs:
    """``NodeNUMAResourceArgs``."""

    default_cpu_bind_policy: str = FULL_PCPUS
    """``defaultCPUBindPolicy``: FullPCPUs or SpreadByPCPUs."""
    scoring_strategy: str = LEAST_ALLOCATED
    """``scoringStrategy.type``: LeastAllocated or MostAllocated."""
    resource_weights: Mapping[str, int] = field(default_factory=lambda: {"cpu": 1, "memory": 1})
    """``scoringStrategy.resources`` weights."""
    numa_allocate_strategy: str = MOST_ALLOCATED
    """Which NUMA node a pod lands on among equals (label
    ``node.koordinator.sh/numa-allocate-strategy`` overrides per node)."""


def parse_args(raw: Mapping[str, Any] | None, source: str) -> NUMAArgs:
    """Validate ``NodeNUMAResourceArgs``."""
    r = ArgsReader(raw, source, NAME)
    policy = r.string("defaultCPUBindPolicy", FULL_PCPUS, (FULL_PCPUS, SPREAD_BY_PCPUS))
    strategy = LEAST_ALLOCATED
    weights: dict[str, int] = {"cpu": 1, "memory": 1}
    sub = r.section("scoringStrategy")
    if sub is not None:
        strategy = sub.string("type", LEAST_ALLOCATED, (LEAST_ALLOCATED, MOST_ALLOCATED))
        resources = sub.args.get("resources")
        if resources is not None:
            if not isinstance(resources, list) or not resources:
                raise sub.fail("resources", "must be a non-empty list of {name, weight}")
            weights = {}
            for i, item in enumerate(resources):
                if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
                    raise sub.fail(f"resources[{i}]", "needs a name")
                w = item.get("weight", 1)
                if isinstance(w, bool) or not isinstance(w, int) or w < 0:
                    raise sub.fail(
                        f"resources[{i}].weight", f"must be a non-negative integer, got {w!r}"
                    )
                weights[item["name"]] = w
    numa = r.string("numaAllocateStrategy", MOST_ALLOCATED, (LEAST_ALLOCATED, MOST_ALLOCATED))
    return NUMAArgs(policy, strategy, weights, numa)


@dataclass(frozen=True, slots=True)
class _PodNeed:
    bind: bool
    cpus: int
    policy: str
    required: str
    exclusive: str
    error: str | None

    @property
    def key(self) -> tuple[Any, ...]:
        """The fields as a plain tuple (hashed in C, for the placement memo)."""
        return (self.bind, self.cpus, self.policy, self.required, self.exclusive)


@dataclass(slots=True)
class _NodeState:
    generation: int
    topo: Topology | None
    bind_policy: str
    numa_policy: str
    numa_strategy: str
    free_cpus: frozenset[int]
    pcpu_exclusive_cores: frozenset[tuple[int, int]]
    numa_exclusive_nodes: frozenset[int]
    numa_alloc: dict[int, ResourceList]
    numa_used: dict[int, ResourceList]


@dataclass(frozen=True, slots=True)
class _Placement:
    numa_nodes: tuple[int, ...]
    cpus: tuple[int, ...]
    per_numa: dict[int, ResourceList]


def pod_need(pod: PodInfo, args: NUMAArgs) -> _PodNeed:
    """What the pod asks of this plugin."""
    spec: dict[str, Any] = {}
    raw = pod.annotations.get(ANNOTATION_RESOURCE_SPEC)
    if raw:
        try:
            loaded = json.loads(raw)
            spec = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            spec = {}
    bind = pod.qos_label in ("LSE", "LSR") and pod.priority_class == PRIORITY_PROD
    milli = pod.requests.get("cpu", 0)
    required = str(spec.get("requiredCPUBindPolicy") or "")
    preferred = str(spec.get("preferredCPUBindPolicy") or "")
    policy = required or preferred
    if policy in ("", "Default"):
        policy = args.default_cpu_bind_policy
    error = ERR_INVALID_REQUESTED_CPUS if bind and (milli % 1000 != 0 or milli == 0) else None
    return _PodNeed(
        bind=bind,
        cpus=milli // 1000,
        policy=policy,
        required="" if required == "Default" else required,
        exclusive=str(spec.get("preferredCPUExclusivePolicy") or ""),
        error=error,
    )


def _resource_status(pod: PodInfo) -> dict[str, Any]:
    raw = pod.annotations.get(ANNOTATION_RESOURCE_STATUS)
    if not raw:
        return {}
    try:
        loaded = json.loads(raw)
    except ValueError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


class NodeNUMAResource(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self, args: NUMAArgs | None = None) -> None:
        self.args = args or NUMAArgs()
        self._cache: dict[str, _NodeState] = {}
        self._token: tuple[int, int] | None = None
        self._policy_nodes: frozenset[str] = frozenset()
        self._memo: dict[
            str, tuple[_NodeState, dict[tuple[tuple[Any, ...], int, int], _Placement | str | None]]
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

    def _state(self, cycle: Cycle, node: NodeInfo) -> _NodeState:
        nrt = cycle.snapshot.topologies.get(node.name)
        cached = self._cache.get(node.name)
        if cached is not None and cached.generation == node.generation:
            return cached
        topo = Topology.build(nrt.cpus) if nrt is not None and nrt.cpus else None
        bind_policy = node.labels.get(LABEL_NODE_CPU_BIND_POLICY, "")
        if not bind_policy and nrt is not None and nrt.kubelet_full_pcpus_only:
            bind_policy = "FullPCPUsOnly"
        numa_policy = node.labels.get(LABEL_NUMA_TOPOLOGY_POLICY)
        if numa_policy is None:
            numa_policy = POLICY_NONE
            if nrt is not None:
                for p in nrt.topology_policies:
                    numa_policy = _KUBELET_POLICIES.get(p, POLICY_NONE)
                    if numa_policy:
                        break
        else:
            numa_policy = _KUBELET_POLICIES.get(numa_policy, POLICY_NONE)
        used_cpus: set[int] = set()
        pcpu_cores: set[tuple[int, int]] = set()
        numa_excl: set[int] = set()
        numa_used: dict[int, ResourceList] = {}
        for pod in node.pods.values():
            status = _resource_status(pod)
            cpus: frozenset[int] = frozenset()
            try:
                cpus = parse_cpulist(str(status.get("cpuset") or ""))
            except ValueError:
                cpus = frozenset()
            used_cpus |= cpus
            for entry in status.get("numaNodeResources") or []:
                try:
                    nid = int(entry.get("node"))
                    res = entry.get("resources") or {}
                    rl = parse_resource_list(res, "pod " + pod.key, "numaNodeResources")
                except (ValueError, TypeError, AttributeError, InputError):
                    continue  # a foreign or broken status: the cpuset above still counts
                bucket = numa_used.setdefault(nid, {})
                for r, v in rl.items():
                    bucket[r] = bucket.get(r, 0) + v
            if cpus and topo is not None:
                excl = pod_need(pod, self.args).exclusive
                if excl == PCPU_LEVEL:
                    pcpu_cores |= {
                        (topo.cpus[c].socket, topo.cpus[c].core) for c in cpus if c in topo.cpus
                    }
                elif excl == NUMA_NODE_LEVEL:
                    numa_excl |= {topo.cpus[c].node for c in cpus if c in topo.cpus}
        free: frozenset[int] = frozenset()
        numa_alloc: dict[int, ResourceList] = {}
        if nrt is not None:
            for z in nrt.zones:
                numa_alloc[z.node] = dict(z.allocatable)
        if topo is not None:
            taken = (
                used_cpus
                | set(nrt.reserved_cpus if nrt else ())
                | set(nrt.kubelet_allocated if nrt else ())
            )
            free = frozenset(c for c in topo.cpus if c not in taken)
            for nid, ids in topo.numa_cpus.items():
                numa_alloc.setdefault(nid, {}).setdefault("cpu", len(ids) * 1000)
        state = _NodeState(
            generation=node.generation,
            topo=topo,
            bind_policy=bind_policy,
            numa_policy=numa_policy,
            numa_strategy=node.labels.get(
                LABEL_NUMA_ALLOCATE_STRATEGY, self.args.numa_allocate_strategy
            ),
            free_cpus=free,
            pcpu_exclusive_cores=frozenset(pcpu_cores),
            numa_exclusive_nodes=frozenset(numa_excl),
            numa_alloc=numa_alloc,
            numa_used=numa_used,
        )
        self._cache[node.name] = state
        return state

    # -- placement ------------------------------------------------------------------------

    def _place(
        self, cycle: Cycle, pod: PodInfo, node: NodeInfo, need: _PodNeed | None = None
    ) -> _Placement | str | None:
        """The placement on ``node``, a rejection reason, or ``None`` (nothing to place).

        A placement depends only on the node's state and on what the pod needs (its
        :class:`_PodNeed` and its cpu and memory requests), so it is remembered per node state:
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
        placed = self._compute_place(need, state, pod)
        if len(memo[1]) >= _PLACEMENT_MEMO_SIZE:
            memo[1].clear()
        memo[1][key] = placed
        return placed

    def _compute_place(
        self, need: _PodNeed, state: _NodeState, pod: PodInfo
    ) -> _Placement | str | None:
        policy = need.policy
        count = need.cpus
        topo = state.topo
        if need.bind:
            if topo is None or not topo.valid:
                return ERR_INVALID_CPU_TOPOLOGY + HINT_NO_CPU_TOPOLOGY
            if state.bind_policy == "FullPCPUsOnly":
                if need.required and need.required != FULL_PCPUS:
                    return ERR_BIND_POLICY_CONFLICT
                if count % topo.cpus_per_core != 0:
                    return ERR_SMT_ALIGNMENT
                policy = FULL_PCPUS
            elif state.bind_policy == SPREAD_BY_PCPUS:
                if need.required and need.required != SPREAD_BY_PCPUS:
                    return ERR_BIND_POLICY_CONFLICT
                policy = SPREAD_BY_PCPUS
        numa_ids = sorted(state.numa_alloc) or (sorted(topo.numa_cpus) if topo else [])
        # a NUMANodeLevel-exclusive pod prefers NUMA nodes no other such pod holds
        preferred_ids = numa_ids
        if need.bind and need.exclusive == NUMA_NODE_LEVEL:
            preferred_ids = [n for n in numa_ids if n not in state.numa_exclusive_nodes]
        request = {r: pod.requests.get(r, 0) for r in _NUMA_RESOURCES}

        def free_of(nid: int, r: str) -> int:
            if r == "cpu" and need.bind and topo is not None:
                return len(state.free_cpus & topo.numa_cpus.get(nid, frozenset())) * 1000
            return state.numa_alloc.get(nid, {}).get(r, 0) - state.numa_used.get(nid, {}).get(r, 0)

        def cap_of(nid: int, r: str) -> int:
            return state.numa_alloc.get(nid, {}).get(r, 0)

        def fits(mask: tuple[int, ...], get: Any) -> bool:
            return all(
                request[r] == 0 or sum(get(n, r) for n in mask) >= request[r]
                for r in _NUMA_RESOURCES
            )

        def free_total(mask: tuple[int, ...]) -> int:
            return sum(free_of(n, "cpu") for n in mask)

        chosen: tuple[int, ...] | None = None
        if state.numa_policy and numa_ids:
            widest = len(numa_ids)
            min_width = next(
                (
                    w
                    for w in range(1, widest + 1)
                    for m in combinations(numa_ids, w)
                    if fits(m, cap_of)
                ),
                widest,
            )
            most = state.numa_strategy == MOST_ALLOCATED
            for width in range(1, widest + 1):
                hints = [m for m in combinations(numa_ids, width) if fits(m, free_of)]
                if hints:
                    hints.sort(
                        key=lambda m: (
                            any(n not in preferred_ids for n in m),
                            free_total(m) if most else -free_total(m),
                            m,
                        )
                    )
                    chosen = hints[0]
                    break
            if state.numa_policy == SINGLE_NUMA_NODE and (chosen is None or len(chosen) != 1):
                return ERR_NOT_MATCH_NUMA
            if state.numa_policy == RESTRICTED and (chosen is None or len(chosen) > min_width):
                return ERR_NOT_MATCH_NUMA
            if chosen is None:  # BestEffort: place anyway, across every NUMA node
                chosen = tuple(numa_ids)
        cpus: list[int] = []
        if need.bind and topo is not None:
            available = state.free_cpus
            if chosen is not None:  # the NUMA nodes the topology policy chose
                allowed = frozenset().union(*(topo.numa_cpus.get(n, frozenset()) for n in chosen))
                available = available & allowed
            got = take_cpus(
                topo,
                available,
                count,
                policy,
                exclusive_policy=need.exclusive,
                exclusive_cores=state.pcpu_exclusive_cores,
                exclusive_numa=state.numa_exclusive_nodes,
                strategy=state.numa_strategy,
            )
            if got is None:
                return ERR_NOT_ENOUGH_CPUS
            cpus = sorted(got)
        per_numa: dict[int, ResourceList] = {}
        if chosen is not None:
            for r in _NUMA_RESOURCES:
                left = request[r]
                if r == "cpu" and need.bind and topo is not None:
                    for n in chosen:
                        k = sum(1 for c in cpus if topo.cpus[c].node == n)
                        if k:
                            per_numa.setdefault(n, {})["cpu"] = k * 1000
                    continue
                for n in chosen:
                    if left <= 0:
                        break
                    take = min(left, max(free_of(n, r), 0)) if n != chosen[-1] else left
                    if take > 0:
                        per_numa.setdefault(n, {})[r] = take
                        left -= take
        return _Placement(chosen or (), tuple(cpus), per_numa)

    def _need(self, cycle: Cycle, pod: PodInfo) -> _PodNeed:
        key = f"{NAME}/need/{pod.uid}"
        need = cycle.data.get(key)
        if need is None:
            need = pod_need(pod, self.args)
            cycle.data[key] = need
        assert isinstance(need, _PodNeed)
        return need

    def _placements(self, cycle: Cycle) -> dict[str, _Placement | str | None]:
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
        for node in nodes:
            name = node.name
            if bind:
                if name not in bindable:
                    hint = HINT_NO_CPU_TOPOLOGY if name in topologies else HINT_NO_NRT
                    placements[name] = out[name] = ERR_INVALID_CPU_TOPOLOGY + hint
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
            if isinstance(placed, _Placement) and placed.numa_nodes:
                state = self._state(cycle, node)
                for r, w in weights.items():
                    alloc = sum(state.numa_alloc.get(n, {}).get(r, 0) for n in placed.numa_nodes)
                    used = sum(state.numa_used.get(n, {}).get(r, 0) for n in placed.numa_nodes)
                    total += w * _resource_score(used + pod.requests.get(r, 0), alloc, most)
            else:
                for r, w in weights.items():
                    alloc = node.allocatable.get(r, 0)
                    used = node.requested.get(r, 0) + pod.requests.get(r, 0)
                    total += w * _resource_score(used, alloc, most)
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


def _resource_score(used: int, alloc: int, most: bool) -> int:
    if alloc <= 0:
        return 0
    if used > alloc:
        return 0
    if most:
        return used * 100 // alloc
    return (alloc - used) * 100 // alloc


def build(args: Mapping[str, Any] | None, source: str) -> NodeNUMAResource:
    """Factory for the plugin table."""
    return NodeNUMAResource(parse_args(args, source))
