"""NodePorts: a host port is bound by one pod a node (kube-scheduler's in-tree plugin,
``pkg/scheduler/framework/plugins/nodeports``).

The pod's containers' ``hostPort`` entries (and those of restartable init containers) conflict
with the ports the node's pods already bind: the same protocol and port, on the same host IP or
where either IP is ``0.0.0.0`` (every address). A conflict rejects the node with ``node(s) didn't
have free ports for the requested pod ports``; evicting the pod holding the port cures it. The
ports a node's pods bind are kept per node until that node changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler_plugins.constraints import HostPort
from scheduler_plugins.framework import Cycle, Plugin
from scheduler_plugins.snapshot import NodeInfo, PodInfo

NAME = "NodePorts"
ERR_PORTS = "node(s) didn't have free ports for the requested pod ports"
"""``nodeports.ErrReason``."""
ANY_IP = "0.0.0.0"


def used_ports(node: NodeInfo) -> dict[str, set[tuple[str, int]]]:
    """Host IP → the (protocol, port) pairs the node's pods bind there."""
    out: dict[str, set[tuple[str, int]]] = {}
    for p in node.pods.values():
        for hp in p.constraints.host_ports:
            out.setdefault(hp.ip, set()).add((hp.protocol, hp.port))
    return out


def conflicts(wanted: tuple[HostPort, ...], used: Mapping[str, set[tuple[str, int]]]) -> bool:
    """``HostPortInfo.CheckConflict`` for each wanted port."""
    for hp in wanted:
        pp = (hp.protocol, hp.port)
        if hp.ip == ANY_IP:
            if any(pp in ports for ports in used.values()):
                return True
        elif pp in used.get(hp.ip, ()) or pp in used.get(ANY_IP, ()):
            return True
    return False


class NodePorts(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self) -> None:
        self._used: dict[str, tuple[NodeInfo, int, dict[str, set[tuple[str, int]]]]] = {}

    def _ports(self, node: NodeInfo) -> dict[str, set[tuple[str, int]]]:
        cached = self._used.get(node.name)
        if cached is not None and cached[0] is node and cached[1] == node.generation:
            return cached[2]
        used = used_ports(node)
        self._used[node.name] = (node, node.generation, used)
        return used

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        wanted = pod.constraints.host_ports
        if not wanted:
            return {}
        return {n.name: ERR_PORTS for n in nodes if conflicts(wanted, self._ports(n))}


def build(args: Mapping[str, Any] | None, source: str) -> NodePorts:
    """Factory for the plugin table (no args)."""
    return NodePorts()
