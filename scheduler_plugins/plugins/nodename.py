"""NodeName: a pod that names its node goes there or nowhere (kube-scheduler's in-tree plugin).

Pods the scheduler sees pending have no ``spec.nodeName`` (one that has it is bound already);
what names a node here is a Reservation's ``spec.template.spec.nodeName``, which the reserve pod
carries as ``scheduling.koordinator.sh/reservation-node``. Every other node is rejected with
``node(s) didn't match the requested node name``; evicting pods cannot cure it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apis.scheduling_keys import ANNOTATION_RESERVATION_NODE
from scheduler_plugins.framework import Cycle, Plugin
from scheduler_plugins.snapshot import NodeInfo, PodInfo

NAME = "NodeName"
ERR_NODE_NAME = "node(s) didn't match the requested node name"
"""``nodename.ErrReason``."""


class NodeName(Plugin):
    """See the module docstring."""

    name = NAME

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        wanted = pod.annotations.get(ANNOTATION_RESERVATION_NODE)
        if not wanted:
            return {}
        return {n.name: ERR_NODE_NAME for n in nodes if n.name != wanted}

    def possible_nodes(self, cycle: Cycle, pod: PodInfo) -> frozenset[str] | None:
        wanted = pod.annotations.get(ANNOTATION_RESERVATION_NODE)
        return frozenset((wanted,)) if wanted else None

    def unresolvable(self, reason: str) -> bool:
        return True


def build(args: Mapping[str, Any] | None, source: str) -> NodeName:
    """Factory for the plugin table (no args)."""
    return NodeName()
