"""Which nodes changed since a plugin last looked: the snapshot's change log read once per
consumer, so per-node indexes are rebuilt for those nodes only."""

from __future__ import annotations

from scheduler_plugins.snapshot import Snapshot


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
