"""Koordinator installed as users install it, on an envtest cluster: ``kubectl apply -k`` of
packaging/kubernetes through an overlay that sets the project's image and puts the koordlet
DaemonSet on one node with the run's host folders (its kubepods folder, the kubelet's files,
the hook socket koord-runtime-proxy calls, a state folder of the run), and the reset DaemonSet
likewise. The tier's settings for a 2-core machine running the suite come along
(:data:`~envtest.workloads.FAST_COLOCATION`, :func:`~envtest.koordinator.tier_scheduler_config`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from envtest.cluster import Cluster, Node
from envtest.koordinator import MANIFESTS, NAMESPACE, hook_socket, tier_scheduler_config, wait
from envtest.workloads import FAST_COLOCATION

IMAGE = "127.0.0.1:5999/koordinator-py/koordinator"
MI = 1 << 20


@dataclass
class Install:
    node: Node
    port: int
    """Where the koordlet's pod serves /metrics (hostNetwork, the bridge address)."""
    overlay: Path
    state_dir: Path
    baseline: dict[str, str]
    """node 0's QoS cgroups before the install."""
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The koordlet pod's HTTP address (/metrics; /debug answers loopback clients only)."""
        return f"http://{self.node.kubelet.address if self.node.kubelet else ''}:{self.port}"


def _json_patch(target: dict[str, str], ops: list[dict[str, Any]]) -> dict[str, Any]:
    return {"target": target, "patch": yaml.safe_dump(ops)}


def koordlet_args(node: Node, port: int) -> list[str]:
    """The shipped DaemonSet's arguments, with this run's address and kubepods folder, the
    kubelet's files where this kubelet keeps them, and the reconciler slowed (as for the host
    process: what the proxy does at creation is what the tests look at)."""
    ds = yaml.safe_load((MANIFESTS / "koordlet" / "daemonset.yaml").read_text())
    args = [
        a
        for a in ds["spec"]["template"]["spec"]["containers"][0]["args"]
        if not a.startswith("--addr=")
    ]
    assert node.kubelet is not None
    return [
        f"--addr={node.kubelet.address}:{port}",
        *args,
        f"--cgroup-kube-dir={node.kubepods_dir}",
        "--var-lib-kubelet-dir=/var/lib/kubelet/root",
        "--kubelet-config-file=/var/lib/kubelet/kubelet.yaml",
        "--runtime-hooks-reconcile-interval=1h",
    ]


def write_overlay(cluster: Cluster, root: Path, node: Node, port: int, ref: str) -> Path:
    """A kustomization over packaging/kubernetes: the image, and the koordlet on node 0 with
    this run's host folders."""
    assert node.kubelet is not None
    root.mkdir(parents=True, exist_ok=True)
    name, _, tag = ref.rpartition(":")
    state = root / "koordlet-state"
    volumes = {
        "host-koordlet-state": str(state),
        "host-var-run-koordlet": str(hook_socket(node).parent),
        "host-etc-hookserver": str(node.root / "hookserver.d"),
        "host-kubelet-rootdir": str(node.kubelet.root),
    }
    ds = yaml.safe_load((MANIFESTS / "koordlet" / "daemonset.yaml").read_text())
    spec = ds["spec"]["template"]["spec"]
    ops: list[dict[str, Any]] = [
        {"op": "add", "path": "/spec/template/spec/nodeSelector",
         "value": {"kubernetes.io/hostname": node.name}},
        {"op": "replace", "path": "/spec/template/spec/containers/0/args",
         "value": koordlet_args(node, port)},
        {"op": "replace", "path": "/spec/template/spec/containers/0/ports/0/containerPort",
         "value": port},
        {"op": "replace", "path": "/spec/template/spec/containers/0/livenessProbe/httpGet/port",
         "value": port},
        {"op": "replace", "path": "/spec/template/spec/containers/0/readinessProbe/httpGet/port",
         "value": port},
    ]  # fmt: skip
    for i, vol in enumerate(spec["volumes"]):
        if vol["name"] in volumes:
            ops.append(
                {"op": "replace", "path": f"/spec/template/spec/volumes/{i}/hostPath/path",
                 "value": volumes[vol["name"]]}
            )  # fmt: skip
    # the tier's settings for a 2-core machine running the suite (docs/realcluster.md)
    configs = [
        _json_patch(
            {"kind": "ConfigMap", "name": "slo-controller-config"},
            [{"op": "replace", "path": "/data/colocation-config",
              "value": json.dumps(FAST_COLOCATION)}],
        ),
        _json_patch(
            {"kind": "ConfigMap", "name": "koord-scheduler-config"},
            [{"op": "replace", "path": "/data/koord-scheduler-config.yaml",
              "value": tier_scheduler_config()}],
        ),
    ]  # fmt: skip
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(MANIFESTS, root)],
        "images": [{"name": IMAGE, "newName": name, "newTag": tag}],
        "patches": [_json_patch({"kind": "DaemonSet", "name": "koordlet"}, ops), *configs],
    }
    (root / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return root


def reset_overlay(root: Path, install: Install, ref: str) -> Path:
    """packaging/kubernetes/koordlet-reset on node 0 with the koordlet's state folder."""
    root.mkdir(parents=True, exist_ok=True)
    name, _, tag = ref.rpartition(":")
    ds = yaml.safe_load((MANIFESTS / "koordlet-reset" / "daemonset.yaml").read_text())
    args = [
        a
        for a in ds["spec"]["template"]["spec"]["initContainers"][0]["args"]
        if not a.startswith("--addr=")
    ]
    assert install.node.kubelet is not None
    ops: list[dict[str, Any]] = [
        {"op": "add", "path": "/spec/template/spec/nodeSelector",
         "value": {"kubernetes.io/hostname": install.node.name}},
        {"op": "replace", "path": "/spec/template/spec/initContainers/0/args",
         "value": [*args, f"--addr={install.node.kubelet.address}:{install.port}",
                   f"--cgroup-kube-dir={install.node.kubepods_dir}"]},
    ]  # fmt: skip
    for i, vol in enumerate(ds["spec"]["template"]["spec"]["volumes"]):
        if vol["name"] == "host-koordlet-state":
            ops.append(
                {"op": "replace", "path": f"/spec/template/spec/volumes/{i}/hostPath/path",
                 "value": str(install.state_dir)}
            )  # fmt: skip
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(MANIFESTS / "koordlet-reset", root)],
        "images": [{"name": IMAGE, "newName": name, "newTag": tag}],
        "patches": [_json_patch({"kind": "DaemonSet", "name": "koordlet-reset"}, ops)],
    }
    (root / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return root


def ready(cluster: Cluster, kind: str, name: str) -> bool:
    """Whether a DaemonSet or Deployment of koordinator-system has all its pods ready."""
    obj = cluster.get(kind, name, NAMESPACE)
    st = obj.get("status") or {}
    if kind == "daemonset":
        return bool(st.get("numberReady")) and st.get("numberReady") == st.get(
            "desiredNumberScheduled"
        )
    return bool(st.get("readyReplicas")) and st.get("readyReplicas") == obj["spec"].get("replicas")


def apply_and_wait(cluster: Cluster, overlay: Path, timeout: float = 180) -> float:
    """``kubectl apply -k`` the install and wait until every component is ready; seconds taken."""
    t0 = time.monotonic()
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(overlay))
    for kind, name in COMPONENTS:
        wait(f"{kind} {name} ready", lambda k=kind, n=name: ready(cluster, k, n), timeout, 1.0)
    return time.monotonic() - t0


COMPONENTS = (
    ("daemonset", "koordlet"),
    ("deployment", "koord-manager"),
    ("deployment", "koord-scheduler"),
    ("deployment", "koord-descheduler"),
)
"""What the install runs."""
