"""A cluster snapshot: what the plugins see, by kind: nodes with their assigned pods, pending
pods, NodeMetrics, NodeResourceTopologies and the other objects the plugins read.
:mod:`scheduler_plugins.loading` builds one from objects as ``kubectl get -o yaml`` prints them;
the informers (``informed.py``) keep one current.

:class:`PodInfo` and :class:`NodeInfo` are parsed here; their placement fields (selectors,
affinity, taints...) by ``constraints.py``, their fields and quantities through
:mod:`scheduler_plugins.objectfields`; NodeMetrics and NodeResourceTopologies are
:mod:`scheduler_plugins.nodeviews`'s.

The scheduler changes it in two ways: :meth:`Snapshot.assume` adds a pod to a node (the
scheduler's "assume" after reserve) and :meth:`Snapshot.forget` takes it back;
:meth:`Snapshot.assume_reservation` puts a Reservation the scheduler has just placed.

**Assumed pods** (kube-scheduler's cache, ``pkg/scheduler/internal/cache/cache.go``: ``AssumePod``,
``ForgetPod``, ``AddPod`` of an assumed pod) stay on their node until the informers bring the
pod bound (the assumption is then *confirmed*: the API server's copy replaces it, on the node the
binding named) or deleted. An informer's copy of an assumed pod that is still unbound (an
annotation patch, a status write, a relist) does not take it off its node: it is kept aside and
is what :meth:`Snapshot.forget` puts back among the pending pods when the binding fails. So no
decision sees the cluster without the pods assumed before it, whatever the order in which
bindings, their failures and the watch events arrive.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apis.extension import LABEL_POD_QOS
from apis.kubernetes_keys import DEFAULT_MEMORY_REQUEST, DEFAULT_MILLI_CPU_REQUEST
from apis.priority import pod_priority_class_with_default
from apis.quantity import resource_value
from scheduler_plugins.clusterobjects import (
    ClaimInfo,
    DisruptionBudget,
    VolumeInfo,
)
from scheduler_plugins.constraints import (
    EMPTY,
    PodConstraints,
    Taint,
    parse_images,
    parse_pod_constraints,
    parse_taints,
)
from scheduler_plugins.errors import InputError
from scheduler_plugins.nodeviews import NodeMetricInfo, NRTInfo
from scheduler_plugins.objectfields import (
    ResourceList,
    add_into,
    as_list,
    as_map,
    as_str_map,
    optional_time,
    parse_resource_list,
)

ALL = "*"
"""A change that is not one node's (see :meth:`Snapshot.touch`)."""
PENDING = ""
"""A change to the pending pods only (no node's index changes; quotas and gangs re-read)."""
MAX_CHANGES = 4096
"""Change log entries kept; a consumer further behind re-indexes everything."""


@dataclass(slots=True)
class PodInfo:
    """One pod as the plugins need it."""

    namespace: str
    """``metadata.namespace`` (``default`` when unset)."""
    name: str
    """``metadata.name``."""
    uid: str
    """``metadata.uid`` (``namespace/name`` when unset, as in a hand-written pod file)."""
    node_name: str
    """``spec.nodeName``; empty while unscheduled."""
    labels: dict[str, str]
    """``metadata.labels``."""
    annotations: dict[str, str]
    """``metadata.annotations``."""
    requests: ResourceList
    """Effective requests: max(sum of containers, largest init container) plus overhead, a
    missing request defaulting to its limit as the API server does."""
    limits: ResourceList
    """Sum of the containers' limits (resources without a limit in some container omitted)."""
    qos_class: str
    """``koordinator.sh/qosClass`` label, else derived from the Kubernetes QoS (LS/BE)."""
    qos_label: str
    """The raw ``koordinator.sh/qosClass`` label (``""`` when absent)."""
    priority_class: str
    """Koordinator priority class: the priority-class label, else the band of ``spec.priority``,
    else by QoS (``GetPodPriorityClassWithDefault``, ``apis.priority``)."""
    priority: int
    """``spec.priority`` (0 when unset)."""
    scheduled_at: float | None
    """When the pod was bound (PodScheduled condition, else startTime, else creation)."""
    owner_kinds: tuple[str, ...]
    """Kinds of ``metadata.ownerReferences`` (``DaemonSet`` exempts a pod from load-aware)."""
    raw: dict[str, Any] = field(repr=False)
    """The object as read."""
    constraints: PodConstraints = EMPTY
    """Its placement fields (node selector, affinity, tolerations...)."""
    non_zero: tuple[int, int] = (0, 0)
    """cpu (milli) and memory requests with kube-scheduler's defaults for containers that
    request none (100m, 200 MiB): what its scores count (``NonZeroRequested``)."""

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


def _kube_qos(containers: Sequence[Mapping[str, Any]]) -> str:
    requests_any = False
    guaranteed = True
    for c in containers:
        res = c.get("resources") or {}
        req = res.get("requests") or {}
        lim = res.get("limits") or {}
        if req or lim:
            requests_any = True
        for name in ("cpu", "memory"):
            if name not in lim:
                guaranteed = False
            elif name in req and str(req[name]) != str(lim[name]):
                try:
                    if resource_value(name, req[name]) != resource_value(name, lim[name]):
                        guaranteed = False
                except ValueError:
                    guaranteed = False
    if not requests_any:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def parse_pod(obj: Mapping[str, Any], source: str, where: str = "") -> PodInfo:
    """A :class:`PodInfo` from a v1 Pod. Raises :class:`InputError` naming the bad field."""
    prefix = f"{where}." if where else ""
    meta = as_map(obj.get("metadata"), source, prefix + "metadata")
    spec = as_map(obj.get("spec"), source, prefix + "spec")
    status = as_map(obj.get("status"), source, prefix + "status")
    name = str(meta.get("name") or "")
    if not name:
        raise InputError(source, prefix + "metadata.name", "a pod needs a name")
    namespace = str(meta.get("namespace") or "default")
    labels = as_str_map(meta.get("labels"), source, prefix + "metadata.labels")
    annotations = as_str_map(meta.get("annotations"), source, prefix + "metadata.annotations")
    containers = as_list(spec.get("containers"), source, prefix + "spec.containers")
    init_containers = as_list(spec.get("initContainers"), source, prefix + "spec.initContainers")
    requests: ResourceList = {}
    limits: ResourceList = {}
    nz_cpu = nz_mem = 0
    for i, c in enumerate(containers):
        cwhere = f"{prefix}spec.containers[{i}].resources"
        res = as_map(
            as_map(c, source, f"{prefix}spec.containers[{i}]").get("resources"), source, cwhere
        )
        lim = parse_resource_list(res.get("limits"), source, cwhere + ".limits")
        req = parse_resource_list(res.get("requests"), source, cwhere + ".requests")
        for rname, value in lim.items():
            req.setdefault(rname, value)
        add_into(requests, req)
        add_into(limits, lim)
        nz_cpu += req.get("cpu", DEFAULT_MILLI_CPU_REQUEST)
        nz_mem += req.get("memory", DEFAULT_MEMORY_REQUEST)
    for i, c in enumerate(init_containers):
        cwhere = f"{prefix}spec.initContainers[{i}].resources"
        res = as_map(
            as_map(c, source, f"{prefix}spec.initContainers[{i}]").get("resources"), source, cwhere
        )
        lim = parse_resource_list(res.get("limits"), source, cwhere + ".limits")
        req = parse_resource_list(res.get("requests"), source, cwhere + ".requests")
        for rname, value in lim.items():
            req.setdefault(rname, value)
        for rname, value in req.items():
            if value > requests.get(rname, 0):
                requests[rname] = value
        nz_cpu = max(nz_cpu, req.get("cpu", DEFAULT_MILLI_CPU_REQUEST))
        nz_mem = max(nz_mem, req.get("memory", DEFAULT_MEMORY_REQUEST))
    overhead = parse_resource_list(spec.get("overhead"), source, prefix + "spec.overhead")
    add_into(requests, overhead)
    nz_cpu += overhead.get("cpu", 0)
    nz_mem += overhead.get("memory", 0)
    raw_priority = spec.get("priority")
    if raw_priority is not None and not isinstance(raw_priority, int):
        raise InputError(
            source, prefix + "spec.priority", f"must be an integer, got {raw_priority!r}"
        )
    priority = int(raw_priority) if raw_priority is not None else 0
    qos_label = labels.get(LABEL_POD_QOS, "")
    kube_qos = str(status.get("qosClass") or _kube_qos(containers))
    qos = qos_label or ("BE" if kube_qos == "BestEffort" else "LS")
    pclass = pod_priority_class_with_default(labels, raw_priority, qos)
    scheduled_at = None
    for i, cond in enumerate(
        as_list(status.get("conditions"), source, prefix + "status.conditions")
    ):
        if isinstance(cond, Mapping) and cond.get("type") == "PodScheduled":
            scheduled_at = optional_time(
                cond.get("lastTransitionTime"),
                source,
                f"{prefix}status.conditions[{i}].lastTransitionTime",
            )
    if scheduled_at is None:
        scheduled_at = optional_time(status.get("startTime"), source, prefix + "status.startTime")
    if scheduled_at is None:
        scheduled_at = optional_time(
            meta.get("creationTimestamp"), source, prefix + "metadata.creationTimestamp"
        )
    owners = tuple(
        str(o.get("kind", ""))
        for o in as_list(meta.get("ownerReferences"), source, prefix + "metadata.ownerReferences")
        if isinstance(o, Mapping)
    )
    return PodInfo(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or f"{namespace}/{name}"),
        node_name=str(spec.get("nodeName") or ""),
        labels=labels,
        annotations=annotations,
        requests=requests,
        limits=limits,
        qos_class=qos,
        qos_label=qos_label,
        priority_class=pclass,
        priority=priority,
        scheduled_at=scheduled_at,
        owner_kinds=owners,
        raw=dict(obj),
        constraints=parse_pod_constraints(obj, namespace, name, labels, source, prefix),
        non_zero=(nz_cpu, nz_mem),
    )


@dataclass(slots=True)
class NodeInfo:
    """One node and the pods assigned to it."""

    name: str
    """``metadata.name``."""
    labels: dict[str, str]
    """``metadata.labels``."""
    annotations: dict[str, str]
    """``metadata.annotations``."""
    allocatable: ResourceList
    """``status.allocatable`` (``capacity`` where allocatable is absent)."""
    unschedulable: bool
    """``spec.unschedulable``."""
    taints: tuple[Taint, ...] = ()
    """``spec.taints``."""
    images: dict[str, int] = field(default_factory=dict)
    """``status.images``: every image name → its size in bytes."""
    conditions: dict[str, str] = field(default_factory=dict)
    """``status.conditions``: type → status (``"True"``, ``"False"``, ``"Unknown"``)."""
    pods: dict[str, PodInfo] = field(default_factory=dict)
    """Assigned pods by uid."""
    requested: ResourceList = field(default_factory=dict)
    """Sum of the assigned pods' requests, plus ``pods`` (their count)."""
    generation: int = 0
    """Bumped on every assume/forget, so per-node caches know when to rebuild."""
    non_zero_requested: list[int] = field(default_factory=lambda: [0, 0])
    """Sum of the assigned pods' :attr:`PodInfo.non_zero` (cpu, memory)."""

    def add_pod(self, pod: PodInfo) -> None:
        """Account an assigned pod."""
        self.pods[pod.uid] = pod
        add_into(self.requested, pod.requests)
        self.requested["pods"] = self.requested.get("pods", 0) + 1
        nz = self.non_zero_requested
        nz[0] += pod.non_zero[0]
        nz[1] += pod.non_zero[1]
        self.generation += 1

    def remove_pod(self, uid: str) -> PodInfo | None:
        """Drop an assigned pod; returns it, or ``None`` when it was not here."""
        pod = self.pods.pop(uid, None)
        if pod is not None:
            add_into(self.requested, pod.requests, -1)
            self.requested["pods"] = self.requested.get("pods", 0) - 1
            nz = self.non_zero_requested
            nz[0] -= pod.non_zero[0]
            nz[1] -= pod.non_zero[1]
            self.generation += 1
        return pod


def parse_node(obj: Mapping[str, Any], source: str, where: str) -> NodeInfo:
    """A :class:`NodeInfo` (no pods yet) from a v1 Node."""
    meta = as_map(obj.get("metadata"), source, where + ".metadata")
    status = as_map(obj.get("status"), source, where + ".status")
    spec = as_map(obj.get("spec"), source, where + ".spec")
    alloc_key = "allocatable" if "allocatable" in status else "capacity"
    return NodeInfo(
        name=str(meta.get("name") or ""),
        labels=as_str_map(meta.get("labels"), source, where + ".metadata.labels"),
        annotations=as_str_map(meta.get("annotations"), source, where + ".metadata.annotations"),
        allocatable=parse_resource_list(
            status.get(alloc_key), source, f"{where}.status.{alloc_key}"
        ),
        unschedulable=bool(spec.get("unschedulable", False)),
        taints=parse_taints(spec.get("taints"), source, where + ".spec.taints"),
        images=parse_images(status.get("images"), source, where + ".status.images"),
        conditions={
            str(c["type"]): str(c.get("status", ""))
            for c in as_list(status.get("conditions"), source, where + ".status.conditions")
            if isinstance(c, Mapping) and "type" in c
        },
    )


@dataclass(slots=True)
class Snapshot:
    """Everything the plugins read, by kind."""

    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    """Nodes by name, in the order read."""
    pending_pods: dict[str, PodInfo] = field(default_factory=dict)
    """Pods not yet assigned to a node, by uid (quota requests and gang members)."""
    node_metrics: dict[str, NodeMetricInfo] = field(default_factory=dict)
    """NodeMetrics by node name."""
    topologies: dict[str, NRTInfo] = field(default_factory=dict)
    """NodeResourceTopologies by node name."""
    quotas: dict[str, dict[str, Any]] = field(default_factory=dict)
    """ElasticQuotas (raw objects) by name."""
    pod_groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    """PodGroups (raw objects) by ``namespace/name``."""
    reservations: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Reservations (raw objects) by name."""
    quota_profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    """ElasticQuotaProfiles (raw objects) by ``namespace/name``."""
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Devices (raw objects) by node name."""
    priority_classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """PriorityClasses (``scheduling.k8s.io/v1``, raw objects) by name."""
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    """Namespaces' labels by name (affinity terms' ``namespaceSelector``)."""
    claims: dict[str, ClaimInfo] = field(default_factory=dict)
    """PersistentVolumeClaims by ``namespace/name``."""
    volumes: dict[str, VolumeInfo] = field(default_factory=dict)
    """PersistentVolumes by name."""
    budgets: dict[str, DisruptionBudget] = field(default_factory=dict)
    """PodDisruptionBudgets by ``namespace/name``."""
    orphans: dict[str, dict[str, PodInfo]] = field(default_factory=dict)
    """Pods bound to nodes the snapshot does not have (yet), by node name then uid."""
    assumed: dict[str, PodInfo] = field(default_factory=dict)
    """Pods assumed on a node and not yet seen bound by the informers, by uid."""
    _unbound_copies: dict[str, PodInfo] = field(default_factory=dict, init=False, repr=False)
    """The informers' latest unbound copy of an assumed pod, by uid (what :meth:`forget` puts
    back)."""
    generation: int = 0
    """Bumped on every change (:meth:`touch`); plugins key their caches on it."""
    reservation_generation: int = 0
    """Bumped by :meth:`assume_reservation` (the informers' changes touch :data:`ALL`)."""
    changes: list[tuple[int, str]] = field(default_factory=list)
    """``(generation, node name)`` of recent changes (:data:`ALL`: not one node's), so plugins
    re-index only the nodes that changed."""

    def touch(self, node_name: str) -> None:
        """Record a change to ``node_name`` (its pods, metric, topology) or, with :data:`ALL`,
        to something every node may see (quotas, gangs, reservations, devices)."""
        self.generation += 1
        self.changes.append((self.generation, node_name))
        if len(self.changes) > MAX_CHANGES:
            del self.changes[: len(self.changes) // 2]

    def changed_since(self, generation: int) -> set[str] | None:
        """Nodes changed after ``generation``; ``None`` when a full re-index is needed (the
        log no longer reaches back that far, or an :data:`ALL` change)."""
        if generation == self.generation:
            return set()
        if generation > self.generation or not self.changes or self.changes[0][0] > generation + 1:
            return None
        start = bisect_right(self.changes, (generation, "\U0010ffff"))
        names = {name for _, name in self.changes[start:]}
        return None if ALL in names else names

    def all_pods(self) -> Iterable[PodInfo]:
        """Assigned and pending pods."""
        for node in self.nodes.values():
            yield from node.pods.values()
        yield from self.pending_pods.values()

    def assume(self, pod: PodInfo, node_name: str) -> None:
        """Account ``pod`` on ``node_name`` as if bound (removes it from the pending pods) until
        the informers confirm the binding or :meth:`forget` undoes it."""
        if self.pending_pods.pop(pod.uid, None) is not None:
            self.touch(PENDING)
        elif pod.uid in self.assumed:  # assumed again (a nominated pod held for a cycle)
            self.remove_pod(pod.uid)
        pod.node_name = node_name
        self.nodes[node_name].add_pod(pod)
        self.assumed[pod.uid] = pod
        self.touch(node_name)

    def is_assumed(self, uid: str) -> bool:
        """Whether ``uid`` is assumed and not yet seen bound."""
        return uid in self.assumed

    def assume_reservation(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Put a Reservation (by name) as the scheduler just wrote it (placed: ``Available`` on
        ``status.nodeName``), so the next pod sees what it holds before the informer brings the
        API server's copy; the object it replaced (``assume_reservation(old)`` undoes it)."""
        name = str((obj.get("metadata") or {}).get("name") or "")
        old = self.reservations.get(name)
        self.reservations[name] = obj
        self.reservation_generation += 1
        for version in (old, obj):
            node = str(((version or {}).get("status") or {}).get("nodeName") or "")
            if node:
                self.touch(node)
        return old

    def forget(self, pod: PodInfo, *, pending: bool = True) -> PodInfo | None:
        """Undo :meth:`assume` of ``pod``: off its node and, with ``pending``, pending again as
        the informers last saw it unbound (``pod`` itself when they sent nothing since); that
        pod, or ``None`` when there is nothing to undo (deleted meanwhile, already seen bound,
        or not assumed: left as it is)."""
        if self.assumed.get(pod.uid) is not pod:
            pod.node_name = ""
            return None
        del self.assumed[pod.uid]
        node = self.nodes.get(pod.node_name)
        if node is not None and node.pods.get(pod.uid) is pod:
            node.remove_pod(pod.uid)
            self.touch(node.name)
        else:
            orphans = self.orphans.get(pod.node_name)
            if orphans is not None and orphans.get(pod.uid) is pod:
                del orphans[pod.uid]
        pod.node_name = ""
        latest = self._unbound_copies.pop(pod.uid, pod)
        latest.node_name = ""
        if pending:
            self.pending_pods[latest.uid] = latest
            self.touch(PENDING)
        return latest

    # -- incremental updates (informers) ------------------------------------------------------

    def upsert_node(self, info: NodeInfo) -> None:
        """Add or replace a node, keeping the pods assigned to it."""
        old = self.nodes.get(info.name)
        pods = list(old.pods.values()) if old is not None else []
        pods += self.orphans.pop(info.name, {}).values()
        self.nodes[info.name] = info
        for pod in pods:
            info.add_pod(pod)
        self.touch(info.name)

    def remove_node(self, name: str) -> None:
        """Drop a node; its pods wait for it in :attr:`orphans`."""
        old = self.nodes.pop(name, None)
        if old is not None and old.pods:
            self.orphans[name] = dict(old.pods)
        self.touch(name)

    def upsert_pod(self, pod: PodInfo) -> None:
        """Add or replace a pod (by uid) where it belongs: its node, pending, or waiting for a
        node the snapshot does not have yet. An assumed pod stays where it was assumed until
        a copy arrives bound (see the module docstring)."""
        if self.assumed and pod.uid in self.assumed:
            if not pod.node_name:
                self._unbound_copies[pod.uid] = pod
                return
            hint = self.assumed.pop(pod.uid).node_name
            self._unbound_copies.pop(pod.uid, None)
            self.remove_pod(pod.uid, hint=hint)
        elif pod.node_name:
            self.remove_pod(pod.uid, hint=pod.node_name)
        # an unbound pod is pending or assumed, never on a node (a pod's nodeName is set once):
        # replacing it needs no search through the nodes
        if not pod.node_name:
            self.pending_pods[pod.uid] = pod
            self.touch(PENDING)
        elif pod.node_name in self.nodes:
            self.nodes[pod.node_name].add_pod(pod)
            self.touch(pod.node_name)
        else:
            self.orphans.setdefault(pod.node_name, {})[pod.uid] = pod

    def remove_pod(self, uid: str, hint: str = "") -> None:
        """Drop a pod wherever it is (``hint``: the node to look at first); an assumed pod is
        no longer assumed."""
        if self.assumed:
            assumed = self.assumed.pop(uid, None)
            self._unbound_copies.pop(uid, None)
            if assumed is not None and not hint:
                hint = assumed.node_name
        if self.pending_pods.pop(uid, None) is not None:
            self.touch(PENDING)
            return
        first = self.nodes.get(hint)
        if first is not None and uid in first.pods:
            first.remove_pod(uid)
            self.touch(first.name)
            return
        for node in self.nodes.values():
            if uid in node.pods:
                node.remove_pod(uid)
                self.touch(node.name)
                return
        for waiting in self.orphans.values():
            if waiting.pop(uid, None) is not None:
                return
