"""The runtime hook plugin table: one row a hook, Koordinator's names and feature gates.

Nothing registers itself: the daemon passes :data:`HOOKS` to the dispatcher, tests pass their
own table. A row holds everything about a hook: its name (upstream's plugin name, the ``hook``
label of ``koordlet_runtime_hook_invoked_duration_milliseconds``), its gate (upstream
``pkg/koordlet/runtimehooks/config.go``: ``defaultRuntimeHooksFG``; the gates themselves are
declared with the koordlet's in :mod:`koordlet.features`), the points it runs at, and the
factory that builds it from the :class:`HookContext`.

A hook implements :class:`Hook`: ``pod()`` for the pod-level points of its row, ``container()``
for the container-level ones; each returns a :class:`~koordlet.runtimehooks.model.Change` or
None, raises :class:`~koordlet.runtimehooks.errors.BadPodInput` for malformed pod data, and never
does I/O (the framework writes, audits and records events).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from apis.slo_inforce import NodeSLOInForce
from koordlet.runtimehooks import batchresource
from koordlet.runtimehooks.model import Change, ContainerRequest, HookPoint, PodRequest

if TYPE_CHECKING:
    from koordlet.system.host import Host


class Hook(Protocol):
    """One hook plugin, built once per dispatcher by its row's factory."""

    def pod(self, req: PodRequest) -> Change | None:
        """The change for a pod-level point of the row; None for none."""

    def container(self, req: ContainerRequest) -> Change | None:
        """The change for a container-level point of the row; None for none."""


@dataclass(frozen=True, slots=True)
class HookContext:
    """What a hook may read: the node's state, never files."""

    node_slo: Callable[[], NodeSLOInForce]
    """The NodeSLO in force (Koordinator's defaults when there is none)."""
    host: Callable[[], Host | None] = lambda: None
    """The node's paths and cgroup layout, once detected."""


@dataclass(frozen=True, slots=True)
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
    factory: Callable[[HookContext], Hook]
    """Builds the hook."""


HOOKS: Mapping[str, HookSpec] = MappingProxyType(
    {
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
            factory=lambda ctx: batchresource.BatchResource(ctx.node_slo),
        ),
    }
)
"""Every runtime hook this koordlet implements, in call order."""
