"""Indexes that let LoadAwareScheduling filter 5,000 nodes without visiting each one.

A node fails a usage threshold ``th`` on a resource of allocatable ``a`` when
``round(100 * (x + e) / a) > th``, with ``x`` what the node already uses (reported plus recent
pods' estimates) and ``e`` the incoming pod's estimate. In integers that is ``e > headroom``
with ``headroom = (2a(th + 1) - a - 1) // 200 - x``: one number per node and resource that does
not depend on the pod. Sorted by headroom, the nodes a pod fails on are a prefix found by
bisection; the same holds for NodeMetric expiry (sorted by the time each NodeMetric expires).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence

# Many nodes share a key (identical nodes have identical headroom), so within a run of equal
# keys the rows stay sorted too: a node is found, or its place is found, by a second bisection
# over that run instead of a walk along it.


def headroom(threshold: int, allocatable: int, existing: int) -> int | None:
    """How much more a node can take on a resource before it exceeds ``threshold`` percent;
    ``None`` when the threshold does not apply (0, or nothing allocatable)."""
    if threshold <= 0 or allocatable <= 0:
        return None
    limit = (2 * allocatable * (threshold + 1) - allocatable - 1) // 200
    return limit - existing


class ThresholdIndex:
    """Per resource, the nodes sorted by headroom, each with the reason it fails with; nodes
    can be replaced one at a time (:meth:`upsert`, :meth:`discard`)."""

    def __init__(self, resources: int) -> None:
        self._keys: list[list[int]] = [[] for _ in range(resources)]
        self._rows: list[list[tuple[str, str]]] = [[] for _ in range(resources)]
        self._of: dict[str, tuple[str, list[int | None]]] = {}

    @classmethod
    def build(
        cls, resources: int, rows: Iterable[tuple[str, str, Sequence[int | None]]]
    ) -> ThresholdIndex:
        """From ``(node, reason, headroom per resource)``."""
        index = cls(resources)
        cols: list[list[tuple[int, str, str]]] = [[] for _ in range(resources)]
        for name, reason, heads in rows:
            index._of[name] = (reason, list(heads))
            for i, h in enumerate(heads):
                if h is not None:
                    cols[i].append((h, name, reason))
        for i, col in enumerate(cols):
            col.sort()
            index._keys[i] = [h for h, _, _ in col]
            index._rows[i] = [(n, r) for _, n, r in col]
        return index

    def discard(self, name: str) -> None:
        """Forget ``name``."""
        old = self._of.pop(name, None)
        if old is None:
            return
        row = (name, old[0])
        for i, h in enumerate(old[1]):
            if h is None:
                continue
            keys, rows = self._keys[i], self._rows[i]
            k = bisect_left(rows, row, bisect_left(keys, h), bisect_right(keys, h))
            if k < len(rows) and rows[k] == row and keys[k] == h:
                del keys[k]
                del rows[k]

    def upsert(self, name: str, reason: str, heads: Sequence[int | None]) -> None:
        """Add or replace ``name``."""
        self.discard(name)
        self._of[name] = (reason, list(heads))
        row = (name, reason)
        for i, h in enumerate(heads):
            if h is None:
                continue
            keys, rows = self._keys[i], self._rows[i]
            k = bisect_left(rows, row, bisect_left(keys, h), bisect_right(keys, h))
            keys.insert(k, h)
            rows.insert(k, row)

    def rows(self) -> Mapping[str, tuple[str, list[int | None]]]:
        """Node → (reason, headroom per resource): a node fails on the first resource whose
        headroom (not ``None``) is below the estimate, as :meth:`failing` lists it first."""
        return self._of

    def failing(self, estimate: Sequence[int]) -> list[tuple[int, str, str]]:
        """``(resource, node, reason)`` for every node and resource the estimate exceeds, in
        resource order."""
        out: list[tuple[int, str, str]] = []
        for i, keys in enumerate(self._keys):
            k = bisect_left(keys, estimate[i])
            if k:
                out.extend((i, n, r) for n, r in self._rows[i][:k])
        return out


class ExpiryIndex:
    """Nodes sorted by when their NodeMetric expires."""

    def __init__(self, rows: Iterable[tuple[float, str]]) -> None:
        ordered = sorted(rows)
        self._keys = [t for t, _ in ordered]
        self._names = [n for _, n in ordered]
        self._of = {n: t for t, n in ordered}

    def discard(self, name: str) -> None:
        """Forget ``name``."""
        t = self._of.pop(name, None)
        if t is None:
            return
        keys, names = self._keys, self._names
        k = bisect_left(names, name, bisect_left(keys, t), bisect_right(keys, t))
        if k < len(names) and names[k] == name and keys[k] == t:
            del keys[k]
            del names[k]

    def upsert(self, name: str, expires_at: float) -> None:
        """Add or replace ``name``."""
        self.discard(name)
        self._of[name] = expires_at
        keys, names = self._keys, self._names
        lo, hi = bisect_left(keys, expires_at), bisect_right(keys, expires_at)
        k = bisect_left(names, name, lo, hi)
        keys.insert(k, expires_at)
        names.insert(k, name)

    def expiry_times(self) -> Mapping[str, float]:
        """Node → when its NodeMetric expires (expired at ``now`` when ``<= now``, as
        :meth:`expired` says)."""
        return self._of

    def count_expired(self, now: float) -> int:
        """How many nodes :meth:`expired` would list, by bisection only."""
        return bisect_right(self._keys, now)

    def expired(self, now: float) -> list[str]:
        """Nodes whose NodeMetric has expired at ``now``."""
        return self._names[: bisect_right(self._keys, now)]
