"""LowNodeLoad: move pods off nodes whose real usage is above the high thresholds.

A Balance plugin, upstream's ``pkg/descheduler/framework/plugins/loadaware`` (v1.6) step by step;
the arithmetic is in :mod:`descheduler.loadaware.utilization`, the long form in
docs/descheduler.md. Per node pool (the top level first, then ``nodePools``):

1. The pool's nodes: its ``nodeSelector`` (none: every node; with one, nodes an earlier pool
   found hot are skipped). Nodes without a current NodeMetric are left out.
2. Classify (usage, thresholds). No source (high, or prod-high): done.
3. Anomaly: a source counts only once its detector says it has been hot long enough
   (``anomalyCondition``; ``consecutiveAbnormalities: 1`` at once). None yet: done.
4. No target (low, prod-low, both-low): done. Targets' detectors are reset. Not more targets than
   ``numberOfNodes``, or every node a target: done.
5. Sources hottest first (``resourceWeights``). For each: its pods (prod pods for prod sources)
   that pass the evictor's filter, the pod selectors and ``evictableNamespaces``, and with
   ``nodeFit`` that have a metric and fit some target (the scheduler's filters) without lifting
   it over its high thresholds (that target's usage then carries the pod); sorted (priority, QoS,
   costs, usage, age); evicted one by one while the source is still above a high threshold and
   every resource has room left on the targets (the sum of high threshold less usage). Each move
   takes the pod's usage off the source and off the room left.
6. Detectors of the sources that were processed are marked normal once.

Every node's class and every candidate's fate goes to the round's report.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from apis.kubernetes_keys import RESOURCE_PODS
from descheduler.anomaly import ANOMALY, Detector, DetectorCache
from descheduler.framework import EvictOptions, Handle, Migration, NodeReport, RoundReport
from descheduler.loadaware.args import NAME, AnomalyCondition, LowNodeLoadArgs, NodePool
from descheduler.loadaware.firstfit import FirstFit
from descheduler.loadaware.nodefit import NodeFit
from descheduler.loadaware.utilization import (
    BOTH_LOW,
    HIGH,
    LOW,
    PROD_HIGH,
    PROD_LOW,
    NodeUsage,
    Thresholds,
    classify,
    display_class,
    new_thresholds,
    node_usages,
    over,
    over_reason,
    set_thresholds,
)
from descheduler.sorter import node_usage_score, pod_sort_key, usage_score
from scheduler_plugins.snapshot import NodeInfo, PodInfo


class LowNodeLoad:
    """See the module docstring."""

    name = NAME

    def __init__(self, args: LowNodeLoadArgs) -> None:
        self.args = args
        self.detectors: DetectorCache | None = None
        self.prod_detectors: DetectorCache | None = None
        self._fit: NodeFit | None = None
        self.observed_rounds: int | None = None
        """``explain``: take the snapshot as observed this many rounds in a row instead of
        asking the detectors (a source is abnormal once the rounds exceed
        ``consecutiveAbnormalities``); ``None`` in the daemon."""

    # -- the round ------------------------------------------------------------------------------
    def balance(self, handle: Handle, nodes: Sequence[NodeInfo]) -> None:
        if self.args.paused:
            handle.report.notes.append(f"{NAME} is paused and will do nothing")
            return
        if self.detectors is None or self.prod_detectors is None:
            ttl = self.args.detector_cache_timeout_s
            self.detectors = DetectorCache(ttl, handle.monotonic)
            self.prod_detectors = DetectorCache(ttl, handle.monotonic)
        processed: set[str] = set()
        for pool in self.args.node_pools:
            self._pool(handle, pool, nodes, processed)

    @property
    def fit_calls(self) -> int:
        """Scheduler filter runs for ``nodeFit`` (benchmarks)."""
        return 0 if self._fit is None else self._fit.calls

    def nodefit(self, handle: Handle) -> NodeFit:
        if self._fit is None or self._fit.snapshot is not handle.cluster.sched:
            self._fit = NodeFit(handle.cluster.sched, clock=handle.clock)
        return self._fit

    def _pool(
        self, handle: Handle, pool: NodePool, nodes: Sequence[NodeInfo], processed: set[str]
    ) -> None:
        assert self.detectors is not None
        assert self.prod_detectors is not None
        report = handle.report
        if pool.node_selector is not None:
            sel = pool.node_selector
            nodes = [n for n in nodes if n.name not in processed and sel.matches(n.labels)]
        if not nodes:
            return
        th = new_thresholds(pool)
        names = th.resources
        skipped: dict[str, str] = {}
        usages = node_usages(
            handle.cluster,
            nodes,
            names,
            handle.clock(),
            self.args.node_metric_expiration_s,
            skipped,
        )
        set_thresholds(usages, th, pool.use_deviation_thresholds)
        groups: dict[str, list[NodeUsage]] = {
            c: [] for c in (LOW, HIGH, PROD_LOW, PROD_HIGH, BOTH_LOW)
        }
        for u in usages.values():
            cls = classify(u)
            if cls in groups:
                groups[cls].append(u)
            self._report_node(report, pool, th, u, cls)
        for name, why in skipped.items():
            report.nodes.setdefault(name, NodeReport(pool=pool.name, note=why))
        low, sources, prod_low, prod_high, both = (
            groups[LOW],
            groups[HIGH],
            groups[PROD_LOW],
            groups[PROD_HIGH],
            groups[BOTH_LOW],
        )
        where = f"{NAME} pool {pool.name}"
        if not sources and not prod_high:
            report.notes.append(f"{where}: no node above its high thresholds")
            return
        abnormal = self._abnormal(sources, self.detectors, pool.anomaly, handle)
        abnormal_prod = self._abnormal(prod_high, self.prod_detectors, pool.anomaly, handle)
        if not abnormal and not abnormal_prod:
            report.notes.append(
                f"{where}: hot node(s) not anomalous yet (need more than "
                f"{pool.anomaly.consecutive_abnormalities} consecutive rounds)"
            )
            return
        if not low and not prod_low and not both:
            report.notes.append(f"{where}: no node under its low thresholds to move pods to")
            return
        for group, cache in (
            (low, self.detectors),
            (prod_low, self.prod_detectors),
            (both, self.detectors),
        ):
            for u in group:
                det = cache.get(u.name)
                if det is not None:
                    det.reset()
        all_low = len(low) + len(prod_low) + len(both)
        if all_low <= self.args.number_of_nodes:
            report.notes.append(
                f"{where}: {all_low} node(s) under the low thresholds, not more than "
                f"numberOfNodes ({self.args.number_of_nodes})"
            )
            return
        if all_low == len(nodes):
            report.notes.append(f"{where}: every node is under its low thresholds")
            return
        weights = pool.resource_weights
        abnormal.sort(key=lambda u: -node_usage_score(u.usage, u.allocatable, weights))
        abnormal_prod.sort(key=lambda u: -node_usage_score(u.prod_usage, u.allocatable, weights))
        self._evict_from_sources(handle, pool, th, abnormal, low, abnormal_prod, prod_low, both)
        for u in abnormal:
            det = self.detectors.get(u.name)
            if det is not None:
                det.mark(True)
        for u in abnormal_prod:
            det = self.prod_detectors.get(u.name)
            if det is not None:
                det.mark(True)
        processed.update(u.name for u in sources)

    def _report_node(
        self, report: RoundReport, pool: NodePool, th: Thresholds, u: NodeUsage, cls: str
    ) -> None:
        if u.name in report.nodes and report.nodes[u.name].pool:
            return  # the first pool that classified the node speaks for it
        alloc = u.allocatable
        report.nodes[u.name] = NodeReport(
            pool=pool.name,
            node_class=display_class(cls),
            detail_class=cls,
            usage={n: v for n, v in u.percentages().items() if n in th.low},
            low={n: 100.0 * u.low[n] / alloc[n] if alloc.get(n) else th.low[n] for n in u.low},
            high={n: 100.0 * u.high[n] / alloc[n] if alloc.get(n) else th.high[n] for n in u.high},
        )

    def _abnormal(
        self,
        nodes: list[NodeUsage],
        cache: DetectorCache,
        cond: AnomalyCondition,
        handle: Handle,
    ) -> list[NodeUsage]:
        """``filterRealAbnormalNodes``."""
        if cond.consecutive_abnormalities == 1:
            return list(nodes)
        if self.observed_rounds is not None:
            return list(nodes) if self.observed_rounds > cond.consecutive_abnormalities else []
        out = []
        for u in nodes:
            det = cache.get(u.name)
            if det is None:
                det = Detector(
                    u.name,
                    abnormal_after=cond.consecutive_abnormalities,
                    normal_after=cond.consecutive_normalities,
                    timeout_s=cond.timeout_s,
                    clock=handle.monotonic,
                )
            if det.mark(False) == ANOMALY:
                out.append(u)
            cache.set(u.name, det)
        return out

    # -- moving pods ----------------------------------------------------------------------------
    def _evict_from_sources(
        self,
        handle: Handle,
        pool: NodePool,
        th: Thresholds,
        sources: list[NodeUsage],
        low: list[NodeUsage],
        prod_sources: list[NodeUsage],
        prod_low: list[NodeUsage],
        both: list[NodeUsage],
    ) -> None:
        """``evictPodsFromSourceNodes``: node usage first, then prod usage."""
        names = th.resources
        total = _room(low, names, False)
        both_total = _room(both, names, False)
        node_room = {n: total[n] + both_total[n] for n in names}
        self._balance(handle, pool, th, sources, [*low, *both], node_room, prod=False)
        if not prod_sources:  # upstream sums the prod room too, for no source to use
            return
        prod_total = _room(prod_low, names, True)
        prod_both = _room(both, names, True)
        for n in names:  # what node balancing left of the both-low nodes' room
            both_total[n] = min(both_total[n], node_room[n])
        prod_room = {n: prod_total[n] + min(prod_both[n], both_total[n]) for n in names}
        self._balance(handle, pool, th, prod_sources, [*prod_low, *both], prod_room, prod=True)

    def _balance(
        self,
        handle: Handle,
        pool: NodePool,
        th: Thresholds,
        sources: list[NodeUsage],
        targets: list[NodeUsage],
        room: dict[str, int],
        *,
        prod: bool,
    ) -> None:
        """``balancePods``."""
        if not targets:
            return
        cluster = handle.cluster
        report = handle.report
        placer = FirstFit(
            [t.prod_usage if prod else t.usage for t in targets],
            [t.prod_high if prod else t.high for t in targets],
            th.resources,
        )
        for src in sources:
            pods = [p for p in src.pods if p.key in src.prod_pod_keys] if prod else list(src.pods)
            removable: list[PodInfo] = []
            for pod in pods:
                reason = self._pod_filter(handle, pod)
                if reason is None and self.args.node_fit:
                    metric = src.report.pods.get(pod.key)
                    if metric is None:
                        reason = "no pod metric in the NodeMetric (nodeFit needs one)"
                    else:
                        reason = self._fits_a_target(handle, pod, targets, placer, metric, prod)
                if reason is not None:
                    report.verdict(src.name, pod.key, NAME, "skip", reason)
                    continue
                removable.append(pod)
            if not removable:
                continue
            usage = src.prod_usage if prod else src.usage
            limits = src.prod_high if prod else src.high
            hot = over(usage, limits)
            excess = {n: hot[n] - limits[n] for n in hot}
            weights = {n: pool.resource_weights.get(n, 0) for n in hot}
            metrics = src.report.pods
            removable.sort(
                key=lambda p: pod_sort_key(
                    cluster.facts(p),
                    usage_score(metrics[p.key], excess, weights) if p.key in metrics else None,
                )
            )
            self._evict_pods(handle, th, src, removable, room, prod=prod)

    def _pod_filter(self, handle: Handle, pod: PodInfo) -> str | None:
        a = self.args
        if a.evictable_include and pod.namespace not in a.evictable_include:
            return f"namespace {pod.namespace} is not in evictableNamespaces.include"
        if pod.namespace in a.evictable_exclude:
            return f"namespace {pod.namespace} is in evictableNamespaces.exclude"
        if a.pod_selectors and not any(sel.matches(pod.labels) for _, sel in a.pod_selectors):
            return "pod matches none of podSelectors"
        return handle.evictor.filter(pod)

    def _fits_a_target(
        self,
        handle: Handle,
        pod: PodInfo,
        targets: list[NodeUsage],
        placer: FirstFit,
        metric: Mapping[str, int],
        prod: bool,
    ) -> str | None:
        """``podFitsAnyNodeWithThreshold``: the first target that takes the pod (scheduler
        filters) and stays under its high thresholds with the pod's usage added carries it."""
        fit = self.nodefit(handle)
        found = placer.first(metric, lambda i: fit.fits(pod, targets[i].node))
        if found is not None:
            placer.take(found, metric)
            return None
        if not handle.report.detailed:
            return f"no target node fits: 0/{len(targets)} target(s)"
        why: Counter[str] = Counter()
        for t in targets:
            reasons = fit.reasons(pod, t.node)
            if reasons:
                why.update(dict.fromkeys(reasons, 1))
                continue
            usage = t.prod_usage if prod else t.usage
            limits = t.prod_high if prod else t.high
            exceeded = next(
                (
                    n
                    for n, lim in limits.items()
                    if n in usage and usage[n] + metric.get(n, 0) > lim
                ),
                None,
            )
            why[f"{exceeded} would exceed its high threshold"] += 1
        parts = ", ".join(f"{count} {reason}" for reason, count in sorted(why.items()))
        return f"no target node fits: 0/{len(targets)} target(s): {parts}"

    def _evict_pods(
        self,
        handle: Handle,
        th: Thresholds,
        src: NodeUsage,
        pods: list[PodInfo],
        room: dict[str, int],
        *,
        prod: bool,
    ) -> None:
        """``evictPods``."""
        report = handle.report
        names = th.resources
        for i, pod in enumerate(pods):
            stop = self._stop(handle, src, room, names, prod)
            if stop is not None:
                for rest in pods[i:]:
                    report.verdict(src.name, rest.key, NAME, "stop", stop)
                return
            reason = self._pod_filter(handle, pod)
            if reason is not None:
                report.verdict(src.name, pod.key, NAME, "skip", reason)
                continue
            why = over_reason(src, th.prod_high if prod else th.high, prod)
            if self.args.dry_run:
                report.verdict(src.name, pod.key, NAME, "migrate", f"dry run: {why}")
                report.migrations.append(Migration(pod.key, src.name, NAME, why))
            else:
                refused = handle.evictor.evict(pod, EvictOptions(NAME, why))
                if refused is not None:
                    report.verdict(src.name, pod.key, NAME, "skip", refused)
                    continue
                report.verdict(src.name, pod.key, NAME, "migrate", why)
            report.migrations.append(Migration(pod.key, src.name, NAME, why))
            metric = src.report.pods.get(pod.key)
            if metric is None:
                continue
            prod_usage = src.prod_usage if prod else None
            for n in room:
                q = 1 if n == RESOURCE_PODS else metric.get(n, 0)
                room[n] -= q
                if n in src.usage:
                    src.usage[n] -= q
                if prod_usage is not None and n in prod_usage:
                    prod_usage[n] -= q

    def _stop(
        self, handle: Handle, src: NodeUsage, room: Mapping[str, int], names: list[str], prod: bool
    ) -> str | None:
        """``continueEvictionCond``: why the source needs no more moves, or ``None``."""
        usage = src.prod_usage if prod else src.usage
        limits = src.prod_high if prod else src.high
        if not over(usage, limits):
            cache = self.prod_detectors if prod else self.detectors
            det = cache.get(src.name) if cache is not None else None
            if det is not None:
                det.reset()
            return "the node is under its high thresholds now"
        for n in names:
            if n in room and room[n] <= 0:
                return f"no room left for {n} on the target nodes"
        return None


def _room(nodes: list[NodeUsage], names: list[str], prod: bool) -> dict[str, int]:
    """``targetAvailableUsage``: the sum of high threshold less usage over ``nodes``."""
    out = dict.fromkeys(names, 0)
    for u in nodes:
        usage = u.prod_usage if prod else u.usage
        limits = u.prod_high if prod else u.high
        for n in names:
            out[n] += limits[n] - usage[n]
    return out
