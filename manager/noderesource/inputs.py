"""Compact, validated views of the objects the calculation reads: Node, NodeMetric and pods.

The raw API JSON (dicts, as the API server or a YAML file gives them) is read once into small
frozen records holding integers: CPU in milli-cores, memory in bytes. A missing or malformed
field that the calculation needs raises :class:`~manager.errors.InputError` naming the field
(``status.capacity.cpu: is required``); a field it can do without takes its Kubernetes default.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from apis import nodemetric
from apis.cpulist import parse_cpulist
from apis.extension import ANNOTATION_RESOURCE_STATUS, LABEL_POD_QOS
from apis.manager_keys import ANNOTATION_NODE_RESERVATION
from apis.nodemetric import NodeMetric, PodMetricInfo, ResourceMap
from apis.priority import pod_priority_class_with_default
from apis.quantity import int_value, milli_value, parse_quantity
from apis.records import frozen
from apis.slo import SchemaError
from manager.errors import InputError

CPU = "cpu"
MEMORY = "memory"
_QOS_NAMES = frozenset({"LSE", "LSR", "LS", "BE", "SYSTEM"})


@frozen
class Resources:
    """CPU (milli-cores) and memory (bytes)."""

    cpu: int = 0
    """Milli-cores."""
    memory: int = 0
    """Bytes."""

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu + other.cpu, self.memory + other.memory)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.cpu - other.cpu, self.memory - other.memory)

    def max(self, other: Resources) -> Resources:
        """Per-resource maximum (``quotav1.Max``)."""
        return Resources(max(self.cpu, other.cpu), max(self.memory, other.memory))

    def floor0(self) -> Resources:
        """Negative parts raised to zero."""
        return Resources(max(self.cpu, 0), max(self.memory, 0))

    def json(self) -> dict[str, int]:
        return {CPU: self.cpu, MEMORY: self.memory}


ZERO = Resources()


@frozen
class NodeView:
    """What the calculation needs of a Node."""

    name: str
    """metadata.name."""
    labels: Mapping[str, str]
    """metadata.labels."""
    annotations: Mapping[str, str]
    """metadata.annotations."""
    capacity: Resources
    """status.capacity (cpu, memory)."""
    allocatable: Resources
    """status.allocatable (cpu, memory); capacity where the node gives none."""
    extended: Mapping[str, int]
    """status.allocatable of every other resource, as integers (``kubernetes.io/batch-cpu`` …)."""


@frozen
class HostAppMetricView:
    """One ``status.hostApplicationMetric`` entry."""

    name: str
    """``name``."""
    priority: str
    """``priority`` class; may be empty."""
    usage: Resources
    """``usage.resources``."""


@frozen
class NodeMetricView:
    """What the calculation needs of a NodeMetric."""

    update_time: datetime | None
    """status.updateTime; None when absent (the calculation then degrades)."""
    node_usage: Resources | None
    """status.nodeMetric.nodeUsage.resources; None unless both cpu and memory are there."""
    system_usage: Resources
    """status.nodeMetric.systemUsage.resources (zero where absent)."""
    pods: tuple[PodMetricInfo, ...]
    """status.podsMetric, as the model holds them (:func:`usage_of` reads their usage)."""
    prod_reclaimable: Resources | None
    """status.prodReclaimableMetric.resource.resources; None when absent."""
    host_apps: tuple[HostAppMetricView, ...]
    """status.hostApplicationMetric."""


@frozen
class PodView:
    """What the calculation needs of a pod."""

    key: str
    """``namespace/name``."""
    node_name: str
    """spec.nodeName."""
    phase: str
    """status.phase (``Pending`` when absent, as for a pod just created)."""
    priority_class: str
    """Koordinator priority class: the ``koordinator.sh/priority-class`` label, else the band of
    spec.priority, else by the QoS class (``GetPodPriorityClassWithDefault``, ``apis.priority``)."""
    qos: str
    """Koordinator QoS class, from the ``koordinator.sh/qosClass`` label, else Kubernetes QoS."""
    request: Resources
    """Effective request: max(sum of containers, each init container) plus overhead."""
    numa_nodes: tuple[int, ...] = ()
    """NUMA node ids the scheduler allocated it (``scheduling.koordinator.sh/resource-status``
    ``numaNodeResources[].node``); empty when it shares every NUMA node or the annotation is
    absent or unreadable (upstream then takes it as sharing them all)."""


def _obj(value: object, source: str, path: str) -> Mapping[str, Any]:
    if type(value) is dict:
        return value
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(source, path, f"must be an object, got {type(value).__name__}")
    return value


def _str_map(value: object, source: str, path: str) -> Mapping[str, str]:
    obj = _obj(value, source, path)
    for k, v in obj.items():
        if not isinstance(v, str):
            raise InputError(source, f"{path}.{k}", "must be a string")
    return obj


def _resources(
    value: object, source: str, path: str, *, need: bool = False
) -> tuple[Resources, bool]:
    """(cpu, memory) of a ResourceList, and whether both were present."""
    obj = _obj(value, source, path)
    for name in (CPU, MEMORY):
        if need and name not in obj:
            raise InputError(source, f"{path}.{name}", "is required")
    try:
        cpu = milli_value(obj[CPU]) if CPU in obj else 0
    except ValueError as err:
        raise InputError(source, f"{path}.{CPU}", str(err)) from None
    try:
        mem = int_value(obj[MEMORY]) if MEMORY in obj else 0
    except ValueError as err:
        raise InputError(source, f"{path}.{MEMORY}", str(err)) from None
    return Resources(cpu, mem), CPU in obj and MEMORY in obj


def numa_nodes_of(annotations: object) -> tuple[int, ...]:
    """The NUMA nodes of a pod's ``resource-status`` annotation, as upstream's
    ``GetPodNUMARequestAndUsage`` reads them: an unreadable annotation counts as none (the pod
    then shares every NUMA node), entries without a whole ``node`` are skipped."""
    if not isinstance(annotations, Mapping):
        return ()
    raw = annotations.get(ANNOTATION_RESOURCE_STATUS)
    if not isinstance(raw, str) or not raw:
        return ()
    try:
        doc = json.loads(raw)
    except ValueError:
        return ()
    entries = doc.get("numaNodeResources") if isinstance(doc, Mapping) else None
    if not isinstance(entries, list):
        return ()
    nodes = []
    for entry in entries:
        node = entry.get("node") if isinstance(entry, Mapping) else None
        if isinstance(node, int) and not isinstance(node, bool):
            nodes.append(node)
    return tuple(nodes)


def parse_node(obj: object, source: str) -> NodeView:
    """A Node object. Raises :class:`InputError`."""
    node = _obj(obj, source, "")
    if node.get("kind", "Node") != "Node":
        raise InputError(source, "kind", f"must be Node, got {node.get('kind')!r}")
    meta = _obj(node.get("metadata"), source, "metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(source, "metadata.name", "is required")
    status = _obj(node.get("status"), source, "status")
    capacity, _ = _resources(status.get("capacity"), source, "status.capacity", need=True)
    alloc_raw = _obj(status.get("allocatable"), source, "status.allocatable")
    allocatable = capacity
    if alloc_raw:
        allocatable, _ = _resources(alloc_raw, source, "status.allocatable", need=True)
    extended: dict[str, int] = {}
    for res, q in alloc_raw.items():
        if res in (CPU, MEMORY):
            continue
        try:
            extended[str(res)] = int_value(q)
        except ValueError as err:
            raise InputError(source, f"status.allocatable.{res}", str(err)) from None
    return NodeView(
        name=name,
        labels=_str_map(meta.get("labels"), source, "metadata.labels"),
        annotations=_str_map(meta.get("annotations"), source, "metadata.annotations"),
        capacity=capacity,
        allocatable=allocatable,
        extended=extended,
    )


def annotation_reserved(node: NodeView) -> tuple[Resources, str]:
    """Resources the ``node.koordinator.sh/reservation`` annotation keeps back, and a note when
    the annotation is unreadable (then nothing is kept back, as upstream)."""
    raw = node.annotations.get(ANNOTATION_NODE_RESERVATION)
    if not raw:
        return ZERO, ""
    try:
        return _reservation(raw), ""
    except (ValueError, TypeError, InputError) as err:
        return ZERO, f"{ANNOTATION_NODE_RESERVATION} ignored: {err}"


def _reservation(raw: str) -> Resources:
    doc = json.loads(raw)
    if not isinstance(doc, Mapping):
        raise TypeError("not a JSON object")
    res, _ = _resources(doc.get("resources"), "", "resources")
    cpus = doc.get("reservedCPUs") or ""
    if cpus:
        res = Resources(len(parse_cpulist(str(cpus))) * 1000, res.memory)
    return res


def usage_of(rm: ResourceMap) -> Resources:
    """The CPU (milli-cores) and memory (bytes) of a NodeMetric ``ResourceMap``."""
    res = rm.resources
    return Resources(res.get(CPU, 0), res.get(MEMORY, 0))


def node_metric_view(metric: NodeMetric) -> NodeMetricView:
    """What the calculation reads of a NodeMetric, derived from the typed model."""
    status = metric.status
    nm = status.node_metric
    node_usage: Resources | None = None
    system_usage = ZERO
    if nm is not None:
        res = nm.node_usage.resources
        if CPU in res and MEMORY in res:
            node_usage = Resources(res[CPU], res[MEMORY])
        system_usage = usage_of(nm.system_usage)
    reclaim = status.prod_reclaimable_metric
    return NodeMetricView(
        update_time=status.update_time,
        node_usage=node_usage,
        system_usage=system_usage,
        pods=status.pods_metric or (),
        prod_reclaimable=None if reclaim is None else usage_of(reclaim),
        host_apps=tuple(
            HostAppMetricView(a.name, a.priority, usage_of(a.usage))
            for a in status.host_application_metric or ()
        ),
    )


def parse_node_metric(obj: object, source: str) -> NodeMetricView:
    """A NodeMetric object (:func:`apis.nodemetric.parse_node_metric`). Raises
    :class:`InputError`."""
    try:
        metric = nodemetric.parse_node_metric(obj, source)
    except SchemaError as err:
        raise InputError(err.source, err.field, err.message) from err
    return node_metric_view(metric)


def _list(value: object, source: str, path: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InputError(source, path, f"must be a list, got {type(value).__name__}")
    return value


def _container_requests(c: Mapping[str, Any], source: str, path: str) -> Resources:
    res = c.get("resources")
    if not res:
        return ZERO
    res = _obj(res, source, f"{path}.resources")
    req = _obj(res.get("requests"), source, f"{path}.resources.requests")
    lim = _obj(res.get("limits"), source, f"{path}.resources.limits")
    # The API server defaults a missing request to the limit; a file may not have been defaulted.
    merged = {k: req.get(k, lim.get(k)) for k in (CPU, MEMORY) if k in req or k in lim}
    return _resources(merged, source, f"{path}.resources.requests")[0]


def _kube_qos(spec: Mapping[str, Any], status: Mapping[str, Any]) -> str:
    given = status.get("qosClass")
    if isinstance(given, str) and given:
        return given
    any_set, guaranteed = False, True
    for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        res = c.get("resources") or {} if isinstance(c, Mapping) else {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            any_set = True
        for k in (CPU, MEMORY):
            if k not in lim or (k in req and parse_quantity(req[k]) != parse_quantity(lim[k])):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


_EMPTY: Mapping[str, Any] = {}

# The fast path builds the two records a pass makes for every pod of the cluster without the
# frozen dataclass __init__ (one object.__setattr__ a field): each slot is filled directly, as
# apis.nodemetric's reader does. The same objects for about half the cost (0.7 us less a pod).
_new = object.__new__
_set_cpu = Resources.__dict__["cpu"].__set__
_set_memory = Resources.__dict__["memory"].__set__
_set_key = PodView.__dict__["key"].__set__
_set_node_name = PodView.__dict__["node_name"].__set__
_set_phase = PodView.__dict__["phase"].__set__
_set_priority_class = PodView.__dict__["priority_class"].__set__
_set_qos = PodView.__dict__["qos"].__set__
_set_request = PodView.__dict__["request"].__set__
_set_numa_nodes = PodView.__dict__["numa_nodes"].__set__


def _fast_pod(pod: Any) -> PodView:
    """The common shape (app containers only, requests as strings) without per-field checks;
    anything unexpected raises and the checked path takes over."""
    spec, meta = pod["spec"], pod["metadata"]
    status = pod.get("status") or _EMPTY
    if spec.get("initContainers") or spec.get("overhead"):
        raise LookupError("not the common shape")
    cpu = mem = 0
    for c in spec.get("containers") or ():
        res = c.get("resources")
        if not res:
            continue
        req = res.get("requests") or _EMPTY
        lim = res.get("limits") or _EMPTY
        q = req.get(CPU, lim.get(CPU))
        if q is not None:
            cpu += milli_value(q)
        q = req.get(MEMORY, lim.get(MEMORY))
        if q is not None:
            mem += int_value(q)
    labels = meta.get("labels") or _EMPTY
    qos = labels.get(LABEL_POD_QOS, "")
    if qos not in _QOS_NAMES:
        qos = "BE" if _kube_qos(spec, status) == "BestEffort" else "LS"
    priority_class = pod_priority_class_with_default(labels, spec.get("priority"), qos)
    annotations = meta.get("annotations")  # most pods have none: no NUMA placement to read
    request = _new(Resources)
    _set_cpu(request, cpu)
    _set_memory(request, mem)
    view = _new(PodView)
    _set_key(view, f"{meta.get('namespace') or ''}/{meta.get('name') or ''}")
    _set_node_name(view, str(spec.get("nodeName") or ""))
    _set_phase(view, str(status.get("phase") or "Pending"))
    _set_priority_class(view, priority_class)
    _set_qos(view, qos)
    _set_request(view, request)
    _set_numa_nodes(view, numa_nodes_of(annotations) if annotations else ())
    return view


def parse_pod(obj: object, source: str, path: str) -> PodView:
    """One pod of a list. Raises :class:`InputError`."""
    try:
        return _fast_pod(obj)
    except (LookupError, AttributeError, TypeError, ValueError):
        pass  # the checked path below names the field at fault
    return _checked_pod(obj, source, path)


def _checked_pod(obj: object, source: str, path: str) -> PodView:
    """Any shape, every field checked: an error names the field at fault."""
    pod = _obj(obj, source, path)
    meta = _obj(pod.get("metadata"), source, f"{path}.metadata")
    spec = _obj(pod.get("spec"), source, f"{path}.spec")
    status = _obj(pod.get("status"), source, f"{path}.status")
    labels = meta.get("labels") or {}
    total = ZERO
    for i, c in enumerate(_list(spec.get("containers"), source, f"{path}.spec.containers")):
        total = total + _container_requests(c, source, f"{path}.spec.containers[{i}]")
    init_max, sidecars = ZERO, ZERO
    inits = _list(spec.get("initContainers"), source, f"{path}.spec.initContainers")
    for i, c in enumerate(inits):
        req = _container_requests(c, source, f"{path}.spec.initContainers[{i}]")
        if c.get("restartPolicy") == "Always":  # a sidecar runs beside the app containers
            sidecars = sidecars + req
            init_max = init_max.max(sidecars)
        else:
            init_max = init_max.max(req + sidecars)
    request = (total + sidecars).max(init_max)
    overhead = spec.get("overhead")
    if overhead:
        request = request + _resources(overhead, source, f"{path}.spec.overhead")[0]
    if not isinstance(labels, Mapping):
        labels = _EMPTY
    qos = labels.get(LABEL_POD_QOS, "")
    if qos not in _QOS_NAMES:
        qos = "BE" if _kube_qos(spec, status) == "BestEffort" else "LS"
    priority_class = pod_priority_class_with_default(labels, spec.get("priority"), qos)
    return PodView(
        key=f"{meta.get('namespace') or ''}/{meta.get('name') or ''}",
        node_name=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        priority_class=priority_class,
        qos=qos,
        request=request,
        numa_nodes=numa_nodes_of(meta.get("annotations")),
    )


def parse_pod_list(obj: object, source: str) -> tuple[PodView, ...]:
    """A v1 PodList (``items``) or a plain list of pods. Raises :class:`InputError`."""
    if isinstance(obj, list):
        items: Sequence[Any] = obj
    else:
        doc = _obj(obj, source, "")
        if doc.get("kind") not in (None, "PodList", "List"):
            raise InputError(source, "kind", f"must be PodList, got {doc.get('kind')!r}")
        items = _list(doc.get("items"), source, "items")
    views: list[PodView] = []
    for i, item in enumerate(items):
        try:
            views.append(_fast_pod(item))
            continue
        except (LookupError, AttributeError, TypeError, ValueError):
            pass  # the checked path below names the field at fault (only it needs the path)
        views.append(_checked_pod(item, source, f"items[{i}]"))
    return tuple(views)


def topology_annotations(obj: object, source: str) -> Mapping[str, str]:
    """The annotations of a NodeResourceTopology (where the koordlet reports the node's CPU
    basic info)."""
    meta = _obj(_obj(obj, source, "").get("metadata"), source, "metadata")
    return _str_map(meta.get("annotations"), source, "metadata.annotations")
