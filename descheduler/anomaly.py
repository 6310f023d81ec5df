"""The anomaly detector: a node is a source only after it stayed hot for several rounds.

Upstream's ``anomaly.BasicDetector`` (``pkg/descheduler/utils/anomaly/basic_detector.go``), a
two-state machine with a counter:

- **OK**: ``mark(False)`` counts an abnormality (and clears the normalities); once the anomaly
  condition holds (more than ``consecutiveAbnormalities`` in a row) the detector turns
  **Anomaly**, with a fresh counter and an expiry ``timeout`` from now. ``mark(True)`` counts a
  normality.
- **Anomaly**: ``mark(True)`` counts a normality and returns to OK once the normal condition
  holds (more than ``consecutiveNormalities`` in a row); ``mark(False)`` counts an abnormality
  (clearing the normalities). Past its expiry, or as soon as the normal condition holds, the
  state reads OK again (fresh counter).
- ``reset()`` returns an Anomaly detector to OK with a fresh counter; an OK one is left as it
  is, counter included (so a round under the low thresholds does not clear a run of hot rounds).

LowNodeLoad keeps one detector per node (and one per node for prod usage); a detector unused for
``detectorCacheTimeout`` is forgotten (:class:`DetectorCache`), as upstream's go-cache expires it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

OK = "OK"
ANOMALY = "Anomaly"
DEFAULT_TIMEOUT_S = 60.0


@dataclass(slots=True)
class Counter:
    total: int = 0
    normalities: int = 0
    abnormalities: int = 0
    consecutive_normalities: int = 0
    consecutive_abnormalities: int = 0


class Detector:
    """See the module docstring."""

    def __init__(
        self,
        name: str,
        *,
        abnormal_after: int,
        normal_after: int,
        timeout_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.name = name
        self.abnormal_after = abnormal_after
        """The anomaly condition: ``consecutive_abnormalities > abnormal_after``."""
        self.normal_after = normal_after
        """The normal condition: ``consecutive_normalities > normal_after``."""
        self.timeout_s = timeout_s if timeout_s > 0 else DEFAULT_TIMEOUT_S
        self.clock = clock
        self.state = OK
        self.counter = Counter()
        self.expiration: float | None = None

    def _anomalous(self) -> bool:
        return self.counter.consecutive_abnormalities > self.abnormal_after

    def _normal(self) -> bool:
        return self.counter.consecutive_normalities > self.normal_after

    def _set(self, state: str, now: float) -> None:
        if state == self.state:
            return
        self.state = state
        self.counter = Counter()
        self.expiration = now + self.timeout_s if state == ANOMALY else None

    def current(self) -> str:
        now = self.clock()
        if self.state == OK and self.expiration is not None and self.expiration < now:
            self.counter = Counter()
            self.expiration = None
        elif self.state == ANOMALY and (
            (self.expiration is not None and self.expiration < now) or self._normal()
        ):
            self._set(OK, now)
        return self.state

    def mark(self, normal: bool) -> str:
        """One observation; the state after it."""
        now = self.clock()
        state = self.current()
        c = self.counter
        c.total += 1
        if normal:
            c.normalities += 1
            c.consecutive_normalities += 1
            c.consecutive_abnormalities = 0
            if state == ANOMALY and self._normal():
                self._set(OK, now)
        else:
            c.abnormalities += 1
            c.consecutive_abnormalities += 1
            c.consecutive_normalities = 0
            if state == OK and self._anomalous():
                self._set(ANOMALY, now)
        return self.current()

    def reset(self) -> None:
        """``Reset``: back to OK with a fresh counter, when in Anomaly; an OK detector keeps its
        counter (upstream's ``setState`` returns early for the same state)."""
        self._set(OK, self.clock())


class DetectorCache:
    """Detectors by node name, each forgotten ``ttl_s`` after it was last stored."""

    def __init__(self, ttl_s: float, clock: Callable[[], float]) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._items: dict[str, tuple[Detector, float]] = {}

    def get(self, name: str) -> Detector | None:
        item = self._items.get(name)
        if item is None:
            return None
        if item[1] <= self.clock():
            del self._items[name]
            return None
        return item[0]

    def set(self, name: str, detector: Detector) -> None:
        self._items[name] = (detector, self.clock() + self.ttl_s)

    def __len__(self) -> int:
        return len(self._items)
