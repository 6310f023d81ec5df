"""BEEvictionPressure (ours): BE pods stay off a node whose koordlet is evicting BE pods.

The koordlet (gate ``BEEvictionCondition``) sets the Node condition
``koordinator.sh/BEEvictionPressure`` to ``True`` while it evicts BE pods for memory or CPU and
for a cool-down after the last eviction (:mod:`apis.node_conditions`). This filter rejects a BE
pod (its ``koordinator.sh/qosClass`` label, or a BestEffort pod without one, as the snapshot
classes it) on such a node, so the scheduler does not send BE pods back into the fire; every
other pod is left alone, which a ``NoSchedule`` taint would not do (docs/qos-eviction.md). It
does not score. Koordinator has no such plugin: the name is ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apis.extension import QoSClass
from apis.node_conditions import CONDITION_BE_EVICTION_PRESSURE
from scheduler_plugins.framework import Cycle, Plugin
from scheduler_plugins.snapshot import NodeInfo, PodInfo

NAME = "BEEvictionPressure"
ERR_BE_EVICTION_PRESSURE = (
    f"node(s) were evicting BE pods ({CONDITION_BE_EVICTION_PRESSURE} condition is True)"
)


class BEEvictionPressure(Plugin):
    """See the module docstring."""

    name = NAME

    def filter(self, cycle: Cycle, pod: PodInfo, node: NodeInfo) -> str | None:
        if pod.qos_class != QoSClass.BE:
            return None
        if node.conditions.get(CONDITION_BE_EVICTION_PRESSURE) == "True":
            return ERR_BE_EVICTION_PRESSURE
        return None


def build(args: Mapping[str, Any] | None, source: str) -> BEEvictionPressure:
    """The table's factory (no arguments)."""
    return BEEvictionPressure()
