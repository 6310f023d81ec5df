"""The runtime hooks' views of the node, computed by the daemon from what its components hold
and cached per inventory snapshot (a reconcile round asks once per container): the cpuset hook's
share pools and CPU manager policy, and the TCNetworkQoS hook's HTB classes of the pods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from koordlet.statesinformer.model import WorkloadSnapshot

if TYPE_CHECKING:
    from koordlet.reporter.topology import KubeletTopology
    from koordlet.runtimehooks.sharepool import CPUSetRule


class HookViews:
    """What :class:`~koordlet.runtimehooks.table.HookContext` asks the daemon for, each read
    once per inventory snapshot (and Node, node info and kubelet topology for the cpuset rule)."""

    def __init__(
        self,
        snapshot: Callable[[], WorkloadSnapshot],
        *,
        node_info: Callable[[], object | None],
        kubelet_topology: Callable[[], KubeletTopology | None],
        node: Callable[[], Mapping[str, Any] | None],
    ) -> None:
        self._snapshot = snapshot
        self._node_info = node_info
        self._kubelet_topology = kubelet_topology
        self._node = node
        self._cpuset_rule_cache: tuple[tuple[object, ...], CPUSetRule] | None = None
        self._net_class_ids_cache: tuple[object, Mapping[str, int]] | None = None

    def pod_net_class_ids(self) -> Mapping[str, int]:
        """The TCNetworkQoS hook's view of the pods' own HTB classes: the network QoS strategy's
        rule over the current inventory, computed once per snapshot."""
        from koordlet.qos.netqos import own_class_ids

        snapshot = self._snapshot()
        cached = self._net_class_ids_cache
        if cached is not None and cached[0] is snapshot:
            return cached[1]
        ids = own_class_ids(snapshot.pods.values())
        self._net_class_ids_cache = (snapshot, ids)
        return ids

    def cpuset_rule(self) -> CPUSetRule:
        """The cpuset hook's view of the node: the share pools as the NRT reports them (online
        CPUs per NUMA node less the kubelet's reserved ones, the Node's reservation and SYSTEM
        QoS CPUs, and LSE/LSR pods' CPUs) and the kubelet's CPU manager policy when its config
        file told it."""
        from koordlet.runtimehooks.sharepool import CPUSetRule, share_pools_of
        from koordlet.statesinformer.nodetopo import (
            cpus_of_node_info,
            node_annotations,
            reserved_cpus,
            system_qos_exclusive_cpus,
        )

        info = self._node_info()
        kubelet = self._kubelet_topology()
        snapshot = self._snapshot()
        node = self._node()
        key = (snapshot, info, kubelet, node)
        cached = self._cpuset_rule_cache
        if cached is not None and all(a is b for a, b in zip(cached[0], key, strict=True)):
            return cached[1]  # the same pods and node: a reconcile round asks once per container
        reserved = set(kubelet.reserved_cpus if kubelet is not None else ())
        if node is not None:
            annotations = node_annotations(node)
            reserved |= reserved_cpus(annotations, cpus_of_node_info(info))
            reserved |= system_qos_exclusive_cpus(annotations)
        pools = share_pools_of(info, snapshot.pods.values(), frozenset(reserved))
        rule = CPUSetRule(pools, kubelet.cpu_manager_policy if kubelet is not None else None)
        self._cpuset_rule_cache = (key, rule)
        return rule
