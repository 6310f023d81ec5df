"""System usage: what the node uses outside pods and host applications (Koordinator's
``SystemResourceCollector``).

Each tick, from values of the same tick (``Tick.last`` sees what the collectors before this one
produced; the table runs this one last)::

    system = max(node - sum(pods) - sum(host apps), 0)          CPU in cores, memory in bytes

Pods are summed at pod level (containers are inside their pod's cgroup); a pod with no value yet
(its CPU counter is still seeding) counts 0, as upstream's per-tick pod sum leaves it out. When
the node value is missing (the node collector seeds on its first tick, or failed), nothing is
reported for that resource: a system figure without the node figure would be made up.
Host-application values are optional (an absent or seeding one counts 0).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from koordlet.collectors.framework import CollectorContext, CollectResult, Tick
from koordlet.metriccache.series import (
    HOST_APP_CPU_USAGE,
    HOST_APP_MEMORY_USAGE,
    NODE,
    NODE_CPU_USAGE,
    NODE_MEMORY_USAGE,
    POD_CPU_USAGE,
    POD_MEMORY_USAGE,
    SYSTEM,
    SYSTEM_CPU_USAGE,
    SYSTEM_MEMORY_USAGE,
    Sample,
    SeriesKey,
    host_app_entity,
    pod_entity,
)
from koordlet.statesinformer.model import HostAppInfo, WorkloadSnapshot
from koordlet.system.host import Host

logger = logging.getLogger(__name__)

NAME = "sysresource"

_CPU_KEY = SeriesKey(SYSTEM_CPU_USAGE, SYSTEM)
_MEM_KEY = SeriesKey(SYSTEM_MEMORY_USAGE, SYSTEM)

_RESOURCES = (
    (NODE_CPU_USAGE, POD_CPU_USAGE, HOST_APP_CPU_USAGE, _CPU_KEY),
    (NODE_MEMORY_USAGE, POD_MEMORY_USAGE, HOST_APP_MEMORY_USAGE, _MEM_KEY),
)


def _sum(last: Callable[[str, str], float | None], metric: str, entities: tuple[str, ...]) -> float:
    total = 0.0
    for entity in entities:
        value = last(metric, entity)
        if value is not None:
            total += value
    return total


class SystemResourceCollector:
    """See the module docstring."""

    def __init__(self, host: Host | None = None, interval: float = 1.0) -> None:
        self.name = NAME
        self.interval = interval
        self._snapshot: WorkloadSnapshot | None = None
        self._apps: tuple[HostAppInfo, ...] | None = None
        self._pods: tuple[str, ...] = ()
        self._host_apps: tuple[str, ...] = ()

    def collect(self, tick: Tick) -> CollectResult:
        snapshot = tick.workloads
        if snapshot is not self._snapshot:
            self._snapshot = snapshot
            self._pods = tuple(pod_entity(uid) for uid in snapshot.pods)
        if snapshot.host_apps is not self._apps:
            self._apps = snapshot.host_apps
            self._host_apps = tuple(host_app_entity(a.name) for a in self._apps if a.present)
        last = tick.last
        samples: list[Sample] = []
        for node_metric, pod_metric, app_metric, key in _RESOURCES:
            node = last(node_metric, NODE)
            if node is None:
                continue
            pods = _sum(last, pod_metric, self._pods)
            apps = _sum(last, app_metric, self._host_apps)
            samples.append(Sample(key, max(node - pods - apps, 0.0)))
        return CollectResult(samples=samples)


def build(ctx: CollectorContext, interval: float) -> SystemResourceCollector:
    """The table's factory."""
    return SystemResourceCollector(ctx.host, interval)
