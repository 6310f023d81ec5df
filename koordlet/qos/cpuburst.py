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
A strategy reads no file: the current quotas are the ones it last wrote (the kubelet's base
before that).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from apis.extension import QoSClass
from apis.slo import DEFAULT_CPU_BURST_STRATEGY
from koordlet.errors import CgroupGoneError, UnsupportedError
from koordlet.metriccache import series
from koordlet.qos.manager import StrategyContext, StrategyReport
from koordlet.statesinformer.model import ContainerInfo, PodInfo

logger = logging.getLogger(__name__)

NAME = "cpuburst"
FEATURE_GATE = "CPUBurst"
NODE_INFO_KEY = "node_info"
POD_BURST_ANNOTATION = "koordinator.sh/cpuBurst"
"""A pod's own ``CPUBurstConfig`` (JSON), merged over the NodeSLO's."""

CFS_PERIOD_US = 100_000
"""Koordinator's ``CFSBasePeriodValue``."""
CFS_INCREASE_STEP = 1.2
CFS_DECREASE_STEP = 0.8
SHARE_POOL_COOLING_RATIO = 0.9
"""Between this fraction of the threshold and the threshold the node is *cooling*."""
LIMITER_CONSUME_PERCENT = 100
LIMITER_SAVE_PERCENT = 60

POLICY_NONE = "none"
POLICY_CPU_BURST_ONLY = "cpuBurstOnly"
POLICY_CFS_QUOTA_BURST_ONLY = "cfsQuotaBurstOnly"
POLICY_AUTO = "auto"


# Settings ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BurstSettings:
    """``cpuBurstStrategy`` (or a pod's ``koordinator.sh/cpuBurst``) over the defaults."""

    policy: str = POLICY_NONE
    """``policy``: none, cpuBurstOnly, cfsQuotaBurstOnly or auto."""
    cpu_burst_percent: int = 100
    """``cpuBurstPercent``: burst as a percent of the limit."""
    cfs_quota_burst_percent: int = 300
    """``cfsQuotaBurstPercent``: the scaled quota's ceiling, percent of the base quota."""
    cfs_quota_burst_period_seconds: int = -1
    """``cfsQuotaBurstPeriodSeconds``: how long a container may run over its limit; -1: no
    limit."""
    share_pool_threshold_percent: int = 50
    """``sharePoolThresholdPercent``: share-pool usage at which scaled quotas come down."""

    @property
    def cpu_burst_enabled(self) -> bool:
        return self.policy in (POLICY_AUTO, POLICY_CPU_BURST_ONLY)

    @property
    def cfs_quota_burst_enabled(self) -> bool:
        return self.policy in (POLICY_AUTO, POLICY_CFS_QUOTA_BURST_ONLY)


_FIELDS = {
    "policy": "policy",
    "cpuBurstPercent": "cpu_burst_percent",
    "cfsQuotaBurstPercent": "cfs_quota_burst_percent",
    "cfsQuotaBurstPeriodSeconds": "cfs_quota_burst_period_seconds",
    "sharePoolThresholdPercent": "share_pool_threshold_percent",
}


def burst_settings(
    section: Mapping[str, Any] | None, pod_override: Mapping[str, Any] | None = None
) -> BurstSettings:
    """Koordinator's defaults, then the NodeSLO's ``cpuBurstStrategy``, then a pod's own."""
    merged: dict[str, Any] = dict(DEFAULT_CPU_BURST_STRATEGY)
    for layer in (section, pod_override):
        if layer:
            merged.update({k: v for k, v in layer.items() if v is not None and k in _FIELDS})
    return BurstSettings(
        policy=str(merged["policy"]),
        cpu_burst_percent=int(merged["cpuBurstPercent"]),
        cfs_quota_burst_percent=int(merged["cfsQuotaBurstPercent"]),
        cfs_quota_burst_period_seconds=int(merged["cfsQuotaBurstPeriodSeconds"]),
        share_pool_threshold_percent=int(merged["sharePoolThresholdPercent"]),
    )


def pod_override(pod: PodInfo) -> Mapping[str, Any] | None:
    """The pod's ``koordinator.sh/cpuBurst`` config; None when absent or malformed (upstream
    then uses the node's)."""
    raw = pod.annotations.get(POD_BURST_ANNOTATION)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        logger.info("%s: pod %s/%s: bad %s annotation", NAME, pod.namespace, pod.name, raw)
        return None
    return value if isinstance(value, dict) else None


# Arithmetic -------------------------------------------------------------------------------------


def is_burstable(pod: PodInfo) -> bool:
    """Upstream's ``IsPodCPUBurstable``: not LSR, LSE or BE."""
    return pod.qos not in (QoSClass.LSR, QoSClass.LSE, QoSClass.BE)


def base_quota_us(limit_milli: int) -> int:
    """The kubelet's quota for a CPU limit: ``limit x 100000 / 1000`` (integer)."""
    return limit_milli * CFS_PERIOD_US // 1000


def static_burst_us(limit_milli: int, settings: BurstSettings) -> int:
    """``limit (cores) x cpuBurstPercent% x 100000``; 0 when CPU burst is off or unlimited."""
    if not settings.cpu_burst_enabled or limit_milli <= 0:
        return 0
    return int(limit_milli / 1000 * (settings.cpu_burst_percent / 100) * CFS_PERIOD_US)


def safe_burst_us(limit_milli: int, settings: BurstSettings, quota: int | None) -> int:
    """:func:`static_burst_us` capped at the current quota (unless unlimited)."""
    burst = static_burst_us(limit_milli, settings)
    if quota is not None and 0 < quota < burst:
        return quota
    return burst


def ceil_quota_us(base: int, settings: BurstSettings) -> int:
    """The highest quota CFS quota burst may set: ``base x cfsQuotaBurstPercent%`` (> 100)."""
    if settings.cfs_quota_burst_percent > 100:
        return int(base * settings.cfs_quota_burst_percent / 100)
    return base


class NodeState(Enum):
    """The share pool's state (upstream's ``nodeStateForBurst``)."""

    OVERLOAD = "overload"
    """usage >= threshold"""
    COOLING = "cooling"
    """90 % of the threshold <= usage < threshold"""
    IDLE = "idle"
    """usage < 90 % of the threshold"""
    UNKNOWN = "unknown"
    """no usage figures"""


class Op(Enum):
    """What happens to a container's quota this round."""

    UP = "scaleUp"
    DOWN = "scaleDown"
    REMAIN = "remain"
    RESET = "reset"


def share_pool_ratio(
    node_used: float,
    total_cpus: int,
    pods: Iterable[PodInfo],
    pod_used: Mapping[str, float],
) -> float:
    """Share-pool usage / share-pool size. The pool is every CPU less the requests of LSE and
    LSR pods; its usage is the node's (system included) less what LSE, LSR and BE pods use. 1.0
    when the pool is empty."""
    total = float(total_cpus)
    used = node_used
    for pod in pods:
        exclusive = pod.qos in (QoSClass.LSE, QoSClass.LSR)
        if exclusive:
            total -= (pod.cpu_request_milli or 0) / 1000
        if (exclusive or pod.qos is QoSClass.BE) and pod.uid in pod_used:
            used -= pod_used[pod.uid]
    return used / total if total > 0 else 1.0


def node_state(ratio: float | None, threshold_percent: int) -> NodeState:
    """The pool's state for a usage ratio (None: unknown)."""
    if ratio is None:
        return NodeState.UNKNOWN
    threshold = threshold_percent / 100
    if ratio >= threshold:
        return NodeState.OVERLOAD
    if ratio >= threshold * SHARE_POOL_COOLING_RATIO:
        return NodeState.COOLING
    return NodeState.IDLE


def container_op(settings: BurstSettings, allowed: bool, throttled: float | None) -> Op:
    """The operation a container asks for: reset when quota burst is off, down when its token
    bucket is empty, up when it was throttled, else remain."""
    if not settings.cfs_quota_burst_enabled:
        return Op.RESET
    if not allowed:
        return Op.DOWN
    if throttled is not None and throttled > 0:
        return Op.UP
    return Op.REMAIN


def adjust_by_node(state: NodeState, op: Op) -> Op:
    """An overloaded pool turns up and remain into down; a cooling or unknown one turns up into
    remain."""
    if state is NodeState.OVERLOAD and op in (Op.UP, Op.REMAIN):
        return Op.DOWN
    if state in (NodeState.COOLING, NodeState.UNKNOWN) and op is Op.UP:
        return Op.REMAIN
    return op


def next_quota(op: Op, current: int, base: int, ceiling: int) -> int:
    """The container's quota after ``op``, kept within ``[base, ceiling]``."""
    target = current
    if op is Op.UP:
        target = int(current * CFS_INCREASE_STEP)
    elif op is Op.DOWN:
        target = int(current * CFS_DECREASE_STEP)
    elif op is Op.RESET:
        target = base
    return max(base, min(target, ceiling))


class BurstLimiter:
    """One container's token bucket (upstream's ``burstLimiter``).

    Capacity ``period x (percent - 100)``; starts at a random level in [0, capacity / 2).
    ``allow(now, usage_percent)`` drains ``(usage - 100) x whole seconds`` at or over 100 %,
    refills ``(100 - usage) x whole seconds`` under 60 %, clamps to ``[-capacity, capacity]`` and
    allows while tokens remain. Whole seconds: at a 1 s interval a round that comes a little
    early counts 0 seconds, as upstream's ``int64(seconds)`` does.
    """

    def __init__(
        self, period_s: int, percent: int, now: float, rng: Callable[[], float] = random.random
    ) -> None:
        self._rng = rng
        self.capacity = 0
        self.tokens = 0
        self.last = now
        self.expire_after = 0.0
        self.reset(period_s, percent, now)

    def reset(self, period_s: int, percent: int, now: float) -> None:
        self.capacity = period_s * (percent - 100)
        self.tokens = int(self.capacity * (self._rng() / 2))
        self.last = now
        self.expire_after = 2.0 * period_s

    def update(self, period_s: int, percent: int, now: float) -> None:
        """Start over when the configuration changed the capacity."""
        if period_s * (percent - 100) != self.capacity:
            self.reset(period_s, percent, now)

    def allow(self, now: float, usage_percent: int) -> bool:
        seconds = int(now - self.last)
        if usage_percent >= LIMITER_CONSUME_PERCENT:
            self.tokens -= (usage_percent - 100) * seconds
        elif usage_percent < LIMITER_SAVE_PERCENT:
            self.tokens += (100 - usage_percent) * seconds
        self.tokens = max(min(self.tokens, self.capacity), -self.capacity)
        self.last = now
        return self.tokens > 0

    def expired(self, now: float) -> bool:
        return now - self.last > self.expire_after


# The strategy -----------------------------------------------------------------------------------


def container_limit_milli(pod: PodInfo, container: ContainerInfo) -> int | None:
    """The container's CPU limit when known: its own field when the inventory gives one, else
    the pod's for a single-container pod."""
    own = getattr(container, "cpu_limit_milli", None)
    if isinstance(own, int):
        return own if own > 0 else None
    if len(pod.containers) == 1 and pod.cpu_limit_milli is not None and pod.cpu_limit_milli > 0:
        return pod.cpu_limit_milli
    return None


def _qos_setting(config: Any, name: str, default: float) -> float:
    qos = getattr(config, "qos", None)
    value = getattr(qos, name, None) if qos is not None else None
    return float(value) if isinstance(value, int | float) and value > 0 else default


@dataclass(slots=True)
class _Gauges:
    burst: dict[tuple[str, str, str, str], float] = field(default_factory=dict)
    quota: dict[tuple[str, str, str, str], float] = field(default_factory=dict)


class CPUBurst:
    """The ``cpuburst`` strategy; see the module docstring."""

    name = NAME

    def __init__(self, ctx: StrategyContext, *, rng: Callable[[], float] = random.random) -> None:
        self._ctx = ctx
        self._rng = rng
        self.interval = _qos_setting(ctx.config, "reconcile_interval", 1.0)
        """Seconds between rounds: Koordinator's ``--reconcile-interval-seconds`` (1)."""
        self._node_name = str(getattr(ctx.config, "node_name", ""))
        self._limiters: dict[str, BurstLimiter] = {}
        self._quota: dict[str, int] = {}
        """Quota last written per cgroup (containers and pods); absent: the kubelet's base."""
        self._gauges = _Gauges()
        self._unsupported: set[str] = set()

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

    def _node_state(self, node_settings: BurstSettings, inputs: dict[str, Any]) -> NodeState:
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

    async def reconcile(self) -> None:
        ctx = self._ctx
        node_settings = burst_settings(ctx.node_slo().cpu_burst_strategy)
        inputs: dict[str, Any] = {"policy": node_settings.policy}
        state = (
            self._node_state(node_settings, inputs)
            if node_settings.cfs_quota_burst_enabled
            else NodeState.UNKNOWN
        )
        now = ctx.now()
        burst_futures: list[tuple[str, Future[Any]]] = []
        scaled = 0
        seen: set[str] = set()
        for pod in ctx.workloads().pods.values():
            if not is_burstable(pod) or not pod.cpu_limit_milli or pod.cpu_limit_milli <= 0:
                continue
            settings = burst_settings(ctx.node_slo().cpu_burst_strategy, pod_override(pod))
            seen.add(pod.cgroup_dir)
            seen.update(c.cgroup_dir for c in pod.containers)
            burst_futures.extend(self._static_burst(pod, settings))
            for container in pod.containers:
                limit = container_limit_milli(pod, container)
                if limit is None:
                    continue
                if await self._quota_burst(pod, container, limit, settings, state, now):
                    scaled += 1
        await self._settle(burst_futures)
        self._recycle(now, seen)
        decision = f"{len(burst_futures)} burst writes, {scaled} quota changes"
        ctx.report(NAME, StrategyReport(inputs, decision, stale=state is NodeState.UNKNOWN))

    # CPU burst -------------------------------------------------------------------------------

    def _static_burst(self, pod: PodInfo, settings: BurstSettings) -> list[tuple[str, Future[Any]]]:
        submit = self._ctx.executor.submit
        out: list[tuple[str, Future[Any]]] = []
        pod_burst = 0
        all_known = bool(pod.containers)
        for container in pod.containers:
            limit = container_limit_milli(pod, container)
            if limit is None:
                all_known = False
                continue
            quota = self._quota.get(container.cgroup_dir, base_quota_us(limit))
            burst = safe_burst_us(limit, settings, quota)
            pod_burst += burst
            reason = f"CPUBurst: limit {limit}m x {settings.cpu_burst_percent}% ({settings.policy})"
            out.append(
                (
                    container.cgroup_dir,
                    submit("cpu_burst", container.cgroup_dir, burst, strategy=NAME, reason=reason),
                )
            )
            key = (pod.namespace, pod.name, container.id, container.name)
            self._gauges.burst[key] = float(burst)
        pod_limit = pod.cpu_limit_milli or 0
        if not all_known:
            pod_quota = self._quota.get(pod.cgroup_dir, base_quota_us(pod_limit))
            pod_burst = safe_burst_us(pod_limit, settings, pod_quota)
        reason = f"CPUBurst: pod limit {pod.cpu_limit_milli}m ({settings.policy})"
        out.append(
            (
                pod.cgroup_dir,
                submit("cpu_burst", pod.cgroup_dir, pod_burst, strategy=NAME, reason=reason),
            )
        )
        return out

    # CFS quota burst -------------------------------------------------------------------------

    def _allowed(
        self,
        pod: PodInfo,
        container: ContainerInfo,
        limit: int,
        settings: BurstSettings,
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
        pod: PodInfo,
        container: ContainerInfo,
        limit: int,
        settings: BurstSettings,
        state: NodeState,
        now: float,
    ) -> bool:
        allowed = self._allowed(pod, container, limit, settings, now)
        throttled = self._ctx.fresh_last(
            series.CONTAINER_CPU_THROTTLED_RATIO, series.container_entity(pod.uid, container.id)
        )
        op = adjust_by_node(state, container_op(settings, allowed, throttled))
        base = base_quota_us(limit)
        current = self._quota.get(container.cgroup_dir, base)
        target = next_quota(op, current, base, ceil_quota_us(base, settings))
        if target == current:
            return False
        delta = target - current
        pod_current = self._quota.get(pod.cgroup_dir, base_quota_us(pod.cpu_limit_milli or 0))
        pod_target = pod_current + delta
        burst = safe_burst_us(limit, settings, target)
        reason = f"CFSQuotaBurst: {op.value}, node {state.value}, throttled {throttled}"
        c_dir, p_dir = container.cgroup_dir, pod.cgroup_dir
        quota_c = ("cpu_cfs_quota", c_dir, target)
        quota_p = ("cpu_cfs_quota", p_dir, pod_target)
        burst_c = ("cpu_burst", c_dir, burst)
        burst_p = ("cpu_burst", p_dir, burst)  # upstream: the pod takes its container's burst
        if delta > 0:  # grow: parent quota first, bursts after the quotas they must not exceed
            steps = [quota_p, quota_c, burst_c, burst_p]
        else:  # shrink: bursts first, child before parent
            steps = [burst_c, quota_c, burst_p, quota_p]
        if not settings.cpu_burst_enabled:
            steps = [s for s in steps if s[0] != "cpu_burst"]
        for knob, rel, value in steps:
            try:
                await asyncio.wrap_future(
                    self._ctx.executor.submit(knob, rel, value, strategy=NAME, reason=reason)
                )
            except UnsupportedError as err:
                if knob == "cpu_burst":
                    self._note_unsupported(err)
                    continue
                raise
            except CgroupGoneError:
                logger.debug("%s: %s gone while scaling its quota", NAME, rel)
                return False
        if self._ctx.dry_run(NAME):
            return True
        self._quota[c_dir] = target
        self._quota[p_dir] = pod_target
        key = (pod.namespace, pod.name, container.id, container.name)
        self._gauges.quota[key] = float(target)
        logger.info(
            "%s: %s/%s/%s quota %d -> %d (%s)",
            NAME,
            pod.namespace,
            pod.name,
            container.name,
            current,
            target,
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
        failed = []
        for (rel, _), res in zip(futures, results, strict=True):
            if isinstance(res, UnsupportedError):
                self._note_unsupported(res)
            elif isinstance(res, CgroupGoneError):
                logger.debug("%s: %s gone", NAME, rel)
            elif isinstance(res, BaseException):
                failed.append(f"{rel}: {res}")
        if failed:
            logger.warning(
                "%s: %d burst writes failed: %s", NAME, len(failed), "; ".join(failed[:5])
            )

    def _recycle(self, now: float, seen: set[str]) -> None:
        for cid in [c for c, lim in self._limiters.items() if lim.expired(now)]:
            del self._limiters[cid]
        for rel in [r for r in self._quota if r not in seen]:
            del self._quota[rel]
        live = {
            (p.namespace, p.name, c.id, c.name)
            for p in self._ctx.workloads().pods.values()
            for c in p.containers
        }
        for gauge in (self._gauges.burst, self._gauges.quota):
            for key in [k for k in gauge if k not in live]:
                del gauge[key]


def new_cpu_burst(ctx: StrategyContext) -> CPUBurst:
    """Table factory."""
    return CPUBurst(ctx)
