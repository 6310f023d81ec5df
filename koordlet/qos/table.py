"""The QoS strategy table: one :class:`~koordlet.qos.framework.StrategySpec` row per strategy, in
start order. Nothing registers itself.

A row holds everything about its strategy as data: its name, the factory by reference (each
module's ``build(ctx, interval)``, ``"koordlet.qos.<name>:build"``, imported only when the row is
enabled: :mod:`koordlet.plugins`), Koordinator's feature gates, the interval from the ``qos``
configuration, the NodeSLO sections it reads (``/debug/qos`` shows their status under it) and
the ``koordlet_*`` families it exports itself. The daemon passes the table to
:class:`~koordlet.qos.manager.QoSManager`; tests pass their own. ``docs/qos.md`` and the pages
it links describe each strategy.
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
from koordlet.qos.framework import StrategySpec


def _reconcile(q: QoSConfig) -> float:
    """``qos.reconcile_interval`` (Koordinator's ``--reconcile-interval-seconds``)."""
    return q.reconcile_interval


STRATEGIES: tuple[StrategySpec, ...] = (
    StrategySpec(
        "cpusuppress",
        "koordlet.qos.cpusuppress:build",
        lambda q: q.cpu_suppress_interval,
        "cpuSuppress",
        gate="BECPUSuppress",
        sections=(RESOURCE_USED_THRESHOLD_WITH_BE, HOST_APPLICATIONS),
        families=("koordlet_be_suppress_cpu_cores", "koordlet_be_suppress_ls_used_cpu_cores"),
    ),
    StrategySpec(
        "cpuburst",
        "koordlet.qos.cpuburst:build",
        _reconcile,
        "cpuBurst",
        gate="CPUBurst",
        sections=(CPU_BURST_STRATEGY,),
        families=(
            "koordlet_container_scaled_cfs_burst_us",
            "koordlet_container_scaled_cfs_quota_us",
        ),
    ),
    StrategySpec(
        "cgreconcile",
        "koordlet.qos.cgreconcile:build",
        _reconcile,
        "cgroupReconcile",
        gate="CgroupReconcile",
        sections=(RESOURCE_QOS_STRATEGY, HOST_APPLICATIONS),
    ),
    StrategySpec(
        "sysreconcile",
        "koordlet.qos.sysreconcile:build",
        _reconcile,
        "systemConfig",
        gate="SystemConfig",
        sections=(SYSTEM_STRATEGY,),
    ),
    StrategySpec(
        "resctrl",
        "koordlet.qos.resctrl:build",
        _reconcile,
        "resctrlReconcile",
        gate="RdtResctrl",
        sections=(RESOURCE_QOS_STRATEGY,),
    ),
    StrategySpec(
        "blkio",
        "koordlet.qos.blkio:build",
        _reconcile,
        "blkIOReconcile",
        gate="BlkIOReconcile",
        sections=(RESOURCE_QOS_STRATEGY,),
    ),
    StrategySpec(
        "netqos",
        "koordlet.qos.netqos:build",
        _reconcile,
        "tcPlugin (netqos)",
        gate="TCNetworkQoS",
        sections=(RESOURCE_QOS_STRATEGY, SYSTEM_STRATEGY),
    ),
    StrategySpec(
        "oomscoreadj",
        "koordlet.qos.oomscoreadj:build",
        _reconcile,
        "OOMScoreAdj (runtime hook reconciler)",
        gate="OOMScoreAdj",
    ),
    StrategySpec(
        "memoryevict",
        "koordlet.qos.memoryevict:build",
        lambda q: q.memory_evict_interval,
        "memoryEvict",
        gate="BEMemoryEvict",
        other_gates=("MemoryEvict", "MemoryAllocatableEvict"),
        sections=(RESOURCE_USED_THRESHOLD_WITH_BE,),
    ),
    StrategySpec(
        "cpuevict",
        "koordlet.qos.cpuevict:build",
        lambda q: q.cpu_evict_interval,
        "cpuEvict",
        gate="BECPUEvict",
        other_gates=("CPUEvict", "CPUAllocatableEvict"),
        sections=(RESOURCE_USED_THRESHOLD_WITH_BE,),
    ),
)
"""Every QoS strategy, in start order."""
