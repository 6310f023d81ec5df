"""Benchmark of koord-descheduler: one LowNodeLoad round, and one arbitration of 1,000 jobs.

Builds (untimed) a cluster of ``--nodes`` nodes (default 5,000; 32 cores, 128 GiB, 110 pods
each) with ``--pods-per-node`` pods each (default 110; 250m and 1 GiB requested, owned by 1,000
ReplicaSets of 550 replicas) and a NodeMetric per node whose pod entries put ``--hot`` of the
nodes (default 10 %) at about 84 % cpu and 44 % memory, a fifth at about 10 % and 14 %, and the
rest at about 52 % and 27 % (a hot node's pods use about 240m each). The
configuration is LowNodeLoad with low thresholds cpu 30 %, memory 30 %, high cpu 65 %,
memory 70 %, ``consecutiveAbnormalities: 1`` and the MigrationController's defaults (at most 2
migrating pods per node, workloads' limits, object limiters).

(a) One descheduling round (``Descheduler.round``: usage of every node, classification, every
pod of every hot node filtered and checked against the targets, sorted, moved until the node is
under its thresholds or per-node limit): ``round_cpu_s`` (process CPU time, the target is 2 s),
``round_wall_s``, ``migrations``, ``hot_nodes``, ``candidate_pods``.

(b) One arbitration (``Arbitrator.arbitrate``: sort then filter) of ``--jobs`` waiting
PodMigrationJobs (default 1,000) for pods spread over the cluster, after the cluster's pod
indexes are warm as the daemon's informers keep them: ``arbitration_ms`` (CPU, target 200 ms),
``arbitration_passed``, ``arbitration_held``, ``arbitration_failed``. ``build_s``: the untimed
setup.

    python -m bench.descheduler_scale [--json] [--nodes N] [--pods-per-node N] [--hot F]
                                      [--jobs N]
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from typing import Any

from apis.groups import SLO_API_VERSION
from apis.podmigrationjob import parse_job
from apis.timestamp import format_time
from bench._stats import print_result
from descheduler.cluster import Cluster, build_cluster
from descheduler.config import parse_config
from descheduler.migration.arbitrator import Arbitrator
from descheduler.rounds import Descheduler

RS_COUNT = 1000
"""ReplicaSets at full size (fewer on a small cluster: at least 55 replicas each)."""
NOW = 1_800_000_000.0


def build(nodes: int, per_node: int, hot: float, rng: random.Random) -> Cluster:
    """The synthetic cluster (see the module docstring)."""
    sets = max(1, min(RS_COUNT, nodes * per_node // 55))
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": f"rs-{r}", "namespace": "default", "uid": f"uid-rs-{r}"},
            "spec": {"replicas": max(nodes * per_node // sets, 1)},
        }
        for r in range(sets)
    ]
    containers = [{"name": "main", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}}]
    created = format_time(NOW - 86400)
    conditions = [{"type": "Ready", "status": "True"}]
    cold_share = 0.2
    for n in range(nodes):
        name = f"node-{n:05d}"
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"zone": f"z{n % 3}"}},
                "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "128"}},
            }
        )
        frac = n / nodes
        cpu_pct, mem_pct = (
            (0.84, 0.44)
            if frac < hot
            else (0.10, 0.14)
            if frac < hot + cold_share
            else (0.52, 0.27)
        )
        per_pod = int((cpu_pct * 32000 - 500) / per_node)  # milli-cores, less the system's
        mem = int((mem_pct * 128 - 2) * 1024 / per_node)  # MiB, less the system's 2 GiB
        jitter = max(per_pod // 12, 1)
        entries = []
        for i in range(per_node):
            pname = f"{name}-p{i}"
            r = (n * per_node + i) % sets
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": pname,
                        "namespace": "default",
                        "uid": f"uid-{pname}",
                        "creationTimestamp": created,
                        "labels": {"app": f"rs-{r}"},
                        "ownerReferences": [
                            {
                                "apiVersion": "apps/v1",
                                "kind": "ReplicaSet",
                                "name": f"rs-{r}",
                                "uid": f"uid-rs-{r}",
                                "controller": True,
                            }
                        ],
                    },
                    "spec": {
                        "nodeName": name,
                        "schedulerName": "koord-scheduler",
                        "containers": containers,
                    },
                    "status": {
                        "phase": "Running",
                        "qosClass": "Burstable",
                        "conditions": conditions,
                    },
                }
            )
            cpu = per_pod + rng.randint(-jitter, jitter)
            entries.append(
                {
                    "namespace": "default",
                    "name": pname,
                    "podUsage": {"resources": {"cpu": f"{cpu}m", "memory": f"{mem}Mi"}},
                }
            )
        objects.append(
            {
                "apiVersion": SLO_API_VERSION,
                "kind": "NodeMetric",
                "metadata": {"name": name},
                "status": {
                    "updateTime": format_time(NOW - 30),
                    "nodeMetric": {
                        "nodeUsage": {"resources": {"cpu": "1", "memory": "1Gi"}},
                        "systemUsage": {"resources": {"cpu": "500m", "memory": "2Gi"}},
                    },
                    "podsMetric": entries,
                },
            }
        )
    return build_cluster(objects, "bench")


CONFIG = {
    "apiVersion": "descheduler/v1alpha2",
    "kind": "DeschedulerConfiguration",
    "profiles": [
        {
            "name": "koord-descheduler",
            "plugins": {"balance": {"enabled": [{"name": "LowNodeLoad"}]}},
            "pluginConfig": [
                {
                    "name": "LowNodeLoad",
                    "args": {
                        "lowThresholds": {"cpu": 30, "memory": 30},
                        "highThresholds": {"cpu": 65, "memory": 70},
                        "anomalyCondition": {"consecutiveAbnormalities": 1},
                    },
                }
            ],
        }
    ],
}


def round_figures(cluster: Cluster) -> dict[str, Any]:
    cfg = parse_config(CONFIG, "bench")
    counter = iter(range(10**9))
    d = Descheduler(
        cfg,
        cluster,
        clock=lambda: NOW,
        monotonic=lambda: NOW,
        new_name=lambda: f"job-{next(counter)}",
    )
    started = time.process_time()
    cluster.pods()  # the daemon's informers keep the pod indexes current
    index_s = time.process_time() - started
    gc.collect()
    gc.disable()
    try:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        result = d.round(detailed=False)
        cpu1, wall1 = time.process_time(), time.perf_counter()
    finally:
        gc.enable()
    hot = [n for n, r in result.report.nodes.items() if r.node_class == "high"]
    candidates = sum(len(cluster.sched.nodes[n].pods) for n in hot)
    for job, _obj in result.created:
        cluster.jobs.forget(job.name)
    return {
        "round_cpu_s": round(cpu1 - cpu0, 3),
        "round_wall_s": round(wall1 - wall0, 3),
        "pod_index_cpu_s": round(index_s, 3),
        "migrations": len(result.report.migrations),
        "hot_nodes": len(hot),
        "candidate_pods": candidates,
        "nodefit_filter_runs": d.fit.calls + sum(getattr(p, "fit_calls", 0) for p in d.plugins()),
    }


def arbitration_figures(cluster: Cluster, jobs: int, rng: random.Random) -> dict[str, Any]:
    cfg = parse_config(CONFIG, "bench")
    d = Descheduler(cfg, cluster, clock=lambda: NOW, monotonic=lambda: NOW)
    arb = Arbitrator(cluster, d.migration_filter)
    pods = [p for node in cluster.sched.nodes.values() for p in node.pods.values()]
    for i, pod in enumerate(rng.sample(pods, jobs)):
        job = parse_job(
            {
                "metadata": {
                    "name": f"job-{i}",
                    "uid": f"uid-job-{i}",
                    "creationTimestamp": format_time(NOW - rng.randint(0, 600)),
                },
                "spec": {"podRef": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid}},
            }
        )
        cluster.jobs.put(job)
        arb.add(job)
    cluster.pods()  # the daemon's informers keep the pod indexes current
    gc.collect()
    gc.disable()
    try:
        cpu0 = time.process_time()
        out = arb.arbitrate()
        cpu1 = time.process_time()
    finally:
        gc.enable()
    return {
        "arbitration_ms": round((cpu1 - cpu0) * 1000, 1),
        "arbitration_jobs": jobs,
        "arbitration_passed": len(out.passed),
        "arbitration_held": len(out.held),
        "arbitration_failed": len(out.failed),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench.descheduler_scale", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods-per-node", type=int, default=110)
    parser.add_argument("--hot", type=float, default=0.1)
    parser.add_argument("--jobs", type=int, default=1000)
    args = parser.parse_args(argv)
    rng = random.Random(7)
    started = time.perf_counter()
    cluster = build(args.nodes, args.pods_per_node, args.hot, rng)
    figures: dict[str, Any] = {
        "nodes": args.nodes,
        "pods": args.nodes * args.pods_per_node,
        "build_s": round(time.perf_counter() - started, 1),
    }
    figures.update(round_figures(cluster))
    figures.update(arbitration_figures(cluster, min(args.jobs, figures["pods"]), rng))
    print_result(figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
