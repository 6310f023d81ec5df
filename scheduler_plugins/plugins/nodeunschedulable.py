"""NodeUnschedulable: cordoned nodes take no new pods (kube-scheduler's in-tree plugin).

A node with ``spec.unschedulable: true`` rejects the pod, ``node(s) were unschedulable``, unless
the pod tolerates the ``node.kubernetes.io/unschedulable`` taint with effect ``NoSchedule``
(``pkg/scheduler/framework/plugins/nodeunschedulable``). Evicting pods cannot cure it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apis.kubernetes_keys import TAINT_EFFECT_NO_SCHEDULE, TAINT_NODE_UNSCHEDULABLE
from scheduler_plugins.constraints import Taint, tolerated
from scheduler_plugins.framework import Cycle, Plugin
from scheduler_plugins.plugins.nodecache import NodeSubset
from scheduler_plugins.snapshot import NodeInfo, PodInfo

NAME = "NodeUnschedulable"
ERR_UNSCHEDULABLE = "node(s) were unschedulable"
"""``ErrReasonUnschedulable``."""
_TAINT = Taint(TAINT_NODE_UNSCHEDULABLE, "", TAINT_EFFECT_NO_SCHEDULE)


class NodeUnschedulable(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self) -> None:
        self._cordoned = NodeSubset(lambda n: n.unschedulable)

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        if NodeSubset.covers(cycle.snapshot, nodes):
            out = dict.fromkeys(self._cordoned.of(cycle.snapshot), ERR_UNSCHEDULABLE)
        else:
            out = {n.name: ERR_UNSCHEDULABLE for n in nodes if n.unschedulable}
        if out and tolerated(_TAINT, pod.constraints.tolerations):
            return {}
        return out

    def unresolvable(self, reason: str) -> bool:
        return True


def build(args: Mapping[str, Any] | None, source: str) -> NodeUnschedulable:
    """Factory for the plugin table (no args)."""
    return NodeUnschedulable()
