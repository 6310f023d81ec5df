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
from apis.records import frozen
from apis.slo import SchemaError
from descheduler.errors import InputError
from descheduler.migration.store import JobStore
from descheduler.podfacts import PodFacts, pod_facts
from descheduler.selectors import Selector, SelectorError, from_label_selector
from scheduler_plugins.errors import InputError as SchedulerInputError
from scheduler_plugins.loading import build_snapshot, load_objects
from scheduler_plugins.snapshot import NodeInfo, PodInfo, Snapshot

WORKLOAD_KINDS = (KIND_REPLICA_SET, KIND_DEPLOYMENT, KIND_STATEFUL_SET, KIND_REPLICATION_CONTROLLER)


@frozen
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


@frozen
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


@frozen
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


def _owner_uids(pod: PodInfo) -> list[str]:
    meta = pod.raw.get("metadata") or {}
    return [
        str(o.get("uid") or "")
        for o in meta.get("ownerReferences") or ()
        if isinstance(o, Mapping) and o.get("uid")
    ]


def pod_unavailable(pod: PodInfo) -> bool:
    """Terminating, or without a ``Ready`` condition that is True."""
    raw = pod.raw
    if (raw.get("metadata") or {}).get("deletionTimestamp"):
        return True
    for c in (raw.get("status") or {}).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True":
            return False
    return True


@dataclass(slots=True)
class PodIndex:
    """The pods by ``namespace/name``, by uid and by owner uid, with each owner's unavailable
    pods (what the migration limits count), read from the raw objects."""

    by_key: dict[str, PodInfo] = field(default_factory=dict)
    by_uid: dict[str, PodInfo] = field(default_factory=dict)
    by_owner: dict[str, dict[str, PodInfo]] = field(default_factory=dict)
    """Owner uid → pod uid → pod."""
    unavailable: dict[str, set[str]] = field(default_factory=dict)
    """Owner uid → ``namespace/name`` of its pods that are terminating or not Ready."""

    def add(self, pod: PodInfo) -> None:
        if (pod.raw.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        self.by_key[pod.key] = pod
        self.by_uid[pod.uid] = pod
        owners = _owner_uids(pod)
        if not owners:
            return
        down = pod_unavailable(pod)
        for uid in owners:
            self.by_owner.setdefault(uid, {})[pod.uid] = pod
            if down:
                self.unavailable.setdefault(uid, set()).add(pod.key)

    def remove(self, pod: PodInfo) -> None:
        if self.by_key.get(pod.key) is pod:
            del self.by_key[pod.key]
        if self.by_uid.get(pod.uid) is pod:
            del self.by_uid[pod.uid]
        for uid in _owner_uids(pod):
            pods = self.by_owner.get(uid)
            if pods is not None and pods.get(pod.uid) is pod:
                del pods[pod.uid]
                if not pods:
                    del self.by_owner[uid]
            down = self.unavailable.get(uid)
            if down is not None:
                down.discard(pod.key)
                if not down:
                    del self.unavailable[uid]


@dataclass(slots=True)
class Cluster:
    """See the module docstring."""

    sched: Snapshot = field(default_factory=Snapshot)
    usage: dict[str, NodeUsageReport] = field(default_factory=dict)
    """NodeMetrics by node name."""
    pdbs: dict[str, DisruptionBudget] = field(default_factory=dict)
    """PodDisruptionBudgets by ``namespace/name``."""
    workloads: dict[tuple[str, str, str], Workload] = field(default_factory=dict)
    """Workloads by ``(kind, namespace, name)``; bump :attr:`workloads_version` on change."""
    jobs: JobStore = field(default_factory=JobStore)
    not_ready: set[str] = field(default_factory=set)
    """Nodes with a ``Ready`` condition other than True (``nodeutil.IsReady``)."""
    live: bool = False
    """Whether an informer keeps the pod indexes current (:meth:`index_pod`,
    :meth:`unindex_pod`); otherwise they are rebuilt from the snapshot once per change."""
    workloads_version: int = 0
    """Bumped on every change of :attr:`workloads` (caches key on it)."""
    pdbs_version: int = 0
    """Bumped on every change of :attr:`pdbs`."""
    _facts: dict[str, tuple[PodInfo, PodFacts]] = field(default_factory=dict)
    _last_facts: tuple[PodInfo, PodFacts] | None = None
    _index: PodIndex | None = None
    _index_generation: int = -1
    _rs_of: tuple[int, dict[str, list[Workload]]] | None = None

    # -- pods --------------------------------------------------------------------------------
    def facts(self, pod: PodInfo) -> PodFacts:
        """The pod's facts, computed once per object version."""
        last = self._last_facts
        if last is not None and last[0] is pod:
            return last[1]
        cached = self._facts.get(pod.uid)
        if cached is not None and cached[0] is pod:
            self._last_facts = cached
            return cached[1]
        facts = pod_facts(pod)
        self._last_facts = self._facts[pod.uid] = (pod, facts)
        return facts

    def pods(self) -> PodIndex:
        """The pod indexes (see :class:`PodIndex`)."""
        if self.live:
            if self._index is None:
                self._index = PodIndex()
            return self._index
        if self._index is None or self._index_generation != self.sched.generation:
            index = PodIndex()
            for pod in self.sched.all_pods():
                index.add(pod)
            self._index = index
            self._index_generation = self.sched.generation
        return self._index

    def index_pod(self, pod: PodInfo) -> None:
        """An informer's pod, added or replacing the one of that name (live mode)."""
        index = self.pods()
        old = index.by_key.get(pod.key)
        if old is not None:
            index.remove(old)
        index.add(pod)

    def unindex_pod(self, key: str, uid: str = "") -> None:
        """An informer's pod gone (live mode): by ``namespace/name`` and, when given, uid."""
        index = self.pods()
        old = index.by_key.get(key)
        if old is not None and (not uid or old.uid == uid):
            index.remove(old)
            self._facts.pop(old.uid, None)

    def pod(self, namespace: str, name: str) -> PodInfo | None:
        """A pod by name (assigned or pending)."""
        return self.pods().by_key.get(f"{namespace}/{name}")

    def pod_by_uid(self, uid: str) -> PodInfo | None:
        return self.pods().by_uid.get(uid)

    def pods_of_owner(self, uid: str) -> list[PodInfo]:
        """Pods whose ownerReferences name ``uid``."""
        return list(self.pods().by_owner.get(uid, {}).values())

    def unavailable_of_owner(self, uid: str) -> set[str]:
        """``namespace/name`` of the owner's pods that are terminating or not Ready."""
        return self.pods().unavailable.get(uid, set())

    def replica_sets_of(self, deployment_uid: str) -> list[Workload]:
        """The ReplicaSets a Deployment controls (indexed per change of the workloads)."""
        if self._rs_of is None or self._rs_of[0] != self.workloads_version:
            index: dict[str, list[Workload]] = {}
            for w in self.workloads.values():
                if w.kind == KIND_REPLICA_SET and w.controller_uid:
                    index.setdefault(w.controller_uid, []).append(w)
            self._rs_of = (self.workloads_version, index)
        return self._rs_of[1].get(deployment_uid, [])

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
