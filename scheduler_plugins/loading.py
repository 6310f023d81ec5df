"""Loading a snapshot from objects as ``kubectl get -o yaml`` prints them (a v1 ``List``, or a
YAML stream of objects), and a pod from a file.

Kinds read: Node, Pod, NodeMetric, NodeResourceTopology, ElasticQuota, ElasticQuotaProfile,
PodGroup, Reservation, Device, Namespace, PersistentVolumeClaim, PersistentVolume,
PodDisruptionBudget; any other kind is ignored (a ``kubectl get all`` dump works). Pods in phase
Succeeded or Failed hold nothing and are dropped. A Pod with ``spec.nodeName`` is assigned to that
node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from scheduler_plugins.clusterobjects import (
    parse_budget,
    parse_claim,
    parse_namespace_labels,
    parse_volume,
)
from scheduler_plugins.errors import InputError
from scheduler_plugins.nodeviews import parse_node_metric, parse_nrt
from scheduler_plugins.objectfields import as_list, as_map
from scheduler_plugins.snapshot import PodInfo, Snapshot, parse_node, parse_pod


def load_objects(path: Path) -> list[dict[str, Any]]:
    """The objects of a YAML or JSON file: the items of a ``List``, or each document of a stream.
    Raises :class:`InputError` naming the file."""
    source = str(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise InputError(source, "", f"cannot read: {err.strerror or err}") from err
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise InputError(source, "", f"not YAML: {err}") from err
    objects: list[dict[str, Any]] = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise InputError(source, f"document {i}", "must be an object")
        if str(doc.get("kind", "")).endswith("List") and "items" in doc:
            for j, item in enumerate(as_list(doc.get("items"), source, "items")):
                if not isinstance(item, dict):
                    raise InputError(source, f"items[{j}]", "must be an object")
                objects.append(item)
        else:
            objects.append(doc)
    return objects


def build_snapshot(objects: Sequence[Mapping[str, Any]], source: str = "<snapshot>") -> Snapshot:
    """A :class:`Snapshot` from objects. Raises :class:`InputError` naming the bad field
    (``items[3].status.allocatable.cpu``)."""
    snap = Snapshot()
    pods: list[PodInfo] = []
    # Nodes first, as the informers list them (one kind per list): their objects then lie
    # side by side in memory, and a pass over thousands of nodes (each filter and score of
    # every pod) touches a few pages instead of one a node, as it does when they are
    # interleaved with their pods' objects (2x slower over 5,000 nodes: bench.scheduler_scale)
    order = sorted(range(len(objects)), key=lambda i: objects[i].get("kind") != "Node")
    for i in order:
        obj = objects[i]
        where = f"items[{i}]"
        kind = obj.get("kind")
        meta = as_map(obj.get("metadata"), source, where + ".metadata")
        name = str(meta.get("name") or "")
        if (
            kind
            in (
                "Node",
                "Pod",
                "NodeMetric",
                "NodeResourceTopology",
                "ElasticQuota",
                "ElasticQuotaProfile",
                "PodGroup",
                "Reservation",
                "Device",
                "Namespace",
                "PersistentVolumeClaim",
                "PersistentVolume",
                "PodDisruptionBudget",
            )
            and not name
        ):
            raise InputError(source, where + ".metadata.name", f"a {kind} needs a name")
        if kind == "Node":
            snap.nodes[name] = parse_node(obj, source, where)
        elif kind == "Pod":
            phase = as_map(obj.get("status"), source, where + ".status").get("phase")
            if phase in ("Succeeded", "Failed"):
                continue
            pods.append(parse_pod(obj, source, where))
        elif kind == "NodeMetric":
            snap.node_metrics[name] = parse_node_metric(obj, source, where)
        elif kind == "NodeResourceTopology":
            snap.topologies[name] = parse_nrt(obj, source, where)
        elif kind == "ElasticQuota":
            snap.quotas[name] = dict(obj)
        elif kind == "PodGroup":
            snap.pod_groups[f"{meta.get('namespace') or 'default'}/{name}"] = dict(obj)
        elif kind == "Reservation":
            snap.reservations[name] = dict(obj)
        elif kind == "ElasticQuotaProfile":
            snap.quota_profiles[f"{meta.get('namespace') or 'default'}/{name}"] = dict(obj)
        elif kind == "Device":
            snap.devices[name] = dict(obj)
        elif kind == "Namespace":
            snap.namespaces[name] = parse_namespace_labels(obj, source, where)
        elif kind == "PersistentVolumeClaim":
            claim = parse_claim(obj, source, where)
            snap.claims[claim.key] = claim
        elif kind == "PersistentVolume":
            snap.volumes[name] = parse_volume(obj, source, where)
        elif kind == "PodDisruptionBudget":
            budget = parse_budget(obj, source, where)
            snap.budgets[f"{budget.namespace}/{budget.name}"] = budget
    for pod in pods:
        node = snap.nodes.get(pod.node_name)
        if node is not None:
            node.add_pod(pod)
        elif not pod.node_name:
            snap.pending_pods[pod.uid] = pod
    return snap


def load_snapshot(path: Path) -> Snapshot:
    """:func:`build_snapshot` over :func:`load_objects`."""
    return build_snapshot(load_objects(path), str(path))


def load_pod(path: Path) -> PodInfo:
    """The one Pod of a file. Raises :class:`InputError` naming the file and field."""
    objects = load_objects(path)
    pods = [o for o in objects if o.get("kind", "Pod") == "Pod"]
    if len(pods) != 1:
        raise InputError(str(path), "kind", f"expected exactly one Pod, found {len(pods)}")
    return parse_pod(pods[0], str(path))
