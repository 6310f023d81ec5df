"""Objects as ``kubectl get -o yaml`` prints them, for descheduler tests.

Shaped after upstream's test helpers (``pkg/descheduler/test``): ``build_node(name, milli_cpu,
memory_bytes, pods)``, ``build_pod(name, milli_cpu, memory_bytes, node)`` with a ReplicaSet owner
unless told otherwise, and ``node_metric`` whose pod entries are, as upstream's
``setupNodeMetrics`` makes them, each pod's requests (overridable per pod).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

NOW = 1_800_000_000.0
"""The clock of every test (epoch seconds)."""


def ts(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_node(
    name: str,
    milli_cpu: int = 4000,
    memory: int = 3000,
    pods: int = 110,
    *,
    extra: Mapping[str, int] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    unschedulable: bool = False,
    ready: bool = True,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    alloc = {"cpu": f"{milli_cpu}m", "memory": str(memory), "pods": str(pods)}
    alloc.update({k: str(v) for k, v in (extra or {}).items()})
    spec: dict[str, Any] = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {
            "allocatable": alloc,
            "capacity": dict(alloc),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def build_pod(
    name: str,
    milli_cpu: int,
    memory: int,
    node: str,
    *,
    namespace: str = "default",
    owner: tuple[str, str, str] | None = ("ReplicaSet", "rs", "uid-rs"),
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    priority: int | None = None,
    qos_class: str | None = None,
    created: float = NOW - 3600,
    scheduler: str = "koord-scheduler",
    volumes: list[dict[str, Any]] | None = None,
    ready: bool = True,
    phase: str = "Running",
    extra: Mapping[str, int] | None = None,
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A running pod requesting ``milli_cpu`` and ``memory`` (and ``extra`` resources); with
    ``qos_class="BestEffort"`` and no cpu nor memory it requests nothing, as upstream's
    ``MakeBestEffortPod`` leaves it."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}",
        "labels": dict(labels or {}),
        "annotations": dict(annotations or {}),
        "creationTimestamp": ts(created),
    }
    if owner is not None:
        kind, oname, ouid = owner
        api = "v1" if kind == "ReplicationController" else "apps/v1"
        meta["ownerReferences"] = [
            {"apiVersion": api, "kind": kind, "name": oname, "uid": ouid, "controller": True}
        ]
    requests: dict[str, str] = {}
    if qos_class != "BestEffort" or milli_cpu or memory:
        requests = {"cpu": f"{milli_cpu}m", "memory": str(memory)}
    requests.update({k: str(v) for k, v in (extra or {}).items()})
    spec: dict[str, Any] = {
        "nodeName": node,
        "schedulerName": scheduler,
        "containers": [{"name": "main", "resources": {"requests": requests} if requests else {}}],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if priority is not None:
        spec["priority"] = priority
    if volumes:
        spec["volumes"] = volumes
    status: dict[str, Any] = {
        "phase": phase,
        "qosClass": qos_class or "Burstable",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def _milli(q: str) -> int:
    return int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)


def node_metric(
    node: str,
    pods: Iterable[Mapping[str, Any]] = (),
    *,
    system: Mapping[str, str] | None = None,
    usage: Mapping[str, Mapping[str, str]] | None = None,
    updated: float = NOW - 30,
) -> dict[str, Any]:
    """The NodeMetric of ``node``: one entry per pod of ``pods`` on that node, its usage its
    requests unless ``usage`` (by pod name) says otherwise; ``system`` the system usage."""
    entries = []
    node_usage: dict[str, int] = {"cpu": 0, "memory": 0}
    for p in pods:
        if p["spec"].get("nodeName") != node:
            continue
        name = p["metadata"]["name"]
        res = dict(
            (usage or {}).get(name) or p["spec"]["containers"][0]["resources"].get("requests") or {}
        )
        entries.append(
            {
                "namespace": p["metadata"]["namespace"],
                "name": name,
                "podUsage": {"resources": res},
            }
        )
        node_usage["cpu"] += _milli(str(res.get("cpu", "0")))
        node_usage["memory"] += int(str(res.get("memory", "0")))
    return {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeMetric",
        "metadata": {"name": node},
        "status": {
            "updateTime": ts(updated),
            "nodeMetric": {
                "nodeUsage": {
                    "resources": {
                        "cpu": f"{node_usage['cpu']}m",
                        "memory": str(node_usage["memory"]),
                    }
                },
                "systemUsage": {"resources": dict(system or {})},
            },
            "podsMetric": entries,
        },
    }


def replica_set(
    name: str = "rs", replicas: int = 10, uid: str = "uid-rs", namespace: str = "default"
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}},
    }


def pdb(
    name: str, match: Mapping[str, str], allowed: int, namespace: str = "default"
) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "generation": 1},
        "spec": {"selector": {"matchLabels": dict(match)}},
        "status": {"disruptionsAllowed": allowed, "observedGeneration": 1},
    }


def as_list(*objects: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": list(objects)}


def low_node_load_config(**args: Any) -> dict[str, Any]:
    """A DeschedulerConfiguration enabling LowNodeLoad with ``args`` (and a MigrationController
    with its defaults unless ``migration`` is given)."""
    migration = args.pop("migration", None)
    plugin_config: list[dict[str, Any]] = [{"name": "LowNodeLoad", "args": args}]
    if migration is not None:
        plugin_config.append({"name": "MigrationController", "args": migration})
    return {
        "apiVersion": "descheduler/v1alpha2",
        "kind": "DeschedulerConfiguration",
        "profiles": [
            {
                "name": "koord-descheduler",
                "plugins": {"balance": {"enabled": [{"name": "LowNodeLoad"}]}},
                "pluginConfig": plugin_config,
            }
        ],
    }
