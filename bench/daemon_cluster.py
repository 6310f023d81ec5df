"""Benchmark of the koordlet in cluster mode against a real kube-apiserver: CPU share and RSS.

The same measurement as :mod:`bench.daemon` (``/proc/<pid>/stat`` CPU over the window,
``VmRSS`` every second, the daemon's own step histogram), with the pods coming from a real API
server instead of the kubepods walk alone:

1. a real etcd and kube-apiserver (``envtest.Cluster(nodes=0)``: the binaries of
   ``../shared/k8s``, on loopback, admin kubeconfig with a token and the run's CA), Koordinator's
   CRDs from ``packaging/kubernetes/crds`` applied with the real kubectl;
2. a Node ``bench-node`` (this machine's CPUs and memory as capacity, Ready) with its NodeSLO
   (empty spec: Koordinator's defaults) and NodeMetric (the manager's default collect policy);
3. ``--pods`` Pods bound to that Node (``spec.nodeName``; no scheduler, no kubelet, no
   controller manager), in the QoS mix of :mod:`bench._trees` (a quarter BestEffort, a quarter
   Guaranteed, the rest Burstable), three containers each, with the ServiceAccount token volume
   and the ``managedFields`` a real API server gives them; then each made ``Running`` through
   the ``status`` subresource, its ``containerStatuses[].containerID`` the runtime ids of the
   tree;
4. a real cgroup v1 tree (:func:`bench._trees.real_tree`) whose pod folders carry the UIDs the
   API server gave the Pods;
5. ``python -m koordlet --kubeconfig <admin> --node-name bench-node`` (no ``--standalone``),
   measured as :mod:`bench.daemon` measures, once the pods are in ``/metrics``.

Everything is torn down in a ``finally`` (the daemon killed, the tree removed, the control plane
stopped and its folder deleted), SIGTERM to the bench included.

    python -m bench.daemon_cluster [--json] [--pods N] [--duration S] [--interval S]
                                   [--warmup S] [--checkout DIR] [--runs N]

``--checkout DIR`` runs the koordlet of another checkout (an A/B against another commit);
``--runs N`` measures N daemons one after the other on the same cluster and tree (with
``--checkout-b DIR``, alternating the two checkouts, A first), so that an A/B shares the API
server, its objects and the cgroups.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from apis.groups import SLO_API_VERSION
from apis.kubernetes_keys import ANNOTATION_CONFIG_SEEN, LABEL_HOSTNAME, LABEL_OS
from apis.quantity import format_bytes
from apis.timestamp import format_time
from bench._stats import machine_figures, print_result
from bench._trees import container_id, exit_on_sigterm, qos_of, real_tree
from bench.daemon import REPO, launcher, measure
from envtest import assets as envassets
from envtest.cluster import Cluster
from envtest.controlplane import ADMIN

NODE = "bench-node"
NAMESPACE = "bench"
CONTAINERS = 3
TARGET_CPU_PERCENT = 2.5
"""Issue 26's target at 200 pods in cluster mode: at most 2.5 % of one core (linear above)."""
TARGET_RSS_MIB = 50.0
"""Issue 26's target at 200 pods in cluster mode: at most 50 MiB resident."""
CRDS = REPO / "packaging" / "kubernetes" / "crds"
MiB = 1 << 20
RUN_KEYS = (
    "checkout", "cpu_percent", "cpu_user_percent", "cpu_system_percent", "rss_mib", "rss_max_mib",
    "host_busy_percent", "load_average", "pods_in_metrics", "exit_code", "step_wall_ms",
)  # fmt: skip
"""What ``runs`` gives of each run when there are several."""


class Api:
    """JSON requests to the test API server as its admin, on one kept-alive connection."""

    def __init__(self, url: str, ca: Path, token: str) -> None:
        parts = urlsplit(url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 443
        self._ctx = ssl.create_default_context(cafile=str(ca))
        self._token = token
        self._conn: http.client.HTTPSConnection | None = None

    def call(self, method: str, path: str, body: object = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        for attempt in range(2):  # the server may have closed an idle connection
            if self._conn is None:
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, context=self._ctx, timeout=30
                )
            try:
                self._conn.request(method, path, body=data, headers=headers)
                resp = self._conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException):
                self._conn.close()
                self._conn = None
                if attempt:
                    raise
                continue
            if not 200 <= resp.status < 300:
                raise SystemExit(f"{method} {path}: {resp.status} {raw[:300]!r}")
            decoded: dict[str, Any] = json.loads(raw)
            return decoded
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def _meminfo_kib() -> int:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1])


def node_object() -> dict[str, Any]:
    cpus, mem = str(os.cpu_count() or 1), format_bytes(_meminfo_kib() * 1024)
    resources = {"cpu": cpus, "memory": mem, "pods": "1100", "ephemeral-storage": "100Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "labels": {LABEL_HOSTNAME: NODE, LABEL_OS: "linux"},
        },
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": NODE},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": _now(),
                    "lastTransitionTime": _now(),
                }
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.25.0",
                "containerRuntimeVersion": "containerd://1.7.0",
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kernelVersion": os.uname().release,
                "osImage": "bench",
                "kubeProxyVersion": "v1.25.0",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        },
    }


def _now() -> str:
    return format_time(time.time())


def _resources(index: int) -> dict[str, Any]:
    qos = qos_of(index).value
    if qos == "BestEffort":
        return {}
    if qos == "Guaranteed":
        both = {"cpu": "100m", "memory": "64Mi"}
        return {"requests": both, "limits": both}
    return {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}}


def pod_object(index: int) -> dict[str, Any]:
    """A pod as a Deployment's would be (labels, an owner reference, probes), bound to the
    node."""
    app = f"app-{index % 20}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"bench-{index:04d}",
            "namespace": NAMESPACE,
            "labels": {"app": app, "pod-template-hash": "5d8f9c7b6"},
            "annotations": {ANNOTATION_CONFIG_SEEN: _now()},
        },
        "spec": {
            "nodeName": NODE,
            "containers": [
                {
                    "name": f"c{c}",
                    "image": f"registry.example/{app}:1.{c}",
                    "command": ["/bin/server", f"--port={8080 + c}"],
                    "ports": [{"containerPort": 8080 + c, "protocol": "TCP"}],
                    "env": [{"name": "APP", "value": app}, {"name": "SLOT", "value": str(c)}],
                    "resources": _resources(index),
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080 + c}},
                }
                for c in range(CONTAINERS)
            ],
        },
    }


def running_status(pod: dict[str, Any], index: int) -> dict[str, Any]:
    """The status a kubelet posts for the pod once its containers run."""
    started = _now()
    containers = pod["spec"]["containers"]
    return {
        "phase": "Running",
        "qosClass": qos_of(index).value,
        "hostIP": "127.0.0.1",
        "podIP": f"10.88.{index // 250}.{index % 250 + 2}",
        "podIPs": [{"ip": f"10.88.{index // 250}.{index % 250 + 2}"}],
        "startTime": started,
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": started}
            for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": f"{c['image']}@sha256:{'ab' * 32}",
                "containerID": f"containerd://{container_id(index, i)}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": started}},
            }
            for i, c in enumerate(containers)
        ],
    }


@dataclass
class BenchCluster:
    """The control plane, the objects, and the kubeconfig a koordlet reads."""

    cluster: Cluster
    uids: list[str]
    kubeconfig: Path
    setup_s: float


@contextmanager
def bench_cluster(pods: int) -> Iterator[BenchCluster]:
    """A real API server holding the Node and its ``pods`` Running Pods; stopped afterwards."""
    why = envassets.why_not()
    if why is not None:
        raise SystemExit(f"no real API server here: {why}")
    t0 = time.monotonic()
    cluster = Cluster(nodes=0, controller_manager=False, scheduler=False)
    try:
        cluster.start()
        control = cluster.control
        assert control is not None
        assert control.pki is not None
        cluster.kubectl("apply", "--server-side", "-f", str(CRDS))
        cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        api = Api(control.url, control.pki.ca_crt, control.tokens[ADMIN])
        try:
            uids = _populate(api, pods)
        finally:
            api.close()
        yield BenchCluster(cluster, uids, cluster.kubeconfig(), time.monotonic() - t0)
    finally:
        cluster.close()


def _populate(api: Api, pods: int) -> list[str]:
    def obj(api_version: str, kind: str, name: str, **rest: Any) -> dict[str, Any]:
        return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, **rest}

    api.call("POST", "/api/v1/namespaces", obj("v1", "Namespace", NAMESPACE))
    # No controller manager: the namespace's default ServiceAccount, which the ServiceAccount
    # admission of every pod looks up, is made here.
    api.call(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
        obj("v1", "ServiceAccount", "default"),
    )
    node = node_object()
    made = api.call("POST", "/api/v1/nodes", node)
    made["status"] = node["status"]
    api.call("PUT", f"/api/v1/nodes/{NODE}/status", made)
    group = SLO_API_VERSION
    slo = f"/apis/{group}"
    api.call("POST", f"{slo}/nodeslos", obj(group, "NodeSLO", NODE, spec={}))
    policy = {
        "aggregateDurationSeconds": 300,
        "reportIntervalSeconds": 60,
        "nodeAggregatePolicy": {"durations": ["5m", "10m", "30m"]},
    }
    api.call(
        "POST",
        f"{slo}/nodemetrics",
        obj(group, "NodeMetric", NODE, spec={"metricCollectPolicy": policy}),
    )
    uids = []
    base = f"/api/v1/namespaces/{NAMESPACE}/pods"
    for i in range(pods):
        pod = api.call("POST", base, pod_object(i))
        pod["status"] = running_status(pod, i)
        api.call("PUT", f"{base}/{pod['metadata']['name']}/status", pod)
        uids.append(str(pod["metadata"]["uid"]))
    return uids


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.daemon_cluster", description=__doc__)
    parser.add_argument("--json", action="store_true", help="one JSON line at the end")
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds")
    parser.add_argument("--interval", type=float, default=1.0, help="collect interval, seconds")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds excluded at start")
    parser.add_argument("--log-level", default="info", help="the daemon's --log-level")
    parser.add_argument("--runs", type=int, default=1, help="daemons measured one after another")
    parser.add_argument(
        "--checkout", type=Path, default=REPO, help="the koordlet checkout to run (A)"
    )
    parser.add_argument(
        "--checkout-b",
        type=Path,
        default=None,
        help="a second checkout (B): the runs alternate A, B, A, B...",
    )
    parser.add_argument("--keep-log", action="store_true", help="keep the daemons' log files")
    args = parser.parse_args(argv)
    if args.pods < 1 or args.duration < 1 or args.interval <= 0 or args.warmup < 0:
        parser.error("--pods >= 1, --duration >= 1, --interval > 0 and --warmup >= 0")
    checkouts = [args.checkout.resolve()]
    if args.checkout_b is not None:
        checkouts.append(args.checkout_b.resolve())
    cmd = launcher("module")
    results: list[dict[str, Any]] = []
    logs: list[str] = []
    with (
        exit_on_sigterm(),
        tempfile.TemporaryDirectory(prefix="bench-koordlet-") as tmp,
        bench_cluster(args.pods) as bc,
        real_tree(args.pods, CONTAINERS, uids=bc.uids) as tree,
    ):
        for run in range(args.runs * len(checkouts)):
            checkout = checkouts[run % len(checkouts)]
            state = Path(tmp, f"state-{run}")
            state.mkdir()
            log = Path(tmp, f"koordlet-{run}.log")
            mode = [
                *("--kubeconfig", str(bc.kubeconfig)),
                *("--node-name", NODE),
                *("--state-dir", str(state)),
            ]
            figures = measure(
                tree,
                cmd,
                interval=args.interval,
                warmup=args.warmup,
                duration=args.duration,
                log_level=args.log_level,
                log=log,
                mode=mode,
                cwd=checkout,
            )
            figures["checkout"] = str(checkout)
            figures["load_average"] = os.getloadavg()[0]
            results.append(figures)
            if args.keep_log:
                kept = Path(tempfile.gettempdir(), f"bench-koordlet-cluster-{run}.log")
                kept.write_bytes(log.read_bytes())
                logs.append(str(kept))
        setup_s = bc.setup_s
    head = dict(results[0])
    head["mode"] = "cluster"
    head["api_server"] = "kube-apiserver v1.25 (envtest)"
    head["setup_s"] = round(setup_s, 1)
    head["target_cpu_percent"] = round(TARGET_CPU_PERCENT * args.pods / 200, 3)
    head["target_rss_mib"] = TARGET_RSS_MIB
    head["meets_target"] = (
        head["cpu_percent"] <= head["target_cpu_percent"]
        and head["rss_max_mib"] <= head["target_rss_mib"]
    )
    if len(results) > 1:
        head["runs"] = [{k: r[k] for k in RUN_KEYS} for r in results]
    if logs:
        head["logs"] = logs
    head.update(machine_figures())
    print_result(head, args.json, width=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
