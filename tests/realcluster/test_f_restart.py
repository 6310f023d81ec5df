"""The koordlet killed and started again while BE and LS pods run on its node: nothing it writes
after the restart differs from what it had written (no wrong write), it takes up its state (the
originals journal of its first start), and ``koordlet reset`` then leaves the node's QoS cgroups
as they were before it first ran. Runs last among the host-process tests: it ends with the
koordlet of node 0 reset and stopped."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from envtest.cluster import Cluster, Node
from envtest.koordinator import (
    KUBELET_RECOMPUTED,
    HostProcs,
    Koordinator,
    binary,
    free_port,
    qos_snapshot,
    wait,
    without_kubelets,
)
from envtest.workloads import (
    COLOCATION_LABEL,
    COLOCATION_NS,
    colocation_profile,
    delete_pods,
    kept_originals,
    pod,
    wait_running,
)

pytestmark = pytest.mark.timeout(300)
POD_KNOBS = ("cpu.cfs_quota_us", "cpu.shares", "cpuset.cpus", "memory.limit_in_bytes")


def pod_snapshot(node: Node, qos: str, uid: str) -> dict[str, str]:
    out = {}
    for knob in POD_KNOBS:
        controller = knob.split(".")[0]
        path = node.cgroup(controller, "kubepods", *([qos] if qos else []), f"pod{uid}", knob)
        out[knob] = path.read_text().strip()
    return out


@pytest.fixture
def running_pods(cluster: Cluster, hostprocs: HostProcs) -> Iterator[dict[str, str]]:
    cluster.kubectl("create", "namespace", COLOCATION_NS, check=False)
    cluster.kubectl("label", "namespace", COLOCATION_NS, f"{COLOCATION_LABEL}=true", "--overwrite")
    cluster.apply(json.dumps(colocation_profile("be-koord", "koord-scheduler")))
    node = cluster.node_list[0].name
    resources = {"requests": {"cpu": "0", "memory": "32Mi"},
                 "limits": {"cpu": "1", "memory": "128Mi"}}  # fmt: skip
    labels = {COLOCATION_LABEL: "true", "profile": "be-koord"}
    be = pod("be-keep", node=node, labels=labels, resources=resources)
    ls = pod("ls-keep", node=node, resources=resources)
    cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": [be, ls]}))
    uids = {n: wait_running(cluster, n)["metadata"]["uid"] for n in ("be-keep", "ls-keep")}
    yield uids
    delete_pods(cluster, "be-keep", "ls-keep")


def journal_lines(state_dir: Path) -> list[str]:
    path = state_dir / "originals.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def test_a_killed_koordlet_restarts_without_a_wrong_write_and_reset_restores_the_node(
    cluster: Cluster, hostprocs: HostProcs, koordinator: Koordinator, running_pods: dict[str, str]
) -> None:
    node = cluster.node_list[0]
    old = hostprocs.koordlet(node)
    # the BE pod's limits are in place (the proxy at creation), and one reconcile has run
    be_dir = node.cgroup("cpu", "kubepods", "besteffort", f"pod{running_pods['be-keep']}")
    wait("BE limits", lambda: (be_dir / "cpu.cfs_quota_us").read_text().strip() == "100000", 30)
    before = {
        "be": pod_snapshot(node, "besteffort", running_pods["be-keep"]),
        "ls": pod_snapshot(node, "burstable", running_pods["ls-keep"]),
        "qos": qos_snapshot(node),
    }
    journal = journal_lines(old.state_dir)
    assert journal, "the koordlet recorded no original before its first writes"
    log_mark = len(old.proc.log.read_text(errors="replace").splitlines())

    koordinator.kill_koordlet(old)
    new = koordinator.start_koordlet(node, *old.flags)
    hostprocs.koordlets[hostprocs.koordlets.index(old)] = new
    # two reconcile and suppress rounds after the restart
    wait("a QoS round after the restart", lambda: new.get("/debug/qos"), 30)

    def two_rounds() -> bool:
        strategies = new.get("/debug/qos")["strategies"]
        return bool(strategies) and all(s["rounds"] >= 2 for s in strategies.values())

    wait("two rounds", two_rounds, 30)
    after = {
        "be": pod_snapshot(node, "besteffort", running_pods["be-keep"]),
        "ls": pod_snapshot(node, "burstable", running_pods["ls-keep"]),
        "qos": qos_snapshot(node),
    }
    # the kubelet's own knob aside (it moves as an earlier test's pods finish going): the
    # koordlet's audit says it never wrote it
    assert without_kubelets(after["qos"]) == without_kubelets(before["qos"])
    assert (after["be"], after["ls"]) == (before["be"], before["ls"])
    entries = new.get("/debug/audit?kind=write&limit=1000")["entries"]
    written = [e for e in entries if e["path"].endswith(KUBELET_RECOMPUTED)]
    assert written == [], "the koordlet wrote the kubelet's Burstable shares"
    # its state is its first start's: the journal was taken up, not begun again
    assert kept_originals(journal) <= set(journal_lines(new.state_dir))
    lines = new.proc.log.read_text(errors="replace").splitlines()[log_mark:]
    assert any("originals journal" in ln for ln in lines), lines[:20]
    assert not [ln for ln in lines if " ERROR " in ln or "Traceback" in ln]

    # stopped and reset: the node's QoS cgroups as before the koordlet first ran
    koordinator.stop(new.proc)
    hostprocs.koordlets.remove(new)
    argv = koordinator.koordlet_argv(node, free_port(), *new.flags)
    reset = subprocess.run(
        [binary("koordlet"), "reset", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert reset.returncode == 0, reset.stderr
    restored = qos_snapshot(node)
    changed = {
        k: (hostprocs.baseline[node.name][k], v)
        for k, v in restored.items()
        if v != hostprocs.baseline[node.name][k]
    }
    # the kubelet owns the QoS cgroups' cpu.shares and memory limits (it sets them from the
    # pods' requests as they come and go); everything else is as before the install
    assert {
        k for k in changed if not k.endswith(("cpu.shares", "memory.limit_in_bytes"))
    } == set(), changed
