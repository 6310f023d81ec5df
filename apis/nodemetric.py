"""NodeMetric (``slo.koordinator.sh/v1alpha1``): the one typed model the koordlet writes and the
manager and the scheduler read.

The fields follow the CRD (``packaging/kubernetes/crds/slo.koordinator.sh_nodemetrics.yaml``,
upstream ``apis/slo/v1alpha1/nodemetric_types.go``). :func:`parse_node_metric` reads a NodeMetric
object (``kind`` may be absent) and :func:`parse_node_metric_status` its status alone; both raise
:class:`~apis.slo.SchemaError` naming the source and the field path
(``status.podsMetric[3].podUsage.resources.cpu: not a Kubernetes quantity: 'x'``).
:func:`node_metric_status_json` and :func:`node_metric_json` write it back.

Two representation choices, both the ones every reader upstream makes:

- A ``ResourceList`` holds each quantity as Koordinator's ``getResourceValue`` reads it
  (:func:`apis.quantity.resource_value`): ``cpu`` in milli-cores, every other resource by
  ``Value()`` (bytes, counts). The writer prints ``cpu`` as ``NewMilliQuantity(v, DecimalSI)``,
  memory-like resources as ``NewQuantity(v, BinarySI)`` and the rest as DecimalSI, as the Go
  koordlet does, so what is written parses back equal.
- ``devices`` of a ``ResourceMap`` (GPU and RDMA inventories) and a pod metric's ``extensions``
  are kept as read-only JSON (:func:`apis.slo.freeze`): nothing here interprets them.

Times are ``metav1.Time``: RFC 3339, whole seconds. Durations are ``metav1.Duration`` (Go's
duration strings, :mod:`apis.duration`), held in seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from apis.duration import format_duration, parse_duration
from apis.groups import SLO_API_VERSION
from apis.quantity import (
    Format,
    format_milli,
    format_quantity,
    int_value,
    milli_value,
    resource_value,
)
from apis.records import frozen
from apis.slo import SchemaError, freeze, thaw
from apis.timestamp import TimestampError, format_time, parse_time_datetime

KIND = "NodeMetric"
API_VERSION = SLO_API_VERSION

ResourceList = Mapping[str, int]
"""Resource name → value in ``getResourceValue`` units (``cpu`` milli-cores, memory bytes)."""

_EMPTY_RESOURCES: ResourceList = MappingProxyType({})
_EMPTY_OBJECT: Mapping[str, Any] = MappingProxyType({})
_BINARY_RESOURCES = ("memory", "ephemeral-storage")


@frozen
class ResourceMap:
    """``ResourceMap``: ``{"resources": {...}, "devices": [...]}``."""

    resources: ResourceList = field(default_factory=lambda: _EMPTY_RESOURCES)
    """``resources``; empty when absent."""
    devices: tuple[Mapping[str, Any], ...] = ()
    """``devices`` (``DeviceInfo``), as read-only JSON."""


EMPTY_RESOURCE_MAP = ResourceMap()


@frozen
class AggregatedUsage:
    """One ``aggregatedNodeUsages`` (or ``aggregatedSystemUsages``) entry."""

    duration_seconds: float
    """``duration`` (a Go duration, ``"5m0s"``) in seconds."""
    usage: Mapping[str, ResourceMap]
    """``usage``: aggregation type (``avg``, ``p50``, ``p90``, ``p95``, ``p99``) → usage; an
    empty map for a type means too few samples."""


@frozen
class NUMAMetric:
    """One ``numaUsages`` entry."""

    numa_node_id: int
    """``numaNodeID``."""
    node_usage: ResourceMap = EMPTY_RESOURCE_MAP
    """``nodeUsage``."""
    system_usage: ResourceMap | None = None
    """``systemUsage``; None when absent."""


@frozen
class NodeMetricInfo:
    """``status.nodeMetric``."""

    node_usage: ResourceMap = EMPTY_RESOURCE_MAP
    """``nodeUsage``: the node's average usage over ``aggregateDurationSeconds``."""
    system_usage: ResourceMap = EMPTY_RESOURCE_MAP
    """``systemUsage``: the node's usage outside pods."""
    aggregated_node_usages: tuple[AggregatedUsage, ...] = ()
    """``aggregatedNodeUsages``."""
    aggregated_system_usages: tuple[AggregatedUsage, ...] = ()
    """``aggregatedSystemUsages``."""
    numa_usages: tuple[NUMAMetric, ...] = ()
    """``numaUsages``; written only when not empty."""


@frozen
class PodMetricInfo:
    """One ``status.podsMetric`` entry."""

    namespace: str
    """``namespace``."""
    name: str
    """``name``."""
    pod_usage: ResourceMap = EMPTY_RESOURCE_MAP
    """``podUsage``."""
    priority: str = ""
    """``priority``: the pod's Koordinator priority class as the koordlet saw it."""
    qos: str = ""
    """``qos``: the pod's Koordinator QoS class."""
    extensions: Mapping[str, Any] | None = None
    """``extensions`` (third-party data), as read-only JSON; None when absent."""


@frozen
class HostApplicationMetricInfo:
    """One ``status.hostApplicationMetric`` entry."""

    name: str
    """``name`` (the NodeSLO's host application)."""
    usage: ResourceMap = EMPTY_RESOURCE_MAP
    """``usage``."""
    priority: str = ""
    """``priority`` class."""
    qos: str = ""
    """``qos`` class."""


@frozen
class NodeMetricStatus:
    """``status``."""

    update_time: datetime | None = None
    """``updateTime`` (aware, whole seconds); None when never reported."""
    node_metric: NodeMetricInfo | None = None
    """``nodeMetric``; None when absent."""
    pods_metric: tuple[PodMetricInfo, ...] | None = None
    """``podsMetric``; None when absent (written as given: ``[]`` stays ``[]``)."""
    host_application_metric: tuple[HostApplicationMetricInfo, ...] | None = None
    """``hostApplicationMetric``; None when absent."""
    prod_reclaimable_metric: ResourceMap | None = None
    """``prodReclaimableMetric.resource``; None when absent (nothing reclaimable)."""
    prod_peak_metric: ResourceMap | None = None
    """``prodPeakMetric.resource``; None when absent."""


@frozen
class NodeMetricCollectPolicy:
    """``spec.metricCollectPolicy``; a None field is unset (the koordlet's default applies)."""

    aggregate_duration_seconds: int | None = None
    """``aggregateDurationSeconds``."""
    report_interval_seconds: int | None = None
    """``reportIntervalSeconds``."""
    node_aggregate_durations: tuple[str, ...] | None = None
    """``nodeAggregatePolicy.durations`` (Go duration strings, as written)."""
    node_memory_collect_policy: str | None = None
    """``nodeMemoryCollectPolicy`` (``usageWithoutPageCache``...)."""


@frozen
class NodeMetric:
    """A NodeMetric object."""

    name: str
    """``metadata.name``: the node's name."""
    collect_policy: NodeMetricCollectPolicy | None = None
    """``spec.metricCollectPolicy``; None when absent."""
    status: NodeMetricStatus = field(default_factory=NodeMetricStatus)
    """``status``."""


# Reading ---------------------------------------------------------------------------------------


# The fast paths build the two records a NodeMetric has hundreds of without the frozen
# dataclass __init__ (which sets each field through object.__setattr__): every slot is filled
# directly with a value already checked. The same objects for a third of the cost.
_new = object.__new__
_set_resources = ResourceMap.__dict__["resources"].__set__
_set_devices = ResourceMap.__dict__["devices"].__set__
_set_namespace = PodMetricInfo.__dict__["namespace"].__set__
_set_name = PodMetricInfo.__dict__["name"].__set__
_set_pod_usage = PodMetricInfo.__dict__["pod_usage"].__set__
_set_priority = PodMetricInfo.__dict__["priority"].__set__
_set_qos = PodMetricInfo.__dict__["qos"].__set__
_set_extensions = PodMetricInfo.__dict__["extensions"].__set__


def _fast_resource_map(value: Any) -> ResourceMap:
    """The common shape, ``{"resources": {...}}`` of strings, without building field paths;
    anything else raises and the checked path takes over (and names the field)."""
    if type(value) is not dict or len(value) != 1:
        raise TypeError("not the common shape")
    raw = value["resources"]
    if type(raw) is not dict:
        raise TypeError("not the common shape")
    rm = _new(ResourceMap)
    _set_resources(rm, {k: milli_value(v) if k == "cpu" else int_value(v) for k, v in raw.items()})
    _set_devices(rm, ())
    return rm


def _fast_pod_metric(item: Any) -> PodMetricInfo:
    if type(item) is not dict or "extensions" in item:
        raise TypeError("not the common shape")
    ns, name = item["namespace"], item["name"]
    prio, qos = item.get("priority") or "", item.get("qos") or ""
    if type(ns) is not str or type(name) is not str or type(prio) is not str:
        raise TypeError("not the common shape")
    if type(qos) is not str:
        raise TypeError("not the common shape")
    pm = _new(PodMetricInfo)
    _set_namespace(pm, ns)
    _set_name(pm, name)
    _set_pod_usage(pm, _fast_resource_map(item["podUsage"]))
    _set_priority(pm, prio)
    _set_qos(pm, qos)
    _set_extensions(pm, None)
    return pm


class _Reader:
    """Typed field access that raises :class:`SchemaError` with the source and the path."""

    __slots__ = ("source",)

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, message: str) -> SchemaError:
        return SchemaError(message, source=self.source, field=path)

    def obj(self, value: object, path: str) -> Mapping[str, Any]:
        if value is None:
            return _EMPTY_OBJECT
        if not isinstance(value, Mapping):
            raise self.fail(path, f"must be an object, got {type(value).__name__}")
        return value

    def items(self, value: object, path: str) -> Sequence[Any]:
        if value is None:
            return ()
        if not isinstance(value, list | tuple):
            raise self.fail(path, f"must be a list, got {type(value).__name__}")
        return value

    def string(self, value: object, path: str) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.fail(path, f"must be a string, got {value!r}")
        return value

    def integer(self, value: object, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"must be an integer, got {value!r}")
        return value

    def resources(self, value: object, path: str) -> ResourceList:
        out: dict[str, int] = {}
        for name, quantity in self.obj(value, path).items():
            try:
                out[name] = resource_value(name, quantity)
            except ValueError as err:
                raise self.fail(f"{path}.{name}", str(err)) from None
        return out

    def resource_map(self, value: object, path: str) -> ResourceMap:
        try:
            return _fast_resource_map(value)
        except (LookupError, TypeError, ValueError):
            pass  # the checked path below names the field
        obj = self.obj(value, path)
        devices = self.items(obj.get("devices"), f"{path}.devices")
        for i, d in enumerate(devices):
            self.obj(d, f"{path}.devices[{i}]")
        return ResourceMap(
            self.resources(obj.get("resources"), f"{path}.resources"), freeze(list(devices))
        )

    def time(self, value: object, path: str) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            self.string(value, path)
        try:
            return parse_time_datetime(value)
        except TimestampError as err:
            raise self.fail(path, err.message) from err

    def aggregated(self, value: object, path: str) -> tuple[AggregatedUsage, ...]:
        out = []
        for i, item in enumerate(self.items(value, path)):
            where = f"{path}[{i}]"
            entry = self.obj(item, where)
            try:
                seconds = parse_duration(self.string(entry.get("duration") or "0", where))
            except ValueError as err:
                raise self.fail(f"{where}.duration", str(err)) from None
            usage = {
                str(kind): self.resource_map(rm, f"{where}.usage.{kind}")
                for kind, rm in self.obj(entry.get("usage"), f"{where}.usage").items()
            }
            out.append(AggregatedUsage(seconds, MappingProxyType(usage)))
        return tuple(out)

    def node_metric(self, value: object, path: str) -> NodeMetricInfo:
        nm = self.obj(value, path)
        numa = []
        for i, item in enumerate(self.items(nm.get("numaUsages"), f"{path}.numaUsages")):
            where = f"{path}.numaUsages[{i}]"
            entry = self.obj(item, where)
            system = entry.get("systemUsage")
            numa.append(
                NUMAMetric(
                    self.integer(entry.get("numaNodeID"), f"{where}.numaNodeID"),
                    self.resource_map(entry.get("nodeUsage"), f"{where}.nodeUsage"),
                    None if system is None else self.resource_map(system, f"{where}.systemUsage"),
                )
            )
        return NodeMetricInfo(
            self.resource_map(nm.get("nodeUsage"), f"{path}.nodeUsage"),
            self.resource_map(nm.get("systemUsage"), f"{path}.systemUsage"),
            self.aggregated(nm.get("aggregatedNodeUsages"), f"{path}.aggregatedNodeUsages"),
            self.aggregated(nm.get("aggregatedSystemUsages"), f"{path}.aggregatedSystemUsages"),
            tuple(numa),
        )

    def pod_metric(self, item: object, where: str) -> PodMetricInfo:
        pm = self.obj(item, where)
        ext = pm.get("extensions")
        return PodMetricInfo(
            self.string(pm.get("namespace"), f"{where}.namespace"),
            self.string(pm.get("name"), f"{where}.name"),
            self.resource_map(pm.get("podUsage"), f"{where}.podUsage"),
            self.string(pm.get("priority"), f"{where}.priority"),
            self.string(pm.get("qos"), f"{where}.qos"),
            None if ext is None else freeze(dict(self.obj(ext, f"{where}.extensions"))),
        )

    def pods(self, value: object, path: str) -> tuple[PodMetricInfo, ...]:
        out = []
        for i, item in enumerate(self.items(value, path)):
            try:
                out.append(_fast_pod_metric(item))
            except (LookupError, TypeError, ValueError):
                out.append(self.pod_metric(item, f"{path}[{i}]"))
        return tuple(out)

    def host_app(self, item: object, where: str) -> HostApplicationMetricInfo:
        am = self.obj(item, where)
        return HostApplicationMetricInfo(
            self.string(am.get("name"), f"{where}.name"),
            self.resource_map(am.get("usage"), f"{where}.usage"),
            self.string(am.get("priority"), f"{where}.priority"),
            self.string(am.get("qos"), f"{where}.qos"),
        )

    def wrapped(self, value: object, path: str) -> ResourceMap | None:
        """``{"resource": ResourceMap}`` (prodReclaimableMetric, prodPeakMetric)."""
        if value is None:
            return None
        return self.resource_map(self.obj(value, path).get("resource"), f"{path}.resource")

    def status(self, value: object, path: str) -> NodeMetricStatus:
        st = self.obj(value, path)
        p = f"{path}." if path else ""
        pods = st.get("podsMetric")
        apps = st.get("hostApplicationMetric")
        nm = st.get("nodeMetric")
        return NodeMetricStatus(
            update_time=self.time(st.get("updateTime"), f"{p}updateTime"),
            node_metric=None if nm is None else self.node_metric(nm, f"{p}nodeMetric"),
            pods_metric=None if pods is None else self.pods(pods, f"{p}podsMetric"),
            host_application_metric=None
            if apps is None
            else tuple(
                self.host_app(item, f"{p}hostApplicationMetric[{i}]")
                for i, item in enumerate(self.items(apps, f"{p}hostApplicationMetric"))
            ),
            prod_reclaimable_metric=self.wrapped(
                st.get("prodReclaimableMetric"), f"{p}prodReclaimableMetric"
            ),
            prod_peak_metric=self.wrapped(st.get("prodPeakMetric"), f"{p}prodPeakMetric"),
        )

    def collect_policy(self, value: object, path: str) -> NodeMetricCollectPolicy:
        pol = self.obj(value, path)

        def opt_int(key: str) -> int | None:
            raw = pol.get(key)
            return None if raw is None else self.integer(raw, f"{path}.{key}")

        agg = pol.get("nodeAggregatePolicy")
        durations = None
        if agg is not None:
            dpath = f"{path}.nodeAggregatePolicy.durations"
            raw = self.obj(agg, f"{path}.nodeAggregatePolicy").get("durations")
            durations = tuple(
                self.string(d, f"{dpath}[{i}]") for i, d in enumerate(self.items(raw, dpath))
            )
            for i, d in enumerate(durations):
                try:
                    parse_duration(d)
                except ValueError as err:
                    raise self.fail(f"{dpath}[{i}]", str(err)) from None
        memory = pol.get("nodeMemoryCollectPolicy")
        return NodeMetricCollectPolicy(
            opt_int("aggregateDurationSeconds"),
            opt_int("reportIntervalSeconds"),
            durations,
            None if memory is None else self.string(memory, f"{path}.nodeMemoryCollectPolicy"),
        )


def parse_node_metric_status(status: object, source: str) -> NodeMetricStatus:
    """A NodeMetric ``status`` (paths in errors start with ``status.``)."""
    return _Reader(source).status(status, "status")


def parse_node_metric(obj: object, source: str) -> NodeMetric:
    """A NodeMetric object (``kind`` may be absent). Raises :class:`SchemaError`."""
    r = _Reader(source)
    doc = r.obj(obj, "")
    kind = doc.get("kind", KIND)
    if kind != KIND:
        raise r.fail("kind", f"must be {KIND}, got {kind!r}")
    meta = r.obj(doc.get("metadata"), "metadata")
    spec = r.obj(doc.get("spec"), "spec")
    policy = spec.get("metricCollectPolicy")
    return NodeMetric(
        name=r.string(meta.get("name"), "metadata.name"),
        collect_policy=None
        if policy is None
        else r.collect_policy(policy, "spec.metricCollectPolicy"),
        status=r.status(doc.get("status"), "status"),
    )


# Writing ---------------------------------------------------------------------------------------


def format_resource(name: str, value: int) -> str:
    """One resource value as the Go koordlet prints it (see the module docstring)."""
    if name == "cpu":
        return format_milli(value)
    if name in _BINARY_RESOURCES or name.endswith("memory") or name.startswith("hugepages-"):
        return format_quantity(value, Format.BINARY_SI)
    return format_quantity(value)


def resource_map_json(rm: ResourceMap) -> dict[str, Any]:
    """A ``ResourceMap``; ``{}`` when it holds nothing."""
    out: dict[str, Any] = {}
    if rm.resources:
        out["resources"] = {k: format_resource(k, v) for k, v in rm.resources.items()}
    if rm.devices:
        out["devices"] = thaw(rm.devices)
    return out


def _aggregated_json(entries: Sequence[AggregatedUsage]) -> list[dict[str, Any]]:
    return [
        {
            "duration": format_duration(a.duration_seconds),
            "usage": {kind: resource_map_json(rm) for kind, rm in a.usage.items()},
        }
        for a in entries
    ]


def _node_metric_json(nm: NodeMetricInfo) -> dict[str, Any]:
    out: dict[str, Any] = {
        "nodeUsage": resource_map_json(nm.node_usage),
        "aggregatedNodeUsages": _aggregated_json(nm.aggregated_node_usages),
        "systemUsage": resource_map_json(nm.system_usage),
        "aggregatedSystemUsages": _aggregated_json(nm.aggregated_system_usages),
    }
    if nm.numa_usages:
        numa = []
        for n in nm.numa_usages:
            entry: dict[str, Any] = {
                "numaNodeID": n.numa_node_id,
                "nodeUsage": resource_map_json(n.node_usage),
            }
            if n.system_usage is not None:
                entry["systemUsage"] = resource_map_json(n.system_usage)
            numa.append(entry)
        out["numaUsages"] = numa
    return out


def _pod_metric_json(pm: PodMetricInfo) -> dict[str, Any]:
    out: dict[str, Any] = {
        "namespace": pm.namespace,
        "name": pm.name,
        "podUsage": resource_map_json(pm.pod_usage),
        "priority": pm.priority,
        "qos": pm.qos,
    }
    if pm.extensions is not None:
        out["extensions"] = thaw(pm.extensions)
    return out


def node_metric_status_json(status: NodeMetricStatus) -> dict[str, Any]:
    """The JSON of a NodeMetric ``status`` (what the koordlet writes)."""
    out: dict[str, Any] = {}
    if status.update_time is not None:
        out["updateTime"] = format_time(status.update_time)
    if status.node_metric is not None:
        out["nodeMetric"] = _node_metric_json(status.node_metric)
    if status.pods_metric is not None:
        out["podsMetric"] = [_pod_metric_json(pm) for pm in status.pods_metric]
    if status.host_application_metric is not None:
        out["hostApplicationMetric"] = [
            {
                "name": a.name,
                "usage": resource_map_json(a.usage),
                "priority": a.priority,
                "qos": a.qos,
            }
            for a in status.host_application_metric
        ]
    if status.prod_reclaimable_metric is not None:
        out["prodReclaimableMetric"] = {
            "resource": resource_map_json(status.prod_reclaimable_metric)
        }
    if status.prod_peak_metric is not None:
        out["prodPeakMetric"] = {"resource": resource_map_json(status.prod_peak_metric)}
    return out


def node_metric_json(metric: NodeMetric) -> dict[str, Any]:
    """The whole object (``apiVersion``, ``kind``, ``metadata.name``, ``spec``, ``status``)."""
    spec: dict[str, Any] = {}
    policy = metric.collect_policy
    if policy is not None:
        pol: dict[str, Any] = {}
        if policy.aggregate_duration_seconds is not None:
            pol["aggregateDurationSeconds"] = policy.aggregate_duration_seconds
        if policy.report_interval_seconds is not None:
            pol["reportIntervalSeconds"] = policy.report_interval_seconds
        if policy.node_aggregate_durations is not None:
            pol["nodeAggregatePolicy"] = {"durations": list(policy.node_aggregate_durations)}
        if policy.node_memory_collect_policy is not None:
            pol["nodeMemoryCollectPolicy"] = policy.node_memory_collect_policy
        spec["metricCollectPolicy"] = pol
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": metric.name},
        "spec": spec,
        "status": node_metric_status_json(metric.status),
    }
