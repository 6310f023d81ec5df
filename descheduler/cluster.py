"""The cluster as the descheduler sees it: the scheduler's snapshot plus what only we read.

:class:`Cluster` holds a :class:`scheduler_plugins.snapshot.Snapshot` (nodes with their assigned
pods and requests, Reservations, PriorityClasses: what the scheduler's filters need for
``nodeFit``) and, beside it, the NodeMetrics as LowNodeLoad reads them (:class:`NodeUsageReport`:
system usage, each pod's usage, their sum), the PodDisruptionBudgets, the workloads whose
replicas bound a migration (ReplicaSets, Deployments, StatefulSets, ReplicationControllers) and
the PodMigrationJobs (:class:`~descheduler.migration.store.JobStore`).

:func:`build_cluster` reads the objects of a ``kubectl get -o yaml`` List (``explain``); the
daemon keeps one current with informers (``runtime.py``). Bad input raises
:class:`~descheduler.errors.InputError` naming the item and field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apis import nodemetric
from apis.descheduler_keys import (
    ANNOTATION_NODE_RAW_ALLOCATABLE,
    KIND_DEPLOYMENT,
    KIND_REPLICA_SET,
    KIND_REPLICATION_CONTROLLER,
    KIND_STATEFUL_SET,
)
from apis.podmigrationjob import parse_job
from apis.quantity import resource_value
from apis.slo import SchemaError
from descheduler.errors import InputError
from descheduler.migration.store import JobStore
from descheduler.podfacts import PodFacts, pod_facts
from descheduler.selectors import Selector, SelectorError, from_label_selector
from scheduler_plugins.errors import InputError as SchedulerInputError
from scheduler_plugins.snapshot import NodeInfo, PodInfo, Snapshot, build_snapshot, load_objects

WORKLOAD_KINDS = (KIND_REPLICA_SET, KIND_DEPLOYMENT, KIND_STATEFUL_SET, KIND_REPLICATION_CONTROLLER)


@dataclass(frozen=True, slots=True)
class NodeUsageReport:
    """A NodeMetric as LowNodeLoad reads it (``getNodeUsage``)."""

    node: str
    update_time: float | None
    """``status.updateTime`` (epoch seconds); ``None``: never reported."""
    has_node_metric: bool
    """Whether ``status.nodeMetric`` is there (without it the node is not considered)."""
    system: Mapping[str, int]
    """``status.nodeMetric.systemUsage.resources``."""
    pods: Mapping[str, Mapping[str, int]]
    """``status.podsMetric[].podUsage.resources`` by ``namespace/name``."""
    pods_total: Mapping[str, int]
    """The sum of :attr:`pods`, per resource."""


def usage_report(metric: nodemetric.NodeMetric) -> NodeUsageReport:
    status = metric.status
    pods: dict[str, Mapping[str, int]] = {}
    total: dict[str, int] = {}
    for pm in status.pods_metric or ():
        res = pm.pod_usage.resources
        pods[f"{pm.namespace}/{pm.name}"] = res
        for k, v in res.items():
            total[k] = total.get(k, 0) + v
    nm = status.node_metric
    return NodeUsageReport(
        node=metric.name,
        update_time=None if status.update_time is None else status.update_time.timestamp(),
        has_node_metric=nm is not None,
        system={} if nm is None else dict(nm.system_usage.resources),
        pods=pods,
        pods_total=total,
    )


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """A PodDisruptionBudget: its selector and what its status allows."""

    namespace: str
    name: str
    selector: Selector | None
    """``spec.selector``; ``None`` selects no pod (an empty selector selects every pod)."""
    disruptions_allowed: int
    """``status.disruptionsAllowed``."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Workload:
    """A workload the controller finder knows: its replicas and who controls it."""

    kind: str
    namespace: str
    name: str
    uid: str
    replicas: int
    """``spec.replicas`` (1 when unset, as the API server defaults it)."""
    selector: Selector | None
    controller_uid: str = ""
    """The uid of its controlling owner (a ReplicaSet's Deployment)."""
    controller_kind: str = ""
    controller_name: str = ""
    deleting: bool = False


@dataclass(slots=True)
class Cluster:
    """See the module docstring."""

    sched: Snapshot = field(default_factory=Snapshot)
    usage: dict[str, NodeUsageReport] = field(default_factory=dict)
    """NodeMetrics by node name."""
    pdbs: dict[str, DisruptionBudget] = field(default_factory=dict)
    """PodDisruptionBudgets by ``namespace/name``."""
    workloads: dict[tuple[str, str, str], Workload] = field(default_factory=dict)
    """Workloads by ``(kind, namespace, name)``."""
    jobs: JobStore = field(default_factory=JobStore)
    not_ready: set[str] = field(default_factory=set)
    """Nodes with a ``Ready`` condition other than True (``nodeutil.IsReady``)."""
    pods_by_key: dict[str, PodInfo] | None = None
    """Pods by ``namespace/name`` when an informer keeps it current; ``None``: indexed from the
    snapshot once per change."""
    _facts: dict[str, tuple[PodInfo, PodFacts]] = field(default_factory=dict)
    _by_owner: dict[str, dict[str, PodInfo]] | None = None
    _by_owner_generation: int = -1
    _by_key: dict[str, PodInfo] | None = None
    _by_key_generation: int = -1

    # -- pods --------------------------------------------------------------------------------
    def facts(self, pod: PodInfo) -> PodFacts:
        """The pod's facts, computed once per object version."""
        cached = self._facts.get(pod.uid)
        if cached is not None and cached[0] is pod:
            return cached[1]
        facts = pod_facts(pod)
        self._facts[pod.uid] = (pod, facts)
        return facts

    def pod(self, namespace: str, name: str) -> PodInfo | None:
        """A pod by name (assigned or pending)."""
        key = f"{namespace}/{name}"
        if self.pods_by_key is not None:
            return self.pods_by_key.get(key)
        if self._by_key is None or self._by_key_generation != self.sched.generation:
            self._by_key = {p.key: p for p in self.sched.all_pods()}
            self._by_key_generation = self.sched.generation
        return self._by_key.get(key)

    def pods_of_owner(self, uid: str) -> list[PodInfo]:
        """Pods whose ownerReferences name ``uid`` (indexed per snapshot generation)."""
        if self._by_owner is None or self._by_owner_generation != self.sched.generation:
            index: dict[str, dict[str, PodInfo]] = {}
            for pod in self.sched.all_pods():
                for owner in self.facts(pod).owners:
                    index.setdefault(owner.uid, {})[pod.uid] = pod
            self._by_owner = index
            self._by_owner_generation = self.sched.generation
        return list(self._by_owner.get(uid, {}).values())

    # -- nodes --------------------------------------------------------------------------------
    def raw_allocatable(self, node: NodeInfo) -> Mapping[str, int]:
        """``GetNodeRawAllocatableFromNode``: the ``node.koordinator.sh/raw-allocatable``
        annotation when it parses, else ``status.allocatable``."""
        text = node.annotations.get(ANNOTATION_NODE_RAW_ALLOCATABLE)
        if not text:
            return node.allocatable
        try:
            raw = json.loads(text)
            return {str(k): resource_value(str(k), v) for k, v in raw.items()}
        except (ValueError, AttributeError, TypeError):
            return node.allocatable


def node_ready(obj: Mapping[str, Any]) -> bool:
    """``nodeutil.IsReady``: no ``Ready`` condition whose status is not True."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    return not any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") != "True"
        for c in conditions
    )


def _str(raw: Any) -> str:
    return "" if raw is None else str(raw)


def parse_pdb(obj: Mapping[str, Any], source: str, where: str) -> DisruptionBudget:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    try:
        selector = None if spec.get("selector") is None else from_label_selector(spec["selector"])
    except SelectorError as err:
        raise InputError(source, f"{where}.spec", str(err)) from err
    allowed = status.get("disruptionsAllowed", 0)
    if isinstance(allowed, bool) or not isinstance(allowed, int):
        raise InputError(
            source, f"{where}.status.disruptionsAllowed", f"not an integer: {allowed!r}"
        )
    return DisruptionBudget(
        _str(meta.get("namespace")) or "default", _str(meta.get("name")), selector, allowed
    )


def parse_workload(obj: Mapping[str, Any], source: str, where: str) -> Workload:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    replicas = spec.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise InputError(source, f"{where}.spec.replicas", f"not an integer: {replicas!r}")
    sel_raw = spec.get("selector")
    try:
        if (
            isinstance(sel_raw, Mapping)
            and "matchLabels" not in sel_raw
            and ("matchExpressions" not in sel_raw)
        ):  # a ReplicationController's selector is a plain map
            selector: Selector | None = from_label_selector({"matchLabels": sel_raw})
        else:
            selector = None if sel_raw is None else from_label_selector(sel_raw)
    except SelectorError as err:
        raise InputError(source, f"{where}.spec", str(err)) from err
    controller = next(
        (
            o
            for o in meta.get("ownerReferences") or []
            if isinstance(o, Mapping) and o.get("controller")
        ),
        {},
    )
    return Workload(
        kind=_str(obj.get("kind")),
        namespace=_str(meta.get("namespace")) or "default",
        name=_str(meta.get("name")),
        uid=_str(meta.get("uid"))
        or f"{obj.get('kind')}/{meta.get('namespace')}/{meta.get('name')}",
        replicas=replicas,
        selector=selector,
        controller_uid=_str(controller.get("uid")),
        controller_kind=_str(controller.get("kind")),
        controller_name=_str(controller.get("name")),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def build_cluster(objects: Sequence[Mapping[str, Any]], source: str = "<snapshot>") -> Cluster:
    """A :class:`Cluster` from objects (other kinds are ignored). Raises :class:`InputError`
    naming the item and the field (``items[3].status.nodeMetric.systemUsage.resources.cpu``)."""
    plain: list[Mapping[str, Any]] = []
    positions: list[int] = []
    extra: list[tuple[int, Mapping[str, Any]]] = []
    for i, obj in enumerate(objects):
        if obj.get("kind") in ("Node", "Pod", "Reservation", "Device", "NodeResourceTopology"):
            plain.append(obj)
            positions.append(i)
        else:
            extra.append((i, obj))
    try:
        sched = build_snapshot(plain, source)
    except SchedulerInputError as err:  # re-number the item as the file has it
        field_path = err.field
        if field_path.startswith("items["):
            idx = int(field_path[6 : field_path.index("]")])
            field_path = f"items[{positions[idx]}]" + field_path[field_path.index("]") + 1 :]
        raise InputError(source, field_path, err.message) from err
    cluster = Cluster(sched=sched)
    for obj in plain:
        if obj.get("kind") == "Node" and not node_ready(obj):
            cluster.not_ready.add(_str((obj.get("metadata") or {}).get("name")))
    for i, obj in extra:
        where = f"items[{i}]"
        kind = obj.get("kind")
        meta = obj.get("metadata") or {}
        if not isinstance(meta, Mapping):
            raise InputError(source, where + ".metadata", "must be a map")
        name = _str(meta.get("name"))
        if kind == "NodeMetric":
            try:
                metric = nodemetric.parse_node_metric(obj, source)
            except SchemaError as err:
                raise InputError(
                    source, f"{where}.{err.field}" if err.field else where, err.message
                ) from err
            cluster.usage[name] = usage_report(metric)
        elif kind == "PodDisruptionBudget":
            pdb = parse_pdb(obj, source, where)
            cluster.pdbs[pdb.key] = pdb
        elif kind in WORKLOAD_KINDS:
            w = parse_workload(obj, source, where)
            cluster.workloads[(w.kind, w.namespace, w.name)] = w
        elif kind == "PriorityClass":
            sched.priority_classes[name] = dict(obj)
        elif kind == "PodMigrationJob":
            try:
                cluster.jobs.put(parse_job(obj, source))
            except SchemaError as err:
                raise InputError(source, f"{where}.{err.field}", err.message) from err
    return cluster


def load_cluster(path: Path) -> Cluster:
    """:func:`build_cluster` over a file. Raises :class:`InputError` naming the file."""
    try:
        objects = load_objects(path)
    except SchedulerInputError as err:
        raise InputError(err.source, err.field, err.message) from err
    return build_cluster(objects, str(path))
