"""A BE pod's batch limits on the real node: the webhook (through the real API server) makes a
pod matched by a ClusterColocationProfile BE with batch resources and writes
``node.koordinator.sh/extended-resource-spec``; koord-scheduler or kube-scheduler with our
extender binds it; the limits are in its cgroups when its container is created (node 0: the
kubelet on koord-runtime-proxy, the koordlet's reconciler slowed to an interval it cannot meet
here), or within one reconcile interval (node 1: no proxy)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from apis.extension import ANNOTATION_EXTENDED_RESOURCE_SPEC, LABEL_POD_QOS
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY
from envtest.cgroupwatch import CgroupWatch, read_int
from envtest.cluster import Cluster
from envtest.koordinator import HostProcs, Koordinator, wait
from envtest.workloads import (
    COLOCATION_LABEL,
    COLOCATION_NS,
    colocation_profile,
    container_id,
    pod,
    wait_running,
)

pytestmark = pytest.mark.timeout(300)
MI = 1 << 20
# no CPU request: a BE pod's batch-cpu request would need the node's CPU idle enough for the
# manager to offer batch-cpu, which a 2-core machine running the suite (or two busy loops) may
# not be; the limit is what the cgroup gets (test_a_colocation checks the batch resources)
LIMITS = {"requests": {"cpu": "0", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}


@pytest.fixture(scope="module")
def colocation(cluster: Cluster, hostprocs: HostProcs) -> Iterator[None]:
    cluster.kubectl("create", "namespace", COLOCATION_NS, check=False)
    cluster.kubectl("label", "namespace", COLOCATION_NS, f"{COLOCATION_LABEL}=true", "--overwrite")
    cluster.apply(json.dumps(colocation_profile("be-koord", "koord-scheduler")))
    yield
    cluster.kubectl(
        "delete", "pods", "--all", "-n", COLOCATION_NS, "--grace-period=1", "--timeout=60s"
    )


def _pod_cgroup(node_cgroup: Path, uid: str) -> Path:
    return node_cgroup / "kubepods" / "besteffort" / f"pod{uid}"


def test_a_be_pod_through_the_proxy_has_its_batch_limits_when_its_container_is_created(
    cluster: Cluster, hostprocs: HostProcs, colocation: None
) -> None:
    node = cluster.node_list[0]
    with CgroupWatch(node) as watch:
        labels = {COLOCATION_LABEL: "true", "profile": "be-koord"}
        cluster.apply(json.dumps(pod("be-proxy", node=node.name, labels=labels, resources=LIMITS)))
        p = wait_running(cluster, "be-proxy")
        cid = container_id(p)
        seen = wait(
            "its container's limits", lambda: (s := watch.seen.get(cid)) and s.settled and s, 10
        )

    # the webhook's work, as the API server stored it
    assert p["spec"]["schedulerName"] == "koord-scheduler"
    assert p["spec"]["priorityClassName"] == "koord-batch"
    assert p["metadata"]["labels"][LABEL_POD_QOS] == "BE"
    res = p["spec"]["containers"][0]["resources"]
    assert res["requests"] == {BATCH_CPU: "0", BATCH_MEMORY: "64Mi"}
    assert res["limits"] == {BATCH_CPU: "1k", BATCH_MEMORY: "512Mi"}
    spec = json.loads(p["metadata"]["annotations"][ANNOTATION_EXTENDED_RESOURCE_SPEC])
    assert spec == {"containers": {"main": {"requests": res["requests"], "limits": res["limits"]}}}
    assert p["spec"]["nodeName"] == node.name
    assert p["status"]["qosClass"] == "BestEffort"

    # at creation: runc made the container's cgroup with the limits of the spec the proxy
    # adjusted; the first reads, within milliseconds, already show them or show them settle
    # while runc writes its files (the reconciler runs every hour here)
    assert (seen.quota, seen.memory) == (100_000, 512 * MI)
    assert seen.settled is not None
    assert seen.settled - seen.appeared < 0.5, seen
    pod_dir = _pod_cgroup(node.cgroup("cpu"), p["metadata"]["uid"])
    assert read_int(pod_dir / "cpu.cfs_quota_us") == 100_000
    assert read_int(pod_dir / "cpu.shares") == 2  # MilliCPUToShares(0): the minimum
    mem_dir = _pod_cgroup(node.cgroup("memory"), p["metadata"]["uid"])
    assert read_int(mem_dir / "memory.limit_in_bytes") == 512 * MI


def test_a_be_pod_bound_by_kube_scheduler_with_our_extender_has_its_limits_in_a_reconcile_interval(
    cluster: Cluster, hostprocs: HostProcs, koordinator: Koordinator, colocation: None
) -> None:
    node = cluster.node_list[1]
    _, port = koordinator.start_extender()
    koordinator.start_kube_scheduler_with_extender("koord-extender", port)
    resources = {
        "requests": {BATCH_CPU: "0", BATCH_MEMORY: "64Mi"},
        "limits": {BATCH_CPU: "1k", BATCH_MEMORY: "512Mi"},
    }
    body = pod(
        "be-extender",
        node=node.name,
        labels={LABEL_POD_QOS: "BE"},
        resources=resources,
        scheduler="koord-extender",
        priority_class="koord-batch",
    )
    with CgroupWatch(node) as watch:
        cluster.apply(json.dumps(body))
        p = wait_running(cluster, "be-extender")
        cid = container_id(p)
        seen = wait(
            "its container's limits", lambda: (s := watch.seen.get(cid)) and s.settled and s, 15
        )
    assert p["spec"]["nodeName"] == node.name
    spec = json.loads(p["metadata"]["annotations"][ANNOTATION_EXTENDED_RESOURCE_SPEC])
    assert spec["containers"]["main"]["limits"] == resources["limits"]
    assert (seen.quota, seen.memory) == (100_000, 512 * MI)
    assert seen.settled is not None
    # no proxy: the container starts unlimited; the reconciler (every 3 s) writes the limits
    assert seen.settled - seen.appeared < 3 + 2, seen
    events = cluster.get("events", namespace=COLOCATION_NS)["items"]
    scheduled = [
        e
        for e in events
        if e["involvedObject"].get("name") == "be-extender" and e["reason"] == "Scheduled"
    ]
    assert scheduled, "kube-scheduler recorded no Scheduled event"
