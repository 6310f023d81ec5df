"""What the plugins read of a node's Koordinator objects: its NodeMetric (load-aware scheduling,
through the typed model of :mod:`apis.nodemetric`) and its NodeResourceTopology
(NodeNUMAResource: CPU topology, NUMA zones, topology policies, the kubelet's CPUs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from apis import nodemetric
from apis.cpulist import parse_cpulist
from apis.extension import ANNOTATION_CPU_TOPOLOGY
from apis.records import frozen
from apis.scheduling_keys import ANNOTATION_KUBELET_CPU_MANAGER_POLICY, ANNOTATION_POD_CPU_ALLOCS
from apis.slo import SchemaError
from scheduler_plugins.errors import InputError
from scheduler_plugins.objectfields import (
    ResourceList,
    as_list,
    as_map,
    as_str_map,
    parse_resource_list,
)


@frozen
class PodMetric:
    """One pod's entry of ``NodeMetric.status.podsMetric``."""

    key: str
    """``namespace/name``."""
    usage: ResourceList
    """``podUsage.resources``."""
    priority: str
    """``priority`` (the pod's priority class as the koordlet reported it)."""


@frozen
class NodeMetricInfo:
    """A NodeMetric's status, as load-aware scheduling reads it."""

    name: str
    """The node's name."""
    update_time: float | None
    """``status.updateTime`` in epoch seconds; ``None`` means never updated (expired)."""
    report_interval_s: float
    """``spec.metricCollectPolicy.reportIntervalSeconds`` (default 60)."""
    node_usage: ResourceList | None
    """``status.nodeMetric.nodeUsage.resources``; ``None`` without ``status.nodeMetric``."""
    aggregated: dict[float, dict[str, ResourceList]]
    """``aggregatedNodeUsages``: duration (s) → aggregation type (``p50``...) → usage."""
    pods: dict[str, PodMetric]
    """``status.podsMetric`` by ``namespace/name``."""


DEFAULT_REPORT_INTERVAL_S = 60.0
"""``NodeMetric.spec.metricCollectPolicy.reportIntervalSeconds`` when unset (Koordinator: 60)."""


def parse_node_metric(obj: Mapping[str, Any], source: str, where: str) -> NodeMetricInfo:
    """What load-aware scheduling reads of a NodeMetric, derived from the typed model
    (:func:`apis.nodemetric.parse_node_metric`). Raises :class:`InputError` naming the field."""
    try:
        metric = nodemetric.parse_node_metric(obj, source)
    except SchemaError as err:
        raise InputError(
            source, f"{where}.{err.field}" if err.field else where, err.message
        ) from err
    status = metric.status
    nm = status.node_metric
    policy = metric.collect_policy
    interval = policy.report_interval_seconds if policy is not None else None
    pods: dict[str, PodMetric] = {}
    for pm in status.pods_metric or ():
        key = f"{pm.namespace or 'default'}/{pm.name}"
        pods[key] = PodMetric(key, dict(pm.pod_usage.resources), pm.priority)
    return NodeMetricInfo(
        name=metric.name,
        update_time=None if status.update_time is None else status.update_time.timestamp(),
        report_interval_s=float(interval) if interval else DEFAULT_REPORT_INTERVAL_S,
        node_usage=None if nm is None else dict(nm.node_usage.resources),
        aggregated={}
        if nm is None
        else {
            a.duration_seconds: {kind: dict(rm.resources) for kind, rm in a.usage.items()}
            for a in nm.aggregated_node_usages
        },
        pods=pods,
    )


@frozen
class CPUInfo:
    """One logical CPU of ``node.koordinator.sh/cpu-topology``."""

    id: int
    core: int
    socket: int
    node: int


@frozen
class NUMAZone:
    """One ``type: Node`` zone of a NodeResourceTopology."""

    node: int
    """The NUMA node id (``node-1`` → 1)."""
    allocatable: ResourceList
    """The zone's ``allocatable`` (``capacity`` when absent) per resource."""


@frozen
class NRTInfo:
    """A NodeResourceTopology as NodeNUMAResource reads it."""

    name: str
    cpus: tuple[CPUInfo, ...]
    """``node.koordinator.sh/cpu-topology`` detail; empty when not reported."""
    zones: tuple[NUMAZone, ...]
    """NUMA node zones."""
    topology_policies: tuple[str, ...]
    """``topologyPolicies`` (kubelet topology manager policy names)."""
    reserved_cpus: frozenset[int]
    """``reservedCPUs`` of ``kubelet.koordinator.sh/cpu-manager-policy``."""
    kubelet_allocated: frozenset[int]
    """CPUs of ``node.koordinator.sh/pod-cpu-allocs`` (pods the kubelet's static policy pinned)."""
    kubelet_full_pcpus_only: bool
    """The kubelet's static CPU manager runs with ``full-pcpus-only=true``."""


def parse_nrt(obj: Mapping[str, Any], source: str, where: str) -> NRTInfo:
    """What NodeNUMAResource reads of a NodeResourceTopology: the CPU topology annotation, the
    ``type: Node`` zones, the topology policies and the kubelet's reserved and pinned CPUs."""
    meta = as_map(obj.get("metadata"), source, where + ".metadata")
    ann = as_str_map(meta.get("annotations"), source, where + ".metadata.annotations")
    cpus: list[CPUInfo] = []
    topo_key = ANNOTATION_CPU_TOPOLOGY
    if topo_key in ann:
        try:
            detail = json.loads(ann[topo_key]).get("detail") or []
            cpus = [
                CPUInfo(
                    int(c["id"]),
                    int(c.get("core", 0)),
                    int(c.get("socket", 0)),
                    int(c.get("node", 0)),
                )
                for c in detail
            ]
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise InputError(
                source, f"{where}.metadata.annotations[{topo_key}]", f"bad JSON: {err}"
            ) from err
    zones: list[NUMAZone] = []
    for i, z in enumerate(as_list(obj.get("zones"), source, where + ".zones")):
        zwhere = f"{where}.zones[{i}]"
        zone = as_map(z, source, zwhere)
        if zone.get("type") != "Node":
            continue
        zname = str(zone.get("name") or "")
        try:
            node_id = int(zname.rsplit("-", 1)[-1])
        except ValueError as err:
            raise InputError(source, zwhere + ".name", f"not node-<id>: {zname!r}") from err
        alloc: ResourceList = {}
        for j, r in enumerate(as_list(zone.get("resources"), source, zwhere + ".resources")):
            rr = as_map(r, source, f"{zwhere}.resources[{j}]")
            rname = str(rr.get("name") or "")
            q = rr.get("allocatable", rr.get("capacity"))
            if rname and q is not None:
                alloc.update(parse_resource_list({rname: q}, source, f"{zwhere}.resources[{j}]"))
        zones.append(NUMAZone(node_id, alloc))
    reserved: frozenset[int] = frozenset()
    full_only = False
    kpol_key = ANNOTATION_KUBELET_CPU_MANAGER_POLICY
    if kpol_key in ann:
        try:
            kpol = json.loads(ann[kpol_key])
            reserved = parse_cpulist(str(kpol.get("reservedCPUs") or ""))
            full_only = (
                kpol.get("policy") == "static"
                and str((kpol.get("options") or {}).get("full-pcpus-only")) == "true"
            )
        except (ValueError, AttributeError) as err:
            raise InputError(source, f"{where}.metadata.annotations[{kpol_key}]", str(err)) from err
    kubelet_alloc: set[int] = set()
    allocs_key = ANNOTATION_POD_CPU_ALLOCS
    if allocs_key in ann:
        try:
            for a in json.loads(ann[allocs_key]) or []:
                kubelet_alloc |= parse_cpulist(str(a.get("cpuset") or ""))
        except (ValueError, AttributeError, TypeError) as err:
            raise InputError(
                source, f"{where}.metadata.annotations[{allocs_key}]", str(err)
            ) from err
    return NRTInfo(
        name=str(meta.get("name") or ""),
        cpus=tuple(sorted(cpus, key=lambda c: c.id)),
        zones=tuple(sorted(zones, key=lambda z: z.node)),
        topology_policies=tuple(
            str(p)
            for p in as_list(obj.get("topologyPolicies"), source, where + ".topologyPolicies")
        ),
        reserved_cpus=reserved,
        kubelet_allocated=frozenset(kubelet_alloc),
        kubelet_full_pcpus_only=full_only,
    )
