"""CPU topology, NUMA layout and processor facts of the node (Koordinator's
``NodeInfoCollector``), every ``collect.node_cpu_info_interval`` (60 s by default).

It reports no series: ``info["node_info"]`` holds a JSON-ready dict built from
``koordlet.system.topology.read_cpu_topology`` (sysfs and ``/proc/cpuinfo``; no ``lscpu``)::

    {"cpus": [{"cpu_id", "core_id", "socket_id", "numa_node"}...],
     "total": {"cpus", "cores", "sockets", "numa_nodes"},
     "model_name", "vendor_id", "hyperthreading", "turbo",  # turbo None: the host does not say
     "cat_l3_cbm_mask",                                     # None without resctrl L3 CAT
     "numa": {"<id>": {"cpus": "0-3", "memory_total_bytes"}}}

Upstream stores ``NodeCPUInfo`` (lscpu-style processor infos and totals) and ``NodeNUMAInfo``
(per-node meminfo) under two keys; here both halves sit in one value. Topology files are read
directly, not through the tick: they are outside the hot path and not shared with another
collector.
"""

from __future__ import annotations

import logging
from typing import Any

from apis.cpulist import format_cpulist
from koordlet.collectors.framework import CollectorContext, CollectResult, Tick
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths
from koordlet.system.topology import NodeCpuTopology, read_cpu_topology

logger = logging.getLogger(__name__)

NAME = "nodeinfo"
INFO_KEY = "node_info"


def node_info_dict(topology: NodeCpuTopology) -> dict[str, Any]:
    """``topology`` as the JSON-ready value stored under ``node_info``."""
    return {
        "cpus": [
            {
                "cpu_id": c.cpu_id,
                "core_id": c.core_id,
                "socket_id": c.socket_id,
                "numa_node": c.numa_node,
            }
            for c in topology.cpus
        ],
        "total": {
            "cpus": len(topology.cpus),
            "cores": topology.core_count,
            "sockets": topology.socket_count,
            "numa_nodes": len(topology.numa_nodes),
        },
        "model_name": topology.model_name,
        "vendor_id": topology.vendor_id,
        "cat_l3_cbm_mask": topology.cat_l3_cbm_mask,
        "hyperthreading": topology.hyperthreading,
        "turbo": topology.turbo,
        "numa": {
            str(node): {
                "cpus": format_cpulist(cpus),
                "memory_total_bytes": topology.numa_memory_total.get(node),
            }
            for node, cpus in sorted(topology.numa_nodes.items())
        },
    }


class NodeInfoCollector:
    """See the module docstring."""

    def __init__(self, host: Host, interval: float = 60.0) -> None:
        self.name = NAME
        self.interval = interval
        self._paths: HostPaths = host.paths
        self._last: dict[str, Any] | None = None

    def collect(self, tick: Tick) -> CollectResult:
        info = node_info_dict(read_cpu_topology(self._paths))
        if info != self._last:
            total = info["total"]
            logger.info(
                "node info: %d CPUs, %d cores, %d sockets, %d NUMA nodes, %s, HT %s, turbo %s",
                total["cpus"],
                total["cores"],
                total["sockets"],
                total["numa_nodes"],
                info["model_name"],
                info["hyperthreading"],
                info["turbo"],
            )
            self._last = info
        return CollectResult(info={INFO_KEY: info})


def build(ctx: CollectorContext, interval: float) -> NodeInfoCollector:
    """The table's factory."""
    return NodeInfoCollector(ctx.host, interval)
