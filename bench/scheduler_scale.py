"""Benchmark of the koord-scheduler extender over a synthetic cluster.

Builds (untimed) ``--nodes`` nodes (default 5,000) with a NodeMetric each (usage drawn so that
about 10 % of the nodes are over the 65 % cpu threshold), ``--pods-per-node`` assigned pods
(default 10; a few bound after the last report, so the estimator runs), and a NodeResourceTopology
on one node in ten. Nodes carry a zone label (10 zones); one in 50 is tainted ``dedicated``
(NoSchedule), one in 50 ``noisy`` (PreferNoSchedule); pods are labelled ``app`` (20 apps). Of the
pending pods, one in four tolerates ``dedicated`` and prefers two zones (preferred node
affinity), one in ten spreads its app over the zones (ScheduleAnyway), so kube-scheduler's
in-tree plugins filter and score for real in the standalone part. The extender is served on
127.0.0.1 as in production, with the extender's plugin table (kube-scheduler ran its in-tree
plugins before calling it) and Koordinator's default args. Each measured pod (``--pods``,
default 300, after 20 for warm-up) is one ``/filter`` then one ``/prioritize`` request carrying
every node name (``nodeCacheCapable``), timed from the first request sent to the second answer
read. Bodies are in the wire format kube-scheduler writes (``ExtenderArgs`` with Go field names,
the pod as the API server returns it, managed fields and defaults included). A pod in ten is an
LSR pod that needs a cpuset (NodeNUMAResource places it on every candidate node).

Each measured pod is also sent as kube-scheduler really sends it: ``nodeCacheCapable`` with
only the nodes its own filters found feasible, at most ``percentageOfNodesToScore`` of the
cluster (adaptive by default: 10 % of 5,000 nodes, 500 names), its search starting where the
last one stopped; here the next 500 names in turn.

Reported: ``extender_p50_ms``, ``extender_p99_ms`` (filter plus prioritize over HTTP, every node
name sent), ``extender_subset_p50_ms``, ``extender_subset_p99_ms`` (the same with the
``extender_subset_nodes`` names kube-scheduler would send), ``inprocess_p50_ms``,
``inprocess_p99_ms`` (the two verbs called directly with every name: the plugins' share),
``feasible_nodes_mean``, ``nodes``, ``build_s`` (snapshot build and warm-up).
``reference_p50_ms`` times a fixed pure-Python workload (dictionary lookups over 20,000 keys,
the kind of work the plugins do) right after each in-process pod, and ``inprocess_to_reference``
is ``inprocess_p50_ms`` over it: on this shared VM the machine's own speed moves by 20-40 %
over seconds (the reference moves with the extender, in step), and the ratio is the figure to
compare between runs and commits.

Then (b) the standalone scheduler's loop step (``Scheduler.schedule_one``: find feasible nodes,
score them, reserve, assume, bind; every plugin of ``koord-scheduler run``, kube-scheduler's
in-tree ones included) over ``--standalone-pods`` pending pods (default 10,000) on a fresh copy
of the cluster, with a binder that only counts (no API server) and the collector
tuned as ``koord-scheduler run`` tunes it: ``standalone_pods_per_s``, ``standalone_bound`` and
``standalone_nodes_to_find`` (feasible nodes wanted per pod, ``percentageOfNodesToScore``,
default 0: kube-scheduler's adaptive share); and the same at 100 % (every node filtered and
scored) over ``--all-nodes-pods`` pods (default 1,000): ``standalone_all_nodes_pods_per_s``.
Each assumed pod re-indexes only its node (the snapshot's change log). ``load_avg_1m``: the
host's load when done (the figures are wall-clock).

    python -m bench.scheduler_scale [--json] [--nodes N] [--pods N] [--pods-per-node N]
                                    [--standalone-pods N] [--percentage-of-nodes-to-score P]
                                    [--all-nodes-pods N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from apis.extension import ANNOTATION_CPU_TOPOLOGY, LABEL_POD_QOS
from apis.kubernetes_keys import LABEL_HOSTNAME, LABEL_TOPOLOGY_ZONE
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY
from apis.timestamp import format_time
from bench._stats import percentile
from scheduler_plugins.extender import Extender, make_app
from scheduler_plugins.framework import num_feasible_nodes_to_find
from scheduler_plugins.loading import build_snapshot
from scheduler_plugins.snapshot import PodInfo, parse_pod
from scheduler_plugins.standalone import EventRecorder, Scheduler, tune_gc
from scheduler_plugins.table import EXTENDER_PLUGINS, build_framework

ZONE = LABEL_TOPOLOGY_ZONE
ZONES = 10
APPS = 20


def _topology(name: str) -> dict[str, Any]:
    detail = [
        {"id": t * 16 + c, "core": c, "socket": 0, "node": c // 8}
        for t in range(2)
        for c in range(16)
    ]
    return {
        "kind": "NodeResourceTopology",
        "metadata": {
            "name": name,
            "annotations": {ANNOTATION_CPU_TOPOLOGY: json.dumps({"detail": detail})},
        },
        "topologyPolicies": ["None"],
        "zones": [
            {
                "name": f"node-{n}",
                "type": "Node",
                "resources": [
                    {"name": "cpu", "allocatable": "16"},
                    {"name": "memory", "allocatable": "64Gi"},
                ],
            }
            for n in range(2)
        ],
    }


def cluster(nodes: int, pods_per_node: int, seed: int = 7) -> list[dict[str, Any]]:
    """The synthetic cluster's objects."""
    rng = random.Random(seed)
    now = time.time()
    objects: list[dict[str, Any]] = []
    for i in range(nodes):
        name = f"node-{i:05d}"
        node: dict[str, Any] = {
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {LABEL_HOSTNAME: name, ZONE: f"zone-{i % ZONES}"},
            },
            "spec": {},
            "status": {
                "allocatable": {
                    "cpu": "32",
                    "memory": "128Gi",
                    "pods": "110",
                    BATCH_CPU: "20000",
                    BATCH_MEMORY: "60Gi",
                }
            },
        }
        # kube-scheduler's in-tree plugins have something to do: dedicated nodes that only
        # tolerating pods may use, and nodes pods would rather avoid (never a node with an NRT:
        # those are the LSR pods')
        if i % 50 == 5:
            node["spec"]["taints"] = [
                {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}
            ]
        elif i % 50 == 35:
            node["spec"]["taints"] = [{"key": "noisy", "effect": "PreferNoSchedule"}]
        objects.append(node)
        pods_metric = []
        for j in range(pods_per_node):
            pname = f"{name}-p{j}"
            recent = j == 0 and rng.random() < 0.3
            objects.append(
                {
                    "kind": "Pod",
                    "metadata": {
                        "name": pname,
                        "namespace": "bench",
                        "uid": f"u-{pname}",
                        "labels": {"app": f"app-{j % APPS}"},
                    },
                    "spec": {
                        "nodeName": name,
                        "priority": rng.choice((9500, 9500, 5500)),
                        "containers": [
                            {"name": "c", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}
                        ],
                    },
                    "status": {
                        "phase": "Running",
                        "conditions": [
                            {
                                "type": "PodScheduled",
                                "status": "True",
                                "lastTransitionTime": format_time(now - (5 if recent else 3600)),
                            }
                        ],
                    },
                }
            )
            if not recent:
                pods_metric.append(
                    {
                        "namespace": "bench",
                        "name": pname,
                        "podUsage": {"resources": {"cpu": "800m", "memory": "1Gi"}},
                    }
                )
        cpu_pct = rng.uniform(5, 72)
        objects.append(
            {
                "kind": "NodeMetric",
                "metadata": {"name": name},
                "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 60}},
                "status": {
                    "updateTime": format_time(now - 10),
                    "nodeMetric": {
                        "nodeUsage": {
                            "resources": {
                                "cpu": f"{int(cpu_pct * 320)}m",
                                "memory": f"{rng.randint(10, 90)}Gi",
                            }
                        }
                    },
                    "podsMetric": pods_metric,
                },
            }
        )
        if i % 10 == 0:
            objects.append(_topology(name))
    return objects


def _pod(i: int) -> dict[str, Any]:
    if i % 10 == 0:
        return {
            "kind": "Pod",
            "metadata": {
                "name": f"lsr-{i}",
                "namespace": "bench",
                "uid": f"new-{i}",
                "labels": {LABEL_POD_QOS: "LSR"},
            },
            "spec": {
                "priority": 9500,
                "containers": [
                    {
                        "name": "c",
                        "resources": {
                            "requests": {"cpu": "4", "memory": "8Gi"},
                            "limits": {"cpu": "4", "memory": "8Gi"},
                        },
                    }
                ],
            },
        }
    requests = {"cpu": "2", "memory": "4Gi"} if i % 2 else {BATCH_CPU: "2000", BATCH_MEMORY: "4Gi"}
    app = f"app-{i % APPS}"
    spec: dict[str, Any] = {
        "priority": 9500 if i % 2 else 5500,
        "containers": [{"name": "c", "resources": {"requests": requests}}],
    }
    if i % 4 == 1:  # tolerates the dedicated nodes, prefers two zones
        spec["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
        spec["affinity"] = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 50,
                        "preference": {
                            "matchExpressions": [
                                {"key": ZONE, "operator": "In", "values": ["zone-1", "zone-2"]}
                            ]
                        },
                    }
                ]
            }
        }
    if i % 10 == 3:  # spreads its app over the zones
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 5,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app": app}},
            }
        ]
    return {
        "kind": "Pod",
        "metadata": {
            "name": f"p-{i}",
            "namespace": "bench",
            "uid": f"new-{i}",
            "labels": {"app": app},
        },
        "spec": spec,
    }


def _as_sent(obj: dict[str, Any]) -> dict[str, Any]:
    """A pod as kube-scheduler serializes it into ``ExtenderArgs.Pod``: what the API server
    defaulted and recorded (managed fields, container defaults, status), in the shape of
    ``tests/golden/captures/``, so the extender parses bodies of the real size."""
    meta = obj["metadata"]
    spec = obj["spec"]
    for c in spec["containers"]:
        c.update(
            {
                "image": "registry.invalid/bench:1",
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        )
    meta.update(
        {
            "resourceVersion": "1001",
            "creationTimestamp": "2026-11-25T20:46:54Z",
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-25T20:46:54Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {".": {}}},
                        "f:spec": {
                            "f:containers": {
                                'k:{"name":"c"}': {
                                    ".": {},
                                    "f:image": {},
                                    "f:name": {},
                                    "f:resources": {".": {}, "f:requests": {".": {}}},
                                }
                            },
                            "f:dnsPolicy": {},
                            "f:restartPolicy": {},
                            "f:schedulerName": {},
                        },
                    },
                }
            ],
        }
    )
    spec.update(
        {
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        }
    )
    res = spec["containers"][0]["resources"]
    requests = res.get("requests") or {}
    if res.get("limits"):
        qos = "Guaranteed"  # the LSR pods: limits equal requests
    elif "cpu" in requests or "memory" in requests:
        qos = "Burstable"
    else:
        qos = "BestEffort"  # batch resources only
    obj["status"] = {"phase": "Pending", "qosClass": qos}
    return obj


def _args(pod: dict[str, Any], names: list[str]) -> bytes:
    """``ExtenderArgs`` as kube-scheduler marshals it with ``nodeCacheCapable``: Go field
    names, ``Nodes`` an explicit null, compact separators."""
    return json.dumps(
        {"Pod": pod, "Nodes": None, "NodeNames": names}, separators=(",", ":")
    ).encode()


REFERENCE_KEYS = 20_000


def _reference(table: dict[str, int], keys: list[str]) -> int:
    """The fixed workload timed beside each in-process pod (see the module docstring)."""
    total = 0
    for key in keys:
        total += table[key]
    return total


async def _measure(
    ext: Extender, names: list[str], pods: int, warmup: int, subset: int
) -> dict[str, Any]:
    runner = web.AppRunner(make_app(ext), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    base = f"http://127.0.0.1:{port}"
    http_ms: list[float] = []
    subset_ms: list[float] = []
    feasible: list[int] = []
    start = 0
    try:
        async with aiohttp.ClientSession() as session:

            async def verbs(i: int, sent: list[str]) -> tuple[float, int]:
                pod = _as_sent(_pod(i))
                t0 = time.perf_counter()
                async with session.post(base + "/filter", data=_args(pod, sent)) as resp:
                    result = json.loads(await resp.read())
                passing = result["NodeNames"]
                if result["Error"]:
                    raise RuntimeError(f"filter: {result['Error']}")
                async with session.post(base + "/prioritize", data=_args(pod, passing)) as resp:
                    await resp.read()
                return (time.perf_counter() - t0) * 1000, len(passing)

            for i in range(warmup + pods):
                elapsed, passed = await verbs(i, names)
                # what kube-scheduler sends: the nodes its own filters found feasible, at most
                # percentageOfNodesToScore of them, its search starting where the last stopped
                sent = [names[(start + k) % len(names)] for k in range(subset)]
                start = (start + subset) % len(names)
                elapsed_subset, _ = await verbs(20_000 + i, sent)
                if i >= warmup:
                    http_ms.append(elapsed)
                    subset_ms.append(elapsed_subset)
                    feasible.append(passed)
    finally:
        await runner.cleanup()
    direct_ms: list[float] = []
    reference_ms: list[float] = []
    table = {f"key-{k}": k for k in range(REFERENCE_KEYS)}
    keys = list(table)
    for i in range(warmup + pods):
        p = _as_sent(_pod(10_000 + i))
        t0 = time.perf_counter()
        result = ext.filter({"Pod": p, "Nodes": None, "NodeNames": names})
        ext.prioritize({"Pod": p, "Nodes": None, "NodeNames": result["NodeNames"]})
        t1 = time.perf_counter()
        _reference(table, keys)
        if i >= warmup:
            direct_ms.append((t1 - t0) * 1000)
            reference_ms.append((time.perf_counter() - t1) * 1000)
    inprocess_p50 = percentile(direct_ms, 50)
    reference_p50 = percentile(reference_ms, 50)
    return {
        "extender_p50_ms": round(percentile(http_ms, 50), 2),
        "extender_p99_ms": round(percentile(http_ms, 99), 2),
        "extender_subset_nodes": subset,
        "extender_subset_p50_ms": round(percentile(subset_ms, 50), 2),
        "extender_subset_p99_ms": round(percentile(subset_ms, 99), 2),
        "inprocess_p50_ms": round(inprocess_p50, 2),
        "inprocess_p99_ms": round(percentile(direct_ms, 99), 2),
        "reference_p50_ms": round(reference_p50, 2),
        "inprocess_to_reference": round(inprocess_p50 / reference_p50, 3),
        "feasible_nodes_mean": round(statistics.fmean(feasible), 1),
    }


class _NullBinder:
    """Records nothing but a count: the API server's share is not measured here."""

    def __init__(self) -> None:
        self.bound = 0

    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        self.bound += 1


async def _standalone(
    nodes: int, pods_per_node: int, pods: int, percentage: int, prefix: str = "standalone"
) -> dict[str, Any]:
    snapshot = build_snapshot(cluster(nodes, pods_per_node), "synthetic")
    binder = _NullBinder()
    built_at = time.time()  # the clock stands still: NodeMetrics must not expire mid-run
    framework = build_framework()
    sched = Scheduler(
        framework,
        snapshot,
        binder,
        EventRecorder(None),
        clock=lambda: built_at,
        percentage_of_nodes_to_score=percentage,
    )
    pending = []
    for i in range(pods):
        obj = _pod(100_000 + i)
        obj["spec"]["schedulerName"] = "koord-scheduler"
        pending.append(parse_pod(obj, "bench"))
    for p in pending:
        snapshot.pending_pods[p.uid] = p
    logging.getLogger("scheduler_plugins").setLevel(logging.WARNING)
    tune_gc()  # as `koord-scheduler run` does once its informers have synced
    t0, c0 = time.perf_counter(), time.process_time()
    for p in pending:
        await sched.schedule_one(p)
    await sched.wait_bindings()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    gc.unfreeze()
    return {
        f"{prefix}_pods_per_s": round(pods / elapsed, 1),
        # CPU-bound and single-threaded: on a quiet machine CPU time is the wall time; on a
        # shared VM the wall figure also carries stolen time, this one does not.
        f"{prefix}_pods_per_cpu_s": round(pods / cpu, 1) if cpu > 0 else None,
        f"{prefix}_bound": binder.bound,
        f"{prefix}_nodes_to_find": num_feasible_nodes_to_find(percentage, nodes),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench.scheduler_scale", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--pods-per-node", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--standalone-pods", type=int, default=10_000)
    parser.add_argument(
        "--percentage-of-nodes-to-score",
        type=int,
        default=0,
        help="kube-scheduler's setting: 0 adaptive (10 %% of 5,000 nodes), 100 every node",
    )
    parser.add_argument(
        "--all-nodes-pods",
        type=int,
        default=1000,
        help="pods for the standalone figure at 100 %% (every node filtered and scored)",
    )
    args = parser.parse_args(argv)
    subset = num_feasible_nodes_to_find(args.percentage_of_nodes_to_score, args.nodes)
    t0 = time.perf_counter()
    snapshot = build_snapshot(cluster(args.nodes, args.pods_per_node), "synthetic")
    # as `koord-scheduler extender`: kube-scheduler ran its in-tree plugins before calling it
    ext = Extender(build_framework(EXTENDER_PLUGINS), snapshot, tune_gc=True)
    build_s = time.perf_counter() - t0
    names = list(snapshot.nodes)
    figures: dict[str, Any] = {"nodes": args.nodes, "pods": args.pods, "build_s": round(build_s, 2)}
    figures.update(asyncio.run(_measure(ext, names, args.pods, args.warmup, subset)))
    del ext, snapshot
    gc.unfreeze()
    if args.standalone_pods:
        figures.update(
            asyncio.run(
                _standalone(
                    args.nodes,
                    args.pods_per_node,
                    args.standalone_pods,
                    args.percentage_of_nodes_to_score,
                )
            )
        )
    if args.all_nodes_pods:
        figures.update(
            asyncio.run(
                _standalone(
                    args.nodes, args.pods_per_node, args.all_nodes_pods, 100, "standalone_all_nodes"
                )
            )
        )
    figures["load_avg_1m"] = round(os.getloadavg()[0], 2)
    if not args.json:
        for key, value in figures.items():
            print(f"{key}: {value}", file=sys.stderr)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
