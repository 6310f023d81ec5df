"""BEEvictionPressure (ours): BE pods stay off a node whose koordlet is evicting BE pods.

The koordlet (gate ``BEEvictionCondition``) sets the Node condition
``koordinator.sh/BEEvictionPressure`` to ``True`` while it evicts BE pods for memory or CPU and
for a cool-down after the last eviction (:mod:`apis.node_conditions`). This filter rejects a BE
pod (its ``koordinator.sh/qosClass`` label, or a BestEffort pod without one, as the snapshot
classes it) on such a node, so the scheduler does not send BE pods back into the fire; every
other pod is left alone, which a ``NoSchedule`` taint would not do (docs/qos-eviction.md). It
does not score. Koordinator has no such plugin: the name is ours.

Only BE pods concern it, and only the few nodes under pressure can fail them: the plugin keeps
those nodes from the snapshot's change log (:class:`NodeSubset`), so a pod that is not BE costs
nothing per node, and a BE pod costs a pass over the candidates only while some node is under
pressure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apis.extension import QoSClass
from apis.node_conditions import CONDITION_BE_EVICTION_PRESSURE
from scheduler_plugins.framework import Cycle, Plugin
from scheduler_plugins.plugins.nodecache import NodeSubset
from scheduler_plugins.snapshot import NodeInfo, PodInfo

NAME = "BEEvictionPressure"
ERR_BE_EVICTION_PRESSURE = (
    f"node(s) were evicting BE pods ({CONDITION_BE_EVICTION_PRESSURE} condition is True)"
)


class BEEvictionPressure(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self) -> None:
        self._pressured = NodeSubset(_under_pressure)

    def filter(self, cycle: Cycle, pod: PodInfo, node: NodeInfo) -> str | None:
        if pod.qos_class == QoSClass.BE and _under_pressure(node):
            return ERR_BE_EVICTION_PRESSURE
        return None

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        if pod.qos_class != QoSClass.BE:
            return {}
        pressured = self._pressured.of(cycle.snapshot)
        if not pressured:
            return {}
        if NodeSubset.covers(cycle.snapshot, nodes):
            return dict.fromkeys(pressured, ERR_BE_EVICTION_PRESSURE)
        return {n.name: ERR_BE_EVICTION_PRESSURE for n in nodes if _under_pressure(n)}


def _under_pressure(node: NodeInfo) -> bool:
    """Whether the koordlet reports ``node`` evicting BE pods."""
    return node.conditions.get(CONDITION_BE_EVICTION_PRESSURE) == "True"


def build(args: Mapping[str, Any] | None, source: str) -> BEEvictionPressure:
    """The table's factory (no arguments)."""
    return BEEvictionPressure()
