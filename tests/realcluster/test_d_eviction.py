"""Memory eviction on the real node: a BE pod's memory takes the node over the NodeSLO's
threshold, the koordlet evicts it through the Eviction API and the kubelet removes it; with the
``BEEvictionCondition`` gate the Node condition keeps the next BE pod off the node until the
cool-down passes, then koord-scheduler places it."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apis.node_conditions import CONDITION_BE_EVICTION_PRESSURE
from apis.quantity import int_value
from envtest.cluster import Cluster
from envtest.koordinator import HostProcs, wait
from envtest.workloads import (
    COLOCATION_LABEL,
    COLOCATION_NS,
    colocation_profile,
    delete_pods,
    patch_slo_config,
    pod,
    wait_running,
)

pytestmark = pytest.mark.timeout(300)
MI = 1 << 20


def node_memory_percent(cluster: Cluster, name: str) -> float:
    """The node's memory usage as the koordlet counts it (MemTotal - MemAvailable) against the
    Node's capacity."""
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        info[key] = int(value.split()[0]) * 1024
    capacity = cluster.get("node", name)["status"]["capacity"]["memory"]
    cap_bytes = int_value(capacity)
    return 100 * (info["MemTotal"] - info["MemAvailable"]) / cap_bytes


def condition(cluster: Cluster, name: str) -> dict[str, Any] | None:
    for c in cluster.get("node", name)["status"].get("conditions", []):
        if c["type"] == CONDITION_BE_EVICTION_PRESSURE:
            return dict(c)
    return None


def filler(name: str, node: str, mib: int) -> dict[str, Any]:
    """A BE pod that holds ``mib`` MiB in a memory-backed emptyDir (tmpfs pages charged to its
    memory cgroup, not reclaimable: MemAvailable drops by as much)."""
    body = pod(
        name,
        node=node,
        labels={COLOCATION_LABEL: "true", "profile": "be-koord"},
        command=f"dd if=/dev/zero of=/fill/data bs=1M count={mib} && sleep 3600",
        resources={"requests": {"cpu": "0", "memory": "16Mi"},
                   "limits": {"cpu": "1", "memory": f"{mib + 256}Mi"}},
    )  # fmt: skip
    body["spec"]["volumes"] = [{"name": "fill", "emptyDir": {"medium": "Memory"}}]
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": "fill", "mountPath": "/fill"}]
    return body


@pytest.fixture
def evicting(cluster: Cluster, hostprocs: HostProcs) -> Iterator[None]:
    cluster.kubectl("create", "namespace", COLOCATION_NS, check=False)
    cluster.kubectl("label", "namespace", COLOCATION_NS, f"{COLOCATION_LABEL}=true", "--overwrite")
    cluster.apply(json.dumps(colocation_profile("be-koord", "koord-scheduler")))
    yield
    patch_slo_config(
        cluster,
        {
            "resource-threshold-config": {
                "clusterStrategy": {"enable": True, "memoryEvictThresholdPercent": 99}
            }
        },
    )
    delete_pods(cluster, "be-fill", "be-next")


def test_a_be_pod_over_the_memory_threshold_is_evicted_by_api_and_the_condition_holds_the_next(
    cluster: Cluster, hostprocs: HostProcs, evicting: None
) -> None:
    node = cluster.node_list[0]
    capacity = int_value(cluster.get("node", node.name)["status"]["capacity"]["memory"])
    now = node_memory_percent(cluster, node.name)
    threshold = math.ceil(now) + 3
    fill_mib = int(capacity * 0.06 / MI)  # 6 %: over the threshold with room to spare
    patch_slo_config(
        cluster,
        {"resource-threshold-config": {"clusterStrategy": {
            "enable": True, "memoryEvictThresholdPercent": threshold,
            "cpuSuppressThresholdPercent": 65}}},
    )  # fmt: skip
    wait(
        "NodeSLO threshold",
        lambda: (
            cluster.get("nodeslo", node.name)["spec"]["resourceUsedThresholdWithBE"].get(
                "memoryEvictThresholdPercent"
            )
            == threshold
        ),
        30,
    )
    cluster.apply(json.dumps(filler("be-fill", node.name, fill_mib)))
    p = wait_running(cluster, "be-fill")
    uid = p["metadata"]["uid"]

    def gone() -> bool:
        out = cluster.kubectl(
            "get", "pod", "be-fill", "-n", COLOCATION_NS, "-o", "name", check=False
        )
        return (
            out.strip() == ""
            or cluster.get("pod", "be-fill", COLOCATION_NS)["metadata"]["uid"] != uid
        )

    wait("be-fill evicted and removed", gone, 90)
    pod_dir = node.cgroup("memory", "kubepods", "besteffort", f"pod{uid}")
    wait("its cgroup removed by the kubelet", lambda: not pod_dir.exists(), 60)
    events = cluster.get("events", namespace=COLOCATION_NS)["items"]
    mine = [e for e in events if e["involvedObject"].get("uid") == uid]
    assert any(e["reason"] in ("Evicted", "evictPodSuccess") for e in mine), [
        (e["reason"], e.get("message")) for e in mine
    ]
    cond = wait(
        "BEEvictionPressure True",
        lambda: (c := condition(cluster, node.name)) and c["status"] == "True" and c,
        30,
    )
    assert cond["reason"] == "EvictingBEPods"

    # the next BE pod stays Pending while the condition holds, then is placed
    nxt = pod(
        "be-next",
        node=node.name,
        labels={COLOCATION_LABEL: "true", "profile": "be-koord"},
        resources={
            "requests": {"cpu": "0", "memory": "16Mi"},
            "limits": {"cpu": "1", "memory": "64Mi"},
        },
    )
    cluster.apply(json.dumps(nxt))

    def rejected() -> bool:
        for e in cluster.get("events", namespace=COLOCATION_NS)["items"]:
            if e["involvedObject"].get("name") == "be-next" and e["reason"] == "FailedScheduling":
                return "evicting BE pods" in e.get("message", "")
        return False

    if condition(cluster, node.name)["status"] == "True":  # type: ignore[index]
        wait("be-next refused while the node evicts", rejected, 20)
        assert not cluster.get("pod", "be-next", COLOCATION_NS)["spec"].get("nodeName")
    wait("the condition lifted", lambda: condition(cluster, node.name)["status"] == "False", 60)  # type: ignore[index]
    placed = wait_running(cluster, "be-next", timeout=60)
    assert placed["spec"]["nodeName"] == node.name
