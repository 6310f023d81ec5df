"""``koord-scheduler run`` beside kube-scheduler on one real kube-apiserver: pace, CPU, memory,
start-up.

A real etcd and kube-apiserver (v1.25, ``../shared/k8s``, through :mod:`envtest`) with the
Koordinator CRDs of ``packaging/kubernetes/crds``; ``--nodes`` plain Nodes (32 cores, 128 GiB,
110 pods, Ready; no kubelet, and no controller manager to mark them NotReady), each with a
NodeMetric whose usage is drawn between 5 % and 50 % of the node, written as the koordlet writes
it (refreshed before every run, so it is fresh for LoadAware; while a scheduler runs each node
reports again every ``--report-interval`` seconds, the koordlet's 60 by default, spread evenly:
``nodemetric_reports`` counts them). Then, alternately and ``--rounds`` times each, one
scheduler at a time on the same cluster:

- **kube-scheduler** of ``../shared/k8s``, its default profile, with its client limits raised
  (``--kube-api-qps=5000 --kube-api-burst=5000``, as production installs run it);
- **koord-scheduler** (``python -m scheduler_plugins.cli run --leader-elect=false``), every
  plugin of its default table.

A run: ``--backlog`` pods (``100m`` cpu, ``128Mi``) are pending for the scheduler when its
process starts; ``startup_s`` is the time from the process's start to the first binding seen on
a watch, ``drain_pods_per_s`` the backlog's pace from its first binding to its last (the
scheduler's own pace: nothing else runs then). Then ``--pods`` more pods are created in one
burst (``--creators`` requests in flight), and
``pods_per_s`` is their count over the time from the first creation sent to the last binding
seen; ``bound_during_burst`` counts those bound before the last creation returned, ``tail_s``
the time from then to the last binding (near 0: the scheduler kept up with the creations, and
``pods_per_s`` is the creation pace).
``cpu_ms_per_pod`` is the scheduler's CPU (user + system) from just before the burst to the last
binding, per pod; ``apiserver_cpu_s``/``etcd_cpu_s`` and ``apiserver_cpu_share`` (cores busy
over the window) show when the API server is the limit. ``peak_rss_mib`` is the scheduler's
``VmHWM`` at the end. Each run checks that every pod is bound and no node holds more cpu or
memory than it allocates (``over_capacity``), then the pods are deleted and the scheduler
stopped.

Printed: per node count and scheduler, each run's figures, and the ranges (min-max) over the
runs; ``load_avg_1m`` before and after (this machine is shared: the ranges are what to quote).

    python -m bench.scheduler_apiserver [--json] [--nodes 1000,5000] [--pods 1000]
                                        [--backlog 1000] [--rounds 2] [--creators 16]
                                        [--report-interval 60]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apis.kubernetes_keys import LABEL_ARCH, LABEL_HOSTNAME, LABEL_OS, LABEL_TOPOLOGY_ZONE
from apis.nodemetric import format_resource
from apis.quantity import resource_value
from apis.timestamp import format_time
from bench._stats import machine_figures, print_result
from bench._tools import process_cpu
from envtest.assets import why_not
from envtest.cluster import Cluster
from envtest.procs import Proc, tail
from kubeclient.client import KubeClient
from kubeclient.errors import Conflict, KubeError
from kubeclient.resources import NODE_METRICS, NODES, PODS, Resource

REPO = Path(__file__).resolve().parent.parent
CRDS = REPO / "packaging" / "kubernetes" / "crds"
NAMESPACE = "bench"
KOORD = "koord-scheduler"
KUBE = "default-scheduler"
NODE_CPU = 32
NODE_MEMORY_GI = 128
POD_CPU = "100m"
POD_MEMORY = "128Mi"
LABEL_RUN = "run"
RUN_TIMEOUT_S = 300.0


def node_object(name: str, zone: int) -> dict[str, Any]:
    alloc = {"cpu": str(NODE_CPU), "memory": f"{NODE_MEMORY_GI}Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                LABEL_HOSTNAME: name,
                LABEL_OS: "linux",
                LABEL_ARCH: "amd64",
                LABEL_TOPOLOGY_ZONE: f"zone-{zone}",
            },
        },
        "spec": {},
        "status": {
            "capacity": alloc,
            "allocatable": alloc,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "bench node",
                    "lastHeartbeatTime": format_time(time.time()),
                    "lastTransitionTime": format_time(time.time()),
                }
            ],
        },
    }


def metric_status(rng: random.Random) -> dict[str, Any]:
    """A NodeMetric status as the koordlet writes it (``format_resource``: milli-cores, bytes in
    binary SI)."""
    cpu = int(rng.uniform(0.05, 0.5) * NODE_CPU * 1000)
    mem = int(rng.uniform(0.05, 0.5) * NODE_MEMORY_GI * 1024) << 20
    usage = {"cpu": format_resource("cpu", cpu), "memory": format_resource("memory", mem)}
    return {
        "updateTime": format_time(time.time()),
        "nodeMetric": {"nodeUsage": {"resources": usage}},
        "podsMetric": [],
    }


def pod_object(name: str, scheduler: str, run: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {LABEL_RUN: run}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "main",
                    "image": "127.0.0.1:5999/pause:bench",
                    "imagePullPolicy": "Never",
                    "resources": {"requests": {"cpu": POD_CPU, "memory": POD_MEMORY}},
                }
            ],
        },
    }


async def bounded(jobs: Iterable[Callable[[], Awaitable[Any]]], limit: int) -> None:
    """Run ``jobs`` with at most ``limit`` in flight."""
    it = iter(jobs)

    async def worker() -> None:
        for job in it:
            await job()

    await asyncio.gather(*(worker() for _ in range(limit)))


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


@dataclass
class Binds:
    """Bind times of pods, from one watch on the bench namespace."""

    at: dict[str, float] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


async def watch_binds(client: KubeClient, binds: Binds, rv: str) -> None:
    while True:
        try:
            async for event in client.watch(PODS, rv, NAMESPACE, timeout_seconds=600):
                obj = event.object
                meta = obj.get("metadata") or {}
                rv = str(meta.get("resourceVersion") or rv)
                node = (obj.get("spec") or {}).get("nodeName")
                name = str(meta.get("name"))
                if node and name not in binds.at:
                    binds.at[name] = time.monotonic()
                    binds.nodes[name] = str(node)
                    binds.changed.set()
        except KubeError:
            await asyncio.sleep(0.1)


async def until(binds: Binds, check: Callable[[], bool], within: float) -> bool:
    """Whether ``check()`` held within ``within`` seconds (re-checked at each bind seen)."""
    deadline = time.monotonic() + within
    while not check():
        binds.changed.clear()
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(binds.changed.wait(), min(left, 1.0))
    return True


def koord_env(root: Path) -> dict[str, str]:
    """koord-scheduler's environment: its modules' bytecode cached (in the run's folder, not
    the source tree), as an installed package has it, whatever this shell says."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    return env


def compile_koord(root: Path) -> None:
    """Byte-compile what koord-scheduler imports, once, as ``pip install`` does."""
    subprocess.run(
        [sys.executable, "-c", "import scheduler_plugins.cli, scheduler_plugins.leader, "
         "scheduler_plugins.standalone, scheduler_plugins.table, kubeclient.client, uvloop"],
        env=koord_env(root), check=True, cwd=REPO,
    )  # fmt: skip


class Bench:
    def __init__(self, cluster: Cluster, client: KubeClient, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.client = client
        self.args = args
        self.nodes = 0
        self.rng = random.Random(7)
        self.runs = 0
        self.reports = 0

    def proc(self, name: str) -> Proc:
        assert self.cluster.control is not None
        return next(p for p in self.cluster.control.procs if p.name == name)

    async def grow_to(self, n: int) -> float:
        """Nodes and NodeMetrics up to ``n``; seconds taken."""
        t0 = time.monotonic()
        names = [f"node-{i:05d}" for i in range(self.nodes, n)]

        def make(name: str, i: int) -> Callable[[], Awaitable[Any]]:
            async def job() -> None:
                with contextlib.suppress(Conflict):
                    await self.client.create(NODES, node_object(name, i % 10))
                # the TaintNodesByCondition admission taints a new Node not-ready; the node
                # lifecycle controller (not run here) would lift it once the Node is Ready
                await self.client.patch(NODES, name, {"spec": {"taints": None}})
                metric = {
                    "apiVersion": NODE_METRICS.api_version,
                    "kind": "NodeMetric",
                    "metadata": {"name": name},
                    "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 60}},
                }
                with contextlib.suppress(Conflict):
                    await self.client.create(NODE_METRICS, metric)

            return job

        await bounded((make(nm, self.nodes + i) for i, nm in enumerate(names)), 32)
        self.nodes = n
        # Node status is kept on create (nodeStrategy keeps it); a status write checks that
        node = await self.client.get(NODES, names[0] if names else "node-00000")
        ready = [c for c in node["status"].get("conditions", []) if c["type"] == "Ready"]
        if not ready or ready[0]["status"] != "True":
            raise SystemExit("bench: the Node's Ready condition was not kept on create")
        await self.refresh_metrics()
        return time.monotonic() - t0

    async def refresh_metrics(self) -> None:
        names = [f"node-{i:05d}" for i in range(self.nodes)]

        def make(name: str) -> Callable[[], Awaitable[Any]]:
            async def job() -> None:
                await self.client.patch(
                    NODE_METRICS, name, {"status": metric_status(self.rng)}, sub="status"
                )

            return job

        await bounded((make(nm) for nm in names), 32)

    async def report(self, interval: float) -> None:
        """The koordlets' reports while a scheduler runs: each node's NodeMetric status written
        once every ``interval`` seconds, spread evenly (``nodes / interval`` writes a second)."""
        every = interval / max(self.nodes, 1)
        i = 0
        next_at = time.monotonic()
        while True:
            name = f"node-{i % self.nodes:05d}"
            with contextlib.suppress(KubeError):
                await self.client.patch(
                    NODE_METRICS, name, {"status": metric_status(self.rng)}, sub="status"
                )
            self.reports += 1
            i += 1
            next_at += every
            await asyncio.sleep(max(next_at - time.monotonic(), 0.0))

    def start(self, which: str) -> Proc:
        assert self.cluster.control is not None
        self.runs += 1
        if which == KUBE:
            return self.cluster.control.start_scheduler(
                f"kube-scheduler-{self.runs}", None, "--kube-api-qps=5000", "--kube-api-burst=5000"
            )
        argv = [
            sys.executable,
            "-m",
            "scheduler_plugins.cli",
            "run",
            f"--kubeconfig={self.cluster.kubeconfig()}",
            "--leader-elect=false",
            f"--scheduler-name={KOORD}",
        ]
        log = self.cluster.root / f"koord-scheduler-{self.runs}.log"
        proc = Proc(f"koord-scheduler-{self.runs}", argv, log, env=koord_env(self.cluster.root))
        self.cluster.control.procs.append(proc)
        return proc.start()

    def _creation(self, name: str, which: str, run: str) -> Callable[[], Awaitable[Any]]:
        async def job() -> None:
            await self.client.create(PODS, pod_object(name, which, run))

        return job

    async def run(self, which: str) -> dict[str, Any]:
        args = self.args
        run = f"r{self.runs + 1}"
        await self.refresh_metrics()
        listed = await self.client.list(PODS, NAMESPACE)
        binds = Binds()
        watcher = asyncio.create_task(watch_binds(self.client, binds, listed.resource_version))
        reports = self.reports
        reporter = (
            asyncio.create_task(self.report(args.report_interval), name="bench-reports")
            if args.report_interval > 0
            else None
        )
        backlog = [f"b-{run}-{i:04d}" for i in range(max(args.backlog, 1))]
        await bounded((self._creation(n, which, run) for n in backlog), args.creators)
        t0 = time.monotonic()
        proc = self.start(which)
        try:
            if not await until(binds, lambda: any(n in binds.at for n in backlog), 60):
                raise SystemExit(f"bench: {which} bound nothing within 60 s:\n{tail(proc.log)}")
            first = min(binds.at[n] for n in backlog if n in binds.at)
            startup = first - t0
            drained = await until(binds, lambda: all(n in binds.at for n in backlog), RUN_TIMEOUT_S)
            last = max(binds.at[n] for n in backlog if n in binds.at)
            drain = (len(backlog) - 1) / (last - first) if last > first else 0.0
            await asyncio.sleep(1.0)  # let the start-up settle before the window opens
            names = [f"p-{run}-{i:04d}" for i in range(args.pods)]
            sched0 = process_cpu(proc.pid)
            api0 = process_cpu(self.proc("kube-apiserver").pid)
            etcd0 = process_cpu(self.proc("etcd").pid)
            start = time.monotonic()

            await bounded((self._creation(n, which, run) for n in names), args.creators)
            created = time.monotonic()
            during = sum(1 for n in names if n in binds.at)
            ok = await until(binds, lambda: all(n in binds.at for n in names), RUN_TIMEOUT_S)
            end = max((binds.at[n] for n in names if n in binds.at), default=time.monotonic())
            sched_cpu = process_cpu(proc.pid) - sched0
            api_cpu = process_cpu(self.proc("kube-apiserver").pid) - api0
            etcd_cpu = process_cpu(self.proc("etcd").pid) - etcd0
            rss = peak_rss_mib(proc.pid)
        finally:
            proc.stop()
            watcher.cancel()
            if reporter is not None:
                reporter.cancel()
            await asyncio.gather(watcher, *([reporter] if reporter else []), return_exceptions=True)
        bound = sum(1 for n in names if n in binds.at)
        window = end - start
        result = {
            "scheduler": "kube-scheduler" if which == KUBE else "koord-scheduler",
            "nodes": self.nodes,
            "pods": args.pods,
            "bound": bound,
            "all_bound": ok and drained,
            "backlog": len(backlog),
            "drain_pods_per_s": round(drain, 1),
            "pods_per_s": round(bound / window, 1) if window > 0 else 0.0,
            "window_s": round(window, 2),
            "burst_s": round(created - start, 2),
            "bound_during_burst": during,
            "tail_s": round(max(end - created, 0.0), 2),
            "cpu_ms_per_pod": round(sched_cpu * 1000 / max(bound, 1), 2),
            "apiserver_cpu_s": round(api_cpu, 2),
            "etcd_cpu_s": round(etcd_cpu, 2),
            "nodemetric_reports": self.reports - reports,
            "apiserver_cpu_share": round(api_cpu / window, 2) if window > 0 else 0.0,
            "peak_rss_mib": rss,
            "startup_s": round(startup, 3),
            "over_capacity": await self.over_capacity(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
        await self.delete_pods()
        return result

    async def over_capacity(self) -> int:
        """Nodes whose bound pods request more cpu or memory than they allocate."""
        used: dict[str, list[int]] = {}
        for p in (await self.client.list(PODS, NAMESPACE)).items:
            node = (p.get("spec") or {}).get("nodeName")
            if not node:
                continue
            acc = used.setdefault(node, [0, 0])
            for c in p["spec"]["containers"]:
                req = (c.get("resources") or {}).get("requests") or {}
                acc[0] += resource_value("cpu", req.get("cpu", "0"))
                acc[1] += resource_value("memory", req.get("memory", "0"))
        cap_cpu = NODE_CPU * 1000
        cap_mem = NODE_MEMORY_GI << 30
        return sum(1 for cpu, mem in used.values() if cpu > cap_cpu or mem > cap_mem)

    async def delete_pods(self) -> None:
        path = PODS.path(NAMESPACE)
        await self.client.request("DELETE", path, query=[("gracePeriodSeconds", "0")])
        deadline = time.monotonic() + 120
        while (await self.client.list(PODS, NAMESPACE)).items:
            if time.monotonic() > deadline:
                raise SystemExit("bench: the pods were not deleted within 120 s")
            await asyncio.sleep(0.5)


def ranges(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("pods_per_s", "drain_pods_per_s", "cpu_ms_per_pod", "peak_rss_mib", "startup_s",
                "bound_during_burst", "tail_s", "apiserver_cpu_share"):  # fmt: skip
        values = [r[key] for r in runs]
        out[key] = [min(values), max(values)]
    out["all_bound"] = all(r["all_bound"] for r in runs)
    out["over_capacity"] = sum(r["over_capacity"] for r in runs)
    return out


async def main_async(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    cluster.kubectl("apply", "--server-side", "-f", str(CRDS))
    cluster.kubectl("create", "namespace", NAMESPACE)
    # no controller manager: the ServiceAccount admission plugin wants the default account
    cluster.kubectl("create", "serviceaccount", "default", "-n", NAMESPACE)
    compile_koord(cluster.root)
    result: dict[str, Any] = {"load_avg_1m_before": round(os.getloadavg()[0], 2)}
    async with await KubeClient.connect(str(cluster.kubeconfig())) as client:
        # the CRDs are served once their first list answers
        for res in (NODE_METRICS,):
            await _served(client, res)
        bench = Bench(cluster, client, args)
        for n in args.nodes:
            grow_s = await bench.grow_to(n)
            runs: dict[str, list[dict[str, Any]]] = {"kube-scheduler": [], "koord-scheduler": []}
            order = [KUBE, KOORD] * args.rounds
            for which in order:
                r = await bench.run(which)
                runs[r["scheduler"]].append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
            result[str(n)] = {
                "setup_s": round(grow_s, 1),
                **{name: {"ranges": ranges(rs), "runs": rs} for name, rs in runs.items()},
            }
    result["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    result.update(machine_figures())
    return result


async def _served(client: KubeClient, res: Resource) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            await client.list(res, limit=1)
        except KubeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
        else:
            return


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scheduler_apiserver")
    p.add_argument("--json", action="store_true", help="one JSON object on the last line")
    p.add_argument("--nodes", default="1000,5000", help="node counts, ascending (1000,5000)")
    p.add_argument("--pods", type=int, default=1000, help="pods per run (1000)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each scheduler (2)")
    p.add_argument("--creators", type=int, default=16, help="creations in flight (16)")
    p.add_argument(
        "--backlog", type=int, default=1000, help="pods pending when a scheduler starts (1000)"
    )
    p.add_argument(
        "--report-interval",
        type=float,
        default=60.0,
        help="seconds between two NodeMetric reports of a node while a scheduler runs "
        "(the koordlet's default 60; 0: none)",
    )
    args = p.parse_args(argv)
    args.nodes = sorted(int(x) for x in args.nodes.split(","))
    why = why_not(node=False)
    if why is not None:
        print(f"bench: cannot run here: {why}", file=sys.stderr)
        return 2
    cluster = Cluster(nodes=0, controller_manager=False, scheduler=False)
    try:
        cluster.start()
        result = asyncio.run(main_async(cluster, args))
    finally:
        cluster.close()
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
