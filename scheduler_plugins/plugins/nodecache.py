"""What changed on nodes, and values kept per node until it does: shared by the plugins that
index or memoize per node.

- :class:`Changes` reads the snapshot's change log once per consumer, so per-node indexes are
  rebuilt for the nodes that changed only.
- :class:`NodeMemo` keeps, per pod *shape* (whatever a plugin's value depends on besides the
  node: a request vector, a selector), one value per node, valid while the node is the same
  object with the same generation (a pod assumed, bound or removed there bumps it; a Node update
  replaces the object). Replicas of one workload then pay a dict lookup a node.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

from scheduler_plugins.snapshot import NodeInfo, Snapshot

_V = TypeVar("_V")


class Changes:
    """A cursor over :meth:`Snapshot.changed_since` for one consumer."""

    def __init__(self) -> None:
        self._token: tuple[int, int] | None = None
        self.new_snapshot = False
        """Whether the last poll saw another snapshot than the poll before it (or was the
        first): per-node values keyed by generation must then be dropped, not revalidated."""

    def poll(self, snap: Snapshot) -> set[str] | None:
        """The nodes changed since the last poll (empty: none); ``None`` when everything must
        be rebuilt (first poll, another snapshot, a gap in the log, a change not one node's)."""
        token = (id(snap), snap.generation)
        self.new_snapshot = self._token is None or self._token[0] != id(snap)
        if token == self._token:
            return set()
        names = None
        if self._token is not None and not self.new_snapshot:
            names = snap.changed_since(self._token[1])
        self._token = token
        return names


class NodeMemo(Generic[_V]):
    """Values per (shape, node), for the last ``shapes`` shapes."""

    def __init__(self, shapes: int = 32) -> None:
        self.shapes = shapes
        self._tables: dict[Hashable, dict[str, tuple[NodeInfo, int, _V]]] = {}

    def table(self, shape: Hashable) -> dict[str, tuple[NodeInfo, int, _V]]:
        """The per-node entries of ``shape`` (oldest shape dropped past :attr:`shapes`)."""
        table = self._tables.get(shape)
        if table is None:
            if len(self._tables) >= self.shapes:
                del self._tables[next(iter(self._tables))]
            table = self._tables[shape] = {}
        return table

    def get(self, shape: Hashable, node: NodeInfo, compute: Callable[[NodeInfo], _V]) -> _V:
        """The value for ``node``, computed when missing or stale."""
        table = self.table(shape)
        hit = table.get(node.name)
        if hit is not None and hit[0] is node and hit[1] == node.generation:
            return hit[2]
        value = compute(node)
        table[node.name] = (node, node.generation, value)
        return value

    def values(
        self, shape: Hashable, nodes: Sequence[NodeInfo], compute: Callable[[NodeInfo], _V]
    ) -> dict[str, _V]:
        """``{node name: value}`` for each of ``nodes``, computed where missing or stale (a
        plugin's ``score_nodes``)."""
        table = self.table(shape)
        out: dict[str, _V] = {}
        for node in nodes:
            name = node.name
            hit = table.get(name)
            if hit is not None and hit[0] is node and hit[1] == node.generation:
                out[name] = hit[2]
                continue
            value = compute(node)
            table[name] = (node, node.generation, value)
            out[name] = value
        return out

    def clear(self) -> None:
        """Forget everything."""
        self._tables.clear()


class NodeSubset:
    """The snapshot's nodes that satisfy ``wanted`` (a few: tainted, cordoned), kept up to date
    from the change log, so a plugin that concerns only them need not look at every node."""

    def __init__(self, wanted: Callable[[NodeInfo], bool]) -> None:
        self.wanted = wanted
        self._changes = Changes()
        self._nodes: dict[str, NodeInfo] = {}

    def of(self, snap: Snapshot) -> dict[str, NodeInfo]:
        """The wanted nodes of ``snap`` by name."""
        names = self._changes.poll(snap)
        if names is None:
            self._nodes = {name: n for name, n in snap.nodes.items() if self.wanted(n)}
        else:
            for name in names:
                node = snap.nodes.get(name)
                if node is not None and self.wanted(node):
                    self._nodes[name] = node
                else:
                    self._nodes.pop(name, None)
        return self._nodes

    @staticmethod
    def covers(snap: Snapshot, nodes: Sequence[NodeInfo]) -> bool:
        """Whether ``nodes`` are every node of ``snap`` (the framework's first filters and a
        search over all nodes pass them so): then the subset can be walked instead."""
        return len(nodes) == len(snap.nodes)
