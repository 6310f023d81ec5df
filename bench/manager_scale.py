"""Benchmark of koord-manager's node resource pass over a synthetic cluster.

Builds (untimed) a cluster of ``--nodes`` nodes (default 5,000) with ``--pods`` pods each
(default 110: a mix of prod, mid, batch and free pods, a few without metrics, a few terminated)
and one NodeMetric per node, as raw API JSON. A full pass then, for every node: reads the Node,
NodeMetric and pods into their views, resolves the colocation strategy, computes batch and mid
resources without recording per-pod terms (as the controller runs), and decides whether the
Node must be written. Reported:

- ``first_pass_cpu_ms``: CPU time of the pass on a cluster never written (every node writes);
- ``pass_cpu_ms``: CPU time of the pass after every NodeMetric was updated, with the previous
  results on the Nodes and last written 60 s ago; ``--changed`` (default 10 %) of the nodes got
  a large usage change, the others a small jitter;
- ``node_writes``: Node writes the second pass decides (should equal ``nodes_changed``);
- ``per_node_us``: ``pass_cpu_ms`` per node.

CPU rather than wall time (``time.process_time``) so other processes do not inflate it. Each
pass starts after a full collection (``gc.collect()``, untimed) and runs with the collector on,
so it pays for its own garbage but not for collecting the cluster the benchmark has just built:
which pass that collection lands in depends on allocation counts since start-up, not on the
code the pass runs, and moved ``pass_cpu_ms`` by about 100 ms at 1,000 nodes (a generation-1
collection of the NodeMetrics just rebuilt) between otherwise equal runs.

    python -m bench.manager_scale [--json] [--nodes N] [--pods N] [--changed FRACTION]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from apis.configuration import SLOControllerConfig
from apis.manager_keys import EXTENDED_RESOURCES
from apis.sloconfig import parse_slo_controller_config
from apis.timestamp import format_time
from bench._stats import print_result
from manager.noderesource.calculator import calculate, decide_update
from manager.noderesource.inputs import parse_node, parse_node_metric, parse_pod_list

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
_PRIORITIES = (9500, 9500, 9500, 7500, 5500, 5500, 3500)


@dataclass
class NodeState:
    node: dict[str, Any]
    metric: dict[str, Any]
    pods: list[dict[str, Any]]
    last_write: datetime | None = None


def _pod(rng: random.Random, node: str, i: int) -> dict[str, Any]:
    cpu = rng.choice(("250m", "500m", "1", "2"))
    mem = rng.choice(("512Mi", "1Gi", "2Gi", "4Gi"))
    phase = "Succeeded" if rng.random() < 0.02 else "Running"
    return {
        "metadata": {"name": f"{node}-p{i}", "namespace": "ns", "labels": {}},
        "spec": {
            "nodeName": node,
            "priority": rng.choice(_PRIORITIES),
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": mem}}}],
        },
        "status": {"phase": phase, "qosClass": "Burstable"},
    }


def _usage(cpu_milli: int, mem_bytes: int) -> dict[str, Any]:
    return {"resources": {"cpu": f"{cpu_milli}m", "memory": str(mem_bytes)}}


def _metric(
    rng: random.Random, node: str, pods: Sequence[dict[str, Any]], load: float
) -> dict[str, Any]:
    pod_metrics = []
    total_cpu = total_mem = 0
    for p in pods:
        if rng.random() < 0.05:  # newly scheduled: no metric yet
            continue
        cpu = int(rng.randint(50, 900) * load)
        mem = int(rng.randint(200, 1500) * load) << 20
        total_cpu += cpu
        total_mem += mem
        pod_metrics.append(
            {
                "namespace": "ns",
                "name": p["metadata"]["name"],
                "podUsage": _usage(cpu, mem),
            }
        )
    return {
        "kind": "NodeMetric",
        "metadata": {"name": node},
        "status": {
            "updateTime": format_time(NOW - timedelta(seconds=30)),
            "nodeMetric": {
                "nodeUsage": _usage(total_cpu + 2000, total_mem + (4 << 30)),
                "systemUsage": _usage(2000, 4 << 30),
            },
            "podsMetric": pod_metrics,
            "prodReclaimableMetric": {"resource": _usage(rng.randint(0, 8000), 8 << 30)},
        },
    }


def build(nodes: int, pods: int, seed: int = 7) -> list[NodeState]:
    """The synthetic cluster as raw API JSON."""
    rng = random.Random(seed)
    cluster = []
    for n in range(nodes):
        name = f"node-{n}"
        node = {
            "kind": "Node",
            "metadata": {"name": name, "labels": {"pool": "a" if n % 2 else "b"}},
            "status": {
                "capacity": {"cpu": "96", "memory": "384Gi"},
                "allocatable": {"cpu": "94", "memory": "376Gi"},
            },
        }
        pod_objs = [_pod(rng, name, i) for i in range(pods)]
        cluster.append(NodeState(node, _metric(random.Random(n), name, pod_objs, 1.0), pod_objs))
    return cluster


def config() -> SLOControllerConfig:
    colocation = {
        "enable": True,
        "midUnallocatedPercent": 20,
        "nodeConfigs": [
            {
                "name": "pool-a",
                "nodeSelector": {"matchLabels": {"pool": "a"}},
                "cpuReclaimThresholdPercent": 65,
            }
        ],
    }
    return parse_slo_controller_config({"data": {"colocation-config": json.dumps(colocation)}}, "")


def full_pass(cluster: list[NodeState], cfg: SLOControllerConfig, now: datetime) -> int:
    """One pass over every node; writes the results it decides onto the Node objects. Returns
    the number of Node writes."""
    writes = 0
    for state in cluster:
        node = parse_node(state.node, "node")
        metric = parse_node_metric(state.metric, "nodemetric")
        pods = parse_pod_list(state.pods, "pods")
        result = calculate(cfg, node, metric, pods, now, record=False)
        decision = decide_update(result, node.extended, state.last_write, now)
        if decision.needed:
            writes += 1
            alloc = state.node["status"]["allocatable"]
            for name in EXTENDED_RESOURCES:
                value = result.values[name]
                if value is None:
                    alloc.pop(name, None)
                else:
                    alloc[name] = str(value)
            state.last_write = now
    return writes


def _timed_pass(
    cluster: list[NodeState], cfg: SLOControllerConfig, now: datetime
) -> tuple[int, float]:
    """:func:`full_pass` after a full collection; its Node writes and CPU milliseconds."""
    gc.collect()
    start = time.process_time()
    writes = full_pass(cluster, cfg, now)
    return writes, (time.process_time() - start) * 1000


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--changed", type=float, default=0.1)
    args = parser.parse_args(argv)

    cluster = build(args.nodes, args.pods)
    cfg = config()
    first_writes, first_ms = _timed_pass(cluster, cfg, NOW)

    rng = random.Random(11)
    changed = set(rng.sample(range(args.nodes), int(args.nodes * args.changed)))
    later = NOW + timedelta(seconds=60)
    for i, state in enumerate(cluster):
        load = 3.0 if i in changed else rng.uniform(0.98, 1.02)
        # the same pods keep their metrics; only the usage moves
        state.metric = _metric(random.Random(i), state.node["metadata"]["name"], state.pods, load)
        state.metric["status"]["updateTime"] = format_time(later)
    writes, pass_ms = _timed_pass(cluster, cfg, later)

    figures = {
        "nodes": args.nodes,
        "pods_per_node": args.pods,
        "first_pass_cpu_ms": round(first_ms, 1),
        "first_pass_writes": first_writes,
        "pass_cpu_ms": round(pass_ms, 1),
        "per_node_us": round(pass_ms * 1000 / max(args.nodes, 1), 1),
        "nodes_changed": len(changed),
        "node_writes": writes,
    }
    print_result(figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
