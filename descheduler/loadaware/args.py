"""``LowNodeLoadArgs`` (``descheduler/v1alpha2``): read, defaulted and validated as upstream does.

Defaults are upstream's ``SetDefaults_LowNodeLoadArgs`` (``pkg/descheduler/apis/config/v1alpha2/
defaults.go``): ``nodeFit`` true; ``anomalyCondition`` ``{timeout: 1m, consecutiveAbnormalities:
5, consecutiveNormalities: 3}`` (a zero ``consecutiveAbnormalities`` becomes 5);
``detectorCacheTimeout`` 5m; ``nodeMetricExpirationSeconds`` 180; ``resourceWeights`` cpu 1,
memory 1 and 1 for every resource of ``lowThresholds``/``highThresholds`` (a weight of 0 or less
for one of those is raised to its default). A node pool inherits, field by field, what it leaves
unset (thresholds, weights, the anomaly condition and its zero counters) from the top level
(``defaults_test.go``, "nodePools inherit all fields from top-level config").

Then, as ``Convert_v1alpha2_LowNodeLoadArgs_To_config_LowNodeLoadArgs`` does, the top-level
``nodeSelector``, ``useDeviationThresholds``, thresholds, weights and anomaly condition become a
pool named ``__default_node_pool__``, processed before the configured pools. Validation is
``ValidateLowLoadUtilizationArgs``: ``numberOfNodes`` >= 0, ``nodeMetricExpirationSeconds`` > 0,
not both ``evictableNamespaces.include`` and ``exclude``, no negative percentage, a low threshold
not above its high one, ``consecutiveAbnormalities`` > 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

from apis.kubernetes_keys import RESOURCE_CPU, RESOURCE_MEMORY
from apis.records import frozen
from descheduler.readers import Fields
from descheduler.selectors import Selector

NAME = "LowNodeLoad"
DEFAULT_POOL = "__default_node_pool__"
"""The pool the top-level fields become (upstream's name)."""
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_CONSECUTIVE_ABNORMALITIES = 5
DEFAULT_CONSECUTIVE_NORMALITIES = 3
DEFAULT_DETECTOR_CACHE_TIMEOUT_S = 300.0
DEFAULT_NODE_METRIC_EXPIRATION_S = 180


@frozen
class AnomalyCondition:
    """``LoadAnomalyCondition``: when a node over its high thresholds counts as abnormal."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    """``timeout``: how long an abnormal node stays abnormal; 0 (a condition written without
    one): the detector's own 60 s."""
    consecutive_abnormalities: int = DEFAULT_CONSECUTIVE_ABNORMALITIES
    """``consecutiveAbnormalities``: a node is abnormal once it was over its thresholds in more
    than this many rounds in a row (exactly 1: at once)."""
    consecutive_normalities: int = DEFAULT_CONSECUTIVE_NORMALITIES
    """``consecutiveNormalities``: an abnormal node is normal again after more than this many
    normal marks in a row."""


@frozen
class NodePool:
    """``LowNodeLoadNodePool``: nodes of one selector with their own thresholds."""

    name: str
    """``name``."""
    node_selector: Selector | None = None
    """``nodeSelector``; ``None``: every node (and nodes of earlier pools are not skipped)."""
    use_deviation_thresholds: bool = False
    """``useDeviationThresholds``: thresholds are deviations from the pool's mean usage."""
    high_thresholds: Mapping[str, float] | None = None
    """``highThresholds``: percent of allocatable above which a node is a source."""
    low_thresholds: Mapping[str, float] | None = None
    """``lowThresholds``: percent of allocatable under which a node is a target."""
    prod_high_thresholds: Mapping[str, float] | None = None
    """``prodHighThresholds``: the same for the usage of koord-prod pods only."""
    prod_low_thresholds: Mapping[str, float] | None = None
    """``prodLowThresholds``."""
    resource_weights: Mapping[str, int] = field(default_factory=dict)
    """``resourceWeights``: how resources weigh when ranking nodes and pods."""
    anomaly: AnomalyCondition = field(default_factory=AnomalyCondition)
    """``anomalyCondition``."""


@frozen
class LowNodeLoadArgs:
    """``LowNodeLoadArgs`` after defaulting and conversion (the top level is a pool)."""

    paused: bool = False
    """``paused``: the plugin does nothing."""
    dry_run: bool = False
    """``dryRun``: decide and log, evict nothing."""
    node_fit: bool = True
    """``nodeFit``: a pod moves only if it fits a target node and keeps it under its high
    thresholds."""
    evictable_include: tuple[str, ...] = ()
    """``evictableNamespaces.include``."""
    evictable_exclude: tuple[str, ...] = ()
    """``evictableNamespaces.exclude``."""
    pod_selectors: tuple[tuple[str, Selector], ...] = ()
    """``podSelectors[].{name, selector}``: a pod must match one of them (none: every pod)."""
    detector_cache_timeout_s: float = DEFAULT_DETECTOR_CACHE_TIMEOUT_S
    """``detectorCacheTimeout``: a node's anomaly detector is forgotten after this long unused."""
    node_metric_expiration_s: int = DEFAULT_NODE_METRIC_EXPIRATION_S
    """``nodeMetricExpirationSeconds``: an older NodeMetric makes its node unknown."""
    number_of_nodes: int = 0
    """``numberOfNodes``: act only when more nodes than this are under the low thresholds."""
    node_pools: tuple[NodePool, ...] = ()
    """The pools, :data:`DEFAULT_POOL` first."""


def _anomaly(f: Fields, key: str, inherit: AnomalyCondition | None) -> AnomalyCondition:
    """The top level's condition (``inherit`` None: upstream's defaulting, only a zero
    ``consecutiveAbnormalities`` replaced) or a pool's (zero fields taken from ``inherit``)."""
    if not f.has(key):
        return inherit or AnomalyCondition()
    a = f.sub(key)
    a.warn_unknown(("timeout", "consecutiveAbnormalities", "consecutiveNormalities"))
    timeout = a.duration("timeout", None)
    abn = a.integer("consecutiveAbnormalities", 0, minimum=0) or 0
    norm = a.integer("consecutiveNormalities", 0, minimum=0) or 0
    if inherit is None:
        return AnomalyCondition(
            timeout_s=timeout or 0.0,
            consecutive_abnormalities=abn or DEFAULT_CONSECUTIVE_ABNORMALITIES,
            consecutive_normalities=norm,
        )
    return AnomalyCondition(
        timeout_s=inherit.timeout_s if timeout is None else timeout,
        consecutive_abnormalities=abn or inherit.consecutive_abnormalities,
        consecutive_normalities=norm or inherit.consecutive_normalities,
    )


def _weights(
    given: Mapping[str, int] | None, *thresholds: Mapping[str, float] | None
) -> dict[str, int]:
    defaults = {RESOURCE_CPU: 1, RESOURCE_MEMORY: 1}
    for t in thresholds:
        for name in t or {}:
            defaults[name] = 1
    if given is None:
        return defaults
    out = dict(given)
    for name, w in defaults.items():
        if out.get(name, 0) <= 0:
            out[name] = w
    return out


def _check_thresholds(f: Fields, low_key: str, low: Any, high: Any) -> None:
    for name, pct in (low or {}).items():
        if high and name in high and pct > high[name]:
            raise f.error(
                f"{low_key}.{name}",
                f"low percentage must be less than or equal to highThresholds ({high[name]:g})",
            )


_POOL_KEYS = (
    "name",
    "nodeSelector",
    "useDeviationThresholds",
    "highThresholds",
    "lowThresholds",
    "prodHighThresholds",
    "prodLowThresholds",
    "resourceWeights",
    "anomalyCondition",
)
_KEYS = (
    *_POOL_KEYS[1:],
    "paused",
    "dryRun",
    "nodeFit",
    "evictableNamespaces",
    "podSelectors",
    "detectorCacheTimeout",
    "nodeMetricExpirationSeconds",
    "numberOfNodes",
    "nodePools",
)


def parse_args(raw: Mapping[str, Any] | None, source: str, path: str = "args") -> LowNodeLoadArgs:
    """Read, default, convert and validate. Raises :class:`~descheduler.errors.ConfigError`."""
    f = Fields(raw, source, path)
    f.warn_unknown(_KEYS)
    high = f.thresholds("highThresholds")
    low = f.thresholds("lowThresholds")
    prod_high = f.thresholds("prodHighThresholds")
    prod_low = f.thresholds("prodLowThresholds")
    _check_thresholds(f, "lowThresholds", low, high)
    _check_thresholds(f, "prodLowThresholds", prod_low, prod_high)
    weights = _weights(f.weights("resourceWeights"), low, high)
    anomaly = _anomaly(f, "anomalyCondition", None)
    ns = f.sub("evictableNamespaces")
    ns.warn_unknown(("include", "exclude"))
    include, exclude = ns.strings("include"), ns.strings("exclude")
    if include and exclude:
        raise f.error("evictableNamespaces", "only one of Include/Exclude namespaces can be set")
    selectors = []
    for item in f.items("podSelectors"):
        item.warn_unknown(("name", "selector"))
        sel = item.label_selector("selector")
        if sel is not None:
            selectors.append((item.string("name"), sel))
    expiration = (
        f.integer("nodeMetricExpirationSeconds", DEFAULT_NODE_METRIC_EXPIRATION_S)
        or DEFAULT_NODE_METRIC_EXPIRATION_S
    )
    if f.has("nodeMetricExpirationSeconds") and (f.raw["nodeMetricExpirationSeconds"] <= 0):
        raise f.error("nodeMetricExpirationSeconds", "should be a positive value")
    number = f.integer("numberOfNodes", 0) or 0
    if number < 0:
        raise f.error("numberOfNodes", "must be greater than or equal to 0")
    top = NodePool(
        name=DEFAULT_POOL,
        node_selector=f.label_selector("nodeSelector"),
        use_deviation_thresholds=f.boolean("useDeviationThresholds", False),
        high_thresholds=high,
        low_thresholds=low,
        prod_high_thresholds=prod_high,
        prod_low_thresholds=prod_low,
        resource_weights=weights,
        anomaly=anomaly,
    )
    pools = [top]
    for pf in f.items("nodePools"):
        pf.warn_unknown(_POOL_KEYS)
        p_high = pf.thresholds("highThresholds")
        p_low = pf.thresholds("lowThresholds")
        p_prod_high = pf.thresholds("prodHighThresholds")
        p_prod_low = pf.thresholds("prodLowThresholds")
        p_high = high if p_high is None else p_high
        p_low = low if p_low is None else p_low
        p_prod_high = prod_high if p_prod_high is None else p_prod_high
        p_prod_low = prod_low if p_prod_low is None else p_prod_low
        _check_thresholds(pf, "lowThresholds", p_low, p_high)
        p_weights = pf.weights("resourceWeights")
        pool_anomaly = _anomaly(pf, "anomalyCondition", anomaly)
        if pool_anomaly.consecutive_abnormalities <= 0:
            raise pf.error("anomalyCondition.consecutiveAbnormalities", "must be greater than 0")
        pools.append(
            NodePool(
                name=pf.string("name"),
                node_selector=pf.label_selector("nodeSelector"),
                use_deviation_thresholds=pf.boolean("useDeviationThresholds", False),
                high_thresholds=p_high,
                low_thresholds=p_low,
                prod_high_thresholds=p_prod_high,
                prod_low_thresholds=p_prod_low,
                resource_weights=weights if p_weights is None else _weights(p_weights),
                anomaly=pool_anomaly,
            )
        )
    return LowNodeLoadArgs(
        paused=f.boolean("paused", False),
        dry_run=f.boolean("dryRun", False),
        node_fit=f.boolean("nodeFit", True),
        evictable_include=include,
        evictable_exclude=exclude,
        pod_selectors=tuple(selectors),
        detector_cache_timeout_s=f.duration("detectorCacheTimeout", None)
        or DEFAULT_DETECTOR_CACHE_TIMEOUT_S,
        node_metric_expiration_s=expiration,
        number_of_nodes=number,
        node_pools=tuple(pools),
    )
