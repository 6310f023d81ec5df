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

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from scheduler_plugins.snapshot import NodeInfo, Snapshot

_V = TypeVar("_V")


class Changes:
    """A cursor over :meth:`Snapshot.changed_since` for one consumer."""

    def __init__(self) -> None:
        self._token: tuple[int, int] | None = None

    def poll(self, snap: Snapshot) -> set[str] | None:
        """The nodes changed since the last poll (empty: none); ``None`` when everything must
        be rebuilt (first poll, another snapshot, a gap in the log, a change not one node's)."""
        token = (id(snap), snap.generation)
        if token == self._token:
            return set()
        names = None
        if self._token is not None and self._token[0] == id(snap):
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

    def clear(self) -> None:
        """Forget everything."""
        self._tables.clear()
