"""Usage of host applications declared in NodeSLO (Koordinator's ``HostApplicationCollector``).

A host application is a non-containerized process group in a cgroup of its own
(``spec.hostApplications[].cgroupPath``); the inventory resolves its ``cgroup_dir`` and whether
that cgroup exists. For each present application, each tick reports:

- **CPU**, in cores: the cgroup's CPU-time counter (v1 ``cpuacct.usage``; v2 ``cpu.stat``
  ``usage_usec``) differenced against the previous tick over the elapsed seconds; the first
  reading seeds, a counter that went backwards re-seeds;
- **memory**, in bytes: ``anon + unevictable`` of ``memory.stat`` (page cache excluded);
- **memory with page cache**, in bytes: the cgroup's whole charge, v1 ``memory.usage_in_bytes``
  or v2 ``memory.current``, as upstream reads it (``CgroupReader.ReadMemoryUsage``).

Declared-but-absent applications, and those whose cgroup vanished mid-tick, produce no samples;
``info["host_applications"]`` lists the names of both kinds (``present``/``absent``).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from koordlet.collectors.framework import CollectorContext, CollectResult, Tick
from koordlet.collectors.shared import CpuCounters
from koordlet.errors import CgroupGoneError
from koordlet.metriccache.series import (
    HOST_APP_CPU_USAGE,
    HOST_APP_MEMORY_USAGE,
    HOST_APP_MEMORY_WITH_PAGE_CACHE,
    Sample,
    SeriesKey,
    host_app_entity,
)
from koordlet.statesinformer.model import HostAppInfo
from koordlet.system.host import Host
from koordlet.system.stats import CPU_USAGE, MEMORY_CHARGE, MEMORY_STAT

logger = logging.getLogger(__name__)

NAME = "hostapplication"
INFO_KEY = "host_applications"
"""Name of the ``info`` entry: ``{"present": [names], "absent": [names]}``."""
NS_PER_SECOND = 1e9


class _Plan(NamedTuple):
    name: str
    entity: str
    cpu_path: str
    stat_path: str
    usage_path: str
    cpu_key: SeriesKey
    mem_key: SeriesKey
    mem_pc_key: SeriesKey


class HostApplicationCollector:
    """See the module docstring."""

    def __init__(self, host: Host, interval: float = 1.0) -> None:
        self.name = NAME
        self.interval = interval
        self._cpu = CPU_USAGE.bind(host.layout)
        self._memory = MEMORY_STAT.bind(host.layout)
        self._charge = MEMORY_CHARGE.bind(host.layout)
        self._apps: tuple[HostAppInfo, ...] | None = None
        self._plan: tuple[_Plan, ...] = ()
        self._declared_absent: tuple[str, ...] = ()
        self._counters = CpuCounters()

    def _replan(self, apps: tuple[HostAppInfo, ...]) -> None:
        plan = []
        for app in apps:
            if not app.present:
                continue
            entity = host_app_entity(app.name)
            plan.append(
                _Plan(
                    app.name,
                    entity,
                    self._cpu.path(app.cgroup_dir),
                    self._memory.path(app.cgroup_dir),
                    self._charge.path(app.cgroup_dir),
                    SeriesKey(HOST_APP_CPU_USAGE, entity),
                    SeriesKey(HOST_APP_MEMORY_USAGE, entity),
                    SeriesKey(HOST_APP_MEMORY_WITH_PAGE_CACHE, entity),
                )
            )
        self._apps = apps
        self._plan = tuple(plan)
        self._declared_absent = tuple(a.name for a in apps if not a.present)
        self._counters.keep_only({p.entity for p in plan})

    def collect(self, tick: Tick) -> CollectResult:
        apps = tick.workloads.host_apps
        if apps is not self._apps:
            self._replan(apps)
        now = tick.now
        cpu_usage, memory_stat, charge = self._cpu.get, self._memory.get, self._charge.get
        samples: list[Sample] = []
        present: list[str] = []
        absent = list(self._declared_absent)
        for p in self._plan:
            try:
                usage_ns = cpu_usage(tick, p.cpu_path)
                memory = memory_stat(tick, p.stat_path)
                with_page_cache = charge(tick, p.usage_path)
            except CgroupGoneError:
                self._counters.forget(p.entity)
                absent.append(p.name)
                continue
            present.append(p.name)
            samples.append(Sample(p.mem_key, float(memory.usage)))
            samples.append(Sample(p.mem_pc_key, float(with_page_cache)))
            rate = self._counters.rate(p.entity, usage_ns, now)
            if rate is not None:
                samples.append(Sample(p.cpu_key, rate / NS_PER_SECOND))
        return CollectResult(
            samples=samples, info={INFO_KEY: {"present": present, "absent": sorted(absent)}}
        )


def build(ctx: CollectorContext, interval: float) -> HostApplicationCollector:
    """The table's factory."""
    return HostApplicationCollector(ctx.host, interval)
