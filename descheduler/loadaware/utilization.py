"""Node usage against thresholds: LowNodeLoad's arithmetic, as upstream computes it.

From ``pkg/descheduler/framework/plugins/loadaware/utilization_util.go`` and ``low_node_load.go``
(v1.6), re-implemented:

- **Resources** (``newThresholds``): every resource named by any of the four threshold maps, plus
  ``memory``. One missing from ``lowThresholds`` gets 100 % low *and* high (0 % in deviation
  mode), whatever ``highThresholds`` said; the same pairing for the prod maps.
- **Usage** (``getNodeUsage``): per resource, the NodeMetric's ``systemUsage`` plus the sum of
  every ``podsMetric`` entry; prod usage sums the entries of the node's koord-prod pods only;
  ``pods`` is the number of pods on the node (prod: of prod pods). A node without a NodeMetric,
  without ``status.nodeMetric``, or whose ``updateTime`` is ``nodeMetricExpirationSeconds`` old
  or older is left out of the pool.
- **Thresholds** (``getNodeThresholds``): a percentage of the node's raw allocatable
  (``node.koordinator.sh/raw-allocatable``, else ``status.allocatable``), truncated to an integer
  in Koordinator's units: ``int(pct * 0.01 * allocatable)`` (cpu in milli-cores). In deviation
  mode the percentage is the pool's mean usage percentage minus ``low`` (plus ``high``), clipped to
  [0, 100]; a resource whose ``low`` is 0 gets the whole allocatable for both.
- **Classes** (``classifyNodes``): *low* when schedulable and no resource is above its low
  threshold (then *prod-high* if some prod resource is above its prod high threshold, else
  *both-low* if none is above its prod low, else *low*); otherwise *high* when some resource is
  above its high threshold; otherwise *prod-high*, *prod-low* or normal by the prod thresholds.
- **Percentages** shown: ``100 * usage / allocatable`` (cpu in milli-cores).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from apis.kubernetes_keys import RESOURCE_CPU, RESOURCE_MEMORY, RESOURCE_PODS
from apis.priority import PRIORITY_PROD
from apis.records import frozen
from descheduler.cluster import Cluster, NodeUsageReport
from descheduler.loadaware.args import NodePool
from scheduler_plugins.snapshot import NodeInfo, PodInfo

MIN_PERCENT = 0.0
MAX_PERCENT = 100.0

HIGH = "high"
LOW = "low"
NORMAL = "normal"
PROD_HIGH = "prod-high"
PROD_LOW = "prod-low"
BOTH_LOW = "both-low"


@frozen
class Thresholds:
    """The four threshold maps of a pool after ``newThresholds`` (percentages)."""

    low: dict[str, float]
    high: dict[str, float]
    prod_low: dict[str, float]
    prod_high: dict[str, float]

    @property
    def resources(self) -> list[str]:
        """``getResourceNames(lowThresholds)``: the resources the pool looks at."""
        return list(self.low)


def new_thresholds(pool: NodePool) -> Thresholds:
    """``newThresholds`` (see the module docstring)."""
    low = dict(pool.low_thresholds or {})
    high = dict(pool.high_thresholds or {})
    prod_low = dict(pool.prod_low_thresholds or {})
    prod_high = dict(pool.prod_high_thresholds or {})
    names: list[str] = [*low, *high, *prod_low, *prod_high, RESOURCE_MEMORY]
    fill = MIN_PERCENT if pool.use_deviation_thresholds else MAX_PERCENT
    for name in names:
        if name not in low:
            low[name] = fill
            high[name] = fill
        if name not in prod_low:
            prod_low[name] = fill
            prod_high[name] = fill
    return Thresholds(low, high, prod_low, prod_high)


def value_of(name: str, amount: int) -> int:
    """Koordinator's units are already ``MilliValue`` for cpu and ``Value`` otherwise."""
    return amount


@dataclass(slots=True)
class NodeUsage:
    """One node of a pool: its pods, usage and thresholds (``NodeUsage`` + ``NodeThresholds``)."""

    node: NodeInfo
    allocatable: Mapping[str, int]
    """The raw allocatable."""
    pods: list[PodInfo]
    report: NodeUsageReport
    usage: dict[str, int]
    """Per resource of the pool, plus ``pods``."""
    _prod_keys: set[str] | None = None
    """``namespace/name`` of the koord-prod pods, found when first asked (:attr:`prod_pod_keys`)."""
    _cluster: Cluster | None = None
    low: dict[str, int] = field(default_factory=dict)
    high: dict[str, int] = field(default_factory=dict)
    prod_low: dict[str, int] = field(default_factory=dict)
    prod_high: dict[str, int] = field(default_factory=dict)
    _prod_usage: dict[str, int] | None = None
    _resources: Sequence[str] = ()

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def prod_pod_keys(self) -> set[str]:
        """``namespace/name`` of the node's koord-prod pods."""
        if self._prod_keys is None:
            cluster = self._cluster
            self._prod_keys = (
                set() if cluster is None else {p.key for p in self.pods if is_prod(cluster, p)}
            )
        return self._prod_keys

    @property
    def prod_usage(self) -> dict[str, int]:
        """Prod usage, summed when first read."""
        if self._prod_usage is None:
            out = dict.fromkeys(self._resources, 0)
            pods = self.report.pods
            for key in self.prod_pod_keys:
                metric = pods.get(key)
                if metric is None:
                    continue
                for name in self._resources:
                    out[name] += metric.get(name, 0)
            out[RESOURCE_PODS] = len(self.prod_pod_keys)
            self._prod_usage = out
        return self._prod_usage

    def prod_upper_bound(self, name: str) -> int:
        """A bound of prod usage without summing it: prod pods are some of the pods."""
        if self._prod_usage is not None:
            return self._prod_usage.get(name, 0)
        if self._prod_keys is None:  # every pod may be prod
            return len(self.pods) if name == RESOURCE_PODS else self.report.pods_total.get(name, 0)
        if name == RESOURCE_PODS:
            return len(self._prod_keys)
        return self.report.pods_total.get(name, 0) if self._prod_keys else 0

    def percentages(self, prod: bool = False) -> dict[str, float]:
        """``resourceUsagePercentages``: ``100 * usage / allocatable`` per resource, in Go's
        float64 steps over ``MilliValue`` (cpu is in milli-cores already)."""
        usage = self.prod_usage if prod else self.usage
        out: dict[str, float] = {}
        for name, used in usage.items():
            cap = self.allocatable.get(name, 0)
            if cap:
                scale = 1 if name == RESOURCE_CPU else 1000
                out[name] = 100 * float(used * scale) / float(cap * scale)
        return out


def is_prod(cluster: Cluster, pod: PodInfo) -> bool:
    return cluster.facts(pod).priority_class == PRIORITY_PROD


def node_usages(
    cluster: Cluster,
    nodes: Iterable[NodeInfo],
    resources: Sequence[str],
    now: float,
    expiration_s: int,
    skipped: dict[str, str] | None = None,
) -> dict[str, NodeUsage]:
    """``getNodeUsage`` over ``nodes``, in their order; ``skipped`` gets why a node is left out."""
    out: dict[str, NodeUsage] = {}
    for node in nodes:
        report = cluster.usage.get(node.name)
        if report is None:
            if skipped is not None:
                skipped[node.name] = "no NodeMetric"
            continue
        if not report.has_node_metric:
            if skipped is not None:
                skipped[node.name] = "NodeMetric has no status.nodeMetric"
            continue
        if report.update_time is None or (
            expiration_s > 0 and now - report.update_time >= expiration_s
        ):
            if skipped is not None:
                skipped[node.name] = f"NodeMetric expired (older than {expiration_s}s)"
            continue
        pods = list(node.pods.values())
        usage = {
            name: report.system.get(name, 0) + report.pods_total.get(name, 0) for name in resources
        }
        usage[RESOURCE_PODS] = len(pods)
        out[node.name] = NodeUsage(
            node=node,
            allocatable=cluster.raw_allocatable(node),
            pods=pods,
            report=report,
            usage=usage,
            _cluster=cluster,
            _resources=tuple(resources),
        )
    return out


def _fraction(pct: float, capacity: int) -> int:
    """``resourceThreshold``: ``int64(float64(threshold) * 0.01 * float64(capacity))``."""
    return int(pct * 0.01 * capacity)


def _average(usages: Mapping[str, NodeUsage], prod: bool) -> dict[str, float]:
    """``calcAverageResourceUsagePercent``: the mean over the pool's nodes (nodes without the
    resource count in the denominator)."""
    totals: dict[str, float] = {}
    for u in usages.values():
        values = u.prod_usage if prod else u.usage
        for name, used in values.items():
            cap = u.allocatable.get(name, 0)
            if cap:
                totals[name] = totals.get(name, 0.0) + used / cap * 100.0
    n = len(usages)
    return {name: total / n for name, total in totals.items()} if n else {}


def _clip(pct: float) -> float:
    return min(max(pct, MIN_PERCENT), MAX_PERCENT)


def set_thresholds(
    usages: Mapping[str, NodeUsage], thresholds: Thresholds, deviation: bool
) -> dict[str, dict[str, float]]:
    """``getNodeThresholds``: fill each node's thresholds in units; the mean percentages used in
    deviation mode (``{"node": ..., "prod": ...}``, empty otherwise)."""
    means: dict[str, dict[str, float]] = {}
    if deviation:
        means = {"node": _average(usages, False), "prod": _average(usages, True)}
    names = thresholds.resources
    for u in usages.values():
        alloc = u.allocatable
        for name in names:
            cap = alloc.get(name, 0)
            if deviation:
                avg, pavg = means["node"].get(name, 0.0), means["prod"].get(name, 0.0)
                if thresholds.low[name] == MIN_PERCENT:
                    u.low[name] = u.high[name] = cap
                else:
                    u.low[name] = _fraction(_clip(avg - thresholds.low[name]), cap)
                    u.high[name] = _fraction(_clip(avg + thresholds.high[name]), cap)
                if thresholds.prod_low[name] == MIN_PERCENT:
                    u.prod_low[name] = u.prod_high[name] = cap
                else:
                    u.prod_low[name] = _fraction(_clip(pavg - thresholds.prod_low[name]), cap)
                    u.prod_high[name] = _fraction(_clip(pavg + thresholds.prod_high[name]), cap)
            else:
                u.low[name] = _fraction(thresholds.low[name], cap)
                u.high[name] = _fraction(thresholds.high[name], cap)
                u.prod_low[name] = _fraction(thresholds.prod_low[name], cap)
                u.prod_high[name] = _fraction(thresholds.prod_high[name], cap)
    return means


def over(usage: Mapping[str, int], thresholds: Mapping[str, int]) -> dict[str, int]:
    """``isNodeOverutilized``: the resources above their threshold, with their usage."""
    return {
        name: usage[name]
        for name, limit in thresholds.items()
        if name in usage and usage[name] > limit
    }


def under(usage: Mapping[str, int], thresholds: Mapping[str, int]) -> bool:
    """``isNodeUnderutilized``: no resource above its threshold."""
    return all(usage[name] <= limit for name, limit in thresholds.items() if name in usage)


def prod_over(u: NodeUsage) -> bool:
    """Some prod resource above its prod high threshold (bounds first, summing only if needed)."""
    if all(u.prod_upper_bound(n) <= limit for n, limit in u.prod_high.items()):
        return False
    return bool(over(u.prod_usage, u.prod_high))


def prod_under(u: NodeUsage) -> bool:
    """No prod resource above its prod low threshold."""
    if all(u.prod_upper_bound(n) <= limit for n, limit in u.prod_low.items()):
        return True
    return under(u.prod_usage, u.prod_low)


def classify(u: NodeUsage) -> str:
    """``classifyNodes`` for one node (see the module docstring)."""
    if not u.node.unschedulable and under(u.usage, u.low):
        if prod_over(u):
            return PROD_HIGH
        return BOTH_LOW if not u.node.unschedulable and prod_under(u) else LOW
    if over(u.usage, u.high):
        return HIGH
    if prod_over(u):
        return PROD_HIGH
    if not u.node.unschedulable and prod_under(u):
        return PROD_LOW
    return NORMAL


def display_class(node_class: str) -> str:
    """The three classes ``explain`` prints: a source is ``high``, a node under its low
    thresholds ``low``, the rest ``normal``."""
    if node_class in (HIGH, PROD_HIGH):
        return HIGH
    if node_class in (LOW, BOTH_LOW):
        return LOW
    return NORMAL


def over_reason(u: NodeUsage, percents: Mapping[str, float], prod: bool) -> str:
    """``overUtilizedEvictionReason``: ``node is overutilized, node cpu usage(76.00%)>
    threshold(70.00%)`` over the resources above their high threshold, sorted by name."""
    usage = u.prod_usage if prod else u.usage
    limits = u.prod_high if prod else u.high
    hot = over(usage, limits)
    pcts = u.percentages(prod)
    label = "prod" if prod else "node"
    infos = [
        f"{label} {name} usage({pcts.get(name, 0.0):.2f}%)>threshold({percents[name]:.2f}%)"
        for name in sorted(percents)
        if name in hot
    ]
    return "node is overutilized, " + ", ".join(infos)


def cpu_first(names: Iterable[str]) -> list[str]:
    """Resource names for display: cpu, memory, then the rest sorted."""
    rest = sorted(n for n in names if n not in (RESOURCE_CPU, RESOURCE_MEMORY))
    return [n for n in (RESOURCE_CPU, RESOURCE_MEMORY) if n in set(names)] + rest
