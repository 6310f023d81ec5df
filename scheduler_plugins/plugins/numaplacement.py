"""NodeNUMAResource's rules: its args, what a pod asks of it, each node's CPU and NUMA state, and
where a pod goes on one node (pure: :mod:`scheduler_plugins.plugins.nodenumaresource` caches the
states and memoizes the placements per node, and runs the framework's steps; its docstring has
the semantics).

Upstream: ``pkg/scheduler/plugins/nodenumaresource`` (``NodeNUMAResourceArgs``, the pod's
``resource-spec``, the kubelet topology manager's hints at pod scope); the CPUs are chosen by
:mod:`scheduler_plugins.plugins.cpuaccumulator`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from apis.cpulist import parse_cpulist
from apis.extension import ANNOTATION_RESOURCE_STATUS
from apis.priority import PRIORITY_PROD
from apis.records import frozen
from apis.scheduling_keys import (
    ANNOTATION_RESOURCE_SPEC,
    LABEL_NODE_CPU_BIND_POLICY,
    LABEL_NUMA_ALLOCATE_STRATEGY,
    LABEL_NUMA_TOPOLOGY_POLICY,
)
from scheduler_plugins.args import ArgsReader
from scheduler_plugins.errors import InputError
from scheduler_plugins.nodeviews import NRTInfo
from scheduler_plugins.objectfields import ResourceList, parse_resource_list
from scheduler_plugins.plugins.cpuaccumulator import (
    FULL_PCPUS,
    SPREAD_BY_PCPUS,
    Topology,
    take_cpus,
)
from scheduler_plugins.snapshot import NodeInfo, PodInfo

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


@frozen
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
    strategy, weights = r.scoring_strategy(max_weight=None)
    numa = r.string("numaAllocateStrategy", MOST_ALLOCATED, (LEAST_ALLOCATED, MOST_ALLOCATED))
    return NUMAArgs(policy, strategy, weights, numa)


@frozen
class PodNeed:
    """What a pod asks of the plugin: a cpuset or not, how many CPUs, its bind and exclusive
    policies; ``error`` refuses it at pre-filter."""

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
class NodeState:
    """One node as the plugin sees it (see :func:`node_state`)."""

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


@frozen
class Placement:
    """Where a pod goes on one node."""

    numa_nodes: tuple[int, ...]
    cpus: tuple[int, ...]
    per_numa: dict[int, ResourceList]


def pod_need(pod: PodInfo, args: NUMAArgs) -> PodNeed:
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
    return PodNeed(
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


def node_state(node: NodeInfo, nrt: NRTInfo | None, args: NUMAArgs) -> NodeState:
    """The node's CPU and NUMA state: its CPU topology and bind policy, its NUMA policy and
    allocate strategy, the free CPUs, what exclusive pods hold, and each NUMA node's
    allocatable and used resources (from the pods' resource-status)."""
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
            excl = pod_need(pod, args).exclusive
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
    return NodeState(
        generation=node.generation,
        topo=topo,
        bind_policy=bind_policy,
        numa_policy=numa_policy,
        numa_strategy=node.labels.get(LABEL_NUMA_ALLOCATE_STRATEGY, args.numa_allocate_strategy),
        free_cpus=free,
        pcpu_exclusive_cores=frozenset(pcpu_cores),
        numa_exclusive_nodes=frozenset(numa_excl),
        numa_alloc=numa_alloc,
        numa_used=numa_used,
    )


def compute_placement(need: PodNeed, state: NodeState, pod: PodInfo) -> Placement | str | None:
    """The placement of ``pod`` on a node in ``state``: the NUMA nodes its topology policy
    chooses, the CPUs it binds and its resources per NUMA node; a rejection reason; or ``None``
    (nothing to place)."""
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
            request[r] == 0 or sum(get(n, r) for n in mask) >= request[r] for r in _NUMA_RESOURCES
        )

    def free_total(mask: tuple[int, ...]) -> int:
        return sum(free_of(n, "cpu") for n in mask)

    chosen: tuple[int, ...] | None = None
    if state.numa_policy and numa_ids:
        widest = len(numa_ids)
        min_width = next(
            (w for w in range(1, widest + 1) for m in combinations(numa_ids, w) if fits(m, cap_of)),
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
    return Placement(chosen or (), tuple(cpus), per_numa)


def resource_score(used: int, alloc: int, most: bool) -> int:
    """LeastAllocated (or, ``most``, MostAllocated) score of one resource, 0..100."""
    if alloc <= 0:
        return 0
    if used > alloc:
        return 0
    if most:
        return used * 100 // alloc
    return (alloc - used) * 100 // alloc
