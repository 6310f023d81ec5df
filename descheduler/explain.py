"""``koord-descheduler explain``: what one descheduling round would do to a snapshot, and why.

The snapshot is a v1 ``List`` as ``kubectl get -o yaml`` prints it (the format ``koord-scheduler
explain`` reads): Nodes, Pods, NodeMetrics, PodDisruptionBudgets, the pods' owners (ReplicaSets,
Deployments, StatefulSets, ReplicationControllers), PriorityClasses, existing PodMigrationJobs and
Reservations. One round runs as the daemon runs it, the jobs it decides created in memory only
(so the arbitration limits count them as it goes). A snapshot is one observation: by default it
is taken as observed for as many rounds as every pool's ``anomalyCondition`` needs
(``--rounds N`` takes it as seen N rounds in a row; ``--rounds 1`` is the daemon's first round).

Printed: each node's class and usage against its thresholds, each candidate pod's fate, the
migrations in the order they would start (plugin and reason), then notes. With ``--json``
instead one JSON document and nothing else: ``{"nodes": {NAME: {"class":
"high"|"low"|"normal", "usage": {RESOURCE: percent}}}, "migrations": [{"pod": "NS/NAME",
"from": NODE, "plugin": ..., "reason": ...}]}``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from descheduler.cluster import Cluster
from descheduler.config import DeschedulerConfig
from descheduler.framework import NodeReport, RoundReport
from descheduler.loadaware.plugin import LowNodeLoad
from descheduler.loadaware.utilization import cpu_first
from descheduler.rounds import Descheduler

ALWAYS_ANOMALOUS = 10**9
"""``--rounds`` default: every pool's anomaly condition is met."""


def explain_round(
    cfg: DeschedulerConfig, cluster: Cluster, now: float | None, rounds: int | None
) -> RoundReport:
    """Run one round over ``cluster``; its report."""
    clock_now = time.time() if now is None else now
    counter = iter(range(1, 10**9))
    d = Descheduler(
        cfg,
        cluster,
        clock=lambda: clock_now,
        monotonic=lambda: clock_now,
        new_name=lambda: f"explain-{next(counter)}",
    )
    for plugin in d.plugins():
        if isinstance(plugin, LowNodeLoad):
            plugin.observed_rounds = ALWAYS_ANOMALOUS if rounds is None else rounds
    return d.round().report


def as_json(cluster: Cluster, report: RoundReport) -> dict[str, Any]:
    """The ``--json`` document (see the module docstring)."""
    nodes: dict[str, Any] = {}
    for name in cluster.sched.nodes:
        r = report.nodes.get(name) or NodeReport()
        nodes[name] = {"class": r.node_class, "usage": dict(r.usage)}
    return {
        "nodes": nodes,
        "migrations": [
            {"pod": m.pod, "from": m.node, "plugin": m.plugin, "reason": m.reason}
            for m in report.migrations
        ],
    }


def _usage_line(r: NodeReport) -> str:
    parts = []
    for name in cpu_first(r.usage):
        low, high = r.low.get(name), r.high.get(name)
        bounds = (
            f" (low {low:.2f}%, high {high:.2f}%)" if low is not None and high is not None else ""
        )
        parts.append(f"{name} {r.usage[name]:.2f}%{bounds}")
    return ", ".join(parts)


def render(cfg: DeschedulerConfig, cluster: Cluster, report: RoundReport) -> Iterator[str]:
    """The human-readable explanation."""
    yield f"config: {cfg.source}; profiles: " + ", ".join(p.name for p in cfg.profiles)
    width = max((len(n) for n in cluster.sched.nodes), default=4)
    for name in cluster.sched.nodes:
        r = report.nodes.get(name)
        if r is None:
            yield f"node {name:<{width}}  not considered (not ready, or outside every pool)"
        elif r.note:
            yield f"node {name:<{width}}  not considered: {r.note}"
        else:
            detail = f" [{r.detail_class}]" if r.detail_class not in ("", r.node_class) else ""
            usage = _usage_line(r)
            yield f"node {name:<{width}}  {r.node_class:<6}{detail}  {usage}  (pool {r.pool})"
    if report.verdicts:
        yield "candidates:"
        for v in report.verdicts:
            yield f"  {v.node}  {v.pod}  {v.outcome:<7} {v.detail}"
    yield "migrations:" if report.migrations else "migrations: none"
    for i, m in enumerate(report.migrations, 1):
        yield f"  {i}. {m.pod} from {m.node} by {m.plugin}: {m.reason}"
    for note in report.notes:
        yield f"note: {note}"


def explain(
    cfg: DeschedulerConfig,
    cluster: Cluster,
    *,
    now: float | None,
    rounds: int | None,
    json_line: bool,
) -> list[str]:
    """The lines ``koord-descheduler explain`` prints."""
    report = explain_round(cfg, cluster, now, rounds)
    if json_line:  # one JSON document and nothing else
        return [json.dumps(as_json(cluster, report), separators=(",", ":"))]
    return list(render(cfg, cluster, report))
