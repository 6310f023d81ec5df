"""The collector table: name → factory, in execution order. Nothing registers itself.

The order matters: every collector of a tick sees, through ``Tick.last``, the samples of those
before it, and the system collector (node - pods - host applications) must come after the node,
pod and host-application collectors. ``docs/collectors.md`` describes each one.

=================  =============================================  ======================
name               Koordinator collector                          interval
=================  =============================================  ======================
noderesource       NodeResourceCollector                          collect.res_used_interval
nodeinfo           NodeInfoCollector                              collect.node_cpu_info_interval
podresource        PodResourceCollector                           collect.res_used_interval
podthrottled       PodThrottledCollector                          collect.res_used_interval
pagecache          PageCacheCollector                             collect.res_used_interval
hostapplication    HostApplicationCollector                       collect.res_used_interval
beresource         BEResourceCollector                            collect.res_used_interval
coldmemory         ColdMemoryCollector (gate ColdPageCollector)   collect.cold_page_interval
resctrlmon         ResctrlCollector (--enable-resctrl-collector)  collect.resctrl_interval
sysresource        SystemResourceCollector                        collect.res_used_interval
cpi                CPICollector (gate CPICollector)               collect.cpi_interval
psi                performanceCollector, PSI (gate PSICollector)  collect.psi_interval
=================  =============================================  ======================
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Any

from koordlet.collectors import coldmemory, cpi, psi, resctrlmon
from koordlet.collectors.beresource import BEResourceCollector
from koordlet.collectors.framework import Collector, CollectorContext, CollectorFactory
from koordlet.collectors.hostapplication import HostApplicationCollector
from koordlet.collectors.nodeinfo import NodeInfoCollector
from koordlet.collectors.noderesource import NodeResourceCollector
from koordlet.collectors.pagecache import PageCacheCollector
from koordlet.collectors.podresource import PodResourceCollector
from koordlet.collectors.podthrottled import PodThrottledCollector
from koordlet.collectors.sysresource import SystemResourceCollector
from koordlet.errors import ConfigError

DEFAULT_RES_USED_INTERVAL = 1.0
"""Seconds; Koordinator's ``--collect-res-used-interval-seconds`` default."""
DEFAULT_NODE_CPU_INFO_INTERVAL = 60.0
"""Seconds; Koordinator's ``--collect-node-cpu-info-interval-seconds`` default."""


def _collect_setting(config: Any, name: str, default: float) -> float:
    """``config.collect.<name>``, or ``default`` when the context carries no configuration."""
    collect = getattr(config, "collect", None)
    if collect is None:
        return default
    return float(getattr(collect, name))


def res_used_interval(ctx: CollectorContext) -> float:
    """The usage collectors' interval (``collect.res_used_interval``)."""
    return _collect_setting(ctx.config, "res_used_interval", DEFAULT_RES_USED_INTERVAL)


def node_cpu_info_interval(ctx: CollectorContext) -> float:
    """The node info collector's interval (``collect.node_cpu_info_interval``)."""
    return _collect_setting(ctx.config, "node_cpu_info_interval", DEFAULT_NODE_CPU_INFO_INTERVAL)


def _noderesource(ctx: CollectorContext) -> Collector:
    return NodeResourceCollector(ctx.host, res_used_interval(ctx))


def _nodeinfo(ctx: CollectorContext) -> Collector:
    return NodeInfoCollector(ctx.host, node_cpu_info_interval(ctx))


def _podresource(ctx: CollectorContext) -> Collector:
    return PodResourceCollector(ctx.host, res_used_interval(ctx))


def _podthrottled(ctx: CollectorContext) -> Collector:
    return PodThrottledCollector(ctx.host, res_used_interval(ctx))


def _pagecache(ctx: CollectorContext) -> Collector:
    return PageCacheCollector(ctx.host, res_used_interval(ctx))


def _hostapplication(ctx: CollectorContext) -> Collector:
    return HostApplicationCollector(ctx.host, res_used_interval(ctx))


def _beresource(ctx: CollectorContext) -> Collector:
    return BEResourceCollector(ctx.host, res_used_interval(ctx))


def _sysresource(ctx: CollectorContext) -> Collector:
    return SystemResourceCollector(ctx.host, res_used_interval(ctx))


COLLECTORS: Mapping[str, CollectorFactory] = MappingProxyType(
    {
        "noderesource": _noderesource,
        "nodeinfo": _nodeinfo,
        "podresource": _podresource,
        "podthrottled": _podthrottled,
        "pagecache": _pagecache,
        "hostapplication": _hostapplication,
        "beresource": _beresource,
        "coldmemory": coldmemory.build,
        "resctrlmon": resctrlmon.build,
        "sysresource": _sysresource,
        "cpi": cpi.build,
        "psi": psi.build,
    }
)
"""Every collector, in execution order."""

FEATURE_GATES: Mapping[str, str] = MappingProxyType(
    {"cpi": cpi.FEATURE_GATE, "coldmemory": coldmemory.FEATURE_GATE, "psi": psi.FEATURE_GATE}
)
"""Collector → the koordlet feature gate that must be on for it to run (Koordinator's gates)."""

SWITCHES: Mapping[str, str] = MappingProxyType({"resctrlmon": "enable_resctrl_collector"})
"""Collector → the ``collect`` setting that must be true for it to run (Koordinator's
``--enable-resctrl-collector``, off by default)."""


def build_collectors(
    ctx: CollectorContext,
    table: Mapping[str, CollectorFactory] = COLLECTORS,
    *,
    disabled: Collection[str] = (),
    gates: Mapping[str, str] = FEATURE_GATES,
    switches: Mapping[str, str] = SWITCHES,
) -> list[Collector]:
    """Instantiate the collectors of ``table`` in its order, leaving out those named in
    ``disabled``, those whose feature gate (``gates``) is off in ``ctx.config`` and those whose
    ``collect`` switch (``switches``) is false or absent.

    A name in ``disabled`` that the table does not hold is a :class:`ConfigError`.
    """
    unknown = sorted(set(disabled) - set(table))
    if unknown:
        raise ConfigError(f"unknown collectors {unknown}; known: {list(table)}", field="collectors")
    feature_gates = getattr(ctx.config, "feature_gates", None)
    collect = getattr(ctx.config, "collect", None)
    collectors: list[Collector] = []
    for name, factory in table.items():
        if name in disabled:
            continue
        gate = gates.get(name)
        if gate is not None and (feature_gates is None or not feature_gates.enabled(gate)):
            continue
        switch = switches.get(name)
        if switch is not None and not getattr(collect, switch, False):
            continue
        collectors.append(factory(ctx))
    return collectors
