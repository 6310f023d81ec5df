"""What the framework answers for one pod: each node's verdict, scores and rank
(:class:`NodeResult`), and the whole evaluation (:class:`Evaluation`) that ``explain``, the
extender and the tests read (:mod:`scheduler_plugins.framework` computes them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class NodeResult:
    """The verdict for one node."""

    feasible: bool = True
    """No plugin rejected the node."""
    reasons: list[str] = field(default_factory=list)
    """Why not, in Koordinator's words, in plugin order."""
    rejected_by: dict[str, str] = field(default_factory=dict)
    """Plugin name → its reason."""
    scores: dict[str, int] = field(default_factory=dict)
    """Plugin name → normalized score (0..100), feasible nodes only."""
    score: int = 0
    """Weighted mean (0..100)."""
    weighted: int = 0
    """``sum(weight * score)``: kube-scheduler's total, what ranks the node."""


@dataclass(slots=True)
class Evaluation:
    """Filter and score results for one pod."""

    nodes: dict[str, NodeResult]
    """By node name, in snapshot order."""
    scoring_plugins: list[str]
    """Plugins that scored this pod."""

    def best(self) -> str | None:
        """The feasible node with the highest total (ties: first in snapshot order)."""
        best: str | None = None
        top = -1
        for name, r in self.nodes.items():
            if r.feasible and r.weighted > top:
                best, top = name, r.weighted
        return best

    def as_json(self) -> dict[str, Any]:
        """``{"nodes": {NODE: {"feasible", "reasons", "scores", "score"}}}``."""
        return {
            "nodes": {
                name: {
                    "feasible": r.feasible,
                    "reasons": list(r.reasons),
                    "scores": dict(r.scores),
                    "score": r.score,
                }
                for name, r in self.nodes.items()
            }
        }
