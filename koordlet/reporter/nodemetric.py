"""NodeMetric status: this node's usage as Koordinator's manager and scheduler read it.

:func:`build_status` turns the metric cache into a ``NodeMetric.status`` (``slo.koordinator.sh/
v1alpha1``), following the Go koordlet's NodeMetric informer field by field:

- ``updateTime``: when it was built (RFC 3339, seconds);
- ``nodeMetric.nodeUsage`` and ``nodeMetric.systemUsage``: the average over the collect
  policy's ``aggregateDurationSeconds`` (default 300) ending now, reported whatever the coverage;
- ``nodeMetric.aggregatedNodeUsages`` and ``aggregatedSystemUsages``: one entry per
  ``nodeAggregatePolicy.durations`` window (default 5m, 10m, 30m) with ``p50``, ``p90``,
  ``p95`` and ``p99`` (Koordinator's nearest-rank rule) and, beyond upstream, ``avg``; each is an
  empty object while the window's samples span less than half of it (the cold-start rule of
  ``validateTimeRangeRatio``), judged on the CPU series as upstream does;
- ``nodeMetric.numaUsages``: per NUMA node (``numaNodeID``) its ``nodeUsage`` (the averages of
  its CPUs' usage and of its memory usage without page cache) and its ``systemUsage``: CPU, the
  node's system CPU apportioned by the NUMA node's share of the node's CPU usage (the CRD's
  rule); memory is left out (the per-pod NUMA memory it needs is not collected here);
- ``podsMetric``: per pod with CPU samples in the window: ``namespace``, ``name``,
  ``podUsage`` (averages), ``priority`` (Koordinator priority class) and ``qos``;
- ``hostApplicationMetric``: the same for the NodeSLO's host applications.

Memory follows ``nodeMemoryCollectPolicy``: ``usageWithoutPageCache`` (default) reads the usage
without page cache, ``usageWithPageCache`` the usage with it, ``usageWithHotPageCache`` the usage
with hot page cache where the cold-page collector produced it (else the default). Quantities are
printed as Kubernetes prints them (:mod:`apis.nodemetric` writes the typed status): CPU in whole
milli-cores (``"1250m"``), memory in bytes in canonical binary form.

:class:`NodeMetricReporter` writes the status through the ``status`` subresource every
``reportIntervalSeconds`` (default 60, minimum 30) with conflict retry, behind a token bucket of
0.1 writes/s with a burst of 2 (upstream's ``statusUpdateQPS``/``Burst``), and not at all until
the NodeMetric exists (the manager creates it). ``prodReclaimableMetric`` and
``prodPeakMetric`` come from the peak predictor (:mod:`koordlet.reporter.predictor`) when one is
given and it can predict; otherwise the fields are left out, which the manager reads as nothing
reclaimable.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn, Protocol

from apis.nodemetric import (
    EMPTY_RESOURCE_MAP,
    AggregatedUsage,
    HostApplicationMetricInfo,
    NodeMetricInfo,
    NodeMetricStatus,
    NUMAMetric,
    PodMetricInfo,
    ResourceMap,
    node_metric_status_json,
    parse_node_metric_status,
)
from apis.records import frozen
from apis.slo import HostApplication
from apis.slo_inforce import NodeSLOInForce
from koordlet.metriccache import MIN_VALID_COVERAGE, MetricCache
from koordlet.metriccache import series as s
from koordlet.metriccache.aggregate import Aggregate
from koordlet.reporter.predictor import Reclaimable
from koordlet.statesinformer.kube import CollectPolicy
from koordlet.statesinformer.model import PodInfo
from kubeclient.client import KubeClient, Obj
from kubeclient.errors import ApiError, NotFound
from kubeclient.resources import NODE_METRICS
from kubeclient.writes import WriteRateLimiter, update_status

logger = logging.getLogger(__name__)

STATUS_UPDATE_QPS = 0.1
"""Writes per second the status writer may average (upstream ``statusUpdateQPS``)."""
STATUS_UPDATE_BURST = 2
"""Writes it may make at once (upstream ``statusUpdateBurst``)."""

AGGREGATIONS = ("avg", "p50", "p90", "p95", "p99")
"""Keys of each ``aggregatedNodeUsages[].usage`` (Koordinator's ``AggregationType`` values)."""


@frozen
class _MemorySeries:
    node: str
    pod: str
    host_app: str


_MEMORY_POLICY = {
    "usageWithoutPageCache": _MemorySeries(
        s.NODE_MEMORY_USAGE, s.POD_MEMORY_USAGE, s.HOST_APP_MEMORY_USAGE
    ),
    "usageWithPageCache": _MemorySeries(
        s.NODE_MEMORY_WITH_PAGE_CACHE,
        s.POD_MEMORY_WITH_PAGE_CACHE,
        s.HOST_APP_MEMORY_WITH_PAGE_CACHE,
    ),
    "usageWithHotPageCache": _MemorySeries(
        s.NODE_MEMORY_WITH_HOT_PAGE_CACHE,
        s.POD_MEMORY_WITH_HOT_PAGE_CACHE,
        s.HOST_APP_MEMORY_WITH_HOT_PAGE_CACHE,
    ),
}
_DEFAULT_MEMORY = _MEMORY_POLICY["usageWithoutPageCache"]


def _resources(cpu: float | None, memory: float | None) -> ResourceMap:
    """A ``ResourceMap`` of CPU (cores, truncated to the milli-core as the Go koordlet does) and
    memory (bytes, truncated); empty when nothing is known."""
    res: dict[str, int] = {}
    if cpu is not None:
        res["cpu"] = int(cpu * 1000)
    if memory is not None:
        res["memory"] = int(memory)
    return ResourceMap(res) if res else EMPTY_RESOURCE_MAP


class _Reader:
    """Window queries against the metric cache for one report (``end`` fixed)."""

    def __init__(self, cache: MetricCache, policy: CollectPolicy, end: float) -> None:
        self.cache = cache
        self.policy = policy
        self.end = end
        self.start = end - policy.aggregate_duration_seconds
        memory = _MEMORY_POLICY.get(policy.node_memory_collect_policy, _DEFAULT_MEMORY)
        if memory is not _DEFAULT_MEMORY and not cache.entities(memory.node):
            memory = _DEFAULT_MEMORY  # e.g. hot page cache without the cold-page collector
        self.memory = memory

    def avg(self, metric: str, entity: str) -> float | None:
        agg = self.cache.aggregate(metric, entity, self.start, self.end)
        return None if agg is None else agg.avg

    def usage(self, cpu_metric: str, mem_metric: str, entity: str) -> ResourceMap:
        return _resources(self.avg(cpu_metric, entity), self.avg(mem_metric, entity))

    def aggregated(
        self, cpu_metric: str, mem_metric: str, entity: str
    ) -> tuple[AggregatedUsage, ...]:
        out = []
        for seconds in self.policy.node_aggregate_durations:
            start = self.end - seconds
            cpu = self.cache.aggregate(cpu_metric, entity, start, self.end)
            mem = self.cache.aggregate(mem_metric, entity, start, self.end)
            usage: dict[str, ResourceMap]
            if cpu is None or cpu.coverage(start, self.end) < MIN_VALID_COVERAGE:
                usage = dict.fromkeys(AGGREGATIONS, EMPTY_RESOURCE_MAP)
            else:
                usage = {
                    kind: _resources(_value(cpu, kind), _value(mem, kind)) for kind in AGGREGATIONS
                }
            out.append(AggregatedUsage(float(seconds), usage))
        return tuple(out)


def _value(agg: Aggregate | None, kind: str) -> float | None:
    if agg is None:
        return None
    result: float = getattr(agg, kind)
    return result


def build_metric_status(
    cache: MetricCache,
    policy: CollectPolicy,
    pods: Iterable[PodInfo],
    host_apps: Iterable[HostApplication],
    now: float,
    prod_reclaimable: ResourceMap | None = None,
    prod_peak: ResourceMap | None = None,
) -> NodeMetricStatus:
    """The typed NodeMetric ``status`` for the window ending at ``now`` (see the module
    docstring); ``prod_reclaimable`` and ``prod_peak`` are the predictor's
    ``prodReclaimableMetric.resource`` and ``prodPeakMetric.resource``."""
    r = _Reader(cache, policy, now)
    numa = []
    node_cpu = r.avg(s.NODE_CPU_USAGE, s.NODE)
    system_cpu = r.avg(s.SYSTEM_CPU_USAGE, s.SYSTEM)
    for entity in sorted(
        set(cache.entities(s.NUMA_MEMORY_USAGE)) | set(cache.entities(s.NUMA_CPU_USAGE))
    ):
        node_id = entity.rpartition("/")[2]
        mem = r.avg(s.NUMA_MEMORY_USAGE, entity)
        cpu = r.avg(s.NUMA_CPU_USAGE, entity)
        if not node_id.isdigit() or (mem is None and cpu is None):
            continue
        system = None
        if cpu is not None and system_cpu is not None and node_cpu:
            system = _resources(system_cpu * cpu / node_cpu, None)
        numa.append(NUMAMetric(int(node_id), _resources(cpu, mem), system))
    node_metric = NodeMetricInfo(
        node_usage=r.usage(s.NODE_CPU_USAGE, r.memory.node, s.NODE),
        system_usage=r.usage(s.SYSTEM_CPU_USAGE, s.SYSTEM_MEMORY_USAGE, s.SYSTEM),
        aggregated_node_usages=r.aggregated(s.NODE_CPU_USAGE, r.memory.node, s.NODE),
        aggregated_system_usages=r.aggregated(s.SYSTEM_CPU_USAGE, s.SYSTEM_MEMORY_USAGE, s.SYSTEM),
        numa_usages=tuple(sorted(numa, key=lambda n: n.numa_node_id)),
    )
    pods_metric = []
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        entity = s.pod_entity(pod.uid)
        cpu = r.avg(s.POD_CPU_USAGE, entity)
        if cpu is None:
            continue  # no samples in the window: upstream skips the pod too
        pods_metric.append(
            PodMetricInfo(
                namespace=pod.namespace,
                name=pod.name,
                pod_usage=_resources(cpu, r.avg(r.memory.pod, entity)),
                priority=pod.priority_class,
                qos=pod.qos.value,
            )
        )
    apps_metric = []
    for app in host_apps:
        entity = s.host_app_entity(app.name)
        cpu = r.avg(s.HOST_APP_CPU_USAGE, entity)
        if cpu is None:
            continue
        apps_metric.append(
            HostApplicationMetricInfo(
                name=app.name,
                usage=_resources(cpu, r.avg(r.memory.host_app, entity)),
                priority=app.priority.value,
                qos=app.qos.value,
            )
        )
    return NodeMetricStatus(
        update_time=datetime.fromtimestamp(int(now), UTC),
        node_metric=node_metric,
        pods_metric=tuple(pods_metric),
        host_application_metric=tuple(apps_metric),
        prod_reclaimable_metric=prod_reclaimable,
        prod_peak_metric=prod_peak,
    )


def build_status(
    cache: MetricCache,
    policy: CollectPolicy,
    pods: Iterable[PodInfo],
    host_apps: Iterable[HostApplication],
    now: float,
    prod_reclaimable: Obj | None = None,
    prod_peak: Obj | None = None,
) -> Obj:
    """The NodeMetric ``status`` JSON (:func:`build_metric_status` written by
    :func:`apis.nodemetric.node_metric_status_json`); ``prod_reclaimable`` is the predictor's
    ``prodReclaimableMetric`` JSON (None: left out)."""
    reclaim = peak = None
    if prod_reclaimable is not None:
        reclaim = parse_node_metric_status(
            {"prodReclaimableMetric": prod_reclaimable}, "predictor"
        ).prod_reclaimable_metric
    if prod_peak is not None:
        peak = parse_node_metric_status({"prodPeakMetric": prod_peak}, "predictor").prod_peak_metric
    return node_metric_status_json(
        build_metric_status(cache, policy, pods, host_apps, now, reclaim, peak)
    )


class StatesView(Protocol):
    """What the reporter reads of the states informer (``KubeStatesSource`` is one)."""

    node_name: str
    collect_policy: CollectPolicy
    node_slo: NodeSLOInForce

    def node_metric(self) -> Obj | None: ...

    def list_pods(self) -> Mapping[str, PodInfo]: ...


class ReclaimablePredictor(Protocol):
    """What the reporter asks of the peak predictor (``PeakPredictor`` is one)."""

    def prod_reclaimable(self, now: float | None = None) -> Reclaimable | None: ...

    def prod_peak(self, now: float | None = None) -> Reclaimable | None: ...


@dataclass
class ReportStats:
    written: int = 0
    """Status writes that succeeded."""
    skipped_missing: int = 0
    """Reports skipped because the NodeMetric does not exist (yet)."""
    limited: int = 0
    """Reports refused by the write limiter."""
    failed: int = 0
    """Reports whose write failed (logged)."""
    skipped_no_samples: int = 0
    """Reports skipped because no node usage was collected yet (the first seconds)."""


FIRST_REPORT_RETRY_S = 2.0
"""Seconds between tries of the first report (before one is written)."""


class NodeMetricReporter:
    """Writes the node's NodeMetric status at the collect policy's report interval."""

    def __init__(
        self,
        client: KubeClient,
        states: StatesView,
        cache: MetricCache,
        *,
        limiter: WriteRateLimiter | None = None,
        predictor: ReclaimablePredictor | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self._client = client
        self._states = states
        self._cache = cache
        self._limiter = limiter or WriteRateLimiter(STATUS_UPDATE_QPS, STATUS_UPDATE_BURST)
        self._predictor = predictor
        self._clock = clock
        self._sleep = sleep
        self.stats = ReportStats()
        # The written status is not kept: at 200 pods it is about 0.4 MiB of dicts that nothing
        # reads again (the next report builds its own).

    def build(self) -> Obj:
        """The status for now (synchronous, on the event loop: the cache is not thread-safe)."""
        now = self._clock()
        reclaimable = peak = None
        if self._predictor is not None:
            prediction = self._predictor.prod_reclaimable(now)
            reclaimable = prediction.to_metric() if prediction is not None else None
            predicted_peak = self._predictor.prod_peak(now)
            peak = predicted_peak.to_metric() if predicted_peak is not None else None
        return build_status(
            self._cache,
            self._states.collect_policy,
            self._states.list_pods().values(),
            self._states.node_slo.host_applications,
            now,
            reclaimable,
            peak,
        )

    async def report_once(self) -> bool:
        """One report; whether a status was written. Never raises an API error (logged)."""
        name = self._states.node_name
        if self._states.node_metric() is None:
            self.stats.skipped_missing += 1
            logger.debug("NodeMetric %s does not exist yet; report skipped", name)
            return False
        status = self.build()
        if not ((status.get("nodeMetric") or {}).get("nodeUsage") or {}).get("resources"):
            self.stats.skipped_no_samples += 1
            logger.debug("NodeMetric %s: no node usage collected yet; report skipped", name)
            return False
        if not self._limiter.try_acquire():
            self.stats.limited += 1
            logger.warning("NodeMetric %s: write rate limit reached; report skipped", name)
            return False
        try:
            written = await update_status(
                self._client, NODE_METRICS, name, lambda _current: status, sleep=self._sleep
            )
        except NotFound:
            self.stats.skipped_missing += 1
            logger.info("NodeMetric %s disappeared; report skipped", name)
            return False
        except ApiError as err:
            self.stats.failed += 1
            logger.warning("NodeMetric %s status update failed: %s", name, err)
            return False
        self.stats.written += 1
        logger.debug("NodeMetric %s status written at rv %s", name, _rv(written))
        return True

    async def run(self) -> NoReturn:
        """Report at once, then every ``reportIntervalSeconds`` (re-read each time), until
        cancelled: upstream's reporter runs under ``wait.Until``, whose first call is
        immediate. Until a first status is written (no node sample collected yet, the manager
        not yet done creating the NodeMetric) it tries again every :data:`FIRST_REPORT_RETRY_S`
        seconds, so a new node's usage reaches the manager within seconds of the koordlet's
        start rather than a whole interval later."""
        reported = False
        while True:
            try:
                reported = await self.report_once() or reported
            except Exception:
                logger.exception("NodeMetric report failed")
            interval = self._states.collect_policy.report_interval_seconds
            await self._sleep(interval if reported else min(FIRST_REPORT_RETRY_S, interval))


def _rv(obj: Obj | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion", ""))
