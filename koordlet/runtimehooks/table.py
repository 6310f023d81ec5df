"""The runtime hook plugin table: one row a hook, Koordinator's names and feature gates.

Nothing registers itself: the daemon passes :data:`HOOKS` to the dispatcher, tests pass their
own table. A row holds everything about a hook: its name (upstream's plugin name, the ``hook``
label of ``koordlet_runtime_hook_invoked_duration_milliseconds``), its gate (upstream
``pkg/koordlet/runtimehooks/config.go``: ``defaultRuntimeHooksFG``; the gates themselves are
declared with the koordlet's in :mod:`koordlet.features`), the points it runs at, the factory
that builds it from the :class:`HookContext` by reference (each module's ``build``, imported
only when the gate is on: :mod:`koordlet.plugins`), and the cgroup levels the reconciler applies
it to (:class:`Level`; upstream's ``RegisterCgroupReconciler`` calls).

A hook implements :class:`Hook`: ``pod()`` for the pod-level points of its row, ``container()``
for the container-level ones (and ``kube_qos()`` for a row with ``Level.KUBE_QOS``,
``node_files()`` for one with ``Level.NODE``, ``node_inputs()`` to let the reconciler reuse its
results: :class:`NodeInputsHook`); each returns
a :class:`~koordlet.runtimehooks.model.Change` or None, raises
:class:`~koordlet.runtimehooks.errors.BadPodInput` for malformed pod data, and never does I/O (the
framework writes, audits and records events).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from apis.extension import KubeQOS
from apis.records import frozen
from apis.slo_inforce import NodeSLOInForce
from apis.terway import TERWAY_QOS_DIR
from koordlet.plugins import load
from koordlet.runtimehooks.model import Change, ContainerRequest, HookPoint, NodeFiles, PodRequest
from koordlet.runtimehooks.sharepool import CPUSetRule

if TYPE_CHECKING:
    from koordlet.statesinformer.model import PodInfo
    from koordlet.system.host import Host
    from koordlet.system.probe import Capabilities


class Hook(Protocol):
    """One hook plugin, built once per dispatcher by its row's factory."""

    def pod(self, req: PodRequest) -> Change | None:
        """The change for a pod-level point of the row; None for none."""

    def container(self, req: ContainerRequest) -> Change | None:
        """The change for a container-level point of the row; None for none."""


@runtime_checkable
class NodeInputsHook(Protocol):
    """A hook whose result for a pod or container the reconciler may reuse from one round to
    the next (:mod:`koordlet.runtimehooks.reconciler`, "Each pod's results kept")."""

    def node_inputs(self) -> object:
        """Everything the hook's ``pod()`` and ``container()`` read besides the request (the
        NodeSLO sections, the mechanism the kernel allows, the share pools), as one value
        compared with ``==``: while it and the pod's own data are equal, the result is too. A
        hook without this method is run for every pod every round."""


@runtime_checkable
class KubeQOSHook(Protocol):
    """A hook that also sets the Kubernetes QoS cgroups (rows with :attr:`Level.KUBE_QOS`)."""

    def kube_qos(self, kube_qos: KubeQOS) -> Change | None:
        """The change for the QoS cgroup of ``kube_qos``; None for none."""


@runtime_checkable
class NodeFilesHook(Protocol):
    """A hook that keeps whole files of the node (rows with :attr:`Level.NODE`)."""

    def node_files(self, pods: Iterable[PodInfo]) -> NodeFiles:
        """What its folder must hold for the inventory's ``pods`` and the NodeSLO in force."""


class Level(StrEnum):
    """What the reconciler applies a hook to: cgroups (upstream ``ReconcilerLevel``), or the
    node's files (ours: upstream's ``TerwayQoS`` does this from rule callbacks)."""

    KUBE_QOS = "kubeqos"
    POD = "pod"
    CONTAINER = "container"
    NODE = "node"


@frozen
class HookContext:
    """What a hook may read: the node's state, never files."""

    node_slo: Callable[[], NodeSLOInForce]
    """The NodeSLO in force (Koordinator's defaults when there is none)."""
    host: Callable[[], Host | None] = lambda: None
    """The node's paths and cgroup layout, once detected."""
    capabilities: Callable[[], Capabilities | None] = lambda: None
    """The start-up probe of knobs and sources; None before it (every knob then counts as
    unsupported for the hooks that choose a mechanism by it)."""
    cpuset_rule: Callable[[], CPUSetRule] = CPUSetRule
    """The node's CPU share pools and the kubelet's CPU manager policy, when known."""
    pod_net_class_ids: Callable[[], Mapping[str, int]] = dict
    """The class ids of the pods' own HTB classes (``koordinator.sh/networkQOS``), by UID, as
    the network QoS strategy allots them to the inventory's pods; empty when none."""
    terway_qos_dir: str = TERWAY_QOS_DIR
    """terway-qos's folder as the koordlet sees it (``--runtime-hooks-terway-qos-dir``)."""

    def supported(self, knob: str) -> bool:
        """Whether the probe found ``knob`` usable."""
        caps = self.capabilities()
        return caps is not None and knob in caps and caps.supported(knob)


@frozen
class HookSpec:
    """One row of the table."""

    name: str
    """Koordinator's plugin name (``BatchResource``); the metric's ``hook`` label."""
    gate: str
    """The koordlet feature gate that enables it (:mod:`koordlet.features`)."""
    description: str
    """One line for logs and ``/debug``."""
    points: frozenset[HookPoint]
    """Where it runs (upstream's ``hooks.Register`` calls of the plugin)."""
    factory: Callable[[HookContext], Hook] | str
    """Builds the hook: each module's ``build``, named ``"koordlet.runtimehooks.x:build"`` so
    that the module is imported only when the gate is on (:mod:`koordlet.plugins`)."""
    reconcile: frozenset[Level] = frozenset()
    """What the reconciler applies it to (upstream's ``RegisterCgroupReconciler`` calls; the
    node's files for ``Level.NODE``); empty: the reconciler leaves it out."""

    def build(self, ctx: HookContext) -> Hook:
        """The hook, its factory imported now if the row names it by reference (an import error
        propagates: the start that builds the row fails)."""
        factory: Callable[[HookContext], Hook] = load(self.factory)
        return factory(ctx)


_POD_AND_CONTAINERS = frozenset({Level.POD, Level.CONTAINER})

HOOKS: Mapping[str, HookSpec] = MappingProxyType(
    {
        "GroupIdentity": HookSpec(
            name="GroupIdentity",
            gate="GroupIdentity",
            description="set bvt value (or cpu.idle) by priority and qos class",
            points=frozenset({HookPoint.PRE_RUN_POD_SANDBOX}),
            factory="koordlet.runtimehooks.groupidentity:build",
            reconcile=frozenset({Level.KUBE_QOS, Level.POD}),
        ),
        "CPUSetAllocator": HookSpec(
            name="CPUSetAllocator",
            gate="CPUSetAllocator",
            description="set cpuset value by pod allocation",
            points=frozenset(
                {
                    HookPoint.PRE_RUN_POD_SANDBOX,
                    HookPoint.PRE_CREATE_CONTAINER,
                    HookPoint.PRE_UPDATE_CONTAINER_RESOURCES,
                }
            ),
            factory="koordlet.runtimehooks.cpuset:build",
            reconcile=_POD_AND_CONTAINERS,
        ),
        "GPUEnvInject": HookSpec(
            name="GPUEnvInject",
            gate="GPUEnvInject",
            description="inject NVIDIA_VISIBLE_DEVICES env into container",
            points=frozenset({HookPoint.PRE_CREATE_CONTAINER}),
            factory="koordlet.runtimehooks.gpu:build",
        ),
        "BatchResource": HookSpec(
            name="BatchResource",
            gate="BatchResource",
            description="set fundamental cgroups value for batch and mid pods",
            points=frozenset(
                {
                    HookPoint.PRE_RUN_POD_SANDBOX,
                    HookPoint.PRE_CREATE_CONTAINER,
                    HookPoint.PRE_UPDATE_CONTAINER_RESOURCES,
                }
            ),
            factory="koordlet.runtimehooks.batchresource:build",
            reconcile=_POD_AND_CONTAINERS,
        ),
        "CoreSched": HookSpec(
            name="CoreSched",
            gate="CoreSched",
            description="manage core sched cookies for pod and containers",
            points=frozenset({HookPoint.POST_START_CONTAINER}),
            factory="koordlet.runtimehooks.coresched:build",
            reconcile=frozenset({Level.CONTAINER}),
        ),
        "TCNetworkQoS": HookSpec(
            name="TCNetworkQoS",
            gate="TCNetworkQoS",
            description="set the pod's net_cls class id for network QoS by tc",
            points=frozenset({HookPoint.PRE_RUN_POD_SANDBOX}),
            factory="koordlet.runtimehooks.tc:build",
        ),
        "TerwayQoS": HookSpec(
            name="TerwayQoS",
            gate="TerwayQoS",
            description="keep terway-qos's global_bps_config and pod.json from the NodeSLO",
            points=frozenset(),
            factory="koordlet.runtimehooks.terwayqos:build",
            reconcile=frozenset({Level.NODE}),
        ),
        "Resctrl": HookSpec(
            name="Resctrl",
            gate="Resctrl",
            description="move a started container's threads into its class's resctrl group",
            points=frozenset({HookPoint.POST_START_CONTAINER}),
            factory="koordlet.runtimehooks.resctrl:build",
        ),
        "OOMScoreAdj": HookSpec(
            name="OOMScoreAdj",
            gate="OOMScoreAdj",
            description="start a new container with the oom_score_adj of its pod's annotations",
            points=frozenset({HookPoint.PRE_CREATE_CONTAINER}),
            factory="koordlet.runtimehooks.oomscoreadj:build",
        ),
    }
)
"""Every runtime hook this koordlet implements, in call order (upstream's registration order:
``GroupIdentity``, ``CPUSetAllocator``, ``GPUEnvInject``, ``BatchResource``; then the
``CoreSched``, ``TCNetworkQoS``, ``TerwayQoS``, ``Resctrl`` and ``OOMScoreAdj`` plugins).
``BatchResource`` after ``CPUSetAllocator``: a BE pod's quota is the batch one. ``TerwayQoS`` has
no point: the reconciler keeps its files (``Level.NODE``)."""
