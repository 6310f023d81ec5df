"""The node's CPU share pools and a pod's CPU allocation, as the cpuset hook reads them.

**Share pools.** Koordinator's koordlet publishes, in the NodeResourceTopology annotation
``node.koordinator.sh/cpu-shared-pools``, one pool per NUMA node: its CPUs less the kubelet's
reserved CPUs and less the cpusets of LSE and LSR pods (``[{"socket": 0, "node": 0, "cpuset":
"2-7"}]``, upstream ``apis/extension`` ``CPUSharedPool``); the cpuset hook reads it back
(``hooks/cpuset/rule.go``: ``parseRule``). Here :func:`share_pools_of` computes the same pools
from the node-info collector's value and the pods on the node, as the topology reporter computes
the annotation (``koordlet.reporter.topology.build_nrt``), so that standalone nodes, which have no
NodeResourceTopology, get them too.

**Allocation.** The scheduler writes a pod's CPUs into ``scheduling.koordinator.sh/
resource-status``: ``{"cpuset": "0-3"}`` for LSE and LSR pods, ``{"numaNodeResources": [{"node":
0, "resources": {...}}]}`` for an LS pod bound to NUMA nodes (upstream ``ResourceStatus``).
:func:`parse_resource_status` raises :class:`~koordlet.runtimehooks.errors.BadPodInput` naming
the field for a malformed one (upstream returns the error too, and the hook fails).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from apis.cpulist import format_cpulist, parse_cpulist
from apis.extension import ANNOTATION_RESOURCE_STATUS, QoSClass
from apis.records import frozen
from koordlet.runtimehooks.errors import BadPodInput
from koordlet.statesinformer.model import PodInfo

REASON = "InvalidResourceStatus"
"""The Warning Event reason for a malformed ``resource-status`` annotation."""


@frozen
class CPUSharedPool:
    """One NUMA node's share pool."""

    socket: int
    """The socket of the pool's CPUs."""
    node: int
    """The NUMA node."""
    cpus: frozenset[int]
    """Its CPUs."""

    def as_json(self) -> dict[str, object]:
        """Upstream's JSON form."""
        return {"socket": self.socket, "node": self.node, "cpuset": format_cpulist(self.cpus)}


@frozen
class CPUSetRule:
    """What the CPUSetAllocator hook knows of the node (upstream ``cpusetRule``); here, beside
    the pools, so the hook table can name it without importing the hook."""

    share_pools: tuple[CPUSharedPool, ...] | None = None
    """The share pools; None while unknown."""
    kubelet_policy: str | None = None
    """The kubelet's ``cpuManagerPolicy`` when known."""


@frozen
class ResourceStatus:
    """The scheduler's allocation of a pod."""

    cpus: frozenset[int]
    """``cpuset``: the pod's own CPUs (LSE, LSR); empty when none."""
    numa_nodes: tuple[int, ...]
    """``numaNodeResources[].node``: the NUMA nodes an LS pod is bound to; empty when none."""


def share_pools_of(
    info: object, pods: Iterable[PodInfo], reserved: frozenset[int] = frozenset()
) -> tuple[CPUSharedPool, ...] | None:
    """Per NUMA node: its online CPUs less ``reserved`` and the CPUs of LSE and LSR pods (a
    malformed ``resource-status`` holds none); None while the node-info value is unknown."""
    if not isinstance(info, Mapping) or not isinstance(info.get("cpus"), list):
        return None
    exclusive: set[int] = set()
    for pod in pods:
        if pod.qos in (QoSClass.LSE, QoSClass.LSR):
            try:
                exclusive |= parse_resource_status(pod.annotations).cpus
            except BadPodInput:
                continue
    by_node: dict[int, list[tuple[int, int]]] = {}
    for cpu in info["cpus"]:
        if isinstance(cpu, Mapping) and {"cpu_id", "numa_node", "socket_id"} <= cpu.keys():
            by_node.setdefault(int(cpu["numa_node"]), []).append(
                (int(cpu["cpu_id"]), int(cpu["socket_id"]))
            )
    pools = []
    for node, cpus in sorted(by_node.items()):
        shared = sorted((c, s) for c, s in cpus if c not in reserved and c not in exclusive)
        if shared:
            pools.append(CPUSharedPool(shared[0][1], node, frozenset(c for c, _ in shared)))
    return tuple(pools)


def parse_resource_status(annotations: Mapping[str, str]) -> ResourceStatus:
    """The pod's ``resource-status``; empty without the annotation. Raises BadPodInput naming
    the field for anything malformed."""
    raw = annotations.get(ANNOTATION_RESOURCE_STATUS)
    if raw is None:
        return ResourceStatus(frozenset(), ())
    key = ANNOTATION_RESOURCE_STATUS
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise BadPodInput(REASON, key, f"not JSON: {err}") from err
    if not isinstance(doc, Mapping):
        raise BadPodInput(REASON, key, "must be a JSON object")
    text = doc.get("cpuset", "")
    if not isinstance(text, str):
        raise BadPodInput(REASON, f"{key}: cpuset", f"must be a cpulist string, got {text!r}")
    try:
        cpus = parse_cpulist(text) if text.strip() else frozenset[int]()
    except ValueError as err:
        raise BadPodInput(REASON, f"{key}: cpuset", str(err)) from err
    nodes = []
    numa = doc.get("numaNodeResources") or []
    if not isinstance(numa, list):
        raise BadPodInput(REASON, f"{key}: numaNodeResources", "must be a list")
    for i, item in enumerate(numa):
        node = item.get("node") if isinstance(item, Mapping) else None
        if not isinstance(node, int) or isinstance(node, bool) or node < 0:
            raise BadPodInput(
                REASON, f"{key}: numaNodeResources[{i}].node", f"must be a NUMA node id: {node!r}"
            )
        nodes.append(node)
    return ResourceStatus(frozenset(cpus), tuple(nodes))
