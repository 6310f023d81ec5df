"""The ``slo-controller-config`` ConfigMap's model (``apis/configuration`` upstream): its data keys,
the colocation strategy with Koordinator's defaults, node selectors, the CPU normalization and
resource amplification strategies, and the whole ConfigMap as parsed (:class:`SLOControllerConfig`).

Each data key holds a JSON document:

- ``colocation-config``: a :class:`ColocationStrategy` for the cluster plus ``nodeConfigs``, each a
  ``name``, a ``nodeSelector`` and the fields it overrides; the first match in list order wins.
- ``cpu-normalization-config`` and ``resource-amplification-config``: typed here too
  (:class:`CPUNormalizationStrategy`, :class:`ResourceAmplificationStrategy`), same layout.
- ``resource-threshold-config``, ``resource-qos-config``, ``cpu-burst-config``,
  ``system-config``: ``clusterStrategy`` plus ``nodeStrategies``; each strategy checked by the
  NodeSLO section parsers of ``apis.slo_strategies`` (field names, types, upstream's ranges),
  node selectors checked, and kept raw (read-only) for the NodeSLO controller to merge.
  ``host-application-config``: ``applications`` plus ``nodeConfigs``, each application checked
  as a NodeSLO host application.

:mod:`apis.sloconfig` parses and validates the ConfigMap into these types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from apis.records import frozen

T = TypeVar("T")

COLOCATION_CONFIG_KEY = "colocation-config"
RESOURCE_THRESHOLD_CONFIG_KEY = "resource-threshold-config"
RESOURCE_QOS_CONFIG_KEY = "resource-qos-config"
CPU_BURST_CONFIG_KEY = "cpu-burst-config"
SYSTEM_CONFIG_KEY = "system-config"
HOST_APPLICATION_CONFIG_KEY = "host-application-config"
CPU_NORMALIZATION_CONFIG_KEY = "cpu-normalization-config"
RESOURCE_AMPLIFICATION_CONFIG_KEY = "resource-amplification-config"
CONFIG_KEYS = (
    COLOCATION_CONFIG_KEY,
    RESOURCE_THRESHOLD_CONFIG_KEY,
    RESOURCE_QOS_CONFIG_KEY,
    CPU_BURST_CONFIG_KEY,
    SYSTEM_CONFIG_KEY,
    HOST_APPLICATION_CONFIG_KEY,
    CPU_NORMALIZATION_CONFIG_KEY,
    RESOURCE_AMPLIFICATION_CONFIG_KEY,
)
"""Every data key of the ConfigMap the manager reads."""

CPU_NORMALIZATION_MIN_RATIO = 1.0
"""Smallest CPU normalization ratio a node may get (Koordinator does not scale CPU down;
``defaultMinRatio`` in ``plugins/cpunormalization/plugin.go``)."""
CPU_NORMALIZATION_MAX_RATIO = 5.0
"""Largest CPU normalization ratio a node may get (``defaultMaxRatio``)."""


class CalculatePolicy(StrEnum):
    """How high-priority pods count against batch resources (``CalculatePolicy`` upstream)."""

    USAGE = "usage"
    """HP pods count by their usage: batch reclaims what HP pods requested but do not use."""
    REQUEST = "request"
    """HP pods count by their request: no overcommit between priority bands (memory only)."""
    MAX_USAGE_REQUEST = "maxUsageRequest"
    """HP pods count by max(usage, request): the conservative policy."""


# Label selectors -----------------------------------------------------------------------------
@frozen
class SelectorRequirement:
    """One ``matchExpressions`` entry."""

    key: str
    """Label key."""
    operator: str
    """``In``, ``NotIn``, ``Exists`` or ``DoesNotExist``."""
    values: tuple[str, ...]
    """Values for ``In``/``NotIn``; empty for the others."""

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        if self.operator == "NotIn":
            return self.key not in labels or labels[self.key] not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels  # DoesNotExist


@frozen
class LabelSelector:
    """A metav1.LabelSelector: every ``matchLabels`` pair and every expression must hold."""

    match_labels: Mapping[str, str]
    """Required label values."""
    match_expressions: tuple[SelectorRequirement, ...] = ()
    """Set-based requirements."""

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a node with ``labels`` is selected (an empty selector selects every node)."""
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        return all(req.matches(labels) for req in self.match_expressions)


# The colocation strategy ---------------------------------------------------------------------
@frozen
class ColocationStrategy:
    """A resolved ColocationStrategy: every field set (Koordinator's defaults under what the
    ConfigMap, the node's config and the node's own metadata say)."""

    enable: bool = False
    """``enable``: whether batch and mid resources are computed at all; off resets them."""
    metric_aggregate_duration_seconds: int = 300
    """``metricAggregateDurationSeconds``: the NodeMetric aggregation window (s), ≥ 1."""
    metric_report_interval_seconds: int = 60
    """``metricReportIntervalSeconds``: how often the koordlet reports the NodeMetric (s), ≥ 1."""
    metric_aggregate_durations: tuple[str, ...] = ("5m", "10m", "30m")
    """``metricAggregatePolicy.durations``: Go durations of the aggregated usages."""
    metric_memory_collect_policy: str = "usageWithoutPageCache"
    """``metricMemoryCollectPolicy``: how the koordlet counts memory usage."""
    cpu_reclaim_threshold_percent: int = 60
    """``cpuReclaimThresholdPercent``: share of node CPU capacity batch may reach (%), ≥ 0."""
    cpu_calculate_policy: CalculatePolicy = CalculatePolicy.USAGE
    """``cpuCalculatePolicy``: ``usage`` or ``maxUsageRequest`` (``request`` counts as usage)."""
    memory_reclaim_threshold_percent: int = 65
    """``memoryReclaimThresholdPercent``: share of node memory capacity batch may reach (%)."""
    memory_calculate_policy: CalculatePolicy = CalculatePolicy.USAGE
    """``memoryCalculatePolicy``: ``usage``, ``request`` or ``maxUsageRequest``."""
    degrade_time_minutes: int = 15
    """``degradeTimeMinutes``: a NodeMetric older than this resets batch and mid to nothing."""
    update_time_threshold_seconds: int = 300
    """``updateTimeThresholdSeconds``: the Node is rewritten at least this often (s)."""
    resource_diff_threshold: float = 0.1
    """``resourceDiffThreshold``: relative change that triggers a Node write, in (0, 1]."""
    mid_reclaim_mode: str = ""
    """``midReclaimMode``: ``static`` takes mid from fixed shares of capacity; else from metrics."""
    mid_cpu_threshold_percent: int = 100
    """``midCPUThresholdPercent``: cap of mid-cpu as a share of node CPU capacity (0..100)."""
    mid_memory_threshold_percent: int = 100
    """``midMemoryThresholdPercent``: cap of mid-memory as a share of node memory (0..100)."""
    mid_unallocated_percent: int = 0
    """``midUnallocatedPercent``: share of prod-unallocated resources added to mid (0..100)."""
    mid_static_cpu_reserved_percent: int = 0
    """``midStaticCPUReservedPercent``: mid-cpu share of capacity in static mode (0..100)."""
    mid_static_memory_reserved_percent: int = 0
    """``midStaticMemoryReservedPercent``: mid-memory share of capacity in static mode (0..100)."""
    batch_cpu_threshold_percent: int | None = None
    """``batchCPUThresholdPercent``: optional cap of batch-cpu as a share of capacity, ≥ 0."""
    batch_memory_threshold_percent: int | None = None
    """``batchMemoryThresholdPercent``: optional cap of batch-memory as a share of capacity."""
    extensions: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """``extensions``: third-party fields, read-only."""


@frozen
class NodeColocationConfig:
    """One ``nodeConfigs`` entry of colocation-config."""

    name: str
    """``name``: an id for the entry (shown by explain)."""
    selector: LabelSelector
    """``nodeSelector``: which nodes it applies to."""
    overrides: Mapping[str, Any]
    """Attribute name → value for each field the entry sets, read-only."""


@frozen
class ColocationConfig:
    """colocation-config: the cluster strategy and the per-node overrides, in order."""

    cluster: ColocationStrategy = ColocationStrategy()
    """The cluster-wide strategy (defaults under what the key sets)."""
    node_configs: tuple[NodeColocationConfig, ...] = ()
    """``nodeConfigs``, in list order; the first whose selector matches applies."""

    def for_node(self, labels: Mapping[str, str]) -> tuple[ColocationStrategy, str]:
        """The strategy for a node with ``labels`` and the name of the node config applied
        (empty for none). Node annotations and labels are merged by the caller
        (:func:`manager.noderesource.strategy`)."""
        for cfg in self.node_configs:
            if cfg.selector.matches(labels):
                return replace(self.cluster, **cfg.overrides), cfg.name
        return self.cluster, ""


# CPU normalization and resource amplification ------------------------------------------------
@frozen
class ModelRatio:
    """The normalization ratios of one CPU model by hyper-threading and turbo state."""

    base_ratio: float | None = None
    """``baseRatio``: neither hyper-threading nor turbo."""
    hyper_thread_enabled_ratio: float | None = None
    """``hyperThreadEnabledRatio``: hyper-threading on, turbo off."""
    turbo_enabled_ratio: float | None = None
    """``turboEnabledRatio``: turbo on, hyper-threading off."""
    hyper_thread_turbo_enabled_ratio: float | None = None
    """``hyperThreadTurboEnabledRatio``: both on."""


MODEL_RATIO_FIELDS = {
    "baseRatio": "base_ratio",
    "hyperThreadEnabledRatio": "hyper_thread_enabled_ratio",
    "turboEnabledRatio": "turbo_enabled_ratio",
    "hyperThreadTurboEnabledRatio": "hyper_thread_turbo_enabled_ratio",
}
"""JSON name → :class:`ModelRatio` attribute (the ratios of ``ratioModel``)."""


@frozen
class CPUNormalizationStrategy:
    """``CPUNormalizationStrategy`` upstream."""

    enable: bool | None = None
    """``enable``: normalization on for the node (a node label overrides it); off writes 1.00."""
    default_ratio: float | None = None
    """``defaultRatio``: the ratio of a node whose CPU model has no (complete) entry in
    ``ratioModel`` (upstream since v1.6, ``getCPUNormalizationRatio``)."""
    ratio_model: Mapping[str, ModelRatio] = field(default_factory=lambda: MappingProxyType({}))
    """``ratioModel``: CPU model name (as the koordlet reports it) → its ratios."""


@frozen
class ResourceAmplificationStrategy:
    """``ResourceAmplificationStrategy`` upstream."""

    enable: bool | None = None
    """``enable``: whether the ratios apply."""
    ratios: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """``resourceAmplificationRatio``: resource name → ratio; a node's final ratios (cpu times
    its normalization ratio) must be ≥ 1."""


@frozen
class NodeScoped(Generic[T]):
    """A strategy applied to the nodes a selector picks."""

    name: str
    """``name`` of the entry."""
    selector: LabelSelector
    """``nodeSelector``."""
    strategy: T
    """The fields the entry sets (unset ones inherit the cluster's)."""


@frozen
class CPUNormalizationConfig:
    """cpu-normalization-config."""

    cluster: CPUNormalizationStrategy = CPUNormalizationStrategy()
    """The cluster-wide strategy."""
    node_configs: tuple[NodeScoped[CPUNormalizationStrategy], ...] = ()
    """``nodeConfigs`` in order; the first match is merged over the cluster's."""

    def for_node(self, labels: Mapping[str, str]) -> CPUNormalizationStrategy:
        """The merged strategy of a node: set fields of the first matching entry win, and its
        ratio models are added over the cluster's model by model."""
        for cfg in self.node_configs:
            if cfg.selector.matches(labels):
                node = cfg.strategy
                return CPUNormalizationStrategy(
                    enable=self.cluster.enable if node.enable is None else node.enable,
                    default_ratio=(
                        self.cluster.default_ratio
                        if node.default_ratio is None
                        else node.default_ratio
                    ),
                    ratio_model=MappingProxyType({**self.cluster.ratio_model, **node.ratio_model}),
                )
        return self.cluster


@frozen
class ResourceAmplificationConfig:
    """resource-amplification-config."""

    cluster: ResourceAmplificationStrategy = ResourceAmplificationStrategy()
    """The cluster-wide strategy."""
    node_configs: tuple[NodeScoped[ResourceAmplificationStrategy], ...] = ()
    """``nodeConfigs`` in order; the first match is merged over the cluster's."""

    def for_node(self, labels: Mapping[str, str]) -> ResourceAmplificationStrategy:
        """The merged strategy of a node (the first matching entry's set fields win)."""
        for cfg in self.node_configs:
            if cfg.selector.matches(labels):
                node = cfg.strategy
                return ResourceAmplificationStrategy(
                    enable=self.cluster.enable if node.enable is None else node.enable,
                    ratios=MappingProxyType({**self.cluster.ratios, **node.ratios}),
                )
        return self.cluster


@frozen
class SLOControllerConfig:
    """The whole ConfigMap, parsed. Keys it lacks take Koordinator's defaults."""

    colocation: ColocationConfig = ColocationConfig()
    """colocation-config."""
    cpu_normalization: CPUNormalizationConfig = CPUNormalizationConfig()
    """cpu-normalization-config."""
    resource_amplification: ResourceAmplificationConfig = ResourceAmplificationConfig()
    """resource-amplification-config."""
    raw: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}))
    """The other keys present, checked and read-only: key → decoded JSON."""
