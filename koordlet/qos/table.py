"""The QoS strategy table: one :class:`~koordlet.qos.framework.StrategySpec` row per strategy, in
start order. Nothing registers itself.

A row holds everything about its strategy: the factory (each module's ``build(ctx, interval)``),
Koordinator's feature gate, the interval from the ``qos`` configuration, the NodeSLO sections it
reads (``/debug/qos`` shows their status under it) and the ``koordlet_*`` families it exports
itself. The daemon passes the table to :class:`~koordlet.qos.manager.QoSManager`; tests pass
their own. ``docs/qos.md`` and the pages it links describe each strategy.
"""

from __future__ import annotations

from apis.slo_inforce import (
    CPU_BURST_STRATEGY,
    HOST_APPLICATIONS,
    RESOURCE_QOS_STRATEGY,
    RESOURCE_USED_THRESHOLD_WITH_BE,
    SYSTEM_STRATEGY,
)
from koordlet.config import QoSConfig
from koordlet.qos import (
    blkio,
    cgreconcile,
    cpuburst,
    cpuevict,
    cpusuppress,
    memoryevict,
    netqos,
    resctrl,
    sysreconcile,
)
from koordlet.qos.framework import StrategySpec


def _reconcile(q: QoSConfig) -> float:
    """``qos.reconcile_interval`` (Koordinator's ``--reconcile-interval-seconds``)."""
    return q.reconcile_interval


STRATEGIES: tuple[StrategySpec, ...] = (
    StrategySpec(
        cpusuppress.NAME,
        cpusuppress.build,
        lambda q: q.cpu_suppress_interval,
        "cpuSuppress",
        gate=cpusuppress.FEATURE_GATE,
        sections=(RESOURCE_USED_THRESHOLD_WITH_BE, HOST_APPLICATIONS),
        families=("koordlet_be_suppress_cpu_cores", "koordlet_be_suppress_ls_used_cpu_cores"),
    ),
    StrategySpec(
        cpuburst.NAME,
        cpuburst.build,
        _reconcile,
        "cpuBurst",
        gate=cpuburst.FEATURE_GATE,
        sections=(CPU_BURST_STRATEGY,),
        families=(
            "koordlet_container_scaled_cfs_burst_us",
            "koordlet_container_scaled_cfs_quota_us",
        ),
    ),
    StrategySpec(
        cgreconcile.NAME,
        cgreconcile.build,
        _reconcile,
        "cgroupReconcile",
        gate=cgreconcile.FEATURE_GATE,
        sections=(RESOURCE_QOS_STRATEGY, HOST_APPLICATIONS),
    ),
    StrategySpec(
        sysreconcile.NAME,
        sysreconcile.build,
        _reconcile,
        "systemConfig",
        gate=sysreconcile.FEATURE_GATE,
        sections=(SYSTEM_STRATEGY,),
    ),
    StrategySpec(
        resctrl.NAME,
        resctrl.build,
        _reconcile,
        "resctrlReconcile",
        gate=resctrl.FEATURE_GATE,
        sections=(RESOURCE_QOS_STRATEGY,),
    ),
    StrategySpec(
        blkio.NAME,
        blkio.build,
        _reconcile,
        "blkIOReconcile",
        gate=blkio.FEATURE_GATE,
        sections=(RESOURCE_QOS_STRATEGY,),
    ),
    StrategySpec(
        netqos.NAME,
        netqos.build,
        _reconcile,
        "tcPlugin (netqos)",
        gate=netqos.FEATURE_GATE,
        sections=(RESOURCE_QOS_STRATEGY, SYSTEM_STRATEGY),
    ),
    StrategySpec(
        memoryevict.NAME,
        memoryevict.build,
        lambda q: q.memory_evict_interval,
        "memoryEvict",
        gate=memoryevict.FEATURE_GATE,
        other_gates=(memoryevict.FEATURE_MEMORY_EVICT, memoryevict.FEATURE_ALLOCATABLE_EVICT),
        sections=(RESOURCE_USED_THRESHOLD_WITH_BE,),
    ),
    StrategySpec(
        cpuevict.NAME,
        cpuevict.build,
        lambda q: q.cpu_evict_interval,
        "cpuEvict",
        gate=cpuevict.FEATURE_GATE,
        other_gates=(cpuevict.FEATURE_CPU_EVICT, cpuevict.FEATURE_ALLOCATABLE_EVICT),
        sections=(RESOURCE_USED_THRESHOLD_WITH_BE,),
    ),
)
"""Every QoS strategy, in start order."""
