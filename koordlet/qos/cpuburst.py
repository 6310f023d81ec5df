"""CPU burst: let latency-sensitive containers with CPU limits borrow CPU for short peaks.

Koordinator's ``cpuburst`` strategy (feature gate ``CPUBurst``), re-done from its documented
semantics (``docs/qos-cpu.md``). Only pods whose Koordinator QoS is not LSR, LSE or BE, and only
containers with a CPU limit, are touched. ``cpuBurstStrategy.policy`` picks the mechanisms:

* **CPU burst** (``cpuBurstOnly`` or ``auto``): ``cpu.cfs_burst_us`` (v2 ``cpu.max.burst``) of a
  container = ``limit (cores) x cpuBurstPercent% x 100000``, capped at the container's current
  quota (some kernels refuse a burst above the quota); the pod gets the sum. Any other policy
  writes 0.
* **CFS quota burst** (``cfsQuotaBurstOnly`` or ``auto``): a container throttled in the last
  collection gets its quota scaled up by 1.2 a round, up to ``cfsQuotaBurstPercent`` of its base
  quota (``limit x 100000``); the node's *share pool* (CPUs not held by LSE/LSR pods, used by
  anything but LSE/LSR/BE pods, system included) decides whether it may: at or over
  ``sharePoolThresholdPercent`` every scaled container is scaled down by 0.8 a round (never
  below the base), between 90 % of the threshold and the threshold nothing scales up, below it
  scaling up is allowed. With ``cfsQuotaBurstPeriodSeconds`` > 0 a token bucket per container
  (capacity ``period x (percent - 100)``) limits how long it may run over its limit: it drains by
  ``usage% - 100`` per whole second at or over 100 % usage, refills by ``100 - usage%`` under
  60 %, and an empty bucket scales down. Other policies reset quotas to the base.

The pod's quota moves by the same delta as its container's; scale-ups write pod quota, container
quota, container burst, pod burst, scale-downs the reverse, so a child never exceeds its parent.
Each container's own CPU limit (``ContainerInfo.cpu_limit_milli``) is its base; a pod with an
unlimited container has no pod quota and gets no pod write. The settings are ``cpuBurstStrategy``
of the NodeSLO in force (``ctx.node_slo()``, typed; its last good value when the NodeSLO's was
rejected), a pod's annotation merged over them. The strategy
opens no file: every round it reads the current quotas of the pods and containers it may touch
through the executor, in one job on the writer thread, as upstream reads them.

Which pods it touches, the arithmetic, the share pool's state and the token bucket are in
:mod:`koordlet.qos.cpuburstrules`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from apis.extension import ANNOTATION_POD_CPU_BURST as POD_BURST_ANNOTATION
from apis.records import frozen
from apis.slo import SchemaError
from apis.slo_strategies import CPUBurstStrategy, parse_cpu_burst_strategy
from koordlet.errors import (
    CgroupGoneError,
    HostError,
    InvalidValueError,
    UnsupportedError,
    WritesRefusedError,
)
from koordlet.metriccache import series
from koordlet.prom import GaugeMetricFamily, Metric
from koordlet.qos.cpuburstrules import (
    BurstLimiter,
    NodeState,
    adjust_by_node,
    base_quota_us,
    ceil_quota_us,
    cfs_quota_burst_enabled,
    container_limit_milli,
    container_op,
    cpu_burst_enabled,
    is_burstable,
    next_quota,
    node_state,
    safe_burst_us,
    share_pool_ratio,
)
from koordlet.qos.framework import StrategyContext, StrategyReport
from koordlet.qos.shared import WriteFailures, write_key
from koordlet.statesinformer.model import ContainerInfo, PodInfo, WorkloadSnapshot
from koordlet.system.knobs import CPU_BURST, CPU_CFS_QUOTA, Knob

logger = logging.getLogger(__name__)

NAME = "cpuburst"
FEATURE_GATE = "CPUBurst"
NODE_INFO_KEY = "node_info"

SUMMARY_INTERVAL = 60.0
"""Seconds between two info lines summing up the quota moves of CFS quota burst."""


# Settings ---------------------------------------------------------------------------------------


def pod_settings(pod: PodInfo, node: CPUBurstStrategy) -> CPUBurstStrategy:
    """The pod's ``koordinator.sh/cpuBurst`` config (JSON, the same fields) merged over the
    node's; the node's when absent or invalid (upstream then uses the node's)."""
    raw = pod.annotations.get(POD_BURST_ANNOTATION)
    if not raw:
        return node
    try:
        value = json.loads(raw)
        return parse_cpu_burst_strategy(
            value,
            base=node,
            path=f"annotations[{POD_BURST_ANNOTATION}]",
            source=f"pod {pod.namespace}/{pod.name}",
            strict=False,
        )
    except (ValueError, SchemaError) as err:  # SchemaError is a ValueError; named for the reader
        logger.debug("%s: pod %s/%s: bad %s annotation: %s", NAME, pod.namespace, pod.name,
                     POD_BURST_ANNOTATION, err)  # fmt: skip
        return node


# The strategy -----------------------------------------------------------------------------------


_Step = tuple[Knob[Any], str, int]
"""One quota or burst write of a scaling: ``(knob, cgroup, value)``."""


_GaugeKey = tuple[str, str, str, str]
"""``(pod namespace, pod name, container id, container name)``."""


@dataclass(slots=True)
class _Gauges:
    burst: dict[_GaugeKey, float] = field(default_factory=dict)
    quota: dict[_GaugeKey, float] = field(default_factory=dict)


@frozen
class _Target:
    """One burstable pod and its containers with a known limit."""

    pod: PodInfo
    settings: CPUBurstStrategy
    containers: tuple[tuple[ContainerInfo, int], ...]
    """``(container, limit milli)``."""


_KeptTargets = tuple[WorkloadSnapshot, CPUBurstStrategy, tuple[_Target, ...]]
_KeptLive = tuple[WorkloadSnapshot, frozenset[str], frozenset[_GaugeKey]]


class CPUBurst:
    """The ``cpuburst`` strategy; see the module docstring."""

    name = NAME

    def __init__(
        self,
        ctx: StrategyContext,
        interval: float = 1.0,
        *,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._ctx = ctx
        self._rng = rng
        self.interval = interval
        """Seconds between rounds: Koordinator's ``--reconcile-interval-seconds`` (1)."""
        self._node_name = ctx.config.node_name
        self._limiters: dict[str, BurstLimiter] = {}
        self._gauges = _Gauges()
        self._unsupported: set[str] = set()
        self._failures = WriteFailures(NAME, logger, clock=ctx.now)
        self._refused: list[str] = []
        self._direction: dict[str, str] = {}
        """Container id → ``up``/``down``: the last quota move (a turn is logged at info)."""
        self._changes: dict[str, int] = {}
        """Quota moves by direction since the last summary line."""
        self._summary_at: float | None = None
        self._kept_targets: _KeptTargets | None = None
        """The last snapshot, node settings and their targets (:meth:`_targets`)."""
        self._kept_live: _KeptLive | None = None
        """The last snapshot's container ids and gauge keys (:meth:`_live`)."""
        self.summary_interval = SUMMARY_INTERVAL
        """Seconds between two info summaries of the quota moves (each move is at debug)."""

    # Metrics ---------------------------------------------------------------------------------

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        """Prometheus collector protocol: fresh samples per scrape."""
        return list(self._families())

    def _families(self) -> Iterator[Metric]:
        labels = ["node", "pod_namespace", "pod_name", "container_id", "container_name"]
        burst = GaugeMetricFamily(
            "koordlet_container_scaled_cfs_burst_us",
            "The maximum accumulated run-time(in microseconds) in container-level set by koordlet",
            labels=labels,
        )
        for key, value in sorted(self._gauges.burst.items()):
            burst.add_metric([self._node_name, *key], value)
        yield burst
        quota = GaugeMetricFamily(
            "koordlet_container_scaled_cfs_quota_us",
            "Run-time replenished within a period (in microseconds) in container-level set by "
            "koordlet",
            labels=labels,
        )
        for key, value in sorted(self._gauges.quota.items()):
            quota.add_metric([self._node_name, *key], value)
        yield quota

    # The round -------------------------------------------------------------------------------

    def _node_state(self, node_settings: CPUBurstStrategy, inputs: dict[str, Any]) -> NodeState:
        ctx = self._ctx
        window = min(self.interval * 5, 10.0)
        node = ctx.fresh_aggregate(series.NODE_CPU_USAGE, series.NODE, window)
        processors = ctx.cache.get_info(NODE_INFO_KEY)
        cpus = processors.get("cpus") if isinstance(processors, dict) else None
        if node is None or not isinstance(cpus, list) or not cpus:
            inputs["share_pool"] = "unknown: node CPU usage stale or topology unknown"
            ctx.stale(NAME, "node CPU usage or CPU topology missing or stale")
            return NodeState.UNKNOWN
        snapshot = ctx.workloads()
        pod_used: dict[str, float] = {}
        for uid in snapshot.pods:
            agg = ctx.fresh_aggregate(series.POD_CPU_USAGE, series.pod_entity(uid), window)
            if agg is not None:
                pod_used[uid] = agg.avg
        ratio = share_pool_ratio(node.avg, len(cpus), snapshot.pods.values(), pod_used)
        state = node_state(ratio, node_settings.share_pool_threshold_percent)
        inputs.update(node_used_avg=node.avg, share_pool_ratio=ratio, node_state=state.value)
        return state

    def _targets(self, node_settings: CPUBurstStrategy) -> tuple[_Target, ...]:
        """The burstable pods with their settings; kept from the last round while the snapshot
        is the same object (it is replaced, never changed) and the node's settings are equal."""
        snapshot = self._ctx.workloads()
        kept = self._kept_targets
        if kept is not None and kept[0] is snapshot and kept[1] == node_settings:
            return kept[2]
        out = []
        for pod in snapshot.pods.values():
            if not is_burstable(pod):
                continue
            known = tuple(
                (c, lim) for c in pod.containers if (lim := container_limit_milli(pod, c))
            )
            if known:
                out.append(_Target(pod, pod_settings(pod, node_settings), known))
        self._kept_targets = (snapshot, node_settings, tuple(out))
        return self._kept_targets[2]

    async def _read_quotas(self, targets: Sequence[_Target]) -> dict[str, int | None]:
        """The current ``cpu.cfs_quota_us`` of every pod and container of ``targets`` (None:
        unlimited), read in one job on the writer thread; a cgroup gone or unreadable is left
        out (it is then not touched this round)."""
        executor = self._ctx.executor
        dirs = [t.pod.cgroup_dir for t in targets]
        dirs.extend(c.cgroup_dir for t in targets for c, _ in t.containers)

        def read_all() -> dict[str, int | None]:
            out: dict[str, int | None] = {}
            for rel in dirs:
                try:
                    out[rel] = executor.read(CPU_CFS_QUOTA, rel)
                except CgroupGoneError:
                    continue
                except HostError as err:
                    logger.debug("%s: quota of %s unreadable: %s", NAME, rel, err)
            return out

        if not dirs:
            return {}
        return await asyncio.wrap_future(executor.call(read_all))

    async def reconcile(self) -> None:
        """One round; a write the kernel refuses is that write's alone (the other containers'
        go on), reported, logged once per change, and the round ends with a
        :class:`~koordlet.errors.WritesRefusedError` naming the refusals."""
        self._refused = []
        await self._round()
        if self._refused:
            raise WritesRefusedError(NAME, self._refused)

    async def _round(self) -> None:
        ctx = self._ctx
        node_settings = ctx.node_slo().cpu_burst_strategy
        inputs: dict[str, Any] = {"policy": str(node_settings.policy)}
        quota_burst = cfs_quota_burst_enabled(node_settings)
        state = self._node_state(node_settings, inputs) if quota_burst else NodeState.UNKNOWN
        now = ctx.now()
        targets = self._targets(node_settings)
        quotas = await self._read_quotas(targets)
        burst_futures: list[tuple[str, Future[Any]]] = []
        scaled = 0
        for target in targets:
            burst_futures.extend(self._static_burst(target, quotas))
            for container, limit in target.containers:
                if await self._quota_burst(target, container, limit, state, now, quotas):
                    scaled += 1
        await self._settle(burst_futures)
        self._recycle(now)
        self._summarize(now)
        decision = f"{len(burst_futures)} burst writes, {scaled} quota changes"
        # stale only when the share pool was wanted (quota burst on) and could not be judged:
        # exactly the rounds counted by ctx.stale in _node_state
        stale = quota_burst and state is NodeState.UNKNOWN
        detail: dict[str, Any] = {}
        result = ""
        if self._refused:
            result = f"{len(self._refused)} writes refused"
            detail["refused_this_round"] = list(self._refused)
        if len(self._failures):
            detail["refused"] = self._failures.describe()
        ctx.report(NAME, StrategyReport(inputs, decision, result, stale=stale, detail=detail))

    # CPU burst -------------------------------------------------------------------------------

    def _static_burst(
        self, target: _Target, quotas: Mapping[str, int | None]
    ) -> list[tuple[str, Future[Any]]]:
        submit = self._ctx.executor.submit
        pod, settings = target.pod, target.settings
        out: list[tuple[str, Future[Any]]] = []
        pod_burst = 0
        for container, limit in target.containers:
            if container.cgroup_dir not in quotas:
                continue  # gone or unreadable
            burst = safe_burst_us(limit, settings, quotas[container.cgroup_dir])
            pod_burst += burst
            reason = f"CPUBurst: limit {limit}m x {settings.cpu_burst_percent}% ({settings.policy})"
            out.append(
                (
                    container.cgroup_dir,
                    submit(CPU_BURST, container.cgroup_dir, burst, strategy=NAME, reason=reason),
                )
            )
            key = (pod.namespace, pod.name, container.id, container.name)
            self._gauges.burst[key] = float(burst)
        pod_limit = pod.cpu_limit_milli or 0
        if pod_limit <= 0 or pod.cgroup_dir not in quotas:
            return out  # an unlimited pod (a container without a limit) keeps its burst
        if len(target.containers) < len(pod.containers):
            pod_burst = safe_burst_us(pod_limit, settings, quotas[pod.cgroup_dir])
        reason = f"CPUBurst: pod limit {pod_limit}m ({settings.policy})"
        out.append(
            (
                pod.cgroup_dir,
                submit(CPU_BURST, pod.cgroup_dir, pod_burst, strategy=NAME, reason=reason),
            )
        )
        return out

    # CFS quota burst -------------------------------------------------------------------------

    def _allowed(
        self,
        pod: PodInfo,
        container: ContainerInfo,
        limit: int,
        settings: CPUBurstStrategy,
        now: float,
    ) -> bool:
        period = settings.cfs_quota_burst_period_seconds
        if period < 0:
            return True
        if settings.cfs_quota_burst_percent < 100:
            return False
        usage = self._ctx.fresh_last(
            series.CONTAINER_CPU_USAGE, series.container_entity(pod.uid, container.id)
        )
        cores = limit / 1000 if usage is None else usage
        limiter = self._limiters.get(container.id)
        if limiter is None:
            limiter = BurstLimiter(period, settings.cfs_quota_burst_percent, now, self._rng)
            self._limiters[container.id] = limiter
        else:
            limiter.update(period, settings.cfs_quota_burst_percent, now)
        return limiter.allow(now, int(cores / (limit / 1000) * 100))

    async def _quota_burst(
        self,
        target: _Target,
        container: ContainerInfo,
        limit: int,
        state: NodeState,
        now: float,
        quotas: dict[str, int | None],
    ) -> bool:
        """Scale one container's quota (and its pod's by the same delta) by the rules in the
        module docstring, from the quotas read this round; ``quotas`` is updated with what was
        written. A container whose quota is unlimited or unreadable is left alone, as upstream;
        an unlimited pod gets no pod write."""
        pod, settings = target.pod, target.settings
        c_dir, p_dir = container.cgroup_dir, pod.cgroup_dir
        current = quotas.get(c_dir)
        if current is None:
            return False
        allowed = self._allowed(pod, container, limit, settings, now)
        throttled = self._ctx.fresh_last(
            series.CONTAINER_CPU_THROTTLED_RATIO, series.container_entity(pod.uid, container.id)
        )
        op = adjust_by_node(state, container_op(settings, allowed, throttled))
        base = base_quota_us(limit)
        new = next_quota(op, current, base, ceil_quota_us(base, settings))
        if new == current:
            return False
        delta = new - current
        pod_current = quotas.get(p_dir)
        pod_new = None if pod_current is None else pod_current + delta
        burst = safe_burst_us(limit, settings, new)
        throttled_text = "unknown" if throttled is None else f"{throttled:.2f}"
        reason = f"CFSQuotaBurst: {op.value}, node {state.value}, throttled {throttled_text}"
        quota_c: _Step = (CPU_CFS_QUOTA, c_dir, new)
        burst_c: _Step = (CPU_BURST, c_dir, burst)
        pod_steps: list[_Step] = []
        if pod_new is not None:
            pod_steps = [(CPU_CFS_QUOTA, p_dir, pod_new), (CPU_BURST, p_dir, burst)]
            # upstream: the pod takes its container's burst
        if delta > 0:  # grow: parent quota first, bursts after the quotas they must not exceed
            steps = [*pod_steps[:1], quota_c, burst_c, *pod_steps[1:]]
        else:  # shrink: bursts first, child before parent
            steps = [burst_c, quota_c, *pod_steps[::-1]]
        if not cpu_burst_enabled(settings):
            steps = [s for s in steps if s[0] is not CPU_BURST]
        for knob, rel, value in steps:
            try:
                await asyncio.wrap_future(
                    self._ctx.executor.submit(knob, rel, value, strategy=NAME, reason=reason)
                )
            except UnsupportedError as err:
                if knob is CPU_BURST:
                    self._note_unsupported(err)
                    continue
                raise
            except CgroupGoneError:
                logger.debug("%s: %s gone while scaling its quota", NAME, rel)
                return False
            except (HostError, InvalidValueError) as err:
                # the later steps depend on this one: this container waits for the next round
                self._refuse(write_key(knob.name, rel), str(err))
                return False
            self._failures.succeeded(write_key(knob.name, rel))
        quotas[c_dir] = new
        if pod_new is not None:
            quotas[p_dir] = pod_new
        if self._ctx.dry_run(NAME):
            return True
        key = (pod.namespace, pod.name, container.id, container.name)
        self._gauges.quota[key] = float(new)
        direction = "up" if new > current else "down"
        turned = self._direction.get(container.id) != direction
        self._direction[container.id] = direction
        self._changes[direction] = self._changes.get(direction, 0) + 1
        (logger.info if turned else logger.debug)(
            "%s: %s/%s/%s quota %s: %d -> %d us (%s)",
            NAME,
            pod.namespace,
            pod.name,
            container.name,
            "scaled up" if direction == "up" else "scaled down",
            current,
            new,
            reason,
        )
        return True

    # Housekeeping ----------------------------------------------------------------------------

    def _note_unsupported(self, err: UnsupportedError) -> None:
        text = str(err)
        if text not in self._unsupported:
            self._unsupported.add(text)
            logger.info("%s: CPU burst not written: %s", NAME, text)

    async def _settle(self, futures: list[tuple[str, Future[Any]]]) -> None:
        results = await asyncio.gather(
            *(asyncio.wrap_future(f) for _, f in futures), return_exceptions=True
        )
        for (rel, _), res in zip(futures, results, strict=True):
            key = write_key(CPU_BURST.name, rel)
            if isinstance(res, UnsupportedError):
                self._note_unsupported(res)
            elif isinstance(res, CgroupGoneError):
                logger.debug("%s: %s gone", NAME, rel)
                self._failures.forget((key,))
            elif isinstance(res, (HostError, InvalidValueError)):
                self._refuse(key, str(res))
            elif isinstance(res, BaseException):
                raise res
            else:
                self._failures.succeeded(key)

    def _refuse(self, key: str, error: str) -> None:
        self._failures.failed(key, error)
        self._refused.append(f"{key}: {error}")

    def _summarize(self, now: float) -> None:
        """One info line a ``summary_interval`` with the quota moves since the last one (a busy
        node moves quotas every second; each move is at debug, a turn at info)."""
        if self._summary_at is None:
            self._summary_at = now
        if now - self._summary_at < self.summary_interval or not self._changes:
            return
        logger.info(
            "%s: %d quota scale-ups and %d scale-downs in the last %.0fs; %d containers last "
            "scaled up",
            NAME,
            self._changes.get("up", 0),
            self._changes.get("down", 0),
            now - self._summary_at,
            sum(1 for d in self._direction.values() if d == "up"),
        )
        self._changes.clear()
        self._summary_at = now

    def _recycle(self, now: float) -> None:
        for cid in [c for c, lim in self._limiters.items() if lim.expired(now)]:
            del self._limiters[cid]
        gauges = (self._gauges.burst, self._gauges.quota)
        if not self._direction and not any(gauges):
            return  # nothing to forget (no burstable container with a limit)
        live_ids, live = self._live(self._ctx.workloads())
        for cid in [c for c in self._direction if c not in live_ids]:
            del self._direction[cid]
        for gauge in gauges:
            for key in [k for k in gauge if k not in live]:
                del gauge[key]

    def _live(self, snapshot: WorkloadSnapshot) -> tuple[frozenset[str], frozenset[_GaugeKey]]:
        """The snapshot's container ids and gauge keys, kept while it is the same object."""
        kept = self._kept_live
        if kept is None or kept[0] is not snapshot:
            ids = frozenset(c.id for p in snapshot.pods.values() for c in p.containers)
            keys = frozenset(
                (p.namespace, p.name, c.id, c.name)
                for p in snapshot.pods.values()
                for c in p.containers
            )
            kept = self._kept_live = (snapshot, ids, keys)
        return kept[1], kept[2]


def build(ctx: StrategyContext, interval: float) -> CPUBurst:
    """Table factory."""
    return CPUBurst(ctx, interval)
