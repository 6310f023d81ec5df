"""Wall and CPU time of one runtime-hooks reconcile round at 200 pods (issue 17, item 2).

A fake kubepods tree (``bench._trees.fake_tree``: FakeHost on tmpfs, 200 pods of 3 containers, a
quarter BestEffort; ``--tree real``: the same in this machine's cgroup v1 hierarchies) gets an
inventory where every BestEffort pod is a BE pod with batch resources in its spec, every Guaranteed
pod an LSR pod bound to one CPU, and the others LS pods; the hook table runs with Koordinator's
default gates (GroupIdentity, CPUSetAllocator, BatchResource) and the real executor writes the
tree's files. The first round writes every value; the rounds after it find them in place (the steady
state, what a node pays every 10 s).

Keys: ``first_round_ms``, ``round_ms`` and ``round_p90_ms`` (wall, steady rounds),
``round_cpu_ms`` and ``round_cpu_p90_ms`` (``process_time``, the writer thread included),
``batch_cpu_ms`` (median ``thread_time`` of the executor's batch on the writer thread: reading
and comparing the cgroup values), ``writes`` (planned per round), ``reused`` (pods whose results
the last steady round kept), ``pods``, ``tree``.

    python -m bench.runtimehooks_reconcile [--json] [--pods N] [--rounds N] [--tree fake|real]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

from apis.extension import ANNOTATION_RESOURCE_STATUS, LABEL_POD_QOS, KubeQOS, QoSClass
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY
from apis.slo_inforce import NodeSLOInForce
from bench._stats import percentile, print_result
from bench._trees import BenchTree, fake_tree, real_tree
from koordlet.collectors.nodeinfo import node_info_dict
from koordlet.executor import CgroupWriter
from koordlet.executor.batch import BatchResult, BatchWrite, apply_batch
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
    writer = _TimedWriter(host)
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
        writer.batch_ms.clear()
        for _ in range(rounds):
            w0, c0 = time.perf_counter(), time.process_time()
            last = await reconciler.reconcile()
            walls.append((time.perf_counter() - w0) * 1000)
            cpus.append((time.process_time() - c0) * 1000)
    finally:
        writer.stop()
    return {
        "tree": tree.kind,
        "pods": len(snapshot.pods),
        "writes": first.writes,
        "reused": last.reused,
        "first_round_ms": round(first_ms, 2),
        "round_ms": round(statistics.median(walls), 2),
        "round_p90_ms": round(percentile(walls, 90), 2),
        "round_cpu_ms": round(statistics.median(cpus), 2),
        "round_cpu_p90_ms": round(percentile(cpus, 90), 2),
        "batch_cpu_ms": round(statistics.median(writer.batch_ms), 2),
    }


class _TimedWriter(CgroupWriter):
    """The writer, timing each batch on its thread (``thread_time``)."""

    def __init__(self, host: Any) -> None:
        super().__init__(host)
        self.batch_ms: list[float] = []

    def submit_batch(self, writes: Any) -> Any:
        pool = self._pool
        assert pool is not None
        return pool.submit(self._timed_batch, tuple(writes))

    def _timed_batch(self, writes: tuple[BatchWrite[Any], ...]) -> BatchResult:
        t0 = time.thread_time()
        try:
            return apply_batch(self, writes)
        finally:
            self.batch_ms.append((time.thread_time() - t0) * 1000)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--json", action="store_true", help="one JSON line instead of key: value lines"
    )
    parser.add_argument("--tree", choices=("fake", "real"), default="fake")
    args = parser.parse_args(argv)
    with (real_tree if args.tree == "real" else fake_tree)(args.pods) as tree:
        figures = asyncio.run(_run(tree, max(args.rounds, 1)))
    print_result(figures, args.json, width=16)
    return 0


if __name__ == "__main__":
    sys.exit(main())
