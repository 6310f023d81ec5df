"""What ``/debug/summary`` and ``/debug/series`` compute: the node at a glance, and series of the
metric cache bucketed for a chart (one entity, or the pods of each QoS class summed).

Both read the metric cache and the inventory on the event loop, as the other ``/debug`` views
do. A latest value counts as current when it is at most :data:`STALE_INTERVALS` collect
intervals old, the rule of ``/metrics``; an older one is reported as ``null``, never as zero.
The NodeSLO thresholds are the ``resourceUsedThresholdWithBE`` section merged over Koordinator's
defaults (``apis.slo_strategies``), as the QoS strategies read it; docs/ui.md has the fields.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from apis.extension import QoSClass
from apis.records import frozen
from apis.slo_inforce import NodeSLOInForce
from apis.slo_strategies import (
    ResourceThresholdStrategy,
)
from koordlet.config import KoordletConfig
from koordlet.metriccache import series as s
from koordlet.server.exporter import STALE_INTERVALS, SampleReader
from koordlet.statesinformer.model import WorkloadSnapshot

logger = logging.getLogger(__name__)

PointsFn = Callable[[str, str, float, float], Sequence[tuple[float, float]]]
"""``(metric, entity, start, end)`` → the ``(ts, value)`` samples in the window, oldest first
(``MetricCache.points``)."""
ThresholdsFn = Callable[[], tuple[ResourceThresholdStrategy, str]]
"""``resourceUsedThresholdWithBE`` in force, and why the NodeSLO's own value of it was rejected
(empty when it was taken)."""

CLASS_ORDER: tuple[str, ...] = ("LSE", "LSR", "LS", "BE", "SYSTEM", "unknown")
"""QoS classes in the order the views list them; ``unknown`` holds pods without a class."""
MAX_POINTS = 2000
"""The most buckets one ``/debug/series`` answer may hold."""
DEFAULT_POINTS = 300
"""Buckets in a window when ``step`` is not given."""


@frozen
class UiDeps:
    """What the ``/debug/ui`` views read beyond :class:`koordlet.server.app.ServerDeps`."""

    config: KoordletConfig
    """The koordlet's configuration (node name, mode, dry run, collect interval)."""
    thresholds: ThresholdsFn
    """The suppress and evict thresholds in force (:func:`thresholds_of` the NodeSLO in force)."""
    node_info: Callable[[], object]
    """The nodeinfo collector's value (``cache.get_info("node_info")``): CPUs and NUMA memory."""
    points: PointsFn
    """The metric cache's raw samples in a window (``MetricCache.points``)."""


def class_of(qos: QoSClass) -> str:
    """The class name the views use: the QoS class, or ``unknown`` for none."""
    return str(qos) or "unknown"


def thresholds_of(node_slo: Callable[[], NodeSLOInForce]) -> ThresholdsFn:
    """A :data:`ThresholdsFn` over the NodeSLO in force: its ``resourceUsedThresholdWithBE``
    (the last good value when the newest was rejected) and why that section was rejected, or
    ``""``."""

    def thresholds() -> tuple[ResourceThresholdStrategy, str]:
        slo = node_slo()
        rejected = slo.rejected.get("resourceUsedThresholdWithBE")
        why = "" if rejected is None else str(rejected.error)
        return slo.strategies.resource_used_threshold_with_be, why

    return thresholds


def _fraction(percent: int | None, capacity: float | None) -> float | None:
    if percent is None or capacity is None:
        return None
    return capacity * percent / 100


def summary_payload(
    ui: UiDeps,
    cache: SampleReader,
    snapshot: WorkloadSnapshot,
    now: float,
) -> dict[str, Any]:
    """``/debug/summary``: mode, dry run, capacity, current usage, the BE allowance and the
    NodeSLO thresholds in cores and bytes, and the pods of each QoS class with their usage."""
    cfg = ui.config
    max_age = STALE_INTERVALS * cfg.collect.res_used_interval

    def fresh(metric: str, entity: str) -> float | None:
        sample = cache.last_sample(metric, entity)
        if sample is None or now - sample[0] > max_age:
            return None
        return sample[1]

    info = ui.node_info()
    # Imported at the first /debug/summary, with the page (koordlet.server.app's _LazyUi).
    from koordlet.qos.cpupicker import processors_from_node_info
    from koordlet.qos.sysreconcile import node_memory_total

    cpus = len(processors_from_node_info(info)) or None
    memory = node_memory_total(info)
    th, rejected = ui.thresholds()
    classes: dict[str, dict[str, Any]] = {}
    for pod in snapshot.pods.values():
        row = classes.setdefault(
            class_of(pod.qos), {"pods": 0, "cpu_cores": 0.0, "memory_bytes": 0.0, "unmeasured": 0}
        )
        row["pods"] += 1
        entity = s.pod_entity(pod.uid)
        cpu = fresh(s.POD_CPU_USAGE, entity)
        mem = fresh(s.POD_MEMORY_USAGE, entity)
        if cpu is None and mem is None:
            row["unmeasured"] += 1
        row["cpu_cores"] += cpu or 0.0
        row["memory_bytes"] += mem or 0.0
    return {
        "now": now,
        "node": cfg.node_name,
        "mode": "standalone" if cfg.standalone else "cluster",
        "dry_run": {"all": cfg.qos.dry_run, "strategies": sorted(cfg.qos.dry_run_strategies)},
        "collect_interval_s": cfg.collect.res_used_interval,
        "capacity": {"cpu_cores": cpus, "memory_bytes": memory},
        "usage": {
            "node_cpu_cores": fresh(s.NODE_CPU_USAGE, s.NODE),
            "node_memory_bytes": fresh(s.NODE_MEMORY_USAGE, s.NODE),
            "node_memory_with_page_cache_bytes": fresh(s.NODE_MEMORY_WITH_PAGE_CACHE, s.NODE),
            "system_cpu_cores": fresh(s.SYSTEM_CPU_USAGE, s.SYSTEM),
            "system_memory_bytes": fresh(s.SYSTEM_MEMORY_USAGE, s.SYSTEM),
            "be_cpu_cores": fresh(s.BE_CPU_USAGE, s.BE),
        },
        "be": {
            "cpu_allowance_cores": fresh(s.BE_CPU_REAL_LIMIT, s.BE),
            "cpu_request_cores": fresh(s.BE_CPU_REQUEST, s.BE),
            "cpu_used_cores": fresh(s.BE_CPU_USAGE, s.BE),
        },
        "thresholds": {
            "enable": th.enable,
            "cpu_suppress_policy": str(th.cpu_suppress_policy),
            "cpu_suppress_threshold_percent": th.cpu_suppress_threshold_percent,
            "cpu_suppress_threshold_cores": _fraction(th.cpu_suppress_threshold_percent, cpus),
            "memory_evict_threshold_percent": th.memory_evict_threshold_percent,
            "memory_evict_threshold_bytes": _fraction(th.memory_evict_threshold_percent, memory),
            "cpu_evict_threshold_percent": th.cpu_evict_threshold_percent,
            "nodeslo_rejected": rejected,
        },
        "classes": {c: classes[c] for c in CLASS_ORDER if c in classes},
        "host_apps": len(snapshot.host_apps),
    }


# Series --------------------------------------------------------------------------------------


def bucket_step(window: float, step: float | None) -> float:
    """The bucket width: ``step`` when given, else the window over :data:`DEFAULT_POINTS`
    (at least a millisecond, the cache's resolution). ``ValueError`` when it would make more than
    :data:`MAX_POINTS` buckets."""
    width = step if step is not None else max(window / DEFAULT_POINTS, 0.001)
    if window / width > MAX_POINTS:
        raise ValueError(
            f"window {window:g}s in steps of {width:g}s makes more than {MAX_POINTS} points"
        )
    return width


def bucketed(
    entities: Iterable[str], metric: str, points: PointsFn, start: float, end: float, step: float
) -> list[list[float]]:
    """``[ts, value]`` per bucket of ``step`` seconds (aligned to multiples of ``step`` since the
    epoch, so that two calls agree on the buckets they share): each entity's mean over the
    bucket, summed over the entities with samples in it; ``ts`` is the bucket's newest sample."""
    sums: dict[int, float] = {}
    newest: dict[int, float] = {}
    for entity in entities:
        acc: dict[int, list[float]] = {}
        for ts, value in points(metric, entity, start, end):
            k = math.floor(ts / step)
            cell = acc.get(k)
            if cell is None:
                acc[k] = [value, 1.0, ts]
            else:
                cell[0] += value
                cell[1] += 1.0
                cell[2] = ts
        for k, (total, n, ts) in acc.items():
            sums[k] = sums.get(k, 0.0) + total / n
            if ts > newest.get(k, -math.inf):
                newest[k] = ts
    return [[round(newest[k], 3), sums[k]] for k in sorted(sums)]


def pods_by_class(snapshot: WorkloadSnapshot) -> Mapping[str, list[str]]:
    """The pod entities of each QoS class, classes in :data:`CLASS_ORDER`."""
    out: dict[str, list[str]] = {}
    for pod in snapshot.pods.values():
        out.setdefault(class_of(pod.qos), []).append(s.pod_entity(pod.uid))
    return {c: out[c] for c in CLASS_ORDER if c in out}
