"""Wall and CPU time of one runtime-hooks reconcile round at 200 pods.

A fake kubepods tree (``bench._trees.fake_tree``: FakeHost on tmpfs, 200 pods of 3 containers, a
quarter BestEffort) gets an inventory where every BestEffort pod is a BE pod with batch resources
in its spec, every Guaranteed pod an LSR pod bound to one CPU, and the others LS pods; the hook
table runs with Koordinator's default gates (GroupIdentity, CPUSetAllocator, BatchResource) and
the real executor writes the tree's files. The first round writes every value; the rounds after
it find them in place (the steady state, what a node pays every 10 s).

Keys: ``first_round_ms``, ``round_ms`` and ``round_p90_ms`` (wall, steady rounds),
``round_cpu_ms`` (``process_time``, the writer thread included), ``writes`` (planned per round),
``pods``.

    python -m bench.runtimehooks_reconcile [--json] [--pods N] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from typing import Any

from apis.extension import ANNOTATION_RESOURCE_STATUS, LABEL_POD_QOS, KubeQOS, QoSClass
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY
from apis.slo_inforce import NodeSLOInForce
from bench._stats import print_result
from bench._trees import BenchTree, fake_tree
from koordlet.collectors.nodeinfo import node_info_dict
from koordlet.executor import CgroupWriter
from koordlet.features import FeatureGates
from koordlet.runtimehooks.framework import HookDispatcher
from koordlet.runtimehooks.metrics import HookMetrics
from koordlet.runtimehooks.reconciler import HookReconciler
from koordlet.runtimehooks.sharepool import CPUSetRule, share_pools_of
from koordlet.runtimehooks.table import HOOKS, HookContext
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import PodInfo, WorkloadSnapshot
from koordlet.system.probe import probe_capabilities
from koordlet.system.topology import read_cpu_topology

_CLASS = {KubeQOS.BESTEFFORT: QoSClass.BE, KubeQOS.GUARANTEED: QoSClass.LSR}
_BATCH = {
    c: {
        "requests": {BATCH_CPU: "500", BATCH_MEMORY: "256Mi"},
        "limits": {BATCH_CPU: "1000", BATCH_MEMORY: "512Mi"},
    }
    for c in ("main", "side", "log")
}


def _as_workloads(pods: list[PodInfo], ncpus: int) -> WorkloadSnapshot:
    out = {}
    for i, pod in enumerate(pods):
        qos = _CLASS.get(pod.kube_qos, QoSClass.LS)
        containers = tuple(
            type(c)(c.id, name, c.runtime, c.cgroup_dir)
            for c, name in zip(pod.containers, _BATCH, strict=False)
        )
        annotations = {}
        if qos is QoSClass.LSR:
            annotations[ANNOTATION_RESOURCE_STATUS] = json.dumps({"cpuset": str(i % ncpus)})
        out[pod.uid] = PodInfo(
            pod.uid, f"pod-{i}", "bench", qos, pod.kube_qos, pod.cgroup_dir, containers,
            labels={LABEL_POD_QOS: qos.value}, annotations=annotations,
            extended_resources=_BATCH if qos is QoSClass.BE else {},
        )  # fmt: skip
    return WorkloadSnapshot(pods=out, generation=1)


async def _run(tree: BenchTree, rounds: int) -> dict[str, Any]:
    host = tree.host
    found = list(KubepodsSource(host).list_pods().values())
    ncpus = len(read_cpu_topology(host.paths).cpus)
    snapshot = _as_workloads(found, ncpus)
    caps = probe_capabilities(host)
    info = node_info_dict(read_cpu_topology(host.paths))
    rule = CPUSetRule(share_pools_of(info, snapshot.pods.values()))
    ctx = HookContext(
        node_slo=NodeSLOInForce,
        host=lambda: host,
        capabilities=lambda: caps,
        cpuset_rule=lambda: rule,
    )
    gates = FeatureGates()
    writer = CgroupWriter(host)
    writer.capabilities = caps
    writer.start()
    try:
        dispatcher = HookDispatcher(
            HOOKS, ctx, enabled=gates.enabled, metrics=HookMetrics(None), writer=writer
        )
        reconciler = HookReconciler(
            dispatcher, workloads=lambda: snapshot, host=lambda: host, executor=writer,
            capabilities=lambda: caps,
        )  # fmt: skip
        t0 = time.perf_counter()
        first = await reconciler.reconcile()
        first_ms = (time.perf_counter() - t0) * 1000
        walls, cpus = [], []
        for _ in range(rounds):
            w0, c0 = time.perf_counter(), time.process_time()
            await reconciler.reconcile()
            walls.append((time.perf_counter() - w0) * 1000)
            cpus.append((time.process_time() - c0) * 1000)
    finally:
        writer.stop()
    walls.sort()
    return {
        "pods": len(snapshot.pods),
        "writes": first.writes,
        "first_round_ms": round(first_ms, 2),
        "round_ms": round(statistics.median(walls), 2),
        "round_p90_ms": round(walls[min(len(walls), math.ceil(0.9 * len(walls))) - 1], 2),
        "round_cpu_ms": round(statistics.median(cpus), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--json", action="store_true", help="one JSON line instead of key: value lines"
    )
    args = parser.parse_args(argv)
    with fake_tree(args.pods) as tree:
        figures = asyncio.run(_run(tree, max(args.rounds, 1)))
    print_result(figures, args.json, width=16)
    return 0


if __name__ == "__main__":
    sys.exit(main())
