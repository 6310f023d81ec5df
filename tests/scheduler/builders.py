"""Objects as ``kubectl get -o yaml`` prints them, for scheduler tests."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

NOW = 1_800_000_000.0
"""The cycle clock of every test (epoch seconds)."""


def ts(epoch: float) -> str:
    """RFC 3339 time of ``epoch``."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(
    name: str,
    cpu: str = "32",
    memory: str = "64Gi",
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    extra: dict[str, str] | None = None,
    pods: str = "110",
    taints: list[dict[str, str]] | None = None,
    images: list[dict[str, Any]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    alloc = {"cpu": cpu, "memory": memory, "pods": pods}
    alloc.update(extra or {})
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {},
        "status": {"allocatable": alloc, "capacity": dict(alloc)},
    }
    if taints:
        obj["spec"]["taints"] = taints
    if unschedulable:
        obj["spec"]["unschedulable"] = True
    if images:
        obj["status"]["images"] = images
    return obj


def pod(
    name: str,
    *,
    node_name: str = "",
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    priority: int | None = None,
    scheduled_at: float | None = None,
    namespace: str = "default",
    owner_kind: str | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod; ``spec``: more ``spec`` fields (affinity, tolerations...)."""
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = dict(requests)
    if limits:
        resources["limits"] = dict(limits)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}",
        "labels": labels or {},
        "annotations": annotations or {},
    }
    if owner_kind:
        meta["ownerReferences"] = [
            {"kind": owner_kind, "name": "owner", "apiVersion": "apps/v1", "uid": "o"}
        ]
    spec_obj: dict[str, Any] = {
        "containers": [{"name": "main", "image": "busybox", "resources": resources}]
    }
    if node_name:
        spec_obj["nodeName"] = node_name
    if priority is not None:
        spec_obj["priority"] = priority
    spec_obj.update(spec or {})
    status: dict[str, Any] = {"phase": "Running" if node_name else "Pending"}
    if scheduled_at is not None:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(scheduled_at)}
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec_obj, "status": status}


def node_metric(
    name: str,
    *,
    cpu: str = "0",
    memory: str = "0",
    age: float = 10.0,
    pods: list[tuple[str, str, str]] | None = None,
    aggregated: dict[str, dict[str, str]] | None = None,
    duration: str = "5m0s",
) -> dict[str, Any]:
    """A NodeMetric updated ``age`` seconds before :data:`NOW`; ``pods``: (name, cpu, memory)."""
    nm: dict[str, Any] = {"nodeUsage": {"resources": {"cpu": cpu, "memory": memory}}}
    if aggregated:
        nm["aggregatedNodeUsages"] = [
            {"duration": duration, "usage": {k: {"resources": v} for k, v in aggregated.items()}}
        ]
    return {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeMetric",
        "metadata": {"name": name},
        "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 60}},
        "status": {
            "updateTime": ts(NOW - age),
            "nodeMetric": nm,
            "podsMetric": [
                {
                    "namespace": "default",
                    "name": p,
                    "podUsage": {"resources": {"cpu": c, "memory": m}},
                }
                for p, c, m in (pods or [])
            ],
        },
    }


def nrt(
    name: str,
    *,
    sockets: int = 1,
    numa_per_socket: int = 2,
    cores_per_numa: int = 4,
    threads: int = 2,
    memory_per_numa: str = "32Gi",
    policies: list[str] | None = None,
    reserved: str = "",
) -> dict[str, Any]:
    """A NodeResourceTopology with Koordinator's cpu-topology annotation. CPU ids follow Linux:
    the first threads of every core come first, their siblings after."""
    total_cores = sockets * numa_per_socket * cores_per_numa
    detail = []
    for t in range(threads):
        for core in range(total_cores):
            numa = core // cores_per_numa
            detail.append(
                {
                    "id": t * total_cores + core,
                    "core": core,
                    "socket": numa // numa_per_socket,
                    "node": numa,
                }
            )
    annotations = {"node.koordinator.sh/cpu-topology": json.dumps({"detail": detail})}
    if reserved:
        annotations["kubelet.koordinator.sh/cpu-manager-policy"] = json.dumps(
            {"policy": "static", "reservedCPUs": reserved}
        )
    zones = [
        {
            "name": f"node-{n}",
            "type": "Node",
            "resources": [
                {
                    "name": "cpu",
                    "capacity": str(cores_per_numa * threads),
                    "allocatable": str(cores_per_numa * threads),
                    "available": "0",
                },
                {
                    "name": "memory",
                    "capacity": memory_per_numa,
                    "allocatable": memory_per_numa,
                    "available": "0",
                },
            ],
        }
        for n in range(sockets * numa_per_socket)
    ]
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha1",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name, "annotations": annotations},
        "topologyPolicies": policies or ["None"],
        "zones": zones,
    }


def as_list(*objects: dict[str, Any]) -> dict[str, Any]:
    """A v1 List of ``objects``."""
    return {"apiVersion": "v1", "kind": "List", "items": list(objects)}
