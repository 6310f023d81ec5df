"""LoadAwareScheduling's inputs: its args, the pod estimator, and each node's usage profile.

Re-implemented from Koordinator (``pkg/scheduler/plugins/loadaware``):

- **Args** (``LoadAwareSchedulingArgs``, ``pkg/scheduler/apis/config/v1beta3/defaults.go``):
  see :class:`LoadAwareArgs`.
- **Estimator** (``estimator/default_estimator.go``, ``estimatedUsedByResource``): per resource,
  the pod's request or limit, whichever is larger, of the resource its priority class uses
  (koord-batch: ``kubernetes.io/batch-cpu``...), times the scaling factor, rounded, and capped at
  the limit: a Burstable pod requesting 4 cores with a limit of 8 is estimated at
  ``8 * 85 % = 6.8`` cores. A pod requesting nothing counts 250m cpu and 200 MiB. With
  ``allowCustomizeEstimation`` the pod annotation ``scheduling.koordinator.sh/load-estimated-
  scaling-factors`` (``{"cpu": 100}``) overrides the factors it names.
- **Node allocatable** (``EstimateNode``): ``status.allocatable`` with the resources of the node
  annotation ``node.koordinator.sh/raw-allocatable`` over it.
- **Node profile** (``helper.go``, ``generateUsageThresholdsFilterProfile``): the node annotation
  ``scheduling.koordinator.sh/usage-thresholds`` (``{"usageThresholds", "prodUsageThresholds",
  "aggregatedUsage": {"usageThresholds", "usageAggregationType", "usageAggregatedDuration"}}``)
  replaces the args' thresholds it sets (an empty map: the args'); its ``aggregatedUsage`` is
  used whole, with its own aggregation type and duration, when it has thresholds and a type,
  otherwise the args' ``aggregated`` settings apply. An annotation that does not parse leaves the
  args in force.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from apis.duration import parse_duration
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY
from apis.priority import PRIORITY_BATCH, PRIORITY_MID
from apis.records import frozen
from apis.scheduling_keys import (
    ANNOTATION_CUSTOM_ESTIMATED_SCALING_FACTORS,
    ANNOTATION_CUSTOM_USAGE_THRESHOLDS,
    ANNOTATION_NODE_RAW_ALLOCATABLE,
)
from scheduler_plugins.args import ArgsReader
from scheduler_plugins.errors import InputError
from scheduler_plugins.nodeviews import NodeMetricInfo
from scheduler_plugins.objectfields import ResourceList, parse_resource_list
from scheduler_plugins.snapshot import NodeInfo, PodInfo

NAME = "LoadAwareScheduling"
DEFAULT_MILLI_CPU_REQUEST = 250
"""Estimate of a pod that requests no CPU (milli-cores)."""
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024
"""Estimate of a pod that requests no memory (bytes)."""
AGGREGATION_TYPES = ("avg", "p50", "p90", "p95", "p99")

_TRANSLATE = {
    PRIORITY_BATCH: {"cpu": BATCH_CPU, "memory": BATCH_MEMORY},
    PRIORITY_MID: {"cpu": MID_CPU, "memory": MID_MEMORY},
}


@frozen
class AggregatedArgs:
    """``LoadAwareSchedulingArgs.aggregated``."""

    usage_thresholds: dict[str, int]
    """``usageThresholds``: percent per resource on the aggregated usage; empty: not used."""
    usage_aggregation_type: str
    """``usageAggregationType`` (``avg``, ``p50``, ``p90``, ``p95``, ``p99``)."""
    usage_aggregated_duration: float
    """``usageAggregatedDuration`` in seconds; 0: the longest window reported."""
    score_aggregation_type: str
    """``scoreAggregationType``; empty: score on the instant usage."""
    score_aggregated_duration: float
    """``scoreAggregatedDuration`` in seconds; 0: the longest window reported."""


@frozen
class LoadAwareArgs:
    """``LoadAwareSchedulingArgs``, Koordinator's defaults."""

    filter_expired_node_metrics: bool = True
    """``filterExpiredNodeMetrics``: treat nodes with an expired NodeMetric specially."""
    enable_schedule_when_node_metrics_expired: bool = False
    """``enableScheduleWhenNodeMetricsExpired``: let such nodes pass instead of rejecting them."""
    node_metric_expiration_seconds: int = 180
    """``nodeMetricExpirationSeconds``."""
    resource_weights: Mapping[str, int] | None = None
    """``resourceWeights`` (default cpu 1, memory 1)."""
    dominant_resource_weight: int = 0
    """``dominantResourceWeight`` (0..100, default 0): weight of the node's most used resource
    (its lowest per-resource score) in the score, beside ``resourceWeights``."""
    usage_thresholds: Mapping[str, int] | None = None
    """``usageThresholds`` in percent (default cpu 65, memory 95)."""
    prod_usage_thresholds: Mapping[str, int] | None = None
    """``prodUsageThresholds`` in percent for koord-prod pods (default none)."""
    score_according_prod_usage: bool = False
    """``scoreAccordingProdUsage``."""
    estimated_scaling_factors: Mapping[str, int] | None = None
    """``estimatedScalingFactors`` in percent (default cpu 85, memory 70)."""
    allow_customize_estimation: bool = False
    """``allowCustomizeEstimation``: honour the pod's custom scaling factors annotation."""
    aggregated: AggregatedArgs | None = None
    """``aggregated``."""

    @property
    def weights(self) -> dict[str, int]:
        return dict(self.resource_weights or {"cpu": 1, "memory": 1})

    @property
    def thresholds(self) -> dict[str, int]:
        return dict(self.usage_thresholds or {"cpu": 65, "memory": 95})

    @property
    def factors(self) -> dict[str, int]:
        factors = {"cpu": 85, "memory": 70}
        factors.update(self.estimated_scaling_factors or {})
        return factors


def parse_args(raw: Mapping[str, Any] | None, source: str) -> LoadAwareArgs:
    """Validate ``LoadAwareSchedulingArgs``; raises :class:`PluginArgsError`."""
    r = ArgsReader(raw, source, NAME)
    agg = None
    sub = r.section("aggregated")
    if sub is not None:
        agg = AggregatedArgs(
            usage_thresholds=sub.percent_map("usageThresholds", {}) or {},
            usage_aggregation_type=sub.string("usageAggregationType", "", (*AGGREGATION_TYPES, "")),
            usage_aggregated_duration=sub.duration("usageAggregatedDuration", 0.0),
            score_aggregation_type=sub.string("scoreAggregationType", "", (*AGGREGATION_TYPES, "")),
            score_aggregated_duration=sub.duration("scoreAggregatedDuration", 0.0),
        )
        if agg.usage_thresholds and not agg.usage_aggregation_type:
            raise sub.fail("usageAggregationType", "required with aggregated usageThresholds")
    weights = r.percent_map("resourceWeights", None, low=0, high=100)
    if weights is not None and sum(weights.values()) <= 0:
        raise r.fail("resourceWeights", "needs at least one positive weight")
    dominant = r.integer("dominantResourceWeight", 0, minimum=0)
    if dominant > 100:
        raise r.fail("dominantResourceWeight", f"must be in [0, 100], got {dominant}")
    return LoadAwareArgs(
        filter_expired_node_metrics=r.boolean("filterExpiredNodeMetrics", True),
        enable_schedule_when_node_metrics_expired=r.boolean(
            "enableScheduleWhenNodeMetricsExpired", False
        ),
        node_metric_expiration_seconds=r.integer("nodeMetricExpirationSeconds", 180, minimum=1),
        resource_weights=weights or None,
        dominant_resource_weight=dominant,
        usage_thresholds=r.percent_map("usageThresholds", None) or None,
        prod_usage_thresholds=r.percent_map("prodUsageThresholds", None) or None,
        score_according_prod_usage=r.boolean("scoreAccordingProdUsage", False),
        estimated_scaling_factors=r.percent_map("estimatedScalingFactors", None, low=1),
        allow_customize_estimation=r.boolean("allowCustomizeEstimation", False),
        aggregated=agg,
    )


def go_round(x: float) -> int:
    """Go's ``math.Round`` (half away from zero) for non-negative ``x``."""
    return math.floor(x + 0.5)


def custom_factors(pod: PodInfo) -> dict[str, int]:
    """The pod's ``load-estimated-scaling-factors`` annotation (empty when absent or bad, as
    upstream ignores one that does not parse)."""
    raw = pod.annotations.get(ANNOTATION_CUSTOM_ESTIMATED_SCALING_FACTORS)
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {str(k): v for k, v in parsed.items() if isinstance(v, int) and not isinstance(v, bool)}


def estimate_pod(
    pod: PodInfo,
    resources: Sequence[str],
    factors: Mapping[str, int],
    *,
    allow_customize: bool = False,
) -> list[int]:
    """Koordinator's default estimator: the pod's expected usage per resource of ``resources``."""
    if allow_customize:
        custom = custom_factors(pod)
        if custom:
            factors = {**factors, **custom}
    translate = _TRANSLATE.get(pod.priority_class, {})
    out: list[int] = []
    for name in resources:
        real = translate.get(name, name)
        request = pod.requests.get(real, 0)
        limit = pod.limits.get(real, 0)
        quantity = limit if limit > request else request
        if quantity == 0:
            if real in ("cpu", BATCH_CPU):
                out.append(DEFAULT_MILLI_CPU_REQUEST)
            elif real in ("memory", BATCH_MEMORY):
                out.append(DEFAULT_MEMORY_REQUEST)
            else:
                out.append(0)
            continue
        estimated = go_round(quantity * factors.get(name, 100) / 100)
        if 0 < limit < estimated:
            estimated = limit
        out.append(estimated)
    return out


def node_allocatable(node: NodeInfo) -> ResourceList:
    """``EstimateNode``: allocatable with ``raw-allocatable`` over it."""
    raw = node.annotations.get(ANNOTATION_NODE_RAW_ALLOCATABLE)
    if not raw:
        return node.allocatable
    try:
        parsed = parse_resource_list(json.loads(raw), f"node {node.name}", "raw-allocatable")
    except (ValueError, InputError):
        return node.allocatable
    return {**node.allocatable, **parsed}


def aggregated_usage(metric: NodeMetricInfo, duration: float, kind: str) -> ResourceList | None:
    """``getTargetAggregatedUsage``: the ``kind`` percentile of the window of ``duration``
    seconds; with 0, of the longest window reporting that percentile, else the instant usage.
    ``None`` when there is none."""
    if metric.node_usage is None or not metric.aggregated:
        return None
    if duration <= 0:
        windows = [d for d, by_kind in metric.aggregated.items() if by_kind.get(kind)]
        if not windows:
            return metric.node_usage or None
        return metric.aggregated[max(windows)][kind]
    found = metric.aggregated.get(duration, {}).get(kind)
    return found or None


@frozen
class AggregatedProfile:
    """A node's aggregated-usage filter: thresholds on a percentile over a window."""

    thresholds: dict[str, int]
    kind: str
    """``usageAggregationType``."""
    duration: float
    """``usageAggregatedDuration`` in seconds (0: the longest window reported)."""


@frozen
class UsageProfile:
    """The thresholds that apply to one node."""

    usage: dict[str, int]
    prod: dict[str, int]
    aggregated: AggregatedProfile | None


def _args_aggregated(args: LoadAwareArgs) -> AggregatedProfile | None:
    agg = args.aggregated
    if agg is None or not agg.usage_thresholds or not agg.usage_aggregation_type:
        return None
    return AggregatedProfile(
        dict(agg.usage_thresholds), agg.usage_aggregation_type, agg.usage_aggregated_duration
    )


def _percent_map(raw: Any) -> dict[str, int]:
    if not isinstance(raw, Mapping):
        raise TypeError("not a map")
    out = {}
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 100:
            raise ValueError(f"{k}: {v!r}")
        out[str(k)] = v
    return out


def _object(raw: Any) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise TypeError("not an object")
    return raw


def node_profile(node: NodeInfo, args: LoadAwareArgs) -> UsageProfile:
    """The thresholds for ``node``: the args, or its custom-usage-thresholds annotation."""
    usage = args.thresholds
    prod = dict(args.prod_usage_thresholds or {})
    base_agg = _args_aggregated(args)
    raw = node.annotations.get(ANNOTATION_CUSTOM_USAGE_THRESHOLDS)
    if not raw:
        return UsageProfile(usage, prod, base_agg)
    try:
        parsed = _object(json.loads(raw))
        custom_usage = _percent_map(parsed.get("usageThresholds") or {})
        custom_prod = _percent_map(parsed.get("prodUsageThresholds") or {})
        agg = base_agg
        raw_agg = parsed.get("aggregatedUsage")
        if raw_agg:
            raw_agg = _object(raw_agg)
            thresholds = _percent_map(raw_agg.get("usageThresholds") or {})
            kind = str(raw_agg.get("usageAggregationType") or "")
            duration = parse_duration(str(raw_agg.get("usageAggregatedDuration") or "0s"))
            if thresholds and kind:
                agg = AggregatedProfile(thresholds, kind, duration)
    except (ValueError, TypeError, AttributeError):
        return UsageProfile(usage, prod, base_agg)  # upstream ignores a bad annotation
    return UsageProfile(custom_usage or usage, custom_prod or prod, agg)
