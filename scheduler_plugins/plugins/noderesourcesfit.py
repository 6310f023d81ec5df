"""NodeResourcesFit: the pod's requests fit the node's allocatable, batch and mid included.

kube-scheduler's NodeResourcesFit filter over every resource the pod requests: ``cpu``,
``memory``, ``pods`` (one more pod) and extended resources, which is how Koordinator's
``kubernetes.io/batch-cpu``, ``batch-memory``, ``mid-cpu`` and ``mid-memory`` requests are
checked against what koord-manager wrote on the node. ``requested + request > allocatable``
rejects with kube-scheduler's words, ``Insufficient kubernetes.io/batch-cpu``; an unschedulable
node (``spec.unschedulable``) is rejected as NodeUnschedulable does, ``node(s) were
unschedulable``. Resources the Reservation plugin holds for this pod's owner on the node count as
free for it, and what they hold for others counts as used
(:data:`RESERVATION_ADJUST_KEY`). It does not score: the stock scheduler
(or LoadAwareScheduling) ranks nodes.

Resources named ``koordinator.sh/gpu-*`` and ``nvidia.com/gpu`` are left to DeviceShare, which
places them on a device.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

from apis.scheduling_keys import DEVICE_RESOURCES
from scheduler_plugins.framework import Cycle, Plugin
from scheduler_plugins.snapshot import NodeInfo, PodInfo

NAME = "NodeResourcesFit"
ERR_UNSCHEDULABLE = "node(s) were unschedulable"
RESERVATION_ADJUST_KEY = "Reservation/adjust"
"""Cycle data: node name → resources to add to what is free there for this pod: what
Reservations hold for others (negative) and what one of this pod's own holds (positive); set by
the Reservation plugin's pre-filter."""


class NodeResourcesFit(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self, ignored: Sequence[str] = DEVICE_RESOURCES) -> None:
        self.ignored = frozenset(ignored)
        self._token: tuple[int, int] | None = None
        self._free: dict[str, tuple[list[int], list[str]]] = {}
        self._free_of: dict[str, dict[str, int]] = {}
        self._unschedulable: set[str] = set()

    def warm(self, cycle: Cycle) -> None:
        """Index the snapshot (the extender calls this after loading one)."""
        self._prepare(cycle)
        for r in ("cpu", "memory", "pods"):
            self._index(cycle, r)

    def _prepare(self, cycle: Cycle) -> None:
        """Re-index the nodes the snapshot's change log names (everything after a new snapshot
        or a gap in the log)."""
        snap = cycle.snapshot
        token = (id(snap), snap.generation)
        if token == self._token:
            return
        names = None
        if self._token is not None and self._token[0] == id(snap):
            names = snap.changed_since(self._token[1])
        if names is None:
            self._free.clear()
            self._free_of.clear()
            self._unschedulable = {n.name for n in snap.nodes.values() if n.unschedulable}
        else:
            for name in names:
                node = snap.nodes.get(name)
                if node is not None and node.unschedulable:
                    self._unschedulable.add(name)
                else:
                    self._unschedulable.discard(name)
                for resource, (keys, names_sorted) in self._free.items():
                    of = self._free_of[resource]
                    old = of.pop(name, None)
                    if old is not None:
                        # equal keys keep their names sorted: bisect the run, not walk it
                        k = bisect_left(
                            names_sorted, name, bisect_left(keys, old), bisect_right(keys, old)
                        )
                        del keys[k]
                        del names_sorted[k]
                    if node is not None and (resource != "pods" or resource in node.allocatable):
                        free = node.allocatable.get(resource, 0) - node.requested.get(resource, 0)
                        k = bisect_left(
                            names_sorted, name, bisect_left(keys, free), bisect_right(keys, free)
                        )
                        keys.insert(k, free)
                        names_sorted.insert(k, name)
                        of[name] = free
        self._token = token

    def _index(self, cycle: Cycle, resource: str) -> tuple[list[int], list[str]]:
        """Nodes sorted by what they have left of ``resource`` (``pods``: only nodes that
        declare a pod limit), built on first use and then kept up to date."""
        index = self._free.get(resource)
        if index is None:
            rows = sorted(
                (n.allocatable.get(resource, 0) - n.requested.get(resource, 0), n.name)
                for n in cycle.snapshot.nodes.values()
                if resource != "pods" or resource in n.allocatable
            )
            index = ([f for f, _ in rows], [name for _, name in rows])
            self._free[resource] = index
            self._free_of[resource] = {name: f for f, name in rows}
        return index

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        self._prepare(cycle)
        wanted = [(r, v) for r, v in pod.requests.items() if v > 0 and r not in self.ignored]
        wanted.append(("pods", 1))
        adjust: Mapping[str, Mapping[str, int]] = cycle.data.get(RESERVATION_ADJUST_KEY, {})
        candidates: set[str] | None = None
        if len(nodes) != len(cycle.snapshot.nodes):
            candidates = {n.name for n in nodes}
        out: dict[str, str] = {}
        for name in self._unschedulable:
            if candidates is None or name in candidates:
                out[name] = ERR_UNSCHEDULABLE
        for r, v in wanted:
            keys, names = self._index(cycle, r)
            for name in names[: bisect_left(keys, v)]:
                if (
                    name in out
                    or name in adjust
                    or (candidates is not None and name not in candidates)
                ):
                    continue
                out[name] = f"Insufficient {r}"
        # nodes where a Reservation changes what is free for this pod: checked one by one
        for name, extra in adjust.items():
            node = cycle.snapshot.nodes.get(name)
            if node is None or name in out or (candidates is not None and name not in candidates):
                continue
            for r, v in wanted:
                if r == "pods" and r not in node.allocatable:
                    continue
                free = node.allocatable.get(r, 0) - node.requested.get(r, 0) + extra.get(r, 0)
                if v > free:
                    out[name] = f"Insufficient {r}"
                    break
        return out


def build(args: Mapping[str, Any] | None, source: str) -> NodeResourcesFit:
    """Factory for the plugin table (no args)."""
    return NodeResourcesFit()
