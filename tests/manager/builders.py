"""Builders of the raw API objects the manager reads: Node, NodeMetric, Pod, PodList, ConfigMap.

Plain dicts shaped as the API server returns them, so the tests go through the same parsing as
real objects do.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
"""The fixed "now" of every calculation test."""


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(
    name: str = "node-1",
    *,
    cpu: str = "32",
    memory: str = "128Gi",
    alloc_cpu: str | None = None,
    alloc_memory: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    extended: dict[str, str] | None = None,
) -> dict[str, Any]:
    allocatable = {"cpu": alloc_cpu or cpu, "memory": alloc_memory or memory, "pods": "110"}
    allocatable.update(extended or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "status": {
            "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
            "allocatable": allocatable,
        },
    }


def pod(
    name: str,
    *,
    cpu: str | None = None,
    memory: str | None = None,
    priority: int | None = None,
    qos: str | None = None,
    phase: str = "Running",
    node_name: str = "node-1",
    namespace: str = "default",
) -> dict[str, Any]:
    requests = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = memory
    spec: dict[str, Any] = {
        "nodeName": node_name,
        "containers": [{"name": "main", "resources": {"requests": requests}}],
    }
    if priority is not None:
        spec["priority"] = priority
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"koordinator.sh/qosClass": qos} if qos else {},
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def pod_list(*pods: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PodList", "items": list(pods)}


def usage(cpu: str, memory: str) -> dict[str, Any]:
    return {"resources": {"cpu": cpu, "memory": memory}}


def node_metric(
    *,
    node_usage: tuple[str, str] | None = ("8", "40Gi"),
    system_usage: tuple[str, str] = ("0", "0"),
    pods: list[tuple[str, str, str, str]] | None = None,
    prod_reclaimable: tuple[str, str] | None = None,
    host_apps: list[tuple[str, str, str, str]] | None = None,
    age: timedelta | None = timedelta(minutes=1),
    name: str = "node-1",
) -> dict[str, Any]:
    """``pods``: (namespace/name, priority class, cpu, memory); ``host_apps``: (name, priority,
    cpu, memory)."""
    status: dict[str, Any] = {
        "nodeMetric": {"systemUsage": usage(*system_usage)},
        "podsMetric": [
            {
                "namespace": key.split("/")[0],
                "name": key.split("/")[1],
                "priority": prio,
                "podUsage": usage(c, m),
            }
            for key, prio, c, m in pods or []
        ],
    }
    if node_usage is not None:
        status["nodeMetric"]["nodeUsage"] = usage(*node_usage)
    if age is not None:
        status["updateTime"] = rfc3339(NOW - age)
    if prod_reclaimable is not None:
        status["prodReclaimableMetric"] = {"resource": usage(*prod_reclaimable)}
    if host_apps:
        status["hostApplicationMetric"] = [
            {"name": n, "priority": p, "usage": usage(c, m)} for n, p, c, m in host_apps
        ]
    return {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeMetric",
        "metadata": {"name": name},
        "status": status,
    }


def config_map(**data: Any) -> dict[str, Any]:
    """The ConfigMap with each keyword (``colocation_config=…``) as its JSON data key."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system"},
        "data": {
            k.replace("_", "-"): v if isinstance(v, str) else json.dumps(v) for k, v in data.items()
        },
    }
