"""Batch resources per NUMA zone, onto the node's NodeResourceTopology.

Koordinator's node resource controller (``plugins/batchresource/plugin.go``,
``calculateOnNUMALevel`` and ``prepareForNodeResourceTopology``; the helpers in
``plugins/util/util.go``) computes ``kubernetes.io/batch-cpu`` and ``kubernetes.io/batch-memory``
for each zone of the node's NodeResourceTopology (the koordlet's ``node-<id>`` zones with their
``cpu`` and ``memory`` allocatable) with the node formula (docs/manager.md, "NUMA zones"):

- the zone's capacity is its ``cpu`` and ``memory`` allocatable; its safety margin that capacity
  times ``(100 - reclaimThresholdPercent) / 100``;
- as NUMA-level metrics are not reported, the node's system usage (NodeMetric ``systemUsage``
  plus high-priority host applications), its reservation (``max(kubelet, annotation)``) and the
  usage of metrics without a pod are divided evenly over the zones, rounding each share up to a
  whole milli-unit (``DivideResourceList``);
- a pod's request and usage go to the NUMA nodes of its ``resource-status`` (divided evenly
  among them), or evenly to every zone when it has none; zone ``i`` is NUMA node ``i``;
- HP pods count as at node level (usage; request without a metric; LSE CPU by request) and the
  policies (``cpuCalculatePolicy``, ``memoryCalculatePolicy``) pick among usage, request and
  max(usage, request); no ``batch*ThresholdPercent`` cap applies per zone, as upstream.

:func:`update_zones` merges the result into the object's zones (``UpdateNRTZoneListIfNeeded``):
batch-cpu amplified by the CPU normalization ratio above 1, each of capacity, allocatable and
available replaced only when it moved by more than ``resourceDiffThreshold``, a missing
resource appended (resources kept in name order), the batch resources of a zone without a result
set to zero. Everything else on the object is left as it is.

Arithmetic is in milli-units, memory included, as upstream's quantities divide: a zone's batch
memory may carry milli-bytes (``"1073741823500m"``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from apis.configuration import CalculatePolicy, ColocationStrategy
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY, EXTENDED_RESOURCE_FORMATS
from apis.priority import PRIORITY_BATCH, PRIORITY_FREE
from apis.quantity import Quantity, milli_value
from apis.records import frozen
from manager.noderesource.batch import host_app_usage, node_reserved
from manager.noderesource.inputs import (
    CPU,
    MEMORY,
    ZERO,
    NodeMetricView,
    NodeView,
    PodView,
    Resources,
    usage_of,
)

ZONE_RESOURCES = (BATCH_CPU, BATCH_MEMORY)
"""The zone resources this controller owns (upstream's ``updateNRTResourceSet``)."""
_LOW_PRIORITY = frozenset({PRIORITY_BATCH, PRIORITY_FREE})
_ACTIVE_PHASES = frozenset({"Running", "Pending"})

Obj = dict[str, Any]


@frozen
class Zone:
    """One zone of the NodeResourceTopology, as the calculation reads it."""

    name: str
    """``zones[].name`` (``node-0``)."""
    allocatable: Resources
    """Its ``cpu`` (milli-cores) and ``memory`` (milli-bytes) allocatable; 0 where absent."""


@frozen
class ZoneBatch:
    """A zone's batch resources before CPU normalization."""

    cpu: int
    """batch-cpu in milli-cores (written as that count)."""
    memory_milli: int
    """batch-memory in milli-bytes."""


def _milli(r: Resources) -> Resources:
    """CPU milli-cores and memory bytes → both in milli-units."""
    return Resources(r.cpu, r.memory * 1000)


def _divide(r: Resources, n: int) -> Resources:
    """Each part divided by ``n``, rounded up to a whole milli-unit (``DivideResourceList``)."""
    if n == 0:
        return r
    return Resources(-(-r.cpu // n), -(-r.memory // n))


def read_zones(nrt: Mapping[str, Any]) -> tuple[Zone, ...] | None:
    """The zones of a NodeResourceTopology; None unless a zone has ``cpu`` or ``memory``
    (upstream's ``isNRTResourcesCreated``: the koordlet has not reported yet). Raises
    ``ValueError`` for an allocatable that is not a quantity."""
    zones = []
    found = False
    for zone in nrt.get("zones") or ():
        alloc = {CPU: 0, MEMORY: 0}
        for res in zone.get("resources") or ():
            name = res.get("name")
            if name in alloc:
                found = True
                alloc[name] = milli_value(res.get("allocatable", 0))
        zones.append(Zone(str(zone.get("name") or ""), Resources(alloc[CPU], alloc[MEMORY])))
    return tuple(zones) if found else None


def _share(pod: PodView, amount: Resources, zone_num: int) -> list[Resources]:
    """``GetPodNUMARequestAndUsage``: ``amount`` over the pod's NUMA nodes, else over all."""
    allocated = set(pod.numa_nodes)
    count = sum(1 for n in pod.numa_nodes if 0 <= n < zone_num)
    if count <= 0:
        each = _divide(amount, zone_num)
        return [each] * zone_num
    each = _divide(amount, count)
    return [each if i in allocated else ZERO for i in range(zone_num)]


def _safety_margin(strategy: ColocationStrategy, alloc: Resources) -> Resources:
    """``GetNodeSafetyMargin`` of a zone: milli-cores times the ratio truncated, memory bytes
    (``Value()``, rounded up) times the ratio truncated to a whole byte."""
    cpu_ratio = float(100 - strategy.cpu_reclaim_threshold_percent) / 100.0
    mem_ratio = float(100 - strategy.memory_reclaim_threshold_percent) / 100.0
    mem_bytes = -(-alloc.memory // 1000)
    return Resources(int(float(alloc.cpu) * cpu_ratio), int(float(mem_bytes) * mem_ratio) * 1000)


def calculate_zones(
    strategy: ColocationStrategy,
    node: NodeView,
    metric: NodeMetricView,
    pods: Sequence[PodView],
    zones: Sequence[Zone],
) -> dict[str, ZoneBatch]:
    """Zone name → batch resources, before CPU normalization (see the module docstring)."""
    n = len(zones)
    if n == 0:
        return {}
    host_used, _ = host_app_usage(metric, PRIORITY_BATCH, record=False)
    system_share = _divide(_milli(metric.system_usage + host_used), n)
    reserved_share = _divide(_milli(node_reserved(node)[2]), n)
    requested = [ZERO] * n
    used = [ZERO] * n
    max_used_req = [ZERO] * n
    metrics = {f"{pm.namespace}/{pm.name}": pm for pm in metric.pods}
    for pod in pods:
        if pod.node_name and pod.node_name != node.name:
            continue
        if pod.phase not in _ACTIVE_PHASES:
            continue
        pm = metrics.pop(pod.key, None)
        if pod.priority_class in _LOW_PRIORITY:
            continue
        req = _share(pod, _milli(pod.request), n)
        if pm is None:
            as_used = as_mur = req
        else:
            use = _share(pod, _milli(usage_of(pm.pod_usage)), n)
            if pod.qos == "LSE":  # LSE CPUs are never reclaimed: CPU by request
                as_used = [Resources(r.cpu, u.memory) for r, u in zip(req, use, strict=True)]
            else:
                as_used = use
            as_mur = [u.max(r) for r, u in zip(req, use, strict=True)]
        for i in range(n):
            requested[i] += req[i]
            used[i] += as_used[i]
            max_used_req[i] += as_mur[i]
    for pm in metrics.values():  # metrics without a pod in the list
        if pm.priority in _LOW_PRIORITY:
            continue
        share = _divide(_milli(usage_of(pm.pod_usage)), n)
        for i in range(n):
            used[i] += share
            max_used_req[i] += share
    out = {}
    for i, zone in enumerate(zones):
        cap = zone.allocatable
        base = cap - _safety_margin(strategy, cap)
        sys_or_res = system_share.max(reserved_share)
        by_usage = (base - sys_or_res - used[i]).floor0()
        by_request = (base - reserved_share - requested[i]).floor0()
        by_mur = (base - sys_or_res - max_used_req[i]).floor0()
        cpu_policy = strategy.cpu_calculate_policy
        cpu = by_mur.cpu if cpu_policy is CalculatePolicy.MAX_USAGE_REQUEST else by_usage.cpu
        memory = {
            CalculatePolicy.USAGE: by_usage.memory,
            CalculatePolicy.REQUEST: by_request.memory,
            CalculatePolicy.MAX_USAGE_REQUEST: by_mur.memory,
        }[strategy.memory_calculate_policy]
        out[zone.name] = ZoneBatch(cpu, memory)
    return out


def zone_quantities(batch: ZoneBatch, ratio: float | None) -> dict[str, Quantity]:
    """The zone's resource quantities as written: batch-cpu the count of milli-cores, times the
    normalization ratio above 1 (``MultiplyMilliQuant``: milli-units truncated); batch-memory
    in bytes (``BinarySI``)."""
    cpu_milli = batch.cpu * 1000
    if ratio is not None and ratio > 1.0:
        cpu_milli = int(float(cpu_milli) * ratio)
    return {
        BATCH_CPU: Quantity(Fraction(cpu_milli, 1000), EXTENDED_RESOURCE_FORMATS[BATCH_CPU]),
        BATCH_MEMORY: Quantity(
            Fraction(batch.memory_milli, 1000), EXTENDED_RESOURCE_FORMATS[BATCH_MEMORY]
        ),
    }


def _moved(old: object, new: Quantity, threshold: float) -> bool:
    """``IsQuantityDiff``: |new - old| > old x threshold, in milli-units."""
    try:
        old_milli = milli_value(old)
    except ValueError:
        return True
    return abs(new.milli_value - old_milli) > old_milli * threshold


_FIELDS = ("capacity", "allocatable", "available")


def update_zones(
    nrt: Mapping[str, Any],
    batches: Mapping[str, ZoneBatch],
    ratio: float | None,
    diff_threshold: float,
) -> tuple[Obj, bool]:
    """``nrt`` with the zones' batch resources merged in, and whether anything moved by more
    than ``diff_threshold`` (see the module docstring)."""
    out: Obj = copy.deepcopy(dict(nrt))
    changed = False
    for zone in out.get("zones") or ():
        resources: list[Obj] = zone.setdefault("resources", [])
        batch = batches.get(str(zone.get("name") or ""))
        if batch is None:  # no result for the zone: its batch resources go to zero
            for res in resources:
                if res.get("name") in ZONE_RESOURCES and any(
                    milli_value(res.get(f, 0)) != 0 for f in _FIELDS
                ):
                    res.update(dict.fromkeys(_FIELDS, "0"))
                    changed = True
            continue
        for name, quantity in zone_quantities(batch, ratio).items():
            text = str(quantity)
            entry = next((r for r in resources if r.get("name") == name), None)
            if entry is None:
                resources.append({"name": name, **dict.fromkeys(_FIELDS, text)})
                resources.sort(key=lambda r: str(r.get("name") or ""))
                changed = True
                continue
            for f in _FIELDS:
                if _moved(entry.get(f, "0"), quantity, diff_threshold):
                    entry[f] = text
                    changed = True
    return out, changed


def zone_values(nrt: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Zone name → batch resource → its allocatable in milli-units, as written on ``nrt``."""
    out: dict[str, dict[str, int]] = {}
    for zone in nrt.get("zones") or ():
        for res in zone.get("resources") or ():
            if res.get("name") in ZONE_RESOURCES:
                out.setdefault(str(zone.get("name")), {})[str(res["name"])] = milli_value(
                    res.get("allocatable", 0)
                )
    return out
