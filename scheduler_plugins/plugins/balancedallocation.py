"""NodeResourcesBalancedAllocation: prefer nodes whose cpu and memory fill up evenly
(kube-scheduler's in-tree score plugin, ``noderesources/balanced_allocation.go``).

Per resource (``resources``, default cpu and memory) the fraction ``(requested + request) /
allocatable`` of the node, capped at 1, actual requests (no defaults for containers without
one); the score is ``(1 - std) * 100`` with ``std`` the standard deviation of the fractions
(``|f1 - f2| / 2`` for two). A pod requesting none of the resources is not scored (``Skip``, as
kube-scheduler skips best-effort pods). Default weight 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from scheduler_plugins.args import ArgsReader
from scheduler_plugins.framework import MAX_NODE_SCORE, Cycle, Plugin
from scheduler_plugins.plugins.nodecache import NodeMemo
from scheduler_plugins.snapshot import NodeInfo, PodInfo

NAME = "NodeResourcesBalancedAllocation"


def balanced_score(requested: Sequence[int], allocatable: Sequence[int]) -> int:
    """``balancedResourceScorer``."""
    fractions = [min(r / a, 1.0) for r, a in zip(requested, allocatable, strict=True) if a != 0]
    std = 0.0
    if len(fractions) == 2:
        std = abs((fractions[0] - fractions[1]) / 2)
    elif len(fractions) > 2:
        mean = sum(fractions) / len(fractions)
        std = math.sqrt(sum((f - mean) * (f - mean) for f in fractions) / len(fractions))
    return int((1 - std) * MAX_NODE_SCORE)


class BalancedAllocation(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self, resources: Sequence[str] = ("cpu", "memory")) -> None:
        self.resources = tuple(resources)
        self._scores: NodeMemo[int] = NodeMemo()
        """Scores per pod shape (its requests of the resources)."""

    def score_nodes(
        self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]
    ) -> dict[str, int] | None:
        res = self.resources
        want = tuple(pod.requests.get(r, 0) for r in res)
        if not any(want):
            return None

        def score(node: NodeInfo) -> int:
            requested = node.requested
            return balanced_score(
                [requested.get(r, 0) + w for r, w in zip(res, want, strict=True)],
                [node.allocatable.get(r, 0) for r in res],
            )

        return self._scores.values(want, nodes, score)


def build(args: Mapping[str, Any] | None, source: str) -> BalancedAllocation:
    """Factory for the plugin table (``NodeResourcesBalancedAllocationArgs.resources``)."""
    r = ArgsReader(args, source, NAME)
    raw = r.args.get("resources")
    if raw is None:
        return BalancedAllocation()
    if not isinstance(raw, list) or not raw:
        raise r.fail("resources", "must be a non-empty list of {name, weight}")
    names = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise r.fail(f"resources[{i}]", "needs a name")
        names.append(item["name"])
    return BalancedAllocation(names)
