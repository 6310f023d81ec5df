"""The QoS strategy table: name → factory, in start order. Nothing registers itself.

Koordinator's strategies (``cpusuppress``, ``cpuburst``, ``cgreconcile``, ``sysreconcile``,
``memoryevict``, ``cpuevict``, ``resctrl``), each in a module of its own. The daemon passes
this table to :class:`~koordlet.qos.manager.QoSManager`, which runs each enabled strategy's
``reconcile()`` at its interval; tests pass their own tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from koordlet.qos import (
    cgreconcile,
    cpuburst,
    cpuevict,
    cpusuppress,
    memoryevict,
    resctrl,
    sysreconcile,
)
from koordlet.qos.manager import StrategyFactory

STRATEGIES: Mapping[str, StrategyFactory] = MappingProxyType(
    {
        cpusuppress.NAME: cpusuppress.new_cpu_suppress,
        cpuburst.NAME: cpuburst.new_cpu_burst,
        cgreconcile.NAME: cgreconcile.build,
        sysreconcile.NAME: sysreconcile.build,
        resctrl.NAME: resctrl.build,
        memoryevict.NAME: memoryevict.memoryevict,
        cpuevict.NAME: cpuevict.cpuevict,
    }
)
"""Every QoS strategy, in start order."""

FEATURE_GATES: Mapping[str, str] = MappingProxyType(
    {
        cpusuppress.NAME: cpusuppress.FEATURE_GATE,
        cpuburst.NAME: cpuburst.FEATURE_GATE,
        cgreconcile.NAME: cgreconcile.GATE,
        sysreconcile.NAME: sysreconcile.GATE,
        resctrl.NAME: resctrl.GATE,
        memoryevict.NAME: memoryevict.GATE,
        cpuevict.NAME: cpuevict.GATE,
    }
)
"""Strategy → the koordlet feature gate that must be on for it to run (Koordinator gates each
strategy: ``BECPUSuppress``, ``CPUBurst``, ``BEMemoryEvict``...)."""
