"""NodeResourcesFit: the pod's requests fit the node's allocatable, batch and mid included.

kube-scheduler's NodeResourcesFit filter over every resource the pod requests: ``cpu``,
``memory``, ``pods`` (one more pod) and extended resources, which is how Koordinator's
``kubernetes.io/batch-cpu``, ``batch-memory``, ``mid-cpu`` and ``mid-memory`` requests are
checked against what koord-manager wrote on the node. ``requested + request > allocatable``
rejects with kube-scheduler's words, ``Insufficient kubernetes.io/batch-cpu``; an unschedulable
node (``spec.unschedulable``) is rejected as NodeUnschedulable does, ``node(s) were
unschedulable``. Resources the Reservation plugin holds for this pod's owner on the node count as
free for it (:attr:`Cycle.data` ``"Reservation/free"``). It does not score: the stock scheduler
(or LoadAwareScheduling) ranks nodes.

Resources named ``koordinator.sh/gpu-*`` and ``nvidia.com/gpu`` are left to DeviceShare, which
places them on a device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler_plugins.framework import Cycle, Plugin
from scheduler_plugins.snapshot import NodeInfo, PodInfo

NAME = "NodeResourcesFit"
ERR_UNSCHEDULABLE = "node(s) were unschedulable"
DEVICE_RESOURCES = (
    "koordinator.sh/gpu",
    "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory",
    "koordinator.sh/gpu-memory-ratio",
    "nvidia.com/gpu",
)
RESERVATION_FREE_KEY = "Reservation/free"
"""Cycle data: node name → resources reserved for this pod there (set by Reservation)."""


class NodeResourcesFit(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self, ignored: Sequence[str] = DEVICE_RESOURCES) -> None:
        self.ignored = frozenset(ignored)

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        wanted = [(r, v) for r, v in pod.requests.items() if v > 0 and r not in self.ignored]
        wanted.append(("pods", 1))
        reserved: Mapping[str, Mapping[str, int]] = cycle.data.get(RESERVATION_FREE_KEY, {})
        out: dict[str, str] = {}
        for node in nodes:
            if node.unschedulable:
                out[node.name] = ERR_UNSCHEDULABLE
                continue
            alloc = node.allocatable
            used = node.requested
            extra = reserved.get(node.name)
            for r, v in wanted:
                free = alloc.get(r, 0) - used.get(r, 0)
                if extra:
                    free += extra.get(r, 0)
                if r == "pods" and r not in alloc:
                    continue
                if v > free:
                    out[node.name] = f"Insufficient {r}"
                    break
        return out


def build(args: Mapping[str, Any] | None, source: str) -> NodeResourcesFit:
    """Factory for the plugin table (no args)."""
    return NodeResourcesFit()
