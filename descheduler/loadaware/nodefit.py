"""``nodeFit``: would the pod fit that node? Asked of the scheduler's own filter plugins.

Upstream's ``nodeutil.NodeFit`` checks the pod's node selector and required node affinity, the
node's NoSchedule/NoExecute taints, the pod's requests against what the node has left, and
``spec.unschedulable``. We do not copy those checks: :class:`NodeFit` builds a
:class:`scheduler_plugins.framework.Framework` from the scheduler's plugin table
(:data:`scheduler_plugins.table.PLUGINS`) with the plugins of :data:`FIT_PLUGINS` it has, and runs
their filters on the one node. So every filter the scheduler gains under those names
(kube-scheduler's in-tree ``NodeAffinity``, ``TaintToleration``...) is honoured here through the
same call.

Verdicts are cached per pod shape (requests, node selector, affinity, tolerations) and node, until
the scheduler snapshot changes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scheduler_plugins.framework import Framework
from scheduler_plugins.snapshot import NodeInfo, PodInfo, Snapshot
from scheduler_plugins.table import PLUGINS, PluginFactory, build_framework

FIT_PLUGINS = (
    "NodeUnschedulable",
    "NodeName",
    "NodeAffinity",
    "TaintToleration",
    "NodeResourcesFit",
)
"""The scheduler plugins that answer "does it fit" (not "is it a good idea": LoadAware's own
thresholds are LowNodeLoad's business), in the order they run."""


def _shape(pod: PodInfo) -> tuple[Any, ...]:
    spec = pod.raw.get("spec") or {}
    constraints = {
        k: spec.get(k) for k in ("nodeSelector", "affinity", "tolerations") if spec.get(k)
    }
    return (
        tuple(sorted(pod.requests.items())),
        json.dumps(constraints, sort_keys=True) if constraints else "",
    )


class NodeFit:
    """See the module docstring."""

    def __init__(
        self,
        snapshot: Snapshot,
        table: Mapping[str, PluginFactory] = PLUGINS,
        plugins: Sequence[str] = FIT_PLUGINS,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.snapshot = snapshot
        chosen = {name: table[name] for name in plugins if name in table}
        self.framework: Framework = build_framework(chosen)
        self.plugins = tuple(chosen)
        """The plugins this node fit runs (those of :data:`FIT_PLUGINS` the table has)."""
        self.clock = clock
        self._generation = -1
        self._cache: dict[tuple[Any, str], tuple[str, ...]] = {}
        self._shapes: dict[str, tuple[PodInfo, tuple[Any, ...]]] = {}
        self.calls = 0
        """Filter runs (cache misses), for benchmarks."""

    def _fresh(self) -> None:
        if self._generation != self.snapshot.generation:
            self._cache.clear()
            self._generation = self.snapshot.generation

    def shape(self, pod: PodInfo) -> tuple[Any, ...]:
        cached = self._shapes.get(pod.uid)
        if cached is not None and cached[0] is pod:
            return cached[1]
        shape = _shape(pod)
        self._shapes[pod.uid] = (pod, shape)
        return shape

    def reasons(self, pod: PodInfo, node: NodeInfo) -> tuple[str, ...]:
        """Why ``pod`` does not fit ``node`` (empty: it fits)."""
        self._fresh()
        key = (self.shape(pod), node.name)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        self.calls += 1
        cycle = self.framework.new_cycle(self.snapshot, self.clock())
        _, failures = self.framework.filter_nodes(cycle, pod, [node])
        verdict = tuple(reason for _, reason in failures.get(node.name, ()))
        self._cache[key] = verdict
        return verdict

    def fits(self, pod: PodInfo, node: NodeInfo) -> bool:
        return not self.reasons(pod, node)

    def fits_any_other(self, pod: PodInfo, nodes: Sequence[NodeInfo]) -> bool:
        """``PodFitsAnyOtherNode``: some node other than the pod's own takes it."""
        return any(n.name != pod.node_name and self.fits(pod, n) for n in nodes)
