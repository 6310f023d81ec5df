"""The request/response model every hook mode shares (docs/runtimehooks.md).

A mode (the hook server that koord-runtime-proxy calls, the NRI plugin, the reconciler)
turns what it received into a :class:`PodRequest` or :class:`ContainerRequest`, the framework
runs the enabled hooks of that :class:`HookPoint` and merges their :class:`Change` objects into
one, and the mode turns the merged change back into its own response. Hooks never see a protocol
message. Point names are Koordinator's ``RuntimeHookType`` values (upstream
``pkg/runtimeproxy/config/config.go``), so ``--runtime-hooks-disable-stages`` takes the same
names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, fields, replace
from enum import StrEnum
from typing import Any, TypeVar

from apis.records import frozen


class HookPoint(StrEnum):
    """Where in a pod's or container's life a hook runs (upstream ``RuntimeHookType``)."""

    PRE_RUN_POD_SANDBOX = "PreRunPodSandbox"
    POST_STOP_POD_SANDBOX = "PostStopPodSandbox"
    PRE_REMOVE_POD_SANDBOX = "PreRemoveRunPodSandbox"
    PRE_CREATE_CONTAINER = "PreCreateContainer"
    PRE_START_CONTAINER = "PreStartContainer"
    POST_START_CONTAINER = "PostStartContainer"
    PRE_UPDATE_CONTAINER_RESOURCES = "PreUpdateContainerResources"
    POST_STOP_CONTAINER = "PostStopContainer"

    @property
    def pod_level(self) -> bool:
        """True for the pod sandbox points (the request is a :class:`PodRequest`)."""
        return self in POD_POINTS


POD_POINTS = frozenset(
    {
        HookPoint.PRE_RUN_POD_SANDBOX,
        HookPoint.POST_STOP_POD_SANDBOX,
        HookPoint.PRE_REMOVE_POD_SANDBOX,
    }
)
"""The points whose request is a :class:`PodRequest`; the others get a
:class:`ContainerRequest`."""


@frozen
class Resources:
    """Linux resources of a pod or a container; None means "not specified / unchanged".

    Units are the kernel's: ``cpu_shares`` (2..262144), ``cfs_quota`` and ``cfs_period`` in µs
    (``cfs_quota`` -1 is unlimited), ``memory_limit`` in bytes (-1 unlimited), cpusets in the
    kernel's list format (``0-3,8``).
    """

    cpu_shares: int | None = None
    """cpu.shares."""
    cfs_quota: int | None = None
    """cpu.cfs_quota_us; -1 unlimited."""
    cfs_period: int | None = None
    """cpu.cfs_period_us."""
    cpuset_cpus: str | None = None
    """cpuset.cpus."""
    cpuset_mems: str | None = None
    """cpuset.mems."""
    memory_limit: int | None = None
    """memory.limit_in_bytes; -1 unlimited."""
    cpu_bvt_warp_ns: int | None = None
    """cpu.bvt_warp_ns (group identity, Anolis); koordlet-written, see :data:`KOORDLET_FIELDS`."""
    cpu_idle: int | None = None
    """cpu.idle (0 or 1); koordlet-written. An idle group has no weight: the kernel refuses
    cpu.shares on it, so the framework leaves cpu.shares out where cpu.idle is 1."""
    net_cls_classid: int | None = None
    """net_cls.classid (tc class, ``major << 16 | minor``); koordlet-written."""
    oom_score_adj: int | None = None
    """The ``oom_score_adj`` (-1000..1000) a container's first process starts with: CRI
    ``LinuxContainerResources.oom_score_adj`` (field 5), NRI
    ``LinuxContainerAdjustment.oom_score_adj`` (field 4); at container creation only (no
    cgroup knob: running processes are the ``oomscoreadj`` QoS strategy's)."""

    def merged(self, other: Resources) -> Resources:
        """These resources with every field ``other`` sets taking its value."""
        return replace(self, **other.set_fields())

    def set_fields(self) -> dict[str, Any]:
        """The fields that are not None, by name."""
        return {n: v for n in _RESOURCE_FIELDS if (v := getattr(self, n)) is not None}

    def __bool__(self) -> bool:
        return any(getattr(self, n) is not None for n in _RESOURCE_FIELDS)


_RESOURCE_FIELDS = tuple(f.name for f in fields(Resources))
"""The field names of :class:`Resources`, once (``dataclasses.fields`` rebuilds its tuple at
every call, and the reconciler asks a few thousand times a round)."""


RUNTIME_FIELDS = frozenset(
    {
        "cpu_shares",
        "cfs_quota",
        "cfs_period",
        "cpuset_cpus",
        "cpuset_mems",
        "memory_limit",
        "oom_score_adj",
    }
)
"""The :class:`Resources` a runtime applies from a container request (CRI's and NRI's
``LinuxResources`` have them; ``oom_score_adj`` is CRI's resources' and NRI's
``LinuxContainerAdjustment``'s, at creation only)."""
KOORDLET_FIELDS = frozenset({"cpu_bvt_warp_ns", "cpu_idle", "net_cls_classid"})
"""The :class:`Resources` no runtime request carries: the koordlet writes them itself, into the
pod's cgroup at ``PreRunPodSandbox`` and into pod and container cgroups in the reconciler. A hook
sets them on pods; set at a container's creation they are dropped (logged), the cgroup does not
exist yet."""


@frozen
class Mount:
    """A bind mount to add to a container (NRI ``Mount``; the CRI hook service has none)."""

    destination: str
    """Path in the container."""
    source: str
    """Path on the host."""
    type: str = "bind"
    """Mount type."""
    options: tuple[str, ...] = ("rbind",)
    """Mount options."""


@frozen
class CoreSchedTarget:
    """The core scheduling a container's threads should have (the ``CoreSched`` hook)."""

    group: str
    """The cookie group: containers of one group share one cookie, and so may share a core's
    SMT siblings; different groups never do."""
    enabled: bool
    """False: the threads get the default cookie back (0)."""


@frozen
class PodMeta:
    """Who the pod is, as the runtime names it."""

    name: str
    """Pod name."""
    namespace: str
    """Pod namespace."""
    uid: str
    """Pod UID."""
    attempt: int = 0
    """Sandbox attempt (restarts of the sandbox)."""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@frozen
class PodRequest:
    """A pod sandbox event: what the hooks of a pod-level :class:`HookPoint` see."""

    point: HookPoint
    """The event."""
    pod: PodMeta
    """Name, namespace and UID."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """The pod's labels (the runtime passes the pod's labels to the sandbox)."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """The pod's annotations."""
    cgroup_parent: str = ""
    """The pod's cgroup as the kubelet names it for the runtime: a path for the cgroupfs driver
    (``/kubepods/besteffort/pod<uid>``), a slice name for systemd
    (``kubepods-besteffort-pod<uid>.slice``)."""
    resources: Resources = field(default_factory=Resources)
    """What the request itself carries for the pod (sum of its containers), when it does."""
    runtime_handler: str = ""
    """The RuntimeClass handler."""
    sandbox_id: str = ""
    """The runtime's sandbox ID, once it exists (empty before RunPodSandbox returns)."""


@frozen
class ContainerRequest:
    """A container event: what the hooks of a container-level :class:`HookPoint` see."""

    point: HookPoint
    """The event."""
    pod: PodMeta
    """The container's pod."""
    container_name: str
    """The container's name in the pod spec."""
    container_id: str = ""
    """The runtime's container ID (empty before CreateContainer returns)."""
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    """The pod's labels."""
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    """The pod's annotations."""
    pod_cgroup_parent: str = ""
    """The pod's cgroup, as in :attr:`PodRequest.cgroup_parent`."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """The container's own annotations."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The container's environment."""
    resources: Resources = field(default_factory=Resources)
    """The container's resources as the request carries them."""


@frozen
class Change:
    """What one hook asks for; empty fields ask for nothing. The framework merges the changes of
    all hooks of a point in table order (a later hook wins on a field both set)."""

    resources: Resources = field(default_factory=Resources)
    """New values of the resources to set."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """Annotations to add or overwrite."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables to add or overwrite (containers only)."""
    cgroup_parent: str | None = None
    """A new cgroup parent for the pod (pod sandbox only)."""
    mounts: tuple[Mount, ...] = ()
    """Mounts to add to the container (NRI applies them; the proxy cannot, it logs them)."""
    resctrl_group: str | None = None
    """The resctrl control group the container's threads belong in; the koordlet moves them
    once they exist (``PostStartContainer``)."""
    core_sched: CoreSchedTarget | None = None
    """The core scheduling cookie group of the container's threads; the koordlet assigns the
    cookie once they exist (``PostStartContainer``, the reconciler)."""
    reason: str = ""
    """Why, with the inputs, for the audit log (``BE batch-cpu request 1000m``)."""

    def __bool__(self) -> bool:
        return bool(self.resources or self.annotations or self.env or self.mounts) or any(
            v is not None for v in (self.cgroup_parent, self.resctrl_group, self.core_sched)
        )

    def merged(self, other: Change) -> Change:
        """This change with ``other`` applied over it."""
        reasons = "; ".join(r for r in (self.reason, other.reason) if r)
        return Change(
            resources=self.resources.merged(other.resources),
            annotations={**self.annotations, **other.annotations},
            env={**self.env, **other.env},
            cgroup_parent=_later(self.cgroup_parent, other.cgroup_parent),
            mounts=self.mounts + tuple(m for m in other.mounts if m not in self.mounts),
            resctrl_group=_later(self.resctrl_group, other.resctrl_group),
            core_sched=_later(self.core_sched, other.core_sched),
            reason=reasons,
        )


_T = TypeVar("_T")


def _later(first: _T | None, then: _T | None) -> _T | None:
    return then if then is not None else first


NO_CHANGE = Change()
"""The empty change: the request goes on as it came."""


@frozen
class HookWarning:
    """A Warning Event to record on the pod (the pod's own data was malformed)."""

    hook: str
    """The hook that found it."""
    reason: str
    """Event reason, CamelCase."""
    message: str
    """Event message, naming the field."""


@frozen
class Outcome:
    """What the framework did for one request."""

    change: Change
    """The merged change the mode must apply; empty in dry run or when every hook failed."""
    proposed: Change
    """The merged change the hooks asked for (equal to :attr:`change` unless in dry run)."""
    applied: tuple[str, ...] = ()
    """Hooks whose change is part of :attr:`proposed`."""
    failed: tuple[str, ...] = ()
    """Hooks that raised (failed open: their change is left out)."""
    warnings: tuple[HookWarning, ...] = ()
    """Warning Events recorded for malformed pod data."""
    dry_run: bool = False
    """True when the change was computed and audited but not applied."""


@frozen
class NodeFiles:
    """What a node-level hook (the reconciler's ``Level.NODE``, ``TerwayQoS``) wants in its
    folder: whole files, which the reconciler writes through the executor when they change."""

    folder: str
    """Where the files live (absolute)."""
    files: Mapping[str, str | None] = field(default_factory=dict)
    """File name → its content; None: the file must not exist. Empty: nothing is known yet
    (the NodeSLO has not been read), the folder is left alone."""
    reason: str = ""
    """Why, in a few words, for the audit log."""
    error: str = ""
    """Why the NodeSLO could not be applied (the field named); :attr:`files` then hold the last
    good content."""
    warnings: tuple[tuple[PodMeta, HookWarning], ...] = ()
    """Pods whose own data was malformed, each with its Warning Event."""
    detail: Mapping[str, Any] = field(default_factory=dict)
    """JSON-ready, for ``/debug/runtimehooks``."""
