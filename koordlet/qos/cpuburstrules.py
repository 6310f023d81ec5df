"""CPU burst's rules: which pods and containers it may touch, the burst and quota arithmetic, the
share pool's state, each container's next quota and its token bucket
(:mod:`koordlet.qos.cpuburst` runs them; docs/qos-cpu.md has the formulas).

Upstream: ``qosmanager/plugins/cpuburst`` (``IsPodCPUBurstable``, ``nodeStateForBurst``,
``burstLimiter``, the scale-up and scale-down steps of ``applyCFSQuotaBurst``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from enum import Enum

from apis.extension import QoSClass
from apis.slo_strategies import CPUBurstPolicy, CPUBurstStrategy
from koordlet.statesinformer.model import ContainerInfo, PodInfo

CFS_PERIOD_US = 100_000
"""Koordinator's ``CFSBasePeriodValue``."""
CFS_INCREASE_STEP = 1.2
CFS_DECREASE_STEP = 0.8
SHARE_POOL_COOLING_RATIO = 0.9
"""Between this fraction of the threshold and the threshold the node is *cooling*."""
LIMITER_CONSUME_PERCENT = 100
LIMITER_SAVE_PERCENT = 60


# Settings ---------------------------------------------------------------------------------------

BurstSettings = CPUBurstStrategy
"""``cpuBurstStrategy`` (or a pod's ``koordinator.sh/cpuBurst`` over it): the typed model of
``apis.slo_strategies`` with Koordinator's defaults."""


def cpu_burst_enabled(settings: CPUBurstStrategy) -> bool:
    """``cpuBurstOnly`` or ``auto``: ``cfs_burst_us`` is written."""
    return settings.policy in (CPUBurstPolicy.AUTO, CPUBurstPolicy.CPU_BURST_ONLY)


def cfs_quota_burst_enabled(settings: CPUBurstStrategy) -> bool:
    """``cfsQuotaBurstOnly`` or ``auto``: quotas scale."""
    return settings.policy in (CPUBurstPolicy.AUTO, CPUBurstPolicy.CFS_QUOTA_BURST_ONLY)


# Arithmetic -------------------------------------------------------------------------------------


_NOT_BURSTABLE = (QoSClass.LSR, QoSClass.LSE, QoSClass.BE)


def is_burstable(pod: PodInfo) -> bool:
    """Upstream's ``IsPodCPUBurstable``: not LSR, LSE or BE."""
    return pod.qos not in _NOT_BURSTABLE


def base_quota_us(limit_milli: int) -> int:
    """The kubelet's quota for a CPU limit: ``limit x 100000 / 1000`` (integer)."""
    return limit_milli * CFS_PERIOD_US // 1000


def static_burst_us(limit_milli: int, settings: BurstSettings) -> int:
    """``limit (cores) x cpuBurstPercent% x 100000``; 0 when CPU burst is off or unlimited."""
    if not cpu_burst_enabled(settings) or limit_milli <= 0:
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
    if not cfs_quota_burst_enabled(settings):
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


def container_limit_milli(pod: PodInfo, container: ContainerInfo) -> int | None:
    """The container's own CPU limit (``ContainerInfo.cpu_limit_milli``, which the Kubernetes
    source fills); for a single-container pod whose container carries none, the pod's. None:
    unknown or unlimited (the container is then left alone)."""
    own = container.cpu_limit_milli
    if own is not None:
        return own if own > 0 else None
    if len(pod.containers) == 1 and pod.cpu_limit_milli is not None and pod.cpu_limit_milli > 0:
        return pod.cpu_limit_milli
    return None
