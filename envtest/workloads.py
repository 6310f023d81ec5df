"""Workloads on an envtest cluster with Koordinator, as the real-cluster tests and benchmarks
make them: the slo-controller-config they run with, ClusterColocationProfiles and busybox pods,
waiting for pods, and the manager's own account of a node (``koord-manager explain``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from envtest.cluster import Cluster
from envtest.koordinator import NAMESPACE, binary, wait

FAST_COLOCATION: dict[str, Any] = {
    "enable": True,
    # the koordlet raises both to Koordinator's minimums (60 s and 30 s)
    "metricAggregateDurationSeconds": 60,
    "metricReportIntervalSeconds": 30,
    # all of the node's CPU less what it uses: this 2-core test machine is often busy
    "cpuReclaimThresholdPercent": 100,
    "memoryReclaimThresholdPercent": 65,
    "memoryCalculatePolicy": "usage",
    "degradeTimeMinutes": 15,
    "updateTimeThresholdSeconds": 300,
    "resourceDiffThreshold": 0.1,
}


def patch_slo_config(cluster: Cluster, keys: dict[str, Any]) -> None:
    """Set keys of ``koordinator-system/slo-controller-config`` (each value as its JSON)."""
    data = {k: json.dumps(v) for k, v in keys.items()}
    cluster.kubectl(
        "patch", "configmap", "slo-controller-config", "-n", NAMESPACE, "--type=merge",
        "-p", json.dumps({"data": data}),
    )  # fmt: skip


def last_json(text: str) -> Any:
    """The JSON document a ``--json`` output ends with."""
    try:
        return json.loads(text)
    except ValueError:
        return json.loads(text[text.rindex("\n{") :])


def explain_node(cluster: Cluster, node: str, workdir: Path, *extra: str) -> dict[str, Any]:
    """``koord-manager explain --json`` on the live Node, NodeMetric, NodeResourceTopology,
    pods and config."""
    workdir.mkdir(parents=True, exist_ok=True)
    files = {
        "node": cluster.kubectl("get", "node", node, "-o", "json"),
        "node-metric": cluster.kubectl("get", "nodemetric", node, "-o", "json"),
        "node-resource-topology": cluster.kubectl(
            "get", "noderesourcetopology", node, "-o", "json"
        ),
        "pods": cluster.kubectl(
            "get", "pods", "-A", f"--field-selector=spec.nodeName={node}", "-o", "json"
        ),
        "config": cluster.kubectl(
            "get", "configmap", "slo-controller-config", "-n", NAMESPACE, "-o", "json"
        ),
    }
    args = []
    for flag, body in files.items():
        path = workdir / f"{flag}.json"
        path.write_text(body)
        args.append(f"--{flag}={path}")
    out = subprocess.run(
        [binary("koord-manager"), "explain", *args, "--json", *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return dict(last_json(out.stdout))


COLOCATION_NS = "colo"
COLOCATION_LABEL = "koordinator.sh/enable-colocation"
BUSYBOX = "127.0.0.1:5999/koordtest/busybox:1"


def colocation_profile(name: str, scheduler: str) -> dict[str, Any]:
    """A ClusterColocationProfile (upstream's documented example, config/samples): pods labelled
    ``koordinator.sh/enable-colocation`` in labelled namespaces become BE, koord-batch, batch
    resources, scheduled by ``scheduler``."""
    return {
        "apiVersion": "config.koordinator.sh/v1alpha1",
        "kind": "ClusterColocationProfile",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {COLOCATION_LABEL: "true"}},
            "selector": {"matchLabels": {COLOCATION_LABEL: "true", "profile": name}},
            "qosClass": "BE",
            "priorityClassName": "koord-batch",
            "koordinatorPriority": 1000,
            "schedulerName": scheduler,
            "labels": {"koordinator.sh/mutated": "true"},
        },
    }


def pod(
    name: str,
    *,
    node: str | None = None,
    labels: dict[str, str] | None = None,
    resources: dict[str, Any] | None = None,
    command: str = "sleep 3600",
    namespace: str = COLOCATION_NS,
    scheduler: str | None = None,
    priority_class: str | None = None,
    host_network: bool = False,
) -> dict[str, Any]:
    """A busybox pod (the image every node has imported; never pulled)."""
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "main",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", command],
                "resources": resources or {},
            }
        ],
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    if host_network:
        spec["hostNetwork"] = True
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": spec,
    }


def running(cluster: Cluster, name: str, namespace: str = COLOCATION_NS) -> dict[str, Any] | None:
    p = cluster.get("pod", name, namespace)
    return p if p.get("status", {}).get("phase") == "Running" else None


def wait_running(
    cluster: Cluster, name: str, namespace: str = COLOCATION_NS, timeout: float = 90
) -> dict[str, Any]:
    """The pod once Running; on the deadline an AssertionError with its status and events."""
    try:
        return dict(wait(f"pod {name} Running", lambda: running(cluster, name, namespace), timeout))
    except AssertionError as err:
        status = cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
        events = cluster.kubectl(
            "get", "events", "-n", namespace, f"--field-selector=involvedObject.name={name}",
            check=False,
        )  # fmt: skip
        raise AssertionError(f"{err}\n{status[-2500:]}\n{events}") from None


def delete_pods(cluster: Cluster, *names: str, namespace: str = COLOCATION_NS) -> None:
    """Delete these pods (if there) and wait until they are gone."""
    cluster.kubectl(
        "delete", "pod", *names, "-n", namespace, "--ignore-not-found", "--grace-period=1",
        "--timeout=60s", check=False,
    )  # fmt: skip


def container_id(p: dict[str, Any], container: str = "main") -> str:
    for st in p["status"].get("containerStatuses", []):
        if st["name"] == container and st.get("containerID"):
            return str(st["containerID"]).split("://", 1)[1]
    raise LookupError(f"no container {container} started in {p['metadata']['name']}")


def kept_originals(lines: list[str]) -> set[str]:
    """The originals journal's records whose cgroup folder still exists (a koordlet in a pod
    names them under its /host-cgroup/): a koordlet taking its journal up keeps exactly these
    (those of pods gone are dropped), so they must all be in the journal after a restart."""
    out = set()
    for line in lines:
        path = str(json.loads(line).get("path", ""))
        for prefix in ("/host-cgroup/", "/sys/fs/cgroup/"):
            if path.startswith(prefix):
                if (Path("/sys/fs/cgroup") / path.removeprefix(prefix)).parent.exists():
                    out.add(line)
                break
        else:
            out.add(line)
    return out
