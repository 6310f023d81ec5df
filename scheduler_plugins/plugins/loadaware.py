"""LoadAwareScheduling: avoid nodes whose real usage (NodeMetric) is high; prefer the least used.

Koordinator's semantics (``pkg/scheduler/plugins/loadaware``), re-implemented:

- **Filter.** A node without a NodeMetric, or whose NodeMetric has no ``status.nodeMetric``,
  passes (load awareness is an optimization). A NodeMetric whose ``updateTime`` is older than
  ``nodeMetricExpirationSeconds`` (180) is *expired*: with ``filterExpiredNodeMetrics`` (true)
  the node is rejected, ``node(s) nodeMetric expired``, unless
  ``enableScheduleWhenNodeMetricsExpired`` (false) lets it pass unfiltered. DaemonSet pods
  always pass. Otherwise the node's estimated usage is its reported usage plus, for pods
  assigned too recently to be in the report (not in ``podsMetric``, or bound after
  ``updateTime - reportInterval``), their estimate less what was reported for them; the node is
  rejected when ``round(100 * estimated / allocatable) > threshold``, first for what runs there,
  then with the incoming pod's estimate added, with Koordinator's reason and the numbers:
  ``node(s) cpu usage exceed threshold, cpu usage 91% > threshold 65%``. Thresholds:
  ``usageThresholds`` (cpu 65, memory 95); with ``aggregated.usageThresholds`` the percentile
  usage of ``aggregated.usageAggregationType`` over ``usageAggregatedDuration`` (longest
  reported window when unset) is used instead (``node(s) cpu aggregated usage exceed threshold,
  cpu p95 usage 70% > threshold 60%``); for a koord-prod pod with ``prodUsageThresholds``, only
  prod pods' usage counts (``cpu prod usage``). The node annotation
  ``scheduling.koordinator.sh/usage-thresholds`` overrides the args for that node, its
  ``aggregatedUsage`` with its own type and duration (``loadargs.py``). Allocatable is the
  node's, with ``node.koordinator.sh/raw-allocatable`` over it.
- **Estimator** (``loadargs.py``): per resource, ``max(request, limit)`` of the resource the
  pod's priority class uses times ``estimatedScalingFactors`` (cpu 85 %, memory 70 %), capped at
  the limit; no request at all counts 250m cpu and 200 MiB memory.
- **Score.** ``(sum(weight * score_r) + dominantResourceWeight * min(score_r)) //
  (sum(weight) + dominantResourceWeight)`` over ``resourceWeights`` (cpu 1, memory 1), with
  ``score_r = (alloc - used) * 100 // alloc`` and ``used`` the estimate above plus the pod's; 0
  for a node without a usable NodeMetric. With ``scoreAccordingProdUsage`` a prod pod is scored
  on prod usage only; ``aggregated.scoreAggregationType`` scores on a percentile.
- **Reserve** needs nothing beyond the framework's assume: an assumed pod is a recent pod.

Cost. Per node and resource, the threshold test is one integer comparison against a headroom
that does not depend on the pod (``loadindex``); the score needs the node's capacity and usage
and the pod's estimate. Pods of one shape (replicas: the same estimate) get the same verdict and
score on a node until that node changes, so both are memoized per estimate for the last
:data:`MEMO_SHAPES` estimates: the verdicts as the map of failing nodes, built whole from the
threshold index (only failures are listed), the scores node by node as nodes are asked about.
Whenever a node is re-indexed (a pod assumed or bound there, a new NodeMetric, a Node update) its
memoized verdicts and scores are recomputed at once. NodeMetric expiry depends on the time and is
applied on top, never memoized.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from apis.priority import PRIORITY_PROD
from scheduler_plugins.framework import Cycle, Plugin
from scheduler_plugins.nodeviews import NodeMetricInfo
from scheduler_plugins.objectfields import ResourceList
from scheduler_plugins.plugins.loadargs import (
    NAME as NAME,
)
from scheduler_plugins.plugins.loadargs import (
    LoadAwareArgs,
    aggregated_usage,
    estimate_pod,
    go_round,
    node_allocatable,
    node_profile,
    parse_args,
)
from scheduler_plugins.plugins.loadindex import ExpiryIndex, ThresholdIndex, headroom
from scheduler_plugins.plugins.nodecache import Changes
from scheduler_plugins.snapshot import NodeInfo, PodInfo

ERR_USAGE = "node(s) %s usage exceed threshold"
"""Koordinator's reason (``ErrReasonUsageExceedThreshold``); ours goes on with the numbers:
``node(s) cpu usage exceed threshold, cpu usage 91% > threshold 65%``."""
ERR_AGGREGATED_USAGE = "node(s) %s aggregated usage exceed threshold"
"""``ErrReasonAggregatedUsageExceedThreshold``; ours adds
``, cpu p95 usage 91% > threshold 60%``."""
ERR_EXPIRED = "node(s) nodeMetric expired"
MEMO_SHAPES = 32
"""Pod estimates whose per-node verdicts and scores are kept (oldest dropped first)."""
_MemoKey = tuple[str, tuple[int, ...]]
_T = TypeVar("_T")
_Basis = tuple[list[int], list[int], list[int], str, str]
"""A node's usage basis for one index: existing usage, thresholds, allocatable, the reason
template and the usage's name (``usage``, ``p95 usage``, ``prod usage``)."""


def _usage(rl: ResourceList | None, resources: Sequence[str]) -> list[int] | None:
    if rl is None:
        return None
    return [rl.get(r, 0) for r in resources]


@dataclass(slots=True)
class _NodeLoad:
    """What a node's NodeMetric and assigned pods say, precomputed once per node change."""

    generation: int
    metric: NodeMetricInfo | None
    expires_at: float
    """When the NodeMetric expires (epoch s); -inf when it never was updated."""
    allocatable: list[int]
    has_usage: bool
    node_existing: list[int]
    """Reported usage (less what estimated pods reported) plus estimates of recent pods."""
    agg_filter_existing: list[int] | None
    agg_score_existing: list[int] | None
    prod_existing: list[int]
    thresholds: list[int]
    prod_thresholds: list[int]
    agg_thresholds: list[int]
    filter_aggregated: bool
    agg_kind: str
    """The node's aggregated filter's percentile (``p95``), for the reason."""


class LoadAwareScheduling(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self, args: LoadAwareArgs | None = None) -> None:
        self.args = args or LoadAwareArgs()
        a = self.args
        agg = a.aggregated
        names: list[str] = []
        for m in (
            a.weights,
            a.thresholds,
            a.prod_usage_thresholds or {},
            agg.usage_thresholds if agg else {},
        ):
            for r in m:
                if r not in names:
                    names.append(r)
        self.resources: tuple[str, ...] = tuple(names)
        self.factors = a.factors
        self._weights = [(i, w) for i, w in enumerate(a.weights.get(r, 0) for r in names) if w > 0]
        self._dominant = a.dominant_resource_weight
        self._weight_sum = sum(w for _, w in self._weights) + self._dominant
        self._basis: dict[str, dict[str, _Basis]] = {"normal": {}, "prod": {}}
        """Per threshold index, each node's usage basis (for the reasons' numbers)."""
        self._cache: dict[str, _NodeLoad] = {}
        self._changes = Changes()
        self._normal_index = ThresholdIndex(len(names))
        self._prod_index = ThresholdIndex(len(names))
        self._expiry = ExpiryIndex(())
        self._score_vecs: dict[str, dict[str, tuple[float, list[tuple[int, int]]]]] = {}
        self._verdicts: dict[tuple[str, tuple[int, ...]], dict[str, str]] = {}
        """(index, estimate) -> failing node -> the threshold reason; see the module
        docstring."""
        self._scores: dict[tuple[str, tuple[int, ...]], dict[str, int]] = {}
        """(score vectors, estimate) -> node -> score, expiry not applied."""

    # -- per-node precomputation ----------------------------------------------------------

    def _load(self, cycle: Cycle, node: NodeInfo) -> _NodeLoad:
        metric = cycle.snapshot.node_metrics.get(node.name)
        cached = self._cache.get(node.name)
        if cached is not None and cached.generation == node.generation and cached.metric is metric:
            return cached
        res = self.resources
        n = len(res)
        allocatable = node_allocatable(node)
        alloc = [allocatable.get(r, 0) for r in res]
        profile = node_profile(node, self.args)
        thresholds = [profile.usage.get(r, 0) for r in res]
        prod_thresholds = [profile.prod.get(r, 0) for r in res]
        agg_profile = profile.aggregated
        agg_thresholds = [agg_profile.thresholds.get(r, 0) if agg_profile else 0 for r in res]
        agg = self.args.aggregated
        filter_agg = agg_profile is not None and any(agg_thresholds)
        expires_at = -math.inf
        if metric is not None and metric.update_time is not None:
            expires_at = metric.update_time + self.args.node_metric_expiration_seconds
        load = _NodeLoad(
            generation=node.generation,
            metric=metric,
            expires_at=expires_at,
            allocatable=alloc,
            has_usage=bool(metric and metric.node_usage is not None),
            node_existing=[0] * n,
            agg_filter_existing=None,
            agg_score_existing=None,
            prod_existing=[0] * n,
            thresholds=thresholds,
            prod_thresholds=prod_thresholds,
            agg_thresholds=agg_thresholds,
            filter_aggregated=filter_agg,
            agg_kind=agg_profile.kind if agg_profile else "",
        )
        self._cache[node.name] = load
        if metric is None or metric.node_usage is None:
            return load
        # Pods too recent for the report: estimate them; keep what they reported to subtract.
        delta = [0] * n
        reported_of_estimated = [0] * n
        all_estimated = [0] * n
        prod_reported = [0] * n
        prod_delta = [0] * n
        horizon = (
            None if metric.update_time is None else metric.update_time - metric.report_interval_s
        )
        for pod in node.pods.values():
            pm = metric.pods.get(pod.key)
            reported = _usage(pm.usage, res) if pm is not None else None
            est = estimate_pod(
                pod, res, self.factors, allow_customize=self.args.allow_customize_estimation
            )
            is_prod = pod.priority_class == PRIORITY_PROD
            for i in range(n):
                all_estimated[i] += est[i]
            if is_prod and reported is not None:
                for i in range(n):
                    prod_reported[i] += reported[i]
            recent = (
                pm is None
                or not pm.usage
                or horizon is None
                or pod.scheduled_at is None
                or pod.scheduled_at > horizon
            )
            if not recent:
                continue
            for i in range(n):
                rep = reported[i] if reported is not None else 0
                value = max(est[i], rep)
                delta[i] += value
                reported_of_estimated[i] += rep
                if is_prod:
                    prod_delta[i] += value - rep

        def existing(usage: ResourceList | None) -> list[int] | None:
            if usage is None:
                return None
            out = []
            for i, r in enumerate(res):
                u = usage.get(r, 0)
                if u >= reported_of_estimated[i]:
                    u -= reported_of_estimated[i]
                out.append(u + delta[i])
            return out

        load.node_existing = existing(metric.node_usage) or all_estimated
        if filter_agg and agg_profile is not None:
            load.agg_filter_existing = existing(
                aggregated_usage(metric, agg_profile.duration, agg_profile.kind)
            ) or list(all_estimated)
        if agg is not None and agg.score_aggregation_type:
            load.agg_score_existing = existing(
                aggregated_usage(metric, agg.score_aggregated_duration, agg.score_aggregation_type)
            ) or list(all_estimated)
        load.prod_existing = [prod_reported[i] + prod_delta[i] for i in range(n)]
        return load

    def warm(self, cycle: Cycle) -> None:
        """Precompute every node (the extender calls this after loading a snapshot)."""
        self._prepare(cycle)

    def _prepare(self, cycle: Cycle) -> None:
        """Bring the per-node cache and the indexes up to date: only the nodes the snapshot's
        change log names, or everything after a new snapshot or a gap in the log."""
        snap = cycle.snapshot
        names = self._changes.poll(snap)
        cache = self._cache
        if names is None:
            metrics = snap.node_metrics
            if self._changes.new_snapshot:
                cache.clear()
            for name, node in snap.nodes.items():
                load = cache.get(name)
                if (
                    load is None
                    or load.generation != node.generation
                    or load.metric is not metrics.get(name)
                ):
                    self._load(cycle, node)
            for gone in [n for n in cache if n not in snap.nodes]:
                del cache[gone]
            self._build_indexes()
        else:
            for name in names:
                changed = snap.nodes.get(name)
                if changed is None:
                    if cache.pop(name, None) is not None:
                        self._unindex(name)
                    continue
                self._index(name, self._load(cycle, changed))

    def _rows(
        self, name: str, load: _NodeLoad
    ) -> tuple[
        tuple[str, list[int | None]] | None,
        tuple[str, list[int | None]] | None,
        dict[str, tuple[float, list[tuple[int, int]]]],
        tuple[_Basis, _Basis] | None,
    ]:
        """A node's rows: (normal, prod) threshold rows, its score vectors, and the usage
        basis of each row."""
        if load.metric is None or not load.has_usage:
            return None, None, {}, None
        n = len(self.resources)
        alloc = load.allocatable
        if load.filter_aggregated and load.agg_filter_existing is not None:
            reason, ths, ex = ERR_AGGREGATED_USAGE, load.agg_thresholds, load.agg_filter_existing
            label = f"{load.agg_kind} usage"
        else:
            reason, ths, ex = ERR_USAGE, load.thresholds, load.node_existing
            label = "usage"
        heads = [headroom(ths[i], alloc[i], ex[i]) for i in range(n)]
        normal = (reason, heads)
        prod = normal
        basis: _Basis = (ex, ths, alloc, reason, label)
        prod_basis = basis
        if any(load.prod_thresholds):
            prod = (
                ERR_USAGE,
                [
                    headroom(load.prod_thresholds[i], alloc[i], load.prod_existing[i])
                    for i in range(n)
                ],
            )
            prod_basis = (load.prod_existing, load.prod_thresholds, alloc, ERR_USAGE, "prod usage")
        weighted = [i for i, _ in self._weights]
        vecs = {
            kind: (
                load.expires_at,
                [(alloc[i], existing[i]) if alloc[i] > 0 else (1, 1 << 62) for i in weighted],
            )
            for kind, existing in (
                ("node", load.node_existing),
                ("agg", load.agg_score_existing or load.node_existing),
                ("prod", load.prod_existing),
            )
        }
        return normal, prod, vecs, (basis, prod_basis)

    def _build_indexes(self) -> None:
        n = len(self.resources)
        normal: list[tuple[str, str, list[int | None]]] = []
        prod: list[tuple[str, str, list[int | None]]] = []
        expiry: list[tuple[float, str]] = []
        vecs: dict[str, dict[str, tuple[float, list[tuple[int, int]]]]] = {
            "node": {},
            "agg": {},
            "prod": {},
        }
        self._basis = {"normal": {}, "prod": {}}
        for name, load in self._cache.items():
            if load.metric is not None:
                expiry.append((load.expires_at, name))
            nrow, prow, v, bases = self._rows(name, load)
            if nrow is not None and prow is not None and bases is not None:
                normal.append((name, *nrow))
                prod.append((name, *prow))
                self._basis["normal"][name], self._basis["prod"][name] = bases
            for kind, vec in v.items():
                vecs[kind][name] = vec
        self._normal_index = ThresholdIndex.build(n, normal)
        self._prod_index = ThresholdIndex.build(n, prod)
        self._expiry = ExpiryIndex(expiry)
        self._score_vecs = vecs
        self._verdicts.clear()
        self._scores.clear()

    def _unindex(self, name: str) -> None:
        for fails in self._verdicts.values():
            fails.pop(name, None)
        for scores in self._scores.values():
            scores.pop(name, None)
        self._normal_index.discard(name)
        self._prod_index.discard(name)
        self._expiry.discard(name)
        self._basis["normal"].pop(name, None)
        self._basis["prod"].pop(name, None)
        for kind in self._score_vecs.values():
            kind.pop(name, None)

    def _index(self, name: str, load: _NodeLoad) -> None:
        self._unindex(name)
        if load.metric is not None:
            self._expiry.upsert(name, load.expires_at)
        nrow, prow, v, bases = self._rows(name, load)
        if nrow is not None and prow is not None and bases is not None:
            self._normal_index.upsert(name, *nrow)
            self._prod_index.upsert(name, *prow)
            self._basis["normal"][name], self._basis["prod"][name] = bases
        for kind, vec in v.items():
            self._score_vecs.setdefault(kind, {})[name] = vec
        self._rememo(name)

    def _message(self, kind: str, name: str, i: int, est: Sequence[int]) -> str:
        """The reason ``name`` fails on resource ``i`` for an estimate, with the numbers:
        ``node(s) cpu usage exceed threshold, cpu usage 91% > threshold 65%``."""
        ex, ths, alloc, template, label = self._basis[kind][name]
        r = self.resources[i]
        pct = go_round((ex[i] + est[i]) / alloc[i] * 100) if alloc[i] > 0 else 0
        return f"{template % r}, {r} {label} {pct}% > threshold {ths[i]}%"

    def _rememo(self, name: str) -> None:
        """Recompute ``name``'s memoized verdicts and (where known) scores after a re-index."""
        for (kind, est), fails in self._verdicts.items():
            index = self._prod_index if kind == "prod" else self._normal_index
            row = index.rows().get(name)
            fails.pop(name, None)
            if row is not None:
                for i, h in enumerate(row[1]):
                    if h is not None and est[i] > h:
                        fails[name] = self._message(kind, name, i, est)
                        break
        weight_sum = self._weight_sum or 1
        for (kind, est), scores in self._scores.items():
            vecs = self._score_vecs.get(kind, {})
            weights = [(w, est[i]) for i, w in self._weights]
            scores[name] = _score(vecs.get(name), weights, weight_sum, self._dominant)

    @staticmethod
    def _memo(memos: dict[_MemoKey, _T], key: _MemoKey, value: _T) -> _T:
        """Keep ``value`` under ``key``, dropping the oldest memo past :data:`MEMO_SHAPES`."""
        if len(memos) >= MEMO_SHAPES:
            del memos[next(iter(memos))]
        memos[key] = value
        return value

    def _pod_estimate(self, cycle: Cycle, pod: PodInfo) -> list[int]:
        key = f"{NAME}/estimate/{pod.uid}"
        est = cycle.data.get(key)
        if est is None:
            est = estimate_pod(
                pod,
                self.resources,
                self.factors,
                allow_customize=self.args.allow_customize_estimation,
            )
            cycle.data[key] = est
        return list(est)

    # -- steps ------------------------------------------------------------------------------

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        out: dict[str, str] = {}
        if "DaemonSet" in pod.owner_kinds:
            return out
        a = self.args
        self._prepare(cycle)
        est = self._pod_estimate(cycle, pod)
        prod = pod.priority_class == PRIORITY_PROD
        index = self._prod_index if prod else self._normal_index
        kind = "prod" if prod else "normal"
        # the failing nodes with their reasons, memoized per estimate (see the module docstring)
        fails = self._verdicts.get((kind, tuple(est)))
        if fails is None:
            fails = {}
            for i, name, _ in index.failing(est):
                if name not in fails:
                    fails[name] = self._message(kind, name, i, est)
            self._memo(self._verdicts, (kind, tuple(est)), fails)
        every = len(nodes) == len(cycle.snapshot.nodes)
        if every:
            out = dict(fails)
        else:
            get = fails.get
            out = {n.name: r for n in nodes if (r := get(n.name)) is not None}
        if a.filter_expired_node_metrics and self._expiry.count_expired(cycle.now):
            asked = None if every else {n.name for n in nodes}
            reject = not a.enable_schedule_when_node_metrics_expired
            for name in self._expiry.expired(cycle.now):
                if asked is None or name in asked:
                    if reject:
                        out[name] = ERR_EXPIRED
                    else:
                        out.pop(name, None)
        return out

    def unresolvable(self, reason: str) -> bool:
        return reason == ERR_EXPIRED  # evicting pods does not refresh a NodeMetric

    def might_help(
        self, cycle: Cycle, pod: PodInfo, node: NodeInfo, victims: Sequence[PodInfo]
    ) -> bool:
        """A node this plugin accepts stays accepted; on one it rejects, the reported usage
        stays until the next report, so only victims counted by their estimate (too recent
        for the report) can lower it now."""
        if not self.filter_nodes(cycle, pod, [node]):
            return True
        metric = cycle.snapshot.node_metrics.get(node.name)
        return metric is None or any(_recent(v, metric) for v in victims)

    def score_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, int]:
        a = self.args
        self._prepare(cycle)
        est = self._pod_estimate(cycle, pod)
        now = cycle.now
        if a.score_according_prod_usage and pod.priority_class == PRIORITY_PROD:
            kind = "prod"
        elif a.aggregated and a.aggregated.score_aggregation_type:
            kind = "agg"
        else:
            kind = "node"
        vecs = self._score_vecs.get(kind, {})
        weights = [(w, est[i]) for i, w in self._weights]
        weight_sum = self._weight_sum or 1
        key = (kind, tuple(est))
        scores = self._scores.get(key)
        if scores is None:
            scores = self._memo(self._scores, key, {})
        out: dict[str, int] | None = None
        if len(scores) >= len(nodes):  # perhaps all known: one lookup a node, in C
            names = cycle.names_only(nodes)
            with contextlib.suppress(KeyError):  # one was not: computed below
                out = dict(zip(names, map(scores.__getitem__, names), strict=True))
        if out is None:
            out = {}
            known = scores.get
            get = vecs.get
            for node in nodes:
                name = node.name
                sc = known(name)
                if sc is None:
                    sc = scores[name] = _score(get(name), weights, weight_sum, self._dominant)
                out[name] = sc
        if self._expiry.count_expired(now):
            for name in self._expiry.expired(now):
                if name in out:
                    out[name] = 0
        return out


def _recent(pod: PodInfo, metric: NodeMetricInfo) -> bool:
    """Whether ``pod`` is counted by its estimate (too recent for the report)."""
    pm = metric.pods.get(pod.key)
    if pm is None or not pm.usage or metric.update_time is None or pod.scheduled_at is None:
        return True
    return pod.scheduled_at > metric.update_time - metric.report_interval_s


def _score(
    vec: tuple[float, list[tuple[int, int]]] | None,
    weights: list[tuple[int, int]],
    weight_sum: int,
    dominant: int = 0,
) -> int:
    """A node's score for an estimate (``weights``: (weight, estimate) per weighted resource),
    expiry not applied; 0 without a usable NodeMetric. With a ``dominant`` weight the lowest
    per-resource score (the node's most used resource) counts that much more
    (``loadAwareSchedulingScorer``; ``weight_sum`` includes it)."""
    if vec is None:
        return 0
    total = 0
    lowest = 100
    for (c, x), (w, e) in zip(vec[1], weights, strict=True):
        part = (c - x - e) * 100 // c
        if part < 0:
            part = 0
        total += part * w
        lowest = min(lowest, part)
    if dominant:
        total += lowest * dominant
    return total // weight_sum


def build(args: Mapping[str, Any] | None, source: str) -> LoadAwareScheduling:
    """Factory for the plugin table."""
    return LoadAwareScheduling(parse_args(args, source))
