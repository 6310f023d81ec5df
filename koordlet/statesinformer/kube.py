"""The Kubernetes source of the states informer: this node, its pods, its NodeSLO and NodeMetric.

Four informers (:class:`kubeclient.informer.Informer`), each on one node's objects:

- the Node (``metadata.name=<node>``): :meth:`KubeStatesSource.node`;
- the pods (``spec.nodeName=<node>``): :meth:`~KubeStatesSource.list_pods` (a ``PodSource``);
- the NodeSLO (``metadata.name=<node>``): ``node_slo`` (the NodeSLO in force) and
  :meth:`~KubeStatesSource.list_host_apps` (a ``HostAppSource``);
- the NodeMetric (``metadata.name=<node>``): ``collect_policy``, and whether it exists.

Pods map to :class:`~koordlet.statesinformer.model.PodInfo`: the Koordinator QoS from the
``koordinator.sh/qosClass`` label, else from the Kubernetes QoS (``apis.extension``); the priority
class by upstream's ``GetPodPriorityClassWithDefault`` (``apis.priority``); requests and limits
summed over the containers; the cgroup directory from the UID and the Kubernetes QoS by the node's
cgroup naming; containers from ``status.containerStatuses[].containerID``. Pods that finished
(``Succeeded``, ``Failed``) have no cgroup left and are not listed.

The NodeSLO is read section by section over Koordinator's defaults
(:func:`apis.slo_inforce.node_slo_in_force`): a section that does not parse keeps its last good
value (the defaults when none was good yet), which is logged once per change with the field and
posted as a Warning Event ``InvalidNodeSLO`` on the NodeSLO; the other sections apply. The
document is persisted to ``<state_dir>/nodeslo.json`` on every change, so a restart while the API
server is away runs on the last NodeSLO seen (the daemon's protect-only mode) rather than on bare
defaults. ``list_pods`` and ``list_host_apps`` are
called from the inventory's worker thread: they return immutable snapshots that the event loop
replaces whole, never mutates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any, NoReturn, TypeVar

from apis.duration import parse_duration
from apis.errors import FieldError
from apis.extension import (
    KUBE_QOS_TO_QOS,
    LABEL_POD_QOS,
    KubeQOS,
    QoSClass,
)
from apis.kubernetes_keys import ANNOTATION_LAST_APPLIED
from apis.manager_keys import EXTENDED_RESOURCES
from apis.priority import pod_priority_class_with_default
from apis.quantity import int_value, milli_value
from apis.records import frozen
from apis.slo import API_VERSION as NODESLO_API_VERSION
from apis.slo import KIND as NODESLO_KIND
from apis.slo import SchemaError
from apis.slo_inforce import NodeSLOInForce, Rejection, node_slo_in_force
from apis.timestamp import TimestampError, parse_time
from koordlet.statesinformer.hostapps import host_app_info
from koordlet.statesinformer.model import ContainerInfo, HostAppInfo, PodInfo
from koordlet.system.atomicfile import write_atomic
from koordlet.system.cgroups import CgroupLayout
from kubeclient.client import KubeClient, Obj
from kubeclient.errors import ApiError
from kubeclient.events import core_event
from kubeclient.informer import Informer, strip_managed_fields
from kubeclient.resources import EVENTS, NODE_METRICS, NODE_SLOS, NODES, PODS

logger = logging.getLogger(__name__)

T = TypeVar("T")

NODESLO_FILE = "nodeslo.json"
"""Name of the persisted NodeSLO under the state directory."""
EVENT_REASON_INVALID_NODESLO = "InvalidNodeSLO"
"""Reason of the Warning Event posted on the NodeSLO when a section of it is rejected (ours:
upstream's koordlet does not validate the NodeSLO)."""
EVENT_COMPONENT = "koordlet"

_RUNTIMES = {"containerd": "containerd", "cri-o": "cri-o", "docker": "docker"}
"""``containerID`` scheme → runtime name of the cgroup layout."""


# The NodeMetric spec ---------------------------------------------------------------------------
@frozen
class CollectPolicy:
    """``spec.metricCollectPolicy`` of the node's NodeMetric over Koordinator's defaults
    (``defaultNodeMetricSpec`` of the koordlet's NodeMetric informer)."""

    aggregate_duration_seconds: int = 300
    """``aggregateDurationSeconds``: window of ``nodeUsage``, pod and host-app usage (min 60)."""
    report_interval_seconds: int = 60
    """``reportIntervalSeconds``: how often the status is written (min 30)."""
    node_aggregate_durations: tuple[int, ...] = (300, 600, 1800)
    """``nodeAggregatePolicy.durations`` in seconds: windows of ``aggregatedNodeUsages``."""
    node_memory_collect_policy: str = "usageWithoutPageCache"
    """``nodeMemoryCollectPolicy``: ``usageWithoutPageCache``, ``usageWithPageCache`` or
    ``usageWithHotPageCache``."""


MIN_AGGREGATE_DURATION_SECONDS = 60
MIN_REPORT_INTERVAL_SECONDS = 30


def parse_collect_policy(spec: Mapping[str, Any] | None) -> CollectPolicy:
    """The collect policy of a NodeMetric ``spec``: given fields over the defaults, the two
    intervals raised to Koordinator's minimums; a malformed field keeps its default (logged)."""
    default = CollectPolicy()
    raw = (spec or {}).get("metricCollectPolicy") or {}
    agg = raw.get("aggregateDurationSeconds")
    rep = raw.get("reportIntervalSeconds")
    durations = default.node_aggregate_durations
    policy = (raw.get("nodeAggregatePolicy") or {}).get("durations")
    if isinstance(policy, list):
        try:
            durations = tuple(int(parse_duration(str(d))) for d in policy)
        except ValueError as err:
            logger.warning("NodeMetric nodeAggregatePolicy.durations: %s; using defaults", err)
    memory = raw.get("nodeMemoryCollectPolicy")
    return CollectPolicy(
        aggregate_duration_seconds=max(int(agg), MIN_AGGREGATE_DURATION_SECONDS)
        if isinstance(agg, int)
        else default.aggregate_duration_seconds,
        report_interval_seconds=max(int(rep), MIN_REPORT_INTERVAL_SECONDS)
        if isinstance(rep, int)
        else default.report_interval_seconds,
        node_aggregate_durations=durations,
        node_memory_collect_policy=memory
        if isinstance(memory, str) and memory
        else default.node_memory_collect_policy,
    )


# Pods ------------------------------------------------------------------------------------------
def kube_qos_of(pod: Obj) -> KubeQOS:
    """``status.qosClass``, else computed from the containers' requests and limits."""
    given = str((pod.get("status") or {}).get("qosClass", ""))
    if given in KubeQOS.__members__.values():
        return KubeQOS(given)
    containers = (pod.get("spec") or {}).get("containers") or []
    any_set = False
    guaranteed = bool(containers)
    for c in containers:
        res = c.get("resources") or {}
        req = res.get("requests") or {}
        lim = res.get("limits") or {}
        if req or lim:
            any_set = True
        for name in ("cpu", "memory"):
            limit = lim.get(name)
            if limit is None or (name in req and req[name] != limit):
                guaranteed = False
    if not any_set:
        return KubeQOS.BESTEFFORT
    return KubeQOS.GUARANTEED if guaranteed else KubeQOS.BURSTABLE


def qos_of(labels: Mapping[str, str], kube_qos: KubeQOS) -> QoSClass:
    raw = labels.get(LABEL_POD_QOS, "")
    if raw and raw in QoSClass.__members__.values():
        return QoSClass(raw)
    return KUBE_QOS_TO_QOS[kube_qos]


def qos_label_of(labels: Mapping[str, str]) -> QoSClass:
    """The class of the ``koordinator.sh/qosClass`` label alone (``GetPodQoSClassRaw``); NONE
    without it or for an unknown value."""
    raw = labels.get(LABEL_POD_QOS, "")
    return QoSClass(raw) if raw in QoSClass.__members__.values() else QoSClass.NONE


def _sum(containers: list[Obj], kind: str, name: str, parse: Callable[[str], int]) -> int | None:
    total = 0
    for c in containers:
        value = ((c.get("resources") or {}).get(kind) or {}).get(name)
        if value is None:
            if kind == "limits":
                return None  # one unlimited container makes the pod unlimited
            continue
        total += parse(str(value))
    return total


def _extended_requests(spec: Obj) -> dict[str, int]:
    """Koordinator's extended resources requested by the containers and the sidecars (init
    containers with ``restartPolicy: Always``), as upstream's ``GetContainerBatchMilliCPURequest``
    and friends read them (the quantity's integer value)."""
    containers = list(spec.get("containers") or [])
    containers += [
        c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"
    ]
    out: dict[str, int] = {}
    for name in EXTENDED_RESOURCES:
        total = 0
        for c in containers:
            value = ((c.get("resources") or {}).get("requests") or {}).get(name)
            if value is not None:
                total += max(int_value(str(value)), 0)
        if total:
            out[name] = total
    return out


def _created_at(meta: Obj) -> float | None:
    raw = meta.get("creationTimestamp")
    if not isinstance(raw, str):
        return None
    try:
        return parse_time(raw)
    except TimestampError:
        return None


def extended_resources(containers: list[Obj]) -> dict[str, Mapping[str, Mapping[str, str]]]:
    """Container name -> the batch and mid resources of its ``requests`` and ``limits`` (the
    quantities as written), for containers that have any (upstream
    ``util.GetPodExtendedResources``)."""
    out: dict[str, Mapping[str, Mapping[str, str]]] = {}
    for c in containers:
        resources = c.get("resources") or {}
        kinds = {
            kind: {
                name: str(value)
                for name, value in (resources.get(kind) or {}).items()
                if name in EXTENDED_RESOURCES
            }
            for kind in ("requests", "limits")
        }
        if kinds["requests"] or kinds["limits"]:
            out[str(c.get("name", ""))] = MappingProxyType(kinds)
    return out


def pod_info(pod: Obj, layout: CgroupLayout) -> PodInfo:
    """A Kubernetes pod as the inventory describes it. Raises ``ValueError`` on a pod whose UID
    or resources cannot be read (the caller skips it)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    labels: dict[str, str] = dict(meta.get("labels") or {})
    kube_qos = kube_qos_of(pod)
    qos = qos_of(labels, kube_qos)
    uid = str(meta.get("uid", ""))
    pod_dir = layout.pod_dir(kube_qos, uid)
    priority = spec.get("priority")
    priority = int(priority) if isinstance(priority, int) else None
    names = {str(c.get("name")): c for c in spec.get("containers") or []}
    containers = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        scheme, _, cid = str(status.get("containerID", "")).partition("://")
        runtime = _RUNTIMES.get(scheme)
        if runtime is None or not cid:
            continue  # not started yet, or a runtime we cannot name in the cgroup tree
        spec_c = names.get(str(status.get("name", "")))
        own = [spec_c] if spec_c is not None else None
        containers.append(
            ContainerInfo(
                id=cid,
                name=str(status.get("name", cid[:12])),
                runtime=runtime,
                cgroup_dir=layout.container_dir(pod_dir, runtime, cid),
                cpu_request_milli=_sum(own, "requests", "cpu", milli_value) if own else None,
                cpu_limit_milli=_sum(own, "limits", "cpu", milli_value) if own else None,
                memory_request_bytes=(_sum(own, "requests", "memory", int_value) if own else None),
                memory_limit_bytes=_sum(own, "limits", "memory", int_value) if own else None,
            )
        )
    spec_containers = list(names.values())
    return PodInfo(
        uid=uid,
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        qos=qos,
        kube_qos=kube_qos,
        cgroup_dir=pod_dir,
        containers=tuple(sorted(containers, key=lambda c: c.id)),
        priority_class=pod_priority_class_with_default(labels, priority, qos),
        cpu_request_milli=_sum(spec_containers, "requests", "cpu", milli_value),
        memory_request_bytes=_sum(spec_containers, "requests", "memory", int_value),
        source=KubeStatesSource.name,
        priority=priority,
        labels=_frozen_map(labels),
        annotations=_frozen_map(dict(meta.get("annotations") or {})),
        cpu_limit_milli=_sum(spec_containers, "limits", "cpu", milli_value),
        memory_limit_bytes=_sum(spec_containers, "limits", "memory", int_value),
        created_at=_created_at(meta),
        qos_label=qos_label_of(labels),
        extended_requests=_frozen_map(_extended_requests(spec)),
        extended_resources=_frozen_map(extended_resources(spec_containers)),
    )


_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _frozen_map(d: dict[str, T]) -> Mapping[str, T]:
    """A read-only view of ``d``; one shared empty view for every empty one (most pods have no
    annotations and no batch resources: 0.1 MiB at 200 pods)."""
    return MappingProxyType(d) if d else _EMPTY


POD_PAGE = 50
"""Pods a list asks for at once: the whole objects of one page are held until their views are
made, so a smaller page keeps the list's peak (and what the allocator keeps of it) small."""
_POD_META = ("name", "namespace", "uid", "resourceVersion", "labels", "creationTimestamp")
_POD_STATUS = ("phase", "qosClass")
_POD_KEY = ("name", "namespace", "uid", "resourceVersion")


def pod_view(pod: Obj) -> Obj:
    """What the pod informer keeps of a pod: the fields :func:`pod_info` and the handlers read
    (metadata's name, namespace, uid, resourceVersion, labels, annotations but
    ``kubectl.kubernetes.io/last-applied-configuration``, creationTimestamp; ``spec.priority``;
    the name, ``restartPolicy`` and ``resources`` of each container and init container;
    ``status.phase``, ``qosClass`` and each container status' name and ``containerID``).

    A real pod's JSON is mostly what the koordlet never reads (``managedFields``, volumes,
    probes, environment, conditions): at 200 pods the whole objects held about 8 MiB, the views
    well under one (docs/benchmarks.md, issue 26). A reader of another field adds it here.
    """
    meta = pod.get("metadata") or {}
    view_meta = {k: meta[k] for k in _POD_META if k in meta}
    annotations = meta.get("annotations")
    if annotations:
        view_meta["annotations"] = (
            {k: v for k, v in annotations.items() if k != ANNOTATION_LAST_APPLIED}
            if ANNOTATION_LAST_APPLIED in annotations
            else annotations
        )
    spec = pod.get("spec") or {}
    view_spec: Obj = {}
    if "priority" in spec:
        view_spec["priority"] = spec["priority"]
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        if containers:
            view_spec[key] = [_container_view(c) for c in containers]
    status = pod.get("status") or {}
    view_status = {k: status[k] for k in _POD_STATUS if k in status}
    statuses = status.get("containerStatuses")
    if statuses:
        view_status["containerStatuses"] = [
            {k: s[k] for k in ("name", "containerID") if k in s}
            for s in statuses
            if isinstance(s, dict)
        ]
    return {"metadata": view_meta, "spec": view_spec, "status": view_status}


def pod_key(pod: Obj) -> Obj:
    """What the pod informer's store keeps once the handlers have seen a pod: its name,
    namespace, UID and resourceVersion. The handlers keep the pod's ``PodInfo``; the store needs
    the key, the version (a relist's comparison) and the UID (a delete's handler)."""
    meta = pod.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in _POD_KEY if k in meta}}


def node_view(node: Obj) -> Obj:
    """What the Node informer keeps: the Node without ``managedFields`` and ``status.images``
    (every image on the node, often the largest part of a Node; read by nothing here)."""
    strip_managed_fields(node)
    status = node.get("status")
    if isinstance(status, dict):
        status.pop("images", None)
    return node


def node_metric_view(metric: Obj) -> Obj:
    """What the NodeMetric informer keeps: the object without ``metadata.managedFields`` and
    ``status``. The status is the koordlet's own last report (every pod's usage: about 0.4 MiB
    of parsed JSON at 200 pods, handed back by the watch after each write); the koordlet reads
    the spec (the collect policy) and whether the object exists."""
    strip_managed_fields(metric)
    metric.pop("status", None)
    return metric


def _container_view(container: Any) -> Any:
    if not isinstance(container, dict):
        return container  # malformed: left for pod_info to refuse
    return {k: container[k] for k in ("name", "restartPolicy", "resources") if k in container}


def _finished(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


# The source ------------------------------------------------------------------------------------
NodeSLOListener = Callable[[NodeSLOInForce], None]


class KubeStatesSource:
    """This node's objects from the API server; a ``PodSource`` and a ``HostAppSource``."""

    name = "kubernetes"

    def __init__(
        self,
        client: KubeClient,
        node_name: str,
        layout: Callable[[], CgroupLayout],
        state_dir: str,
        *,
        informer_factory: Callable[..., Informer] = Informer,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_name = node_name
        self._client = client
        self._clock = clock
        self._layout = layout
        self.state_dir = state_dir
        by_name = f"metadata.name={node_name}"
        # Each informer keeps a view of its objects (kubeclient.informer: transform).
        inform = informer_factory
        strip = strip_managed_fields
        self.nodes = inform(client, NODES, field_selector=by_name, transform=node_view)
        by_node = f"spec.nodeName={node_name}"
        self.pods = inform(
            client,
            PODS,
            field_selector=by_node,
            transform=pod_view,
            keep=pod_key,
            page_size=POD_PAGE,
            cache_first_list=False,  # pages: one page of whole pods in memory at a time
        )
        self.node_slos = inform(client, NODE_SLOS, field_selector=by_name, transform=strip)
        self.node_metrics = inform(
            client, NODE_METRICS, field_selector=by_name, transform=node_metric_view
        )
        self._pod_infos: dict[str, PodInfo] = {}
        self._pods_view: Mapping[str, PodInfo] = MappingProxyType({})
        self.node_slo = NodeSLOInForce()
        """The NodeSLO in force (the persisted one until the API server answers)."""
        self.collect_policy = CollectPolicy()
        """The NodeMetric's collect policy (defaults until the NodeMetric is seen)."""
        self._listeners: list[NodeSLOListener] = []
        self._pending: set[asyncio.Task[None]] = set()
        self._persist_lock = asyncio.Lock()  # FIFO: NodeSLOs reach the disk in the order seen
        self.pods.add_handler(self._pod_changed, self._pod_updated, self._pod_deleted)
        self.node_slos.add_handler(self._slo_changed, self._slo_updated, self._slo_deleted)
        self.node_metrics.add_handler(self._metric_changed, self._metric_updated)

    # Reading ------------------------------------------------------------------------------------
    def node(self) -> Obj | None:
        """The Node object, once listed."""
        return self.nodes.get(self.node_name)

    def node_metric(self) -> Obj | None:
        """The NodeMetric object when it exists (the reporter writes only then), without its
        status (:func:`node_metric_view`)."""
        return self.node_metrics.get(self.node_name)

    def list_pods(self) -> Mapping[str, PodInfo]:
        return self._pods_view

    def list_host_apps(self) -> tuple[HostAppInfo, ...]:
        layout = self._layout()
        return tuple(host_app_info(app, layout) for app in self.node_slo.host_applications)

    @property
    def informers(self) -> tuple[Informer, ...]:
        return (self.nodes, self.pods, self.node_slos, self.node_metrics)

    @property
    def synced(self) -> bool:
        return all(i.synced for i in self.informers)

    @property
    def connected(self) -> bool:
        """Whether every informer's last contact with the API server succeeded."""
        return all(i.connected for i in self.informers)

    def add_node_slo_listener(self, listener: NodeSLOListener) -> None:
        """Called on the event loop with the new NodeSLO in force whenever it changes."""
        self._listeners.append(listener)

    # Running ------------------------------------------------------------------------------------
    async def run(self) -> NoReturn:
        """Run the four informers (named tasks) until cancelled."""
        async with asyncio.TaskGroup() as tg:
            for inf in self.informers:
                tg.create_task(inf.run(), name=f"kube-informer-{inf.resource.plural}")
        raise AssertionError("informers returned")  # pragma: no cover - they never return

    async def wait_synced(self, timeout: float) -> bool:  # noqa: ASYNC109 - a bounded wait is the API
        """Wait up to ``timeout`` seconds for all four first lists; whether they came."""
        results = await asyncio.gather(*(i.wait_synced(timeout) for i in self.informers))
        return all(results)

    async def flush(self) -> None:
        """Wait for pending NodeSLO writes to disk and Events (tests and shutdown)."""
        while self._pending:
            await asyncio.gather(*list(self._pending))

    # Persistence --------------------------------------------------------------------------------
    @property
    def nodeslo_path(self) -> str:
        return os.path.join(self.state_dir, NODESLO_FILE)

    def load_persisted(self) -> bool:
        """Blocking (call in a thread at start-up): adopt the NodeSLO persisted by an earlier
        run. Whether one was there and readable; a bad file is logged and left to be overwritten,
        a bad section of it takes the defaults (logged)."""
        try:
            with open(self.nodeslo_path, encoding="utf-8") as f:
                doc = json.load(f)
            in_force = node_slo_in_force(
                doc, source=self.nodeslo_path, strict=False, now=self._clock()
            )
        except FileNotFoundError:
            logger.info("no persisted NodeSLO at %s; Koordinator's defaults", self.nodeslo_path)
            return False
        except (OSError, ValueError, SchemaError) as err:
            logger.warning("persisted NodeSLO unusable (%s); Koordinator's defaults", err)
            return False
        self.node_slo = in_force
        logger.info(
            "using the NodeSLO persisted at %s until the API server answers%s",
            self.nodeslo_path,
            _rejections(in_force.rejected.values()),
        )
        return True

    def _persist(self, spec_json: Mapping[str, Any]) -> None:
        os.makedirs(self.state_dir, exist_ok=True)
        data = json.dumps({"spec": spec_json}, sort_keys=True).encode("utf-8")
        write_atomic(self.nodeslo_path, data, prefix=".nodeslo-")

    async def _persist_async(self, spec_json: Mapping[str, Any]) -> None:
        try:
            # one write at a time, in order: two in threads at once could rename the older last
            async with self._persist_lock:
                await asyncio.to_thread(self._persist, spec_json)
        except OSError as err:
            logger.warning("cannot persist the NodeSLO to %s: %s", self.nodeslo_path, err)

    # Handlers (event loop) ----------------------------------------------------------------------
    def _publish_pods(self) -> None:
        self._pods_view = MappingProxyType(dict(self._pod_infos))

    def _pod_changed(self, pod: Obj) -> None:
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        if _finished(pod):
            if self._pod_infos.pop(uid, None) is not None:
                self._publish_pods()
            return
        try:
            info = pod_info(pod, self._layout())
        except ValueError as err:
            logger.warning("pod %s skipped: %s", (pod.get("metadata") or {}).get("name"), err)
            return
        self._pod_infos[uid] = info
        self._publish_pods()

    def _pod_updated(self, old: Obj, new: Obj) -> None:
        self._pod_changed(new)

    def _pod_deleted(self, pod: Obj) -> None:
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        if self._pod_infos.pop(uid, None) is not None:
            self._publish_pods()

    def _slo_changed(self, obj: Obj) -> None:
        source = f"NodeSLO {self.node_name}"
        before = self.node_slo
        try:
            in_force = node_slo_in_force(
                obj, source=source, strict=False, now=self._clock(), previous=before
            )
        except SchemaError as err:
            logger.warning("%s rejected, keeping the one in force: %s", source, err)
            self._post_invalid(obj, [err])
            return
        rejected = in_force.newly_rejected(before)
        if rejected:
            logger.warning(
                "%s: sections rejected%s",
                source,
                _rejections(rejected.values()),
            )
            self._post_invalid(obj, [r.error for r in rejected.values()])
        self._install_slo(in_force, obj.get("spec") or {})

    def _slo_updated(self, old: Obj, new: Obj) -> None:
        self._slo_changed(new)

    def _slo_deleted(self, obj: Obj) -> None:
        logger.info("NodeSLO %s deleted; Koordinator's defaults", self.node_name)
        defaults = NodeSLOInForce(generation=self.node_slo.generation)
        if defaults != self.node_slo:
            self._install_slo(replace(defaults, generation=defaults.generation + 1), {})

    def _install_slo(self, in_force: NodeSLOInForce, raw: Mapping[str, Any]) -> None:
        if in_force.generation == self.node_slo.generation:
            return
        self.node_slo = in_force
        self._spawn(self._persist_async(raw), "nodeslo-persist")
        for listener in self._listeners:
            try:
                listener(in_force)
            except Exception:
                logger.exception("NodeSLO listener %r failed", listener)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _post_invalid(self, obj: Obj, errors: list[FieldError]) -> None:
        """A Warning Event ``InvalidNodeSLO`` on the NodeSLO naming each rejected field."""
        meta = obj.get("metadata") or {}
        involved = {
            "apiVersion": NODESLO_API_VERSION,
            "kind": NODESLO_KIND,
            "name": str(meta.get("name") or self.node_name),
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        }
        message = (
            "; ".join(f"{e.field or 'spec'}: {e.message}" for e in errors)
            + " (the last good value of each rejected section stays in force)"
        )
        event = core_event(
            involved,
            reason=EVENT_REASON_INVALID_NODESLO,
            message=message,
            component=EVENT_COMPONENT,
            host=self.node_name,
            now=self._clock(),
        )
        self._spawn(self._create_event(event), "nodeslo-invalid-event")

    async def _create_event(self, event: Obj) -> None:
        try:
            await self._client.create(EVENTS, event)
        except ApiError as err:
            logger.warning("cannot post the %s event: %s", EVENT_REASON_INVALID_NODESLO, err)

    def _metric_changed(self, obj: Obj) -> None:
        policy = parse_collect_policy(obj.get("spec"))
        if policy != self.collect_policy:
            logger.info("NodeMetric collect policy: %s", policy)
            self.collect_policy = policy

    def _metric_updated(self, old: Obj, new: Obj) -> None:
        self._metric_changed(new)


def _rejections(rejections: Iterable[Rejection]) -> str:
    """``; rejected, last good kept: <file>: <field>: <why>; ...`` or empty."""
    text = "; ".join(str(r.error) for r in rejections)
    return f"; rejected, last good value kept: {text}" if text else ""
