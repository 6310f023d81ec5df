"""NodeAffinity: ``nodeSelector`` and node affinity (kube-scheduler's in-tree plugin,
``pkg/scheduler/framework/plugins/nodeaffinity``).

- **Filter.** The node must carry every ``spec.nodeSelector`` label and match one of the
  ``requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`` (a term ANDs its
  ``matchExpressions``: ``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``; and its
  ``matchFields``: ``metadata.name``), else ``node(s) didn't match Pod's node affinity/selector``.
  Evicting pods cannot cure it.
- **Score.** The sum of the weights of the ``preferredDuringSchedulingIgnoredDuringExecution``
  terms the node matches, normalized so the best node gets 100 (``DefaultNormalizeScore``); a
  pod without preferred terms is not scored (``Skip``). Default weight 2.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler_plugins.framework import Cycle, Plugin, default_normalize
from scheduler_plugins.selectors import NodeSelectorTerm
from scheduler_plugins.snapshot import NodeInfo, PodInfo

NAME = "NodeAffinity"
MEMO_SHAPES = 32
"""Sets of preferred terms whose per-node sums are kept."""
ERR_NODE_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
"""``ErrReasonPod``."""


class NodeAffinity(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self) -> None:
        self._memo: dict[tuple[tuple[int, NodeSelectorTerm], ...], dict[str, tuple[NodeInfo, int]]]
        self._memo = {}
        """Per set of preferred terms, each node's sum of the weights it matches."""

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        c = pod.constraints
        if not c.node_selector and c.required is None:
            return {}
        return {n.name: ERR_NODE_AFFINITY for n in nodes if not c.matches_node(n.name, n.labels)}

    def score_nodes(
        self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]
    ) -> dict[str, int] | None:
        preferred = pod.constraints.preferred
        if not preferred:
            return None
        memo = self._memo.get(preferred)
        if memo is None:
            if len(self._memo) >= MEMO_SHAPES:
                del self._memo[next(iter(self._memo))]
            memo = self._memo[preferred] = {}
        get = memo.get
        out: dict[str, int] = {}
        for n in nodes:
            hit = get(n.name)
            if hit is not None and hit[0] is n:  # the sum depends on the Node object only
                out[n.name] = hit[1]
            else:
                s = sum(w for w, term in preferred if term.matches(n.name, n.labels))
                memo[n.name] = (n, s)
                out[n.name] = s
        return out

    def normalize(self, scores: dict[str, int]) -> dict[str, int]:
        return default_normalize(scores)

    def unresolvable(self, reason: str) -> bool:
        return True


def build(args: Mapping[str, Any] | None, source: str) -> NodeAffinity:
    """Factory for the plugin table (no args)."""
    return NodeAffinity()
