"""Koordinator installed on real nodes, measured: how long the install takes to offer batch
resources, how soon a BE pod's limits are in its container's cgroup through
koord-runtime-proxy, what the proxy adds to the kubelet's CreateContainer, and what the koordlet
pod costs with 20 real pods on its node.

Run as root from the checkout, with ``../shared/k8s`` beside it:
``python -m bench.realnode --json [--pods 50] [--plain 20] [--window 60]``; the last line is one
JSON object.

Two real nodes on this machine (:mod:`envtest`): node 0's kubelet talks CRI to
koord-runtime-proxy, node 1's straight to containerd. The project's image
(``packaging/image.py``) is imported into both containerds and ``packaging/kubernetes`` applied
through the tests' overlay (:mod:`envtest.install`: the koordlet DaemonSet on node 0, the
settings of a 2-core machine running everything: ``cpuReclaimThresholdPercent`` 100 and no
LoadAware usage thresholds).

Keys:

- ``install_ready_s``: ``kubectl apply -k`` to every component ready; ``install_to_batch_s``:
  to node 0's ``kubernetes.io/batch-cpu`` and ``batch-memory`` in its allocatable;
- ``limits_p50_ms``, ``limits_p99_ms``, ``limits_max_ms`` over ``--pods`` BE pods (a
  ClusterColocationProfile makes them BE with batch resources; koord-scheduler binds them to
  node 0): from the pod's creation request to the CFS quota and memory limit of its container's
  cgroup read back as asked (a thread lists the cgroups every millisecond), created one after
  another; ``limits_at_creation``: how many of them had their limits within 0.5 s of their
  container's cgroup appearing;
- ``create_container_mean_ms`` (``proxy``/``direct``) and ``proxy_added_mean_ms``: the kubelets'
  own ``kubelet_runtime_operations_duration_seconds{operation_type="create_container"}`` over
  ``--plain`` plain pods on each node, interleaved;
- ``koordlet_cpu_percent`` and ``koordlet_rss_mib`` (and ``koordlet_hwm_mib``): the koordlet
  pod's process over ``--window`` seconds while 20 BE pods run on its node.
"""

from __future__ import annotations

import argparse
import json
import re
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from apis.manager_keys import BATCH_CPU, BATCH_MEMORY
from apis.quantity import int_value
from bench._stats import percentile, print_result
from envtest import assets
from envtest.cgroupwatch import CgroupWatch
from envtest.cluster import Cluster, Node
from envtest.install import apply_and_wait, write_overlay
from envtest.koordinator import NAMESPACE, REPO, Koordinator, proxy_front, wait
from envtest.procs import free_port
from envtest.workloads import (
    COLOCATION_LABEL,
    COLOCATION_NS,
    colocation_profile,
    container_id,
    pod,
)

KOORDLET_PODS = 20
"""BE pods on the node while the koordlet pod is measured."""


def _build_image(out: Path) -> tuple[Path, str]:
    archive = out / "koordinator-py.oci.tar"
    done = subprocess.run(
        [sys.executable, str(REPO / "packaging" / "image.py"), "--out", str(archive)],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    return archive, json.loads(done.stdout.strip().splitlines()[-1])["ref"]


def _create_pod(cluster: Cluster, body: dict[str, Any]) -> None:
    ns = body["metadata"]["namespace"]
    cluster.request("POST", f"/api/v1/namespaces/{ns}/pods", body)


def _batch_on(cluster: Cluster, node: str) -> bool:
    alloc = cluster.get("node", node)["status"].get("allocatable", {})
    cpu = int_value(alloc.get(BATCH_CPU, "0") or 0)
    mem = int_value(alloc.get(BATCH_MEMORY, "0") or 0)
    return cpu > 0 and mem > 0


def _kubelet_create_container(node: Node) -> tuple[float, float]:
    """The kubelet's create_container operations: (sum of seconds, count)."""
    assert node.kubelet is not None
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the kubelet's self-signed serving certificate, on the bridge
    url = f"https://{node.kubelet.address}:{node.kubelet.port}/metrics"
    with urllib.request.urlopen(url, context=ctx, timeout=10) as r:
        text = r.read().decode()
    base = (
        'kubelet_runtime_operations_duration_seconds_{}{{operation_type="create_container"}} (\\S+)'
    )
    total = re.search(base.format("sum"), text)
    count = re.search(base.format("count"), text)
    return (float(total[1]) if total else 0.0, float(count[1]) if count else 0.0)


def _pids_of_pod(node: Node, uid: str) -> list[int]:
    pids: list[int] = []
    for qos in ("", "burstable", "besteffort"):
        top = node.cgroup("cpu", "kubepods", *([qos] if qos else []), f"pod{uid}")
        if top.is_dir():
            for procs in top.rglob("cgroup.procs"):
                pids += [int(p) for p in procs.read_text().split()]
    return pids


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, USER_HZ 100


def _proc_mem_mib(pid: int) -> tuple[float, float]:
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return (int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024)


def run(pods: int, plain: int, window: float) -> dict[str, Any]:
    result: dict[str, Any] = {"pods": pods, "plain": plain, "window_s": window}
    cluster = Cluster(nodes=2, fronts={0: proxy_front})
    koordinator = None
    try:
        cluster.start()
        node, direct = cluster.node_list
        result["cluster_ready_s"] = round(cluster.timings["ready_s"], 1)
        t0 = time.monotonic()
        archive, ref = _build_image(Path(tempfile.mkdtemp(prefix="realnode-image-")))
        result["image_build_s"] = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        containerds = [n.containerd for n in cluster.node_list if n.containerd is not None]
        with ThreadPoolExecutor(len(containerds)) as pool:
            list(pool.map(lambda c: c.import_image(archive), containerds))
        result["image_import_s"] = round(time.monotonic() - t0, 1)
        koordinator = Koordinator(cluster)  # only for its log folder and teardown
        assert cluster.network is not None
        port = free_port(cluster.network.gateway)
        overlay = write_overlay(cluster, cluster.root / "install", node, port, ref)
        t_apply = time.monotonic()
        result["install_ready_s"] = round(apply_and_wait(cluster, overlay), 1)
        wait("batch resources on node 0", lambda: _batch_on(cluster, node.name), 300, 0.2)
        result["install_to_batch_s"] = round(time.monotonic() - t_apply, 1)

        cluster.kubectl("create", "namespace", COLOCATION_NS, check=False)
        cluster.kubectl("label", "namespace", COLOCATION_NS, f"{COLOCATION_LABEL}=true")
        cluster.apply(json.dumps(colocation_profile("be-koord", "koord-scheduler")))
        labels = {COLOCATION_LABEL: "true", "profile": "be-koord"}
        resources = {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"cpu": "1", "memory": "64Mi"},
        }
        latencies: list[float] = []
        at_creation = 0
        koordlet: dict[str, float] = {}
        with CgroupWatch(node) as watch:
            for i in range(pods):
                name = f"be-{i}"
                t0 = time.monotonic()
                _create_pod(cluster, pod(name, node=node.name, labels=labels, resources=resources))

                def settled(name: str = name) -> Any:
                    p = cluster.get("pod", name, COLOCATION_NS)
                    cid = container_id(p)
                    seen = watch.seen.get(cid)
                    return seen if seen is not None and seen.settled is not None else None

                try:
                    seen = wait(f"{name}'s limits", settled, 120, 0.05)
                except AssertionError as err:
                    events = cluster.kubectl(
                        "get", "events", "-n", COLOCATION_NS,
                        f"--field-selector=involvedObject.name={name}", check=False,
                    )  # fmt: skip
                    raise AssertionError(f"{err}\n{events}") from None
                latencies.append((seen.settled - t0) * 1000)
                at_creation += seen.settled - seen.appeared < 0.5
                if i + 1 == KOORDLET_PODS:
                    koordlet = _measure_koordlet(cluster, node, window)
        result["limits_p50_ms"] = round(percentile(latencies, 50), 1)
        result["limits_p99_ms"] = round(percentile(latencies, 99), 1)
        result["limits_max_ms"] = round(max(latencies), 1)
        result["limits_at_creation"] = at_creation
        result.update(koordlet)

        before = {n.name: _kubelet_create_container(n) for n in (node, direct)}
        for i in range(plain):
            for n in (node, direct):
                body = pod(f"plain-{n.name[-1]}-{i}", namespace=COLOCATION_NS)
                body["spec"]["nodeName"] = n.name  # no scheduler: the CRI path alone
                _create_pod(cluster, body)
        for i in range(plain):
            for n in (node, direct):
                wait(
                    "plain pods running",
                    lambda name=f"plain-{n.name[-1]}-{i}": (
                        cluster.get("pod", name, COLOCATION_NS)["status"].get("phase") == "Running"
                    ),
                    120,
                    0.2,
                )
        means = {}
        for key, n in (("proxy", node), ("direct", direct)):
            total, count = _kubelet_create_container(n)
            b_total, b_count = before[n.name]
            means[key] = round((total - b_total) / max(count - b_count, 1) * 1000, 1)
        result["create_container_mean_ms"] = means
        result["proxy_added_mean_ms"] = round(means["proxy"] - means["direct"], 1)
        return result
    finally:
        if koordinator is not None:
            koordinator.close()
        cluster.close()


def _measure_koordlet(cluster: Cluster, node: Node, window: float) -> dict[str, float]:
    pods = cluster.get("pods", namespace=NAMESPACE)["items"]
    (kpod,) = [p for p in pods if p["metadata"]["labels"].get("koord-app") == "koordlet"]
    pids = _pids_of_pod(node, kpod["metadata"]["uid"])
    cpu0 = sum(_proc_cpu_s(p) for p in pids)
    t0 = time.monotonic()
    time.sleep(window)
    cpu1 = sum(_proc_cpu_s(p) for p in pids)
    elapsed = time.monotonic() - t0
    rss = hwm = 0.0
    for p in pids:
        r, h = _proc_mem_mib(p)
        rss += r
        hwm += h
    on_node = sum(
        1
        for p in cluster.get("pods", namespace=COLOCATION_NS)["items"]
        if p["spec"].get("nodeName") == node.name
    )
    return {
        "koordlet_cpu_percent": round(100 * (cpu1 - cpu0) / elapsed, 2),
        "koordlet_rss_mib": round(rss, 1),
        "koordlet_hwm_mib": round(hwm, 1),
        "koordlet_node_be_pods": on_node,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.realnode", description=__doc__.split("\n")[0])
    p.add_argument("--pods", type=int, default=50, help="BE pods timed (default 50)")
    p.add_argument("--plain", type=int, default=20, help="plain pods per node (default 20)")
    p.add_argument("--window", type=float, default=60.0, help="koordlet measure, s (default 60)")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    args = p.parse_args(argv)
    why = assets.why_not()
    if why is not None:
        print(json.dumps({"error": f"cannot run here: {why}"}))
        return 2
    if args.pods < KOORDLET_PODS:
        p.error(f"--pods must be at least {KOORDLET_PODS} (the koordlet is measured with them)")
    result = run(args.pods, args.plain, args.window)
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
