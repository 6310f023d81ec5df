"""Running one descheduling round over objects, for table tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from descheduler.cluster import build_cluster
from descheduler.config import parse_config
from descheduler.explain import explain_round
from descheduler.framework import RoundReport
from tests.descheduler.builders import NOW, low_node_load_config, node_metric, replica_set

PERMISSIVE_MIGRATION: dict[str, Any] = {
    "maxMigratingPerNode": 0,
    "skipCheckExpectedReplicas": True,
    "objectLimiters": {"workload": {"duration": "0s"}},
    "maxUnavailablePerWorkload": "100%",
    "maxMigratingPerWorkload": "100%",
    "nodeFit": True,
}
"""A MigrationController that lets every pod the evictor filter passes go, as upstream's
LowNodeLoad tests run with the DefaultEvictor (``NodeFit: true``) instead."""


def run_round(
    nodes: Sequence[dict[str, Any]],
    pods: Sequence[dict[str, Any]],
    *,
    extra: Sequence[dict[str, Any]] = (),
    metrics: Sequence[dict[str, Any]] | None = None,
    usage: Mapping[str, Mapping[str, str]] | None = None,
    migration: Mapping[str, Any] | None = None,
    rounds: int | None = None,
    **args: Any,
) -> RoundReport:
    """One round of LowNodeLoad with ``args``; the NodeMetrics are the pods' requests (as
    upstream's ``setupNodeMetrics`` makes them) unless ``metrics`` are given; the pods' ReplicaSet
    ``rs`` has 100 replicas unless ``extra`` holds one."""
    if metrics is None:
        metrics = [node_metric(n["metadata"]["name"], pods, usage=usage) for n in nodes]
    args.setdefault("anomalyCondition", {"consecutiveAbnormalities": 1})
    doc = low_node_load_config(migration=dict(migration or PERMISSIVE_MIGRATION), **args)
    cfg = parse_config(doc, "test-config")
    owners = (
        [] if any(o.get("kind") == "ReplicaSet" for o in extra) else [replica_set(replicas=100)]
    )
    cluster = build_cluster([*nodes, *pods, *metrics, *extra, *owners], "test-snapshot")
    return explain_round(cfg, cluster, NOW, rounds)


def migrated(report: RoundReport) -> list[str]:
    """Names of the pods migrated, in order."""
    return [m.pod.split("/", 1)[1] for m in report.migrations]
