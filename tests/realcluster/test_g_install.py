"""Installed as users install it: the project's image built here (packaging/image.py: Debian's
packages and the pinned wheels, no registry), imported into each node's containerd, and
``kubectl apply -k`` of packaging/kubernetes through an overlay that sets the image and puts the
koordlet DaemonSet on node 0 with this run's paths. Every component then runs as a pod with the
host access, ServiceAccount and Lease its manifest gives it; the webhook is served by the
manager's pod behind its Service; node 0's kubelet still goes through koord-runtime-proxy, which
now calls the hook server of the koordlet's pod through the host folder the DaemonSet mounts.

Runs after the host-process tests (it stops them). The koordlet's pod is deleted and made again
by its DaemonSet under running pods, and the reset DaemonSet ends the install.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from apis.extension import ANNOTATION_EXTENDED_RESOURCE_SPEC, LABEL_POD_QOS
from envtest.cgroupwatch import CgroupWatch, read_int
from envtest.cluster import Cluster
from envtest.install import Install, apply_and_wait, ready, reset_overlay, write_overlay
from envtest.koordinator import (
    NAMESPACE,
    Koordinator,
    free_port,
    qos_snapshot,
    wait,
    without_kubelets,
)
from envtest.workloads import (
    COLOCATION_LABEL,
    COLOCATION_NS,
    colocation_profile,
    container_id,
    delete_pods,
    kept_originals,
    pod,
    wait_running,
)
from tests import projectimage

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
MI = 1 << 20


@pytest.fixture(scope="module")
def install(
    cluster: Cluster, koordinator: Koordinator, project_image: projectimage.Built
) -> Install:
    koordinator.close()  # the host processes go: the pods take over
    koordinator.taken_over = True
    node = cluster.node_list[0]
    # the host processes' webhook Service had no selector and hand-made Endpoints
    cluster.kubectl(
        "delete", "service", "koordinator-webhook-service", "-n", NAMESPACE, check=False
    )
    t0 = time.monotonic()
    with ThreadPoolExecutor(len(cluster.node_list)) as pool:  # each node's containerd at once
        list(
            pool.map(lambda n: n.containerd.import_image(project_image.archive), cluster.node_list)
        )
    timings = {"import_s": time.monotonic() - t0}
    baseline = qos_snapshot(node)
    port = free_port(cluster.network.gateway if cluster.network else "127.0.0.1")
    root = cluster.root / "install"
    overlay = write_overlay(cluster, root, node, port, project_image.ref)
    timings["install_to_ready_s"] = apply_and_wait(cluster, overlay)
    return Install(node, port, overlay, root / "koordlet-state", baseline, timings)


def test_every_component_runs_as_a_pod_with_its_service_account_and_lease(
    cluster: Cluster, install: Install
) -> None:
    pods = cluster.get("pods", namespace=NAMESPACE)["items"]
    by_app: dict[str, list[dict[str, Any]]] = {}
    for p in pods:
        by_app.setdefault(p["metadata"]["labels"].get("koord-app", ""), []).append(p)
    accounts = {
        "koordlet": "koordlet",
        "koord-manager": "koord-manager",
        "koord-scheduler": "koord-scheduler",
        "koord-descheduler": "koord-descheduler",
    }
    for app, account in accounts.items():
        assert by_app.get(app), f"no {app} pod: {sorted(by_app)}"
        for p in by_app[app]:
            assert p["spec"]["serviceAccountName"] == account
            assert p["spec"]["containers"][0]["image"].startswith("127.0.0.1:5999/")
    (koordlet,) = by_app["koordlet"]
    assert koordlet["spec"]["nodeName"] == install.node.name
    assert koordlet["spec"]["hostPID"]
    assert koordlet["spec"]["hostNetwork"]
    names = {p["metadata"]["name"] for p in pods}
    for lease in ("koordinator-manager", "koord-scheduler", "koord-descheduler"):
        holder = wait(
            f"Lease {lease} held",
            lambda lease=lease: cluster.get("lease", lease, NAMESPACE)["spec"].get(
                "holderIdentity"
            ),
            60,
        )
        assert any(holder.startswith(n) for n in names), (lease, holder, names)


def test_the_koordlet_pod_publishes_its_nodes_nodemetric(
    cluster: Cluster, install: Install
) -> None:
    started = time.time()

    def fresh() -> bool:
        status = cluster.get("nodemetric", install.node.name).get("status") or {}
        when = status.get("updateTime")
        if not when:
            return False
        from datetime import datetime

        return datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp() >= started - 1

    wait("a NodeMetric report from the pod", fresh, 90, 1.0)
    metrics = wait("the pod's /metrics", lambda: _get(install, "/metrics"), 30)
    assert "koordlet_node_resource_usage" in metrics or "koordlet_" in metrics


def _get(install: Install, path: str) -> str:
    import urllib.request

    with urllib.request.urlopen(install.url + path, timeout=5) as r:
        return str(r.read().decode())


def test_a_be_pod_gets_its_limits_at_creation_from_the_koordlet_pod_through_the_proxy(
    cluster: Cluster, install: Install
) -> None:
    node = install.node
    cluster.kubectl("create", "namespace", COLOCATION_NS, check=False)
    cluster.kubectl("label", "namespace", COLOCATION_NS, f"{COLOCATION_LABEL}=true", "--overwrite")
    cluster.apply(json.dumps(colocation_profile("be-koord", "koord-scheduler")))
    labels = {COLOCATION_LABEL: "true", "profile": "be-koord"}
    resources = {
        "requests": {"cpu": "0", "memory": "64Mi"},
        "limits": {"cpu": "1", "memory": "256Mi"},
    }
    try:
        with CgroupWatch(node) as watch:
            cluster.apply(
                json.dumps(pod("be-pods", node=node.name, labels=labels, resources=resources))
            )
            p = wait_running(cluster, "be-pods")
            cid = container_id(p)
            seen = wait(
                "its container's limits", lambda: (s := watch.seen.get(cid)) and s.settled and s, 10
            )
        assert p["metadata"]["labels"][LABEL_POD_QOS] == "BE"
        assert ANNOTATION_EXTENDED_RESOURCE_SPEC in p["metadata"]["annotations"]
        assert (seen.quota, seen.memory) == (100_000, 256 * MI)
        assert seen.settled is not None
        assert seen.settled - seen.appeared < 0.5, seen
    finally:
        delete_pods(cluster, "be-pods")


def test_the_koordlet_pod_made_again_writes_nothing_different_and_the_reset_restores_the_node(
    cluster: Cluster, install: Install, project_image: projectimage.Built
) -> None:
    node = install.node
    labels = {COLOCATION_LABEL: "true", "profile": "be-koord"}
    resources = {
        "requests": {"cpu": "0", "memory": "32Mi"},
        "limits": {"cpu": "1", "memory": "128Mi"},
    }
    cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        pod("be-stay", node=node.name, labels=labels, resources=resources),
        pod("ls-stay", node=node.name, resources=resources),
    ]}))  # fmt: skip
    try:
        uids = {n: wait_running(cluster, n)["metadata"]["uid"] for n in ("be-stay", "ls-stay")}

        def knobs() -> dict[str, str]:
            out = dict(qos_snapshot(node))
            for name, qos in (("be-stay", "besteffort"), ("ls-stay", "burstable")):
                for controller, knob in (("cpu", "cpu.cfs_quota_us"), ("cpu", "cpu.shares"),
                                         ("memory", "memory.limit_in_bytes")):  # fmt: skip
                    path = node.cgroup(controller, "kubepods", qos, f"pod{uids[name]}", knob)
                    out[f"{name}/{knob}"] = str(read_int(path))
            return out

        before = knobs()
        journal = (install.state_dir / "originals.jsonl").read_text().splitlines()
        old = cluster.get(
            "pods",
            namespace=NAMESPACE,
        )["items"]
        (old_pod,) = [p for p in old if p["metadata"]["labels"].get("koord-app") == "koordlet"]
        cluster.kubectl(
            "delete", "pod", old_pod["metadata"]["name"], "-n", NAMESPACE, "--wait=true"
        )

        def replaced() -> bool:
            pods = cluster.get("pods", namespace=NAMESPACE)["items"]
            new = [p for p in pods if p["metadata"]["labels"].get("koord-app") == "koordlet"
                   and p["metadata"]["uid"] != old_pod["metadata"]["uid"]]  # fmt: skip
            return bool(new) and all(
                c.get("ready") for p in new for c in p["status"].get("containerStatuses", [])
            )

        wait("the DaemonSet's new koordlet pod ready", replaced, 120, 1.0)

        def qos_rounds() -> dict[str, float]:
            # /debug answers loopback clients only: the rounds from /metrics
            pattern = (
                r'^koordlet_step_duration_seconds_count\{component="qos",name="([^"]+)"\} (\S+)$'
            )
            return {m[0]: float(m[1]) for m in re.findall(pattern, _get(install, "/metrics"), re.M)}

        wait(
            "two rounds of each QoS strategy in the new pod",
            lambda: (r := qos_rounds()) and all(v >= 2 for v in r.values()),
            60,
        )
        # the kubelet's Burstable shares aside: the koordlet pod replaced moves them
        assert without_kubelets(knobs()) == without_kubelets(before)
        # the journal taken up: every original recorded before whose cgroup is still there
        # (the koordlet drops those of pods gone) is still recorded, as recorded
        assert kept_originals(journal) <= set(
            (install.state_dir / "originals.jsonl").read_text().splitlines()
        )

        # the uninstall: the DaemonSet goes, the reset DaemonSet puts the node back
        cluster.kubectl("delete", "daemonset", "koordlet", "-n", NAMESPACE, "--wait=true")
        wait("the koordlet pod gone", lambda: not _koordlet_pods(cluster), 60)
        overlay = reset_overlay(cluster.root / "reset", install, project_image.ref)
        cluster.kubectl("apply", "-k", str(overlay))
        wait(
            "the reset DaemonSet done",
            lambda: ready(cluster, "daemonset", "koordlet-reset"),
            120,
            1.0,
        )
        restored = qos_snapshot(node)
        changed = {
            k: (install.baseline[k], v) for k, v in restored.items() if v != install.baseline[k]
        }
        kubelets = ("cpu.shares", "memory.limit_in_bytes")
        assert {k for k in changed if not k.endswith(kubelets)} == set(), changed
        logs = cluster.kubectl(
            "logs", "-n", NAMESPACE, "-l", "koord-app=koordlet-reset", "-c", "reset"
        )
        assert "Traceback" not in logs
    finally:
        delete_pods(cluster, "be-stay", "ls-stay")


def _koordlet_pods(cluster: Cluster) -> list[dict[str, Any]]:
    pods = cluster.get("pods", namespace=NAMESPACE)["items"]
    return [p for p in pods if p["metadata"]["labels"].get("koord-app") == "koordlet"]
