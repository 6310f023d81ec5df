"""TaintToleration: a pod goes only where it tolerates the taints (kube-scheduler's in-tree
plugin, ``pkg/scheduler/framework/plugins/tainttoleration``).

- **Filter.** The node's first ``NoSchedule`` or ``NoExecute`` taint that none of the pod's
  tolerations tolerates rejects it: ``node(s) had untolerated taint {key: value}``. A toleration
  tolerates a taint when its effect is empty or the taint's, its key is empty or the taint's, and
  its operator is ``Exists`` or (``Equal``, the default) its value is the taint's. Evicting pods
  cannot cure it.
- **Score.** The number of ``PreferNoSchedule`` taints the pod does not tolerate (counting only
  its tolerations with an empty or ``PreferNoSchedule`` effect), normalized in reverse: the node
  with the most gets 0, a node with none 100 (``DefaultNormalizeScore(100, reverse=true)``).
  Default weight 3.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from apis.kubernetes_keys import (
    TAINT_EFFECT_NO_EXECUTE,
    TAINT_EFFECT_NO_SCHEDULE,
    TAINT_EFFECT_PREFER_NO_SCHEDULE,
)
from scheduler_plugins.constraints import first_untolerated, tolerated
from scheduler_plugins.framework import MAX_NODE_SCORE, Cycle, Plugin
from scheduler_plugins.plugins.nodecache import NodeSubset
from scheduler_plugins.snapshot import NodeInfo, PodInfo

NAME = "TaintToleration"
ERR_UNTOLERATED = "node(s) had untolerated taint {%s: %s}"
"""kube-scheduler's reason, with the taint's key and value."""
_FILTER_EFFECTS = (TAINT_EFFECT_NO_SCHEDULE, TAINT_EFFECT_NO_EXECUTE)


def reverse_normalize(scores: dict[str, int]) -> dict[str, int]:
    """``DefaultNormalizeScore(MaxNodeScore, reverse=true)``: the highest raw score gets 0."""
    top = max(scores.values(), default=0)
    if top <= 0:
        return dict.fromkeys(scores, MAX_NODE_SCORE)
    return {n: MAX_NODE_SCORE - s * MAX_NODE_SCORE // top for n, s in scores.items()}


class TaintToleration(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self) -> None:
        self._hard = NodeSubset(lambda n: any(t.effect in _FILTER_EFFECTS for t in n.taints))
        self._soft = NodeSubset(
            lambda n: any(t.effect == TAINT_EFFECT_PREFER_NO_SCHEDULE for t in n.taints)
        )
        self._last: tuple[dict[str, int], list[str]] | None = None
        """The last raw scores and their non-zero nodes, for :meth:`normalize`."""

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        out: dict[str, str] = {}
        tolerations = pod.constraints.tolerations
        if NodeSubset.covers(cycle.snapshot, nodes):
            nodes = list(self._hard.of(cycle.snapshot).values())
        for n in nodes:
            if n.taints:
                taint = first_untolerated(n.taints, tolerations, _FILTER_EFFECTS)
                if taint is not None:
                    out[n.name] = ERR_UNTOLERATED % (taint.key, taint.value)
        return out

    def score_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, int]:
        prefer = tuple(
            t
            for t in pod.constraints.tolerations
            if not t.effect or t.effect == TAINT_EFFECT_PREFER_NO_SCHEDULE
        )
        out = dict(cycle.names_of(nodes)[1])
        tainted = self._soft.of(cycle.snapshot)
        if NodeSubset.covers(cycle.snapshot, nodes):
            some: Iterable[NodeInfo] = tainted.values()
        else:
            some = (n for n in nodes if n.name in tainted)
        counted = []
        for n in some:
            count = 0
            for taint in n.taints:
                if taint.effect == TAINT_EFFECT_PREFER_NO_SCHEDULE and not tolerated(taint, prefer):
                    count += 1
            if count:
                out[n.name] = count
                counted.append(n.name)
        self._last = (out, counted)
        return out

    def normalize(self, scores: dict[str, int]) -> dict[str, int]:
        last = self._last
        self._last = None
        if last is None or last[0] is not scores:
            return reverse_normalize(scores)
        # only the nodes counted differ from the rest (0 untolerated taints: the best)
        top = max(map(scores.__getitem__, last[1]), default=0)
        out = dict.fromkeys(scores, MAX_NODE_SCORE)
        for name in last[1]:
            out[name] = MAX_NODE_SCORE - scores[name] * MAX_NODE_SCORE // top
        return out

    def unresolvable(self, reason: str) -> bool:
        return True


def build(args: Mapping[str, Any] | None, source: str) -> TaintToleration:
    """Factory for the plugin table (no args)."""
    return TaintToleration()
