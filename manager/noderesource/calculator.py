"""One node's batch and mid resources: the calculation the controller and ``explain`` share.

:func:`calculate` resolves the node's colocation strategy, resets every resource when colocation
is off or the NodeMetric is stale (older than ``degradeTimeMinutes``, or without an update time),
else computes batch (:mod:`.batch`) and mid (:mod:`.mid`) and amplifies batch-cpu by the node's
CPU normalization ratio. :func:`decide_update` says whether the Node must be written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from apis.configuration import SLOControllerConfig
from apis.manager_keys import (
    ANNOTATION_CPU_BASIC_INFO,
    BATCH_CPU,
    BATCH_MEMORY,
    EXTENDED_RESOURCES,
    MID_CPU,
    MID_MEMORY,
)
from apis.nodetopo import parse_cpu_basic_info
from apis.records import frozen
from manager.cpunormalization import (
    NormalizationResult,
    amplify_batch_cpu,
    normalization_ratio,
)
from manager.noderesource.batch import BatchTerms, calculate_batch, hp_sums
from manager.noderesource.inputs import NodeMetricView, NodeView, PodView
from manager.noderesource.mid import MidTerms, calculate_mid
from manager.noderesource.strategy import NodeStrategy, resolve


@frozen
class NodeResourceResult:
    """What the controller would write for one node, with its working."""

    node: str
    """Node name."""
    values: Mapping[str, int | None]
    """Resource name → integer to write (milli-cores for CPU, bytes for memory); None: remove."""
    reset_reason: str
    """Why every resource is removed (colocation off, NodeMetric stale); empty otherwise."""
    strategy: NodeStrategy
    """The strategy in force."""
    batch: BatchTerms | None
    """Batch terms; None when reset."""
    mid: MidTerms | None
    """Mid terms; None when reset."""
    normalization: NormalizationResult
    """The CPU normalization ratio and how it was chosen."""
    metric_age_seconds: float | None
    """now - NodeMetric updateTime; None without one."""


def _reset(
    node: NodeView,
    ns: NodeStrategy,
    norm: NormalizationResult,
    reason: str,
    age: float | None,
) -> NodeResourceResult:
    values = dict.fromkeys(EXTENDED_RESOURCES)
    return NodeResourceResult(node.name, values, reason, ns, None, None, norm, age)


def node_normalization(
    config: SLOControllerConfig, node: NodeView, topology_annotations: Mapping[str, str] = {}
) -> NormalizationResult:
    """The node's CPU normalization ratio. The CPU basic info comes from the annotations of the
    node's NodeResourceTopology, where upstream's koordlet reports it, else from the Node's."""
    raw = topology_annotations.get(ANNOTATION_CPU_BASIC_INFO)
    if raw is None:
        raw = node.annotations.get(ANNOTATION_CPU_BASIC_INFO)
    info = None
    if raw is not None:
        try:
            info = parse_cpu_basic_info(raw)
        except ValueError as err:
            return NormalizationResult(None, f"{ANNOTATION_CPU_BASIC_INFO} unreadable: {err}")
    return normalization_ratio(config.cpu_normalization, node.labels, info)


def calculate(
    config: SLOControllerConfig,
    node: NodeView,
    metric: NodeMetricView | None,
    pods: Sequence[PodView],
    now: datetime,
    *,
    record: bool = True,
    topology_annotations: Mapping[str, str] = {},
) -> NodeResourceResult:
    """Batch and mid resources of ``node`` at ``now``. ``record`` keeps per-pod terms;
    ``topology_annotations`` are those of the node's NodeResourceTopology (CPU basic info)."""
    ns = resolve(config.colocation, node)
    norm = node_normalization(config, node, topology_annotations)
    age = None
    if metric is not None and metric.update_time is not None:
        age = (now - metric.update_time).total_seconds()
    if not ns.enabled:
        return _reset(node, ns, norm, "colocation disabled (enable is not true)", age)
    if metric is None or metric.update_time is None:
        return _reset(node, ns, norm, "degraded: the NodeMetric has no status.updateTime", age)
    limit = timedelta(minutes=ns.strategy.degrade_time_minutes)
    if now > metric.update_time + limit:
        return _reset(
            node,
            ns,
            norm,
            f"degraded: the NodeMetric was updated {age:.0f}s ago, more than "
            f"degradeTimeMinutes ({ns.strategy.degrade_time_minutes} min)",
            age,
        )
    hp = hp_sums(node, metric, pods, record=record)
    batch = calculate_batch(ns.strategy, node, metric, hp, record=record)
    mid = calculate_mid(ns.strategy, node, metric, pods, record=record)
    values: dict[str, int | None] = {
        BATCH_CPU: amplify_batch_cpu(batch.result.cpu, norm.ratio),
        BATCH_MEMORY: batch.result.memory,
        MID_CPU: mid.result.cpu,
        MID_MEMORY: mid.result.memory,
    }
    return NodeResourceResult(node.name, values, "", ns, batch, mid, norm, age)


@frozen
class UpdateDecision:
    """Whether the Node must be written, and why."""

    needed: bool
    """Write the Node."""
    reasons: tuple[str, ...]
    """Each reason (empty when not needed)."""


def is_diff(old: int | None, new: int | None, threshold: float) -> bool:
    """Upstream ``IsResourceDiff``: presence changed, or |new - old| > old x threshold."""
    if (old is None) != (new is None):
        return True
    if old is None or new is None:
        return False
    return abs(new - old) > old * threshold


def decide_update(
    result: NodeResourceResult,
    current: Mapping[str, int],
    last_write: datetime | None,
    now: datetime,
) -> UpdateDecision:
    """Whether writing ``result`` over the Node's ``current`` allocatable is due: no earlier
    write is known, or ``updateTimeThresholdSeconds`` have passed since it, or a resource moved
    by more than ``resourceDiffThreshold`` (or appeared, or went)."""
    strategy = result.strategy.strategy
    reasons = []
    if last_write is None:
        reasons.append("no earlier write known")
    elif now > last_write + timedelta(seconds=strategy.update_time_threshold_seconds):
        reasons.append(
            f"last write more than updateTimeThresholdSeconds "
            f"({strategy.update_time_threshold_seconds}s) ago"
        )
    for name in EXTENDED_RESOURCES:
        old, new = current.get(name), result.values.get(name)
        if is_diff(old, new, strategy.resource_diff_threshold):
            reasons.append(
                f"{name} {old} -> {new} moved more than "
                f"resourceDiffThreshold ({strategy.resource_diff_threshold:g})"
            )
    return UpdateDecision(bool(reasons), tuple(reasons))
