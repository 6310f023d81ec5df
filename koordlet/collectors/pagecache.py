"""Pod and container memory including page cache (Koordinator's ``PageCacheCollector``).

For every pod and container of the inventory, each tick reports, in bytes::

    anon + unevictable + active_file + inactive_file

(``MemoryStatRaw.UsageWithPageCache()`` upstream, from ``memory.stat``; here the stat table's
``memory_lru``: v1 ``hierarchical_*`` lines of ``memory.numa_stat``, the same kernel counters, v2
``memory.stat``). It parses the same bytes the pod resource collector read in this tick: the
tick memoizes reads and parses, so the file is neither read nor parsed a second time.

The node-level counterpart, ``MemTotal - MemFree``, comes from the node resource collector,
which parses ``/proc/meminfo`` anyway; emitting it here too would write the same series twice
per tick. Upstream gates this collector behind ``--enable-page-cache-collector``; here it is on
by default because it costs no extra reads, and the system collector's page-cache figures need
it.
"""

from __future__ import annotations

import logging
from operator import add
from typing import NamedTuple

from koordlet.collectors.framework import CollectorContext, CollectResult, Tick
from koordlet.collectors.shared import TargetCache, target_paths
from koordlet.errors import CgroupGoneError
from koordlet.metriccache.series import (
    CONTAINER_MEMORY_WITH_PAGE_CACHE,
    POD_MEMORY_WITH_PAGE_CACHE,
    Sample,
    SeriesKey,
)
from koordlet.system.host import Host
from koordlet.system.stats import MEMORY_LRU

logger = logging.getLogger(__name__)

NAME = "pagecache"


class _Plan(NamedTuple):
    """The targets' columns, in the targets' order (a tuple per column: see podresource's)."""

    paths: tuple[str, ...] = ()
    keys: tuple[SeriesKey, ...] = ()


class PageCacheCollector:
    """See the module docstring."""

    def __init__(self, host: Host, interval: float = 1.0) -> None:
        self.name = NAME
        self.interval = interval
        self._memory = MEMORY_LRU.bind(host.layout)
        self._targets = TargetCache()
        self._plan = _Plan()

    def collect(self, tick: Tick) -> CollectResult:
        if self._targets.refresh(tick.workloads):
            targets = self._targets.plan
            self._plan = _Plan(
                target_paths(self._memory, targets),
                tuple(
                    SeriesKey(
                        POD_MEMORY_WITH_PAGE_CACHE
                        if t.is_pod
                        else CONTAINER_MEMORY_WITH_PAGE_CACHE,
                        t.entity,
                    )
                    for t in targets
                ),
            )
        values = self._memory.column(tick, self._plan.paths) if self._plan.paths else None
        if values is not None:  # read and parsed at once, or parsed by the usage collector
            anon, unevictable, file = zip(*values, strict=True)
            usage = list(map(float, map(add, map(add, anon, unevictable), file)))
            return CollectResult(columns=[(self._plan.keys, usage)])
        mem = self._memory  # BoundStat.get inlined: a call less per file
        parse, pick, shared = mem.parse, mem.pick, mem.shared
        read, parsed = tick.read, tick.parsed
        samples: list[Sample] = []
        append = samples.append
        new = tuple.__new__  # Sample's own __new__ is Python code; this skips it
        gone = 0
        for path, key in zip(*self._plan, strict=True):
            try:
                m = parsed(path, parse) if shared else parse(read(path), path)
                if pick is not None:
                    m = pick(m, path)
            except CgroupGoneError:
                gone += 1
                continue
            # MemoryLru.usage_with_page_cache without the property call: anon + unevictable +
            # file (active_file + inactive_file).
            append(new(Sample, (key, float(m[0] + m[1] + m[2]))))
        if gone:
            logger.debug("%s: %d cgroups vanished during the tick, skipped", NAME, gone)
        return CollectResult(samples=samples)


def build(ctx: CollectorContext, interval: float) -> PageCacheCollector:
    """The table's factory."""
    return PageCacheCollector(ctx.host, interval)
