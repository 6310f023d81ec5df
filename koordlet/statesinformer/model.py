"""Immutable descriptions of the workloads on this node, as the inventory hands them out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field

from apis.extension import KubeQOS, QoSClass
from apis.records import frozen


@frozen
class ContainerInfo:
    """One container of a pod."""

    id: str
    """Runtime container id (the hex id in the cgroup name)."""
    name: str
    """Kubernetes container name when known; else the first 12 characters of ``id``."""
    runtime: str
    """``containerd``, ``cri-o``, ``docker`` or ``unknown`` (from the cgroup name)."""
    cgroup_dir: str
    """Cgroup directory relative to a controller root (v1) or the unified root (v2)."""
    cpu_request_milli: int | None = None
    """CPU request in milli-cores; None when the source does not know (kubelet-free discovery)."""
    cpu_limit_milli: int | None = None
    """CPU limit in milli-cores; None when unknown or unlimited."""
    memory_request_bytes: int | None = None
    """Memory request in bytes; None when unknown."""
    memory_limit_bytes: int | None = None
    """Memory limit in bytes; None when unknown or unlimited."""


@frozen
class PodInfo:
    """One pod and its containers."""

    uid: str
    """Pod UID with dashes (``0f6d…-…``), whatever the driver wrote in the cgroup name."""
    name: str
    """Pod name; kubelet-free discovery, which has no name, uses ``pod<uid>``."""
    namespace: str
    """Namespace; empty when unknown."""
    qos: QoSClass
    """Koordinator QoS class."""
    kube_qos: KubeQOS
    """Kubernetes QoS class (from the cgroup path or the pod status)."""
    cgroup_dir: str
    """Pod cgroup directory relative to a controller root (v1) or the unified root (v2)."""
    containers: tuple[ContainerInfo, ...] = ()
    priority_class: str = ""
    """Koordinator priority class (``koord-prod``, ``koord-mid``, ``koord-batch``, ``koord-free``);
    empty when unknown."""
    cpu_request_milli: int | None = None
    """Sum of container CPU requests in milli-cores; None when the source does not know."""
    memory_request_bytes: int | None = None
    """Sum of container memory requests in bytes; None when the source does not know."""
    source: str = ""
    """Which inventory source reported it (``kubepods``, ``kubernetes``)."""
    priority: int | None = None
    """``spec.priority``; None when the source does not know (kubelet-free discovery)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Pod labels (``koordinator.sh/eviction-enabled``...); empty when the source has none."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """Pod annotations (``scheduling.koordinator.sh/resource-status``...); empty when none."""
    cpu_limit_milli: int | None = None
    """Sum of container CPU limits in milli-cores; None when unknown or unlimited."""
    memory_limit_bytes: int | None = None
    """Sum of container memory limits in bytes; None when unknown or unlimited."""
    created_at: float | None = None
    """``metadata.creationTimestamp`` in Unix seconds; None when unknown."""
    qos_label: QoSClass | None = None
    """The class the ``koordinator.sh/qosClass`` label gives (``QoSClass.NONE`` without the
    label), as upstream's ``GetPodQoSClassRaw`` reads it; None for a source without labels
    (kubelet-free discovery), where ``qos`` stands in."""
    extended_requests: Mapping[str, int] = field(default_factory=dict)
    """Requests of Koordinator's extended resources summed over the containers and the sidecar
    (restartable init) containers: ``kubernetes.io/batch-cpu`` and ``mid-cpu`` in milli-cores
    (the quantity's integer value), ``batch-memory`` and ``mid-memory`` in bytes; empty when the
    source knows none (kubelet-free discovery)."""
    extended_resources: Mapping[str, Mapping[str, Mapping[str, str]]] = field(default_factory=dict)
    """Container name -> ``{"requests": {...}, "limits": {...}}`` of its batch and mid resources
    (``kubernetes.io/batch-cpu``...) as the spec writes them, for containers that have any;
    empty when none or when the source has no spec (the runtime hooks' reconciler)."""


@frozen
class HostAppInfo:
    """A non-containerized application declared in NodeSLO's ``hostApplications``."""

    name: str
    qos: QoSClass
    cgroup_dir: str
    """Its reserved cgroup, relative to a controller root (v1) or the unified root (v2)."""
    priority_class: str = ""
    present: bool = True
    """False when declared but its cgroup does not exist (reported, not an error)."""


@frozen
class WorkloadSnapshot:
    """Everything the inventory knows at one moment; replaced, never mutated."""

    pods: Mapping[str, PodInfo] = field(default_factory=dict)
    """Pods by UID."""
    host_apps: tuple[HostAppInfo, ...] = ()
    generation: int = 0
    """Increases by one each time the content changes."""
    taken_at: float = 0.0
    """``time.time()`` when it was built."""
