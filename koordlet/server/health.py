"""Whether the protective loops keep up: the collection tick and every QoS strategy.

A loop is **behind** when it has completed no round within three of its intervals (counted from
its start until its first round). ``/readyz`` then answers ``503`` naming it, and two gauges
say so: ``koordlet_loop_behind`` (1 or 0) and ``koordlet_loop_round_age_seconds`` (seconds since
the loop's last completed round), both labelled ``component`` and ``name`` as the
``koordlet_step_*`` families are. A round that raised still completed: failures are counted in
``koordlet_step_errors_total``; behind means the loop is stuck or starved, protection running on
old samples or not at all.

:class:`LoopHealth` does not know the loops: the daemon hands it, per loop, a callable returning
the wall-clock time of its last completed round. The QoS strategies' rounds are read from the QoS
manager's book through :class:`RoundBook`, the one read-only method it needs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from apis.records import frozen
from koordlet.prom import GaugeMetricFamily, Metric

BEHIND_INTERVALS = 3.0
"""A loop without a completed round for this many intervals is behind."""


class RoundBook(Protocol):
    """The part of the QoS manager's book (``koordlet.qos.manager.QoSBook``) read here."""

    def last_round_done(self, strategy: str, /) -> float | None:
        """Wall-clock time the strategy's last round ended; None before its first."""
        ...


@frozen
class LoopState:
    """One watched loop, as judged now."""

    component: str
    """The ``component`` label (``daemon``, ``qos``)."""
    name: str
    """The loop's name (``collect``, ``qos/cpusuppress``)."""
    interval: float
    """Seconds between its rounds."""
    age: float
    """Seconds since its last completed round (since it was watched, before the first)."""
    behind: bool
    """No completed round within :data:`BEHIND_INTERVALS` intervals."""

    def describe(self) -> str:
        return f"{self.name} (no round for {self.age:.1f}s, interval {self.interval:g}s)"


@frozen
class _Watch:
    component: str
    name: str
    interval: float
    last_done: Callable[[], float | None]
    since: float


class LoopHealth:
    """The watched loops; a prometheus-client collector of the two gauges.

    :param clock: wall-clock seconds, the time base of the ``last_done`` callables.
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._watches: dict[str, _Watch] = {}

    def watch(
        self, component: str, name: str, interval: float, last_done: Callable[[], float | None]
    ) -> None:
        """Judge loop ``name`` from now on; ``last_done`` returns its last round's end time."""
        if not interval > 0:
            raise ValueError(f"loop {name}: interval must be positive, got {interval}")
        self._watches[name] = _Watch(component, name, interval, last_done, self._clock())

    def watch_rounds(
        self, component: str, book: RoundBook, intervals: Mapping[str, float], prefix: str = ""
    ) -> None:
        """Judge each strategy of ``intervals`` (name → seconds) from ``book``'s rounds; the
        loop is named ``prefix + name`` (``qos/`` for the QoS manager's loops)."""
        for strategy, interval in intervals.items():
            self.watch(component, prefix + strategy, interval, _rounds_of(book, strategy))

    def unwatch(self, name: str) -> None:
        """Stop judging loop ``name`` (it was stopped on purpose)."""
        self._watches.pop(name, None)

    def states(self) -> list[LoopState]:
        """Every watched loop, judged now, by name."""
        now = self._clock()
        out = []
        for w in sorted(self._watches.values(), key=lambda w: w.name):
            done = w.last_done()
            age = max(now - (w.since if done is None else max(done, w.since)), 0.0)
            out.append(
                LoopState(w.component, w.name, w.interval, age, age > BEHIND_INTERVALS * w.interval)
            )
        return out

    def behind(self) -> list[LoopState]:
        """The loops that are behind now."""
        return [state for state in self.states() if state.behind]

    def as_json(self) -> list[dict[str, object]]:
        """JSON-ready states (``/debug/tasks``)."""
        return [
            {
                "component": st.component,
                "name": st.name,
                "interval_s": st.interval,
                "round_age_s": round(st.age, 3),
                "behind": st.behind,
            }
            for st in self.states()
        ]

    def describe(self) -> list[Metric]:
        """The families without samples, so a registry checks their names at registration."""
        return list(self._families([]))

    def collect(self) -> Iterator[Metric]:
        """The two gauges, judged now."""
        return self._families(self.states())

    def _families(self, states: list[LoopState]) -> Iterator[Metric]:
        behind = GaugeMetricFamily(
            "koordlet_loop_behind",
            "1 when a protective loop (collection, a QoS strategy) completed no round within "
            "three of its intervals, else 0; /readyz then answers 503.",
            labels=("component", "name"),
        )
        age = GaugeMetricFamily(
            "koordlet_loop_round_age_seconds",
            "Seconds since the loop's last completed round.",
            labels=("component", "name"),
        )
        for st in states:
            behind.add_metric((st.component, st.name), 1.0 if st.behind else 0.0)
            age.add_metric((st.component, st.name), round(st.age, 3))
        yield behind
        yield age


def _rounds_of(book: RoundBook, strategy: str) -> Callable[[], float | None]:
    return lambda: book.last_round_done(strategy)
