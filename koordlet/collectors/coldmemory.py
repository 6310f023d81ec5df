"""Cold memory and memory usage with hot page cache (Koordinator's cold-page collector).

Gate ``ColdPageCollector`` (alpha, off by default); interval ``collect.cold_page_interval``
(Koordinator's ``--coldpage-collector-interval``, 5 s). The source is kidled
(:class:`~koordlet.system.kidled.KidledColdPageSource`, Anolis kernels) where start-up probing
found it, else DAMON (:class:`~koordlet.system.damoncold.DamonColdPageSource`, mainline kernels
with the DAMON sysfs interface and ``/proc/kpagecgroup``; docs/coldmemory.md), else kidled again,
which then reports why it cannot measure. Both give the same series. Each step, when the source
can measure:

- **node**: cold bytes of the root memory cgroup, and memory with hot page cache
  ``MemTotal - MemFree - cold`` from ``/proc/meminfo``
  (``GetNodeMemUsageWithHotPageCache`` upstream);
- **pods, containers and host applications**: cold bytes of each cgroup, and memory with hot page
  cache ``anon + unevictable + active_file + inactive_file - cold`` from its ``memory.stat``
  (``MemoryStatRaw.UsageWithPageCache() - cold``, ``GetCgroupMemUsageWithHotPageCache``).

Upstream computes both subtractions in unsigned 64-bit and wraps when cold exceeds the usage (its
own test expects 18446744073419457000); cold can exceed it here too, because kidled also counts
slab and pages off the LRU lists, so the difference is clamped at 0 instead.

When the source cannot measure (kidled absent, scanning off, ``use_hierarchy`` 0, the root has no
``memory.idle_page_stats``; DAMON busy with kdamonds not ours, warming up, no paddr), the step
reports nothing but the reason, under ``CollectResult.unsupported[source.name]`` (``kidled`` or
``damon``). :meth:`ColdMemoryCollector.close` stops the DAMON source's kdamond. A cgroup whose
own accounting is off or that has not been scanned yet is skipped; the count and the first
reason go to ``unsupported["memcg"]``. Cgroups that vanished mid-step are skipped (debug log
with the count).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from koordlet.collectors.framework import CollectorContext, CollectResult, Tick
from koordlet.collectors.shared import TargetCache
from koordlet.errors import CgroupGoneError, UnsupportedError
from koordlet.metriccache.series import (
    CONTAINER_MEMORY_COLD_PAGE,
    CONTAINER_MEMORY_WITH_HOT_PAGE_CACHE,
    HOST_APP_MEMORY_COLD_PAGE,
    HOST_APP_MEMORY_WITH_HOT_PAGE_CACHE,
    NODE,
    NODE_MEMORY_COLD_PAGE,
    NODE_MEMORY_WITH_HOT_PAGE_CACHE,
    POD_MEMORY_COLD_PAGE,
    POD_MEMORY_WITH_HOT_PAGE_CACHE,
    Sample,
    SeriesKey,
    host_app_entity,
)
from koordlet.statesinformer.model import HostAppInfo
from koordlet.system.damon import DamonAttrs
from koordlet.system.damoncold import DamonColdPageSource
from koordlet.system.host import Host
from koordlet.system.kidled import ColdPageSource, KidledColdPageSource
from koordlet.system.probe import Capabilities
from koordlet.system.stats import MEMINFO, MEMORY_STAT

logger = logging.getLogger(__name__)

NAME = "coldmemory"
FEATURE_GATE = "ColdPageCollector"
"""The koordlet feature gate that must be on (Koordinator's name; alpha, off by default)."""
DEFAULT_INTERVAL = 5.0
"""Seconds; Koordinator's ``ColdPageCollectorInterval`` default."""
INFO_KEY = "cold_memory"
"""Name of the ``info`` entry: the source's facts (scan period, cold age)."""

_NODE_COLD = SeriesKey(NODE_MEMORY_COLD_PAGE, NODE)
_NODE_HOT = SeriesKey(NODE_MEMORY_WITH_HOT_PAGE_CACHE, NODE)


class _Plan(NamedTuple):
    rel: str
    stat_path: str
    cold_key: SeriesKey
    hot_key: SeriesKey


class ColdMemoryCollector:
    """See the module docstring.

    :param host: the host (paths and cgroup layout).
    :param interval: seconds between steps.
    :param source: where cold bytes come from; kidled with Koordinator's cold age by default.
    """

    def __init__(
        self, host: Host, interval: float = DEFAULT_INTERVAL, source: ColdPageSource | None = None
    ) -> None:
        self.name = NAME
        self.interval = interval
        self._meminfo_path = MEMINFO.path(host.paths)
        self._source: ColdPageSource = source or KidledColdPageSource(host.layout, host.paths)
        self._memory = MEMORY_STAT.bind(host.layout)
        self._targets = TargetCache()
        self._pod_plan: tuple[_Plan, ...] = ()
        self._apps: tuple[HostAppInfo, ...] | None = None
        self._app_plan: tuple[_Plan, ...] = ()

    def _plan(self, rel: str, cold_metric: str, hot_metric: str, entity: str) -> _Plan:
        return _Plan(
            rel,
            self._memory.path(rel),
            SeriesKey(cold_metric, entity),
            SeriesKey(hot_metric, entity),
        )

    def _replan_pods(self) -> None:
        plan = []
        for t in self._targets.plan:
            cold, hot = (
                (POD_MEMORY_COLD_PAGE, POD_MEMORY_WITH_HOT_PAGE_CACHE)
                if t.is_pod
                else (CONTAINER_MEMORY_COLD_PAGE, CONTAINER_MEMORY_WITH_HOT_PAGE_CACHE)
            )
            plan.append(self._plan(t.rel, cold, hot, t.entity))
        self._pod_plan = tuple(plan)

    def _replan_apps(self, apps: tuple[HostAppInfo, ...]) -> None:
        self._apps = apps
        self._app_plan = tuple(
            self._plan(
                app.cgroup_dir,
                HOST_APP_MEMORY_COLD_PAGE,
                HOST_APP_MEMORY_WITH_HOT_PAGE_CACHE,
                host_app_entity(app.name),
            )
            for app in apps
            if app.present
        )

    def collect(self, tick: Tick) -> CollectResult:
        source, read = self._source, tick.read
        try:
            facts = source.check(read)
            node_cold = source.cold_bytes(read, "")
        except UnsupportedError as err:
            return CollectResult(unsupported={source.name: err.reason})
        except CgroupGoneError as err:
            return CollectResult(
                unsupported={source.name: f"the root memory cgroup has no cold-page file ({err})"}
            )
        meminfo = MEMINFO.get(tick, self._meminfo_path)
        samples = [
            Sample(_NODE_COLD, float(node_cold)),
            Sample(_NODE_HOT, float(max(0, meminfo.used_with_page_cache - node_cold))),
        ]
        if self._targets.refresh(tick.workloads):
            self._replan_pods()
        apps = tick.workloads.host_apps
        if apps is not self._apps:
            self._replan_apps(apps)
        memory_stat = self._memory.get
        gone = 0
        skipped: list[str] = []
        for plan in (*self._pod_plan, *self._app_plan):
            try:
                cold = source.cold_bytes(read, plan.rel)
                memory = memory_stat(tick, plan.stat_path)
            except CgroupGoneError:
                gone += 1
                continue
            except UnsupportedError as err:
                skipped.append(f"{err.what}: {err.reason}")
                continue
            samples.append(Sample(plan.cold_key, float(cold)))
            hot = max(0, memory.usage_with_page_cache - cold)
            samples.append(Sample(plan.hot_key, float(hot)))
        if gone:
            logger.debug("%s: %d cgroups vanished during the step, skipped", NAME, gone)
        unsupported: dict[str, str] = {}
        if skipped:
            unsupported["memcg"] = f"{len(skipped)} cgroups skipped; first: {skipped[0]}"
        return CollectResult(samples=samples, info={INFO_KEY: dict(facts)}, unsupported=unsupported)

    def close(self) -> None:
        """Release the source (the DAMON source stops and removes its kdamond)."""
        close = getattr(self._source, "close", None)
        if close is not None:
            close()


KIDLED_CAPABILITY = "idle_page_stats"
DAMON_CAPABILITY = "damon_cold_pages"


def choose_source(
    host: Host, caps: Capabilities | None, state_dir: str, attrs: DamonAttrs
) -> ColdPageSource:
    """kidled where probing found it, else DAMON where probing found it, else kidled (which
    reports its reason). Without probing results (tests, benchmarks): kidled."""
    if caps is None or caps.supported(KIDLED_CAPABILITY) or not caps.supported(DAMON_CAPABILITY):
        return KidledColdPageSource(host.layout, host.paths)
    return DamonColdPageSource(host.layout, host.paths, state_dir, attrs=attrs)


def build(ctx: CollectorContext, interval: float) -> ColdMemoryCollector:
    """The table's factory (interval ``collect.cold_page_interval``)."""
    c = ctx.config.collect
    attrs = DamonAttrs(cold_age_s=c.cold_page_age)
    source = choose_source(ctx.host, ctx.capabilities, ctx.config.state_dir, attrs)
    return ColdMemoryCollector(ctx.host, interval, source)
