"""How a QoS strategy judges its inputs fresh or stale.

A strategy acts on what the collectors measured. When collection falls behind (a stuck read, an
overloaded node, the daemon just started) the newest sample may be old, and acting on it is
acting blind. The rule, for every strategy: an input older than :data:`STALE_FACTOR` times the
collection interval is stale; a strategy that adjusts a limit (CPU suppress, CPU burst) then
*holds* the state it last applied, and a strategy that evicts *skips* the round. Either way the
strategy reports it (``StrategyContext.stale``), which counts it in
``koordlet_qos_stale_inputs_total{strategy}`` and shows it in ``/debug/qos``.

The functions here are pure over the metric cache's read side; the strategy context wraps them
with its clock, the configured interval and the counting.
"""

from __future__ import annotations

from typing import Protocol

from apis.records import frozen
from koordlet.metriccache.aggregate import Aggregate

STALE_FACTOR = 2.0
"""An input older than this many collection intervals is stale (the issue's rule)."""


class CacheReader(Protocol):
    """The part of ``koordlet.metriccache.store.MetricCache`` the judgement reads."""

    def last_sample(self, metric: str, entity: str) -> tuple[float, float] | None: ...

    def aggregate(self, metric: str, entity: str, start: float, end: float) -> Aggregate | None: ...


def max_input_age(collect_interval: float, factor: float = STALE_FACTOR) -> float:
    """Seconds after which an input collected every ``collect_interval`` seconds is stale."""
    if not collect_interval > 0:
        raise ValueError(f"collect_interval must be positive, got {collect_interval!r}")
    return factor * collect_interval


@frozen
class Reading:
    """The newest sample of one series and the verdict on its age."""

    metric: str
    """The series name."""
    entity: str
    """The entity (``node``, ``pod/<uid>``...)."""
    value: float | None
    """The newest value; None when the series has no sample."""
    ts: float | None
    """Its timestamp (wall-clock seconds); None when absent."""
    age: float | None
    """``now - ts`` in seconds; None when absent."""
    max_age: float
    """The age beyond which it is stale."""

    @property
    def fresh(self) -> bool:
        """True when there is a sample no older than ``max_age``."""
        return self.age is not None and self.age <= self.max_age

    @property
    def why_stale(self) -> str:
        """Empty when fresh; else ``absent`` or ``<age>s old > <max>s``."""
        if self.fresh:
            return ""
        if self.age is None:
            return f"{self.metric}/{self.entity} absent"
        return f"{self.metric}/{self.entity} {self.age:.1f}s old > {self.max_age:g}s"

    def as_dict(self) -> dict[str, object]:
        """JSON-ready, for a strategy's report."""
        return {
            "metric": self.metric,
            "entity": self.entity,
            "value": self.value,
            "age_s": None if self.age is None else round(self.age, 3),
            "fresh": self.fresh,
        }


def read_last(
    cache: CacheReader, metric: str, entity: str, *, max_age: float, now: float
) -> Reading:
    """The newest sample of ``metric`` for ``entity`` with its age judged against ``max_age``.

    A sample stamped in the future (clock step) counts as age 0, not as stale.
    """
    sample = cache.last_sample(metric, entity)
    if sample is None:
        return Reading(metric, entity, None, None, None, max_age)
    ts, value = sample
    return Reading(metric, entity, value, ts, max(now - ts, 0.0), max_age)


def fresh_last(
    cache: CacheReader, metric: str, entity: str, max_age: float, *, now: float
) -> float | None:
    """The newest value when it is at most ``max_age`` seconds old; None when stale or absent."""
    reading = read_last(cache, metric, entity, max_age=max_age, now=now)
    return reading.value if reading.fresh else None


def fresh_aggregate(
    cache: CacheReader,
    metric: str,
    entity: str,
    window: float,
    max_age: float,
    *,
    now: float,
) -> Aggregate | None:
    """The aggregate of the last ``window`` seconds when its newest sample is at most
    ``max_age`` seconds old; None when stale or empty (coverage is the strategy's own rule)."""
    agg = cache.aggregate(metric, entity, now - window, now)
    if agg is None or agg.count == 0 or now - agg.last_ts > max_age:
        return None
    return agg
