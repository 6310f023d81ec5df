"""The koordlet's Kubernetes manifests: kinds, the DaemonSet's shape, and RBAC that grants
exactly what the code uses."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from apis.terway import TERWAY_QOS_DIR
from koordlet.config import load_config
from kubeclient import resources

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "packaging" / "kubernetes" / "koordlet"

USED: set[tuple[str, str, str]] = {
    # koordlet/statesinformer/kube.py: one informer each (list, then watch), field-selected
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("slo.koordinator.sh", "nodeslos", "list"),
    ("slo.koordinator.sh", "nodeslos", "watch"),
    ("slo.koordinator.sh", "nodemetrics", "list"),
    ("slo.koordinator.sh", "nodemetrics", "watch"),
    # koordlet/reporter/nodemetric.py through kubeclient.writes.update_status: GET, PUT /status
    ("slo.koordinator.sh", "nodemetrics", "get"),
    ("slo.koordinator.sh", "nodemetrics/status", "update"),
    # koordlet/reporter/topology.py: get, create when missing, PUT when changed
    ("topology.node.k8s.io", "noderesourcetopologies", "get"),
    ("topology.node.k8s.io", "noderesourcetopologies", "create"),
    ("topology.node.k8s.io", "noderesourcetopologies", "update"),
    # koordlet/reporter/device.py: the same for the node's Device (gate Accelerators)
    ("scheduling.koordinator.sh", "devices", "get"),
    ("scheduling.koordinator.sh", "devices", "create"),
    ("scheduling.koordinator.sh", "devices", "update"),
    # koordlet/reporter/evictioncondition.py through kubeclient.writes.update_status: GET the
    # Node, PUT its status with the koordinator.sh/BEEvictionPressure condition
    ("", "nodes", "get"),
    ("", "nodes/status", "update"),
    # koordlet/qos/evict_api.py: POST pods/<name>/eviction, and the evictPodSuccess Event
    ("", "pods/eviction", "create"),
    ("", "events", "create"),
}
"""Every (API group, resource, verb) the koordlet's code uses."""


def _docs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted(MANIFESTS.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if doc is not None
    ]


def _one(kind: str) -> dict[str, Any]:
    found = [doc for _, doc in _docs() if doc["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def test_every_document_is_a_known_kind_and_kustomize_lists_every_file() -> None:
    kinds = sorted(doc["kind"] for _, doc in _docs())
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "Kustomization",
        "Namespace",
        "ServiceAccount",
    ]
    listed = set(_one("Kustomization")["resources"])
    assert listed == {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    namespaces = {(doc.get("metadata") or {}).get("namespace") for _, doc in _docs()} - {None}
    assert namespaces == {_one("Namespace")["metadata"]["name"]}


def _pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = _one("DaemonSet")["spec"]["template"]["spec"]
    return spec


def test_the_daemonset_runs_node_critical_on_every_node_with_the_host_pids() -> None:
    ds = _one("DaemonSet")
    assert ds["spec"]["selector"]["matchLabels"].items() <= (
        ds["spec"]["template"]["metadata"]["labels"].items()
    )
    spec = _pod_spec()
    assert spec["hostPID"] is True
    assert spec["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in spec["tolerations"]
    assert spec["serviceAccountName"] == _one("ServiceAccount")["metadata"]["name"]
    (container,) = spec["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "50m", "memory": "96Mi"},
        "limits": {"cpu": "500m", "memory": "256Mi"},
    }
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_the_probes_hit_healthz_and_readyz_on_the_koordlet_port() -> None:
    (container,) = _pod_spec()["containers"]
    cfg = load_config(container["args"], environ={"NODE_NAME": "node-1"})
    port = int(cfg.server.addr.rpartition(":")[2])
    assert port == 9316
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}


def test_the_host_is_mounted_where_the_args_point() -> None:
    spec = _pod_spec()
    (container,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"].rstrip("/"): volumes[m["name"]] for m in container["volumeMounts"]}
    host = {path: v["hostPath"]["path"].rstrip("/") for path, v in mounts.items()}
    cfg = load_config(container["args"], environ={"NODE_NAME": "node-1"})
    assert host[cfg.paths.cgroup_root.rstrip("/")] == "/sys/fs/cgroup"
    assert host[cfg.paths.sys_root.rstrip("/")] == "/sys"
    assert cfg.paths.proc_root.rstrip("/") == "/proc"  # the host's processes through hostPID
    assert host[cfg.state_dir.rstrip("/")] == "/var/lib/koordlet"
    assert host["/var/lib/kubelet"] == "/var/lib/kubelet"
    assert not any(m.get("readOnly") for m in container["volumeMounts"] if "cgroup" in m["name"])
    # the runtime hooks: the hook socket and koordlet.json where the host's proxy finds them,
    # the host's /var/run for the runtime's NRI socket
    hooks = cfg.runtime_hooks
    assert host[os.path.dirname(hooks.addr)] == os.path.dirname(hooks.host_endpoint)
    assert host[hooks.config_path.rstrip("/")] == "/etc/runtime/hookserver.d"
    assert host[hooks.var_run_root.rstrip("/")] == "/var/run"
    assert host[hooks.terway_qos_dir] == TERWAY_QOS_DIR  # terway-qos's folder, upstream's mount
    assert hooks.terway_qos_dir == "/host-var-lib/terway/qos"


def _granted() -> set[tuple[str, str, str]]:
    role = _one("ClusterRole")
    return {
        (group, res, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_grants_exactly_what_the_code_uses() -> None:
    granted = _granted()
    assert granted == USED
    binding = _one("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == _one("ClusterRole")["metadata"]["name"]
    sa = _one("ServiceAccount")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
    ]


@pytest.mark.parametrize(
    "name",
    [n for n, v in vars(resources).items() if isinstance(v, resources.Resource)],
)
def test_a_resource_the_koordlet_code_names_is_in_the_rbac_list(name: str) -> None:
    """Keeps :data:`USED` honest: naming a resource constant in ``koordlet/`` (other than in an
    import) means the code talks to it, so it needs a rule; an unnamed one needs none."""
    res: resources.Resource = getattr(resources, name)
    pattern = re.compile(rf"\b{name}\b")
    named = any(
        pattern.search(line) and "import" not in line
        for path in (ROOT / "koordlet").rglob("*.py")
        for line in path.read_text(encoding="utf-8").splitlines()
    )
    in_rbac = any(g == res.group and r == res.plural for g, r, _ in USED)
    if name == "PODS":  # the eviction subresource is named through PODS inside kubeclient
        named = True
    assert named == in_rbac, name


RESET = ROOT / "packaging" / "kubernetes" / "koordlet-reset" / "daemonset.yaml"


def test_the_reset_daemonset_runs_reset_on_the_koordlets_host_paths_and_state() -> None:
    """docs/kubernetes.md's uninstall: the reset reads the same state and writes the same
    cgroup tree as the koordlet it follows, and finds a koordlet still answering on its port."""
    reset = yaml.safe_load(RESET.read_text(encoding="utf-8"))
    spec = reset["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    assert init["command"] == ["koordlet"]
    assert init["args"][0] == "reset"
    volumes = {v["name"]: v["hostPath"]["path"].rstrip("/") for v in spec["volumes"]}
    host = {m["mountPath"].rstrip("/"): volumes[m["name"]] for m in init["volumeMounts"]}
    cfg = load_config(init["args"][1:], environ={"NODE_NAME": "node-1"})
    (koordlet,) = _pod_spec()["containers"]
    daemon = load_config(koordlet["args"], environ={"NODE_NAME": "node-1"})
    assert host[cfg.paths.cgroup_root.rstrip("/")] == "/sys/fs/cgroup"
    assert host[cfg.paths.sys_root.rstrip("/")] == "/sys"
    assert host[cfg.state_dir] == "/var/lib/koordlet"
    # the originals journal names the TerwayQoS files by the paths the koordlet wrote
    assert host[daemon.runtime_hooks.terway_qos_dir] == TERWAY_QOS_DIR
    assert (cfg.paths, cfg.state_dir, cfg.server.port) == (
        daemon.paths,
        daemon.state_dir,
        daemon.server.port,
    )
    assert spec["hostPID"] is True  # the host's processes (a koordlet still running)
    assert spec["hostNetwork"] is True  # the koordlet's port on the node
    assert init["securityContext"]["privileged"] is True
