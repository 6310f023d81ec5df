"""The descheduling framework: profiles of Deschedule and Balance plugins over one evictor.

As upstream's ``pkg/descheduler/framework`` runs them (``descheduler.go``): each round takes the
ready nodes (``NodeReady`` not False) matching the configuration's ``nodeSelector``, runs every
profile's **Deschedule** plugins, then every profile's **Balance** plugins. A plugin asks the
:class:`Evictor` whether a pod may go (``filter``) and to move it (``evict``); the evictor is the
MigrationController (``migration/evictor.py``), which turns a move into a PodMigrationJob.

The configuration's ``maxNoOfPodsToEvictPerNode``, ``maxNoOfPodsToEvictPerNamespace`` and
``maxNoOfPodsToEvictTotal`` cap each round's moves (:class:`RoundLimits`, the ``PodEvictor``'s
counters).

Everything a round decides and why is written to a :class:`RoundReport` (``explain`` prints it;
the daemon logs it): each node's class and usage against its thresholds, each candidate pod's
verdict, each migration with its plugin and reason. Plugins come from an explicit table
(``table.py``); nothing registers itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from apis.records import frozen
from descheduler.cluster import Cluster
from descheduler.selectors import Selector
from scheduler_plugins.snapshot import NodeInfo, PodInfo


@frozen
class EvictOptions:
    """``framework.EvictOptions``."""

    plugin: str
    """The plugin asking (``koordinator.sh/evict-trigger``)."""
    reason: str
    """Why (``koordinator.sh/evict-reason``)."""
    delete_options: Mapping[str, Any] | None = None


class Evictor(Protocol):
    """What plugins evict through."""

    def filter(self, pod: PodInfo) -> str | None:
        """Why ``pod`` may not be moved now, or ``None``."""

    def evict(self, pod: PodInfo, options: EvictOptions) -> str | None:
        """Ask to move ``pod``: ``None`` when accepted, else why not."""


@dataclass(slots=True)
class NodeReport:
    """One node as a round saw it."""

    pool: str = ""
    node_class: str = "normal"
    """``high``, ``low`` or ``normal`` (``explain``'s classes)."""
    detail_class: str = ""
    """The plugin's own class (``prod-high``, ``both-low``...)."""
    usage: dict[str, float] = field(default_factory=dict)
    """Percent of allocatable per resource."""
    low: dict[str, float] = field(default_factory=dict)
    """Low thresholds in percent."""
    high: dict[str, float] = field(default_factory=dict)
    """High thresholds in percent."""
    note: str = ""
    """Why the node was left out, when it was."""


@frozen
class Verdict:
    """What became of one candidate pod."""

    node: str
    pod: str
    plugin: str
    outcome: str
    """``migrate``, ``skip`` (filtered or no target), ``stop`` (the node needs no more)."""
    detail: str


@frozen
class Migration:
    """One move a round asked for."""

    pod: str
    """``namespace/name``."""
    node: str
    """The node it leaves."""
    plugin: str
    reason: str
    job: str = ""
    """The PodMigrationJob's name."""


@dataclass(slots=True)
class RoundReport:
    """See the module docstring."""

    nodes: dict[str, NodeReport] = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)
    migrations: list[Migration] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    detailed: bool = True
    """Record candidate verdicts (off in the benchmark and the daemon's quiet rounds)."""

    def verdict(self, node: str, pod: str, plugin: str, outcome: str, detail: str) -> None:
        if self.detailed:
            self.verdicts.append(Verdict(node, pod, plugin, outcome, detail))


@dataclass(slots=True)
class Handle:
    """What a plugin is given each round."""

    cluster: Cluster
    evictor: Evictor
    report: RoundReport
    clock: Callable[[], float] = time.time
    """Wall clock (NodeMetric expiry)."""
    monotonic: Callable[[], float] = time.monotonic
    """Monotonic clock (anomaly detectors)."""


class Plugin(Protocol):
    name: str


class DeschedulePlugin(Plugin, Protocol):
    def deschedule(self, handle: Handle, nodes: Sequence[NodeInfo]) -> None: ...


class BalancePlugin(Plugin, Protocol):
    def balance(self, handle: Handle, nodes: Sequence[NodeInfo]) -> None: ...


@dataclass(slots=True)
class Profile:
    """One configured profile's plugins."""

    name: str
    deschedule: list[DeschedulePlugin] = field(default_factory=list)
    balance: list[BalancePlugin] = field(default_factory=list)
    node_selector: Selector | None = None

    def own_nodes(self, nodes: Sequence[NodeInfo]) -> list[NodeInfo]:
        """The ``nodes`` its ``nodeSelector`` picks (all of them without one), in order."""
        selector = self.node_selector
        return [n for n in nodes if selector is None or selector.matches(n.labels)]


def ready_nodes(cluster: Cluster, selector: Selector | None) -> list[NodeInfo]:
    """The nodes a round works on (``ReadyNodes``: no ``Ready`` condition other than True),
    in snapshot order."""
    return [
        n
        for n in cluster.sched.nodes.values()
        if (selector is None or selector.matches(n.labels)) and n.name not in cluster.not_ready
    ]


def run_round(profiles: Sequence[Profile], handle: Handle, nodes: Sequence[NodeInfo]) -> None:
    """Deschedule plugins of every profile, then Balance plugins of every profile."""
    for profile in profiles:
        own = profile.own_nodes(nodes)
        for dp in profile.deschedule:
            dp.deschedule(handle, own)
    for profile in profiles:
        own = profile.own_nodes(nodes)
        for bp in profile.balance:
            bp.balance(handle, own)


@dataclass(slots=True)
class RoundLimits:
    """``maxNoOfPodsToEvict{PerNode,PerNamespace,Total}`` for one round."""

    per_node: int | None = None
    per_namespace: int | None = None
    total: int | None = None
    _nodes: dict[str, int] = field(default_factory=dict)
    _namespaces: dict[str, int] = field(default_factory=dict)
    _total: int = 0

    def check(self, pod: PodInfo) -> str | None:
        if self.per_node is not None and self._nodes.get(pod.node_name, 0) >= self.per_node:
            return "maximum number of pods per node reached"
        if self.per_namespace is not None and self._namespaces.get(pod.namespace, 0) >= (
            self.per_namespace
        ):
            return "maximum number of pods per namespace reached"
        if self.total is not None and self._total >= self.total:
            return "maximum number of pods evicted in total reached"
        return None

    def count(self, pod: PodInfo) -> None:
        self._nodes[pod.node_name] = self._nodes.get(pod.node_name, 0) + 1
        self._namespaces[pod.namespace] = self._namespaces.get(pod.namespace, 0) + 1
        self._total += 1
