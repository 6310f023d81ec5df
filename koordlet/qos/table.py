"""The QoS strategy table: name → factory, in start order. Nothing registers itself.

Empty for now: the strategies (Koordinator's ``cpusuppress``, ``cpuburst``, ``memoryevict``,
``cpuevict``, ``resctrl``, ``cgreconcile``, ``sysreconcile``) arrive with the QoS issue, each in a
module of its own, added here by name. The daemon passes this table to
:class:`~koordlet.qos.manager.QoSManager`, which runs each enabled strategy's ``reconcile()`` at
its interval; tests pass their own tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from koordlet.qos import cgreconcile, cpuevict, memoryevict, sysreconcile
from koordlet.qos.manager import StrategyFactory

STRATEGIES: Mapping[str, StrategyFactory] = MappingProxyType(
    {
        cgreconcile.NAME: cgreconcile.build,
        sysreconcile.NAME: sysreconcile.build,
        memoryevict.NAME: memoryevict.memoryevict,
        cpuevict.NAME: cpuevict.cpuevict,
    }
)
"""Every QoS strategy, in start order."""

FEATURE_GATES: Mapping[str, str] = MappingProxyType(
    {
        cgreconcile.NAME: cgreconcile.GATE,
        sysreconcile.NAME: sysreconcile.GATE,
        memoryevict.NAME: memoryevict.GATE,
        cpuevict.NAME: cpuevict.GATE,
    }
)
"""Strategy → the koordlet feature gate that must be on for it to run (Koordinator gates each
strategy: ``BECPUSuppress``, ``CPUBurst``, ``BEMemoryEvict``...)."""
