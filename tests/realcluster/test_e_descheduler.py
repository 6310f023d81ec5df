"""The descheduler on the real cluster: a pod of a real ReplicaSet on the hot node (node 2,
whose allocatable memory is tiny) moves to a cold node through a PodMigrationJob in
ReservationFirst mode: a Reservation placed by koord-scheduler, the pod evicted through the
Eviction API, the ReplicaSet controller's replacement bound into the Reservation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from envtest.cluster import Cluster
from envtest.koordinator import HostProcs, Koordinator, wait
from envtest.workloads import BUSYBOX

pytestmark = pytest.mark.timeout(300)
NS = "web"


def tune(doc: dict[str, Any]) -> None:
    """Rounds every 2 s, one abnormal round is enough; memory thresholds only (CPU usage is
    the whole test machine's on every node)."""
    doc["deschedulingInterval"] = "2s"
    for profile in doc["profiles"]:
        for plugin in profile["pluginConfig"]:
            if plugin["name"] == "LowNodeLoad":
                args = plugin["args"]
                args["lowThresholds"] = {"memory": 50}
                args["highThresholds"] = {"memory": 80}
                args["anomalyCondition"] = {"consecutiveAbnormalities": 1}


def replica_set() -> dict[str, Any]:
    labels = {"app": "web"}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            # two: the migration controller leaves a workload's only pod alone (expected
            # replicas at most maxMigratingPerWorkload, 1)
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "schedulerName": "koord-scheduler",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "main",
                            "image": BUSYBOX,
                            "imagePullPolicy": "Never",
                            "command": ["/bin/sh", "-c", "sleep 3600"],
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                        }
                    ],
                },
            },
        },
    }


@pytest.fixture
def web(cluster: Cluster, hostprocs: HostProcs) -> Iterator[None]:
    cluster.kubectl("create", "namespace", NS, check=False)
    yield
    # foreground: the ReplicaSet goes only after its pods have, so the next test's node is quiet
    # (a Burstable pod still terminating moves the kubelet's QoS cgroups under that test)
    cluster.kubectl(
        "delete", "replicaset", "web", "-n", NS, "--ignore-not-found", "--cascade=foreground",
        "--timeout=90s", check=False,
    )  # fmt: skip
    cluster.kubectl("delete", "podmigrationjobs,reservations", "--all", check=False)
    for i in (0, 1):
        cluster.kubectl("uncordon", cluster.node_name(i), check=False)


def pods(cluster: Cluster) -> list[dict[str, Any]]:
    return list(cluster.get("pods", namespace=NS)["items"])


def where_pods_are(cluster: Cluster) -> str:
    """Each pod's phase, node and conditions, the namespace's events and the nodes' taints: what
    a pod that is not Running in time is waiting for."""
    lines = []
    for p in pods(cluster):
        conditions = [
            f"{c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"
            for c in p["status"].get("conditions", [])
        ]
        lines.append(
            f"pod {p['metadata']['name']}: {p['status'].get('phase')} on "
            f"{p['spec'].get('nodeName')} {conditions}"
        )
    lines.extend(
        f"node {n['metadata']['name']}: taints {n['spec'].get('taints')}"
        for n in cluster.get("nodes")["items"]
    )
    lines.append(cluster.kubectl("get", "events", "-n", NS, check=False))
    return "\n".join(lines)


def test_a_replica_sets_pod_moves_off_the_hot_node_through_a_reservation(
    cluster: Cluster, hostprocs: HostProcs, koordinator: Koordinator, web: None
) -> None:
    hot = cluster.node_name(2)
    # the pod starts on the hot node: the other two are cordoned while it is placed
    for i in (0, 1):
        cluster.kubectl("cordon", cluster.node_name(i))
    cluster.apply(json.dumps(replica_set()))
    started = wait(
        "the ReplicaSet's pods Running on the hot node",
        lambda: (
            (r := [p for p in pods(cluster) if p["status"].get("phase") == "Running"])
            and len(r) == 2
            and r
        ),
        90,
        explain=lambda: where_pods_are(cluster),
    )
    assert {p["spec"]["nodeName"] for p in started} == {hot}
    names = {p["metadata"]["name"] for p in started}
    for i in (0, 1):
        cluster.kubectl("uncordon", cluster.node_name(i))
    descheduler = koordinator.start_descheduler(tune)
    try:
        job = wait(
            "a PodMigrationJob for it",
            lambda: cluster.get("podmigrationjobs")["items"],
            90,
        )[0]
        assert job["spec"]["podRef"]["name"] in names
        moved = job["spec"]["podRef"]["name"]
        assert job["spec"]["mode"] == "ReservationFirst"

        def done() -> dict[str, Any] | None:
            j = cluster.get("podmigrationjob", job["metadata"]["name"])
            phase = (j.get("status") or {}).get("phase")
            assert phase != "Failed", j.get("status")
            return j if phase == "Succeeded" else None

        finished = wait("the PodMigrationJob Succeeded", done, 120, 1.0)
    finally:
        koordinator.stop(descheduler)
    target = finished["status"]["nodeName"]
    assert target in (cluster.node_name(0), cluster.node_name(1))
    live = {
        p["metadata"]["name"]: p
        for p in pods(cluster)
        if not p["metadata"].get("deletionTimestamp")
    }
    assert moved not in live
    replacement = finished["status"]["podRef"]["name"]
    assert live[replacement]["spec"]["nodeName"] == target
    ref = finished["spec"]["reservationOptions"]["reservationRef"]
    reservation = cluster.get("reservation", ref["name"])
    assert reservation["status"]["nodeName"] == target
