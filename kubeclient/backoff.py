"""Exponential backoff with jitter, and the one rule for a server's Retry-After.

The delay doubles from ``base`` to ``cap`` with each consecutive failure; each wait is drawn
uniformly from the upper half of the current step ("equal jitter": never less than half, so a
fleet of agents that failed together spreads out without any of them hammering). A success
resets it. A 429's ``Retry-After`` is a floor: we wait at least what the server asked.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """The delay before the next retry of one loop."""

    base: float = 0.5
    """Seconds of the first step."""
    cap: float = 30.0
    """Seconds no step exceeds."""
    factor: float = 2.0
    """Growth of a step per consecutive failure."""
    rng: random.Random = field(default_factory=random.Random)
    """Randomness (seeded in tests)."""
    failures: int = 0
    """Consecutive failures so far."""

    def next_delay(self, retry_after: float | None = None) -> float:
        """Count one failure and return how long to wait (at least ``retry_after``)."""
        step = min(self.cap, self.base * self.factor**self.failures)
        self.failures += 1
        delay = step / 2 + self.rng.uniform(0.0, step / 2)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay

    def reset(self) -> None:
        """A success: the next failure starts from ``base`` again."""
        self.failures = 0
