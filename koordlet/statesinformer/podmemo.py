"""Values computed from the inventory's pods, kept from one round to the next while their
inputs hold (the cgroup reconcile plan's memory entries, the runtime hooks reconciler's results).

A round asks :meth:`PodMemo.get` with a pod's UID and the key of everything the value depends
on, and gets the value kept from the last round only when it was stored under an equal key;
otherwise it computes the value and stores it with :meth:`PodMemo.put`. :meth:`PodMemo.commit`
ends the round: only the pods asked about or stored since the last commit are kept (a pod gone
from the snapshot is forgotten). :meth:`PodMemo.clear` forgets everything (an input common to
every pod changed).

Rules for the caller: the key holds every input the value is computed from, and nothing in it
is mutated afterwards (copy a mutable mapping into the key you store); a value computed with the
memo is then the value computed without it, which each user tests by changing every input alone.
"""

from __future__ import annotations

from typing import Generic, TypeVar

_V = TypeVar("_V")


class PodMemo(Generic[_V]):
    """One value per pod UID, with the key it was computed from (module docstring)."""

    __slots__ = ("_last", "_this")

    def __init__(self) -> None:
        self._last: dict[str, tuple[object, _V]] = {}
        """What the last committed round kept."""
        self._this: dict[str, tuple[object, _V]] = {}
        """What this round asked for and found, or stored."""

    def __len__(self) -> int:
        """Pods kept by the last committed round."""
        return len(self._last)

    def get(self, uid: str, key: object) -> _V | None:
        """The value kept for ``uid`` when its key equals ``key`` (it is kept for the next
        round too); None otherwise."""
        entry = self._last.get(uid)
        if entry is None or entry[0] != key:
            return None
        self._this[uid] = entry
        return entry[1]

    def put(self, uid: str, key: object, value: _V) -> _V:
        """Keep ``value``, computed from ``key``, for the next round; returns it."""
        self._this[uid] = (key, value)
        return value

    def commit(self) -> None:
        """End a round: keep only what it asked for or stored."""
        self._last, self._this = self._this, {}

    def clear(self) -> None:
        """Forget every value."""
        self._last.clear()
        self._this.clear()
