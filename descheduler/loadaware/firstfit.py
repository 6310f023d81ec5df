"""The first target, in order, that takes a pod: ``podFitsAnyNodeWithThreshold`` without a scan.

Upstream walks the target nodes in order for every removable pod and takes the first one the
scheduler's filters accept whose usage stays at or under each high threshold with the pod's usage
added; that node's usage then carries the pod for the rest of the round. At 5,000 nodes with
thousands of candidates that walk is the round's cost, so :class:`FirstFit` keeps, per resource,
a segment tree of the targets' headroom (high threshold less usage): a subtree where some
resource's largest headroom is below the pod's need holds no answer and is skipped, and the
leftmost leaf that passes every resource is asked the filters (``accept``). The answer is the one
the walk gives: the same first node in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

INF = float("inf")


class FirstFit:
    """Targets in order, each with its usage and high thresholds (see the module docstring).

    ``usages[i]`` and ``limits[i]`` are the i-th target's maps (the usage map is updated in
    place by :meth:`take`, as upstream adds the pod to the node's usage); a resource a target has
    no usage for does not bound it."""

    def __init__(
        self,
        usages: Sequence[dict[str, int]],
        limits: Sequence[Mapping[str, int]],
        resources: Sequence[str],
    ) -> None:
        self.usages = usages
        self.limits = limits
        self.count = len(usages)
        size = 1
        while size < max(self.count, 1):
            size *= 2
        self.size = size
        self.resources = [
            r
            for r in resources
            if any(r in lim and r in u for u, lim in zip(usages, limits, strict=True))
        ]
        self.trees: dict[str, list[float]] = {}
        for r in self.resources:
            tree = [-INF] * (2 * size)
            for i in range(self.count):
                tree[size + i] = self._headroom(i, r)
            for k in range(size - 1, 0, -1):
                tree[k] = max(tree[2 * k], tree[2 * k + 1])
            self.trees[r] = tree

    def _headroom(self, i: int, r: str) -> float:
        lim = self.limits[i].get(r)
        used = self.usages[i].get(r)
        if lim is None or used is None:
            return INF
        return lim - used

    def first(self, need: Mapping[str, int], accept: Callable[[int], bool]) -> int | None:
        """The first target whose headroom covers ``need`` in every resource and that
        ``accept`` takes, or ``None``."""
        if self.count == 0:
            return None
        trees = [self.trees[r] for r in self.resources]
        amounts = [need.get(r, 0) for r in self.resources]
        if len(trees) == 2:  # cpu and memory: the common case, unrolled
            return self._first2(trees[0], trees[1], amounts[0], amounts[1], accept)
        pairs = list(zip(trees, amounts, strict=True))

        def covers(k: int) -> bool:
            return all(tree[k] >= amount for tree, amount in pairs)

        if not covers(1):
            return None
        size = self.size
        count = self.count
        pending: list[int] = []
        k = 1
        while True:
            if k >= size:
                i = k - size
                if i < count and accept(i):
                    return i
            else:
                left = 2 * k
                if covers(left):
                    if covers(left + 1):
                        pending.append(left + 1)
                    k = left
                    continue
                if covers(left + 1):
                    k = left + 1
                    continue
            if not pending:
                return None
            k = pending.pop()

    def _first2(
        self,
        t0: list[float],
        t1: list[float],
        n0: int,
        n1: int,
        accept: Callable[[int], bool],
    ) -> int | None:
        """:meth:`first` over two resources."""
        if t0[1] < n0 or t1[1] < n1:
            return None
        size = self.size
        count = self.count
        pending: list[int] = []
        k = 1
        while True:
            if k >= size:
                i = k - size
                if i < count and accept(i):
                    return i
            else:
                left = 2 * k
                right = left + 1
                if t0[left] >= n0 and t1[left] >= n1:
                    if t0[right] >= n0 and t1[right] >= n1:
                        pending.append(right)
                    k = left
                    continue
                if t0[right] >= n0 and t1[right] >= n1:
                    k = right
                    continue
            if not pending:
                return None
            k = pending.pop()

    def take(self, i: int, need: Mapping[str, int]) -> None:
        """Target ``i`` carries ``need`` from now on."""
        usage = self.usages[i]
        limits = self.limits[i]
        for r in limits:
            if r in usage:
                usage[r] += need.get(r, 0)
        size = self.size
        for r, tree in self.trees.items():
            k = size + i
            tree[k] = self._headroom(i, r)
            k >>= 1
            while k:
                left = tree[2 * k]
                right = tree[2 * k + 1]
                best = left if left > right else right
                if tree[k] == best:
                    break  # the ancestors hold the same maxima
                tree[k] = best
                k >>= 1
