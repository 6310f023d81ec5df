"""Window aggregates over one series: Koordinator's percentile rule and the coverage of a window.

Koordinator's koordlet aggregates a queried window with ``fieldPercentileOfMetricList``
(``pkg/koordlet/metriccache/util.go``): the values are sorted ascending and the p-th percentile is
the element at index ``int(n * p) - 1``, floored at 0. It is a nearest-rank rule without
interpolation, so the p50 of ``[1, 2, 3, 4]`` is 2, not 2.5, and the p99 of fewer than 100 values
is the element just below the maximum as soon as ``n * 0.99`` truncates (the p99 of ten values is
the ninth). Go computes ``n * p`` in float32; for the four percentiles reported here and every
``n`` up to 200,000 this gives the same index as float64 (checked in the unit tests), so we use
float64.

The coverage of a window is Koordinator's ``TimeRangeDuration`` (last sample's time minus the
first's) divided by the window's length. NodeMetric reporting treats an aggregate as "cold start",
and reports nothing for it, while the coverage is below :data:`MIN_VALID_COVERAGE`
(``validateTimeRangeRatio`` in ``statesinformer/impl/states_nodemetric.go``).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from apis.records import frozen

MIN_VALID_COVERAGE = 0.5
"""Below this coverage a window's aggregate is too young to report (Koordinator's
``validateTimeRangeRatio``)."""


class AggregationType(StrEnum):
    """The aggregate a reader wants (Koordinator's ``AggregationType``, lower case)."""

    AVG = "avg"
    P50 = "p50"
    P90 = "p90"
    P95 = "p95"
    P99 = "p99"
    LAST = "last"
    COUNT = "count"


def percentile_index(n: int, p: float) -> int:
    """Index of the p-th percentile in ``n`` ascending values: ``max(int(n * p) - 1, 0)``.

    ``p`` is a fraction in (0, 1]; raises ``ValueError`` for an empty list or ``p`` outside it,
    as Koordinator refuses both.
    """
    if n <= 0:
        raise ValueError("percentile of no values")
    if not 0.0 < p <= 1.0:
        raise ValueError(f"percentile {p!r} is not in (0, 1]")
    return max(int(n * p) - 1, 0)


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The p-th percentile of values already sorted ascending, by Koordinator's rule."""
    return sorted_values[percentile_index(len(sorted_values), p)]


@frozen
class Aggregate:
    """Summary of the samples of one series inside a query window ``[start, end]``."""

    count: int
    """Number of samples in the window (at least 1)."""
    avg: float
    """Arithmetic mean of the values."""
    p50: float
    """50th percentile by Koordinator's nearest-rank rule (:func:`percentile`)."""
    p90: float
    """90th percentile, same rule."""
    p95: float
    """95th percentile, same rule."""
    p99: float
    """99th percentile, same rule."""
    last: float
    """Value of the newest sample in the window."""
    min: float
    """Smallest value."""
    max: float
    """Largest value."""
    first_ts: float
    """Timestamp (seconds, millisecond resolution) of the oldest sample in the window."""
    last_ts: float
    """Timestamp of the newest sample in the window."""

    @property
    def duration(self) -> float:
        """Seconds between the first and the last sample (Koordinator's ``TimeRangeDuration``)."""
        return self.last_ts - self.first_ts

    def value(self, kind: AggregationType) -> float:
        """The aggregate named by ``kind`` (``COUNT`` as a float, as Koordinator returns it)."""
        if kind is AggregationType.COUNT:
            return float(self.count)
        result: float = getattr(self, kind.value)
        return result

    def coverage(self, start: float, end: float) -> float:
        """Fraction of the window ``[start, end]`` these samples span; see :func:`coverage`."""
        return coverage(self.first_ts, self.last_ts, start, end)


def summarize(values: Sequence[float], first_ts: float, last_ts: float) -> Aggregate:
    """Aggregate the values of one window, given oldest first.

    Costs one sort of the window (O(n log n)); raises ``ValueError`` when ``values`` is empty.
    """
    n = len(values)
    if n == 0:
        raise ValueError("aggregate of no values")
    ordered = sorted(values)
    return Aggregate(
        count=n,
        avg=sum(values) / n,
        p50=ordered[percentile_index(n, 0.50)],
        p90=ordered[percentile_index(n, 0.90)],
        p95=ordered[percentile_index(n, 0.95)],
        p99=ordered[percentile_index(n, 0.99)],
        last=values[-1],
        min=ordered[0],
        max=ordered[-1],
        first_ts=first_ts,
        last_ts=last_ts,
    )


def coverage(first_ts: float, last_ts: float, start: float, end: float) -> float:
    """Fraction of the window ``[start, end]`` spanned by samples from ``first_ts`` to ``last_ts``.

    Defined as ``(last_ts - first_ts) / (end - start)`` clamped to [0, 1], with no allowance for
    the collection interval, exactly the quantity Koordinator compares with
    ``validateTimeRangeRatio``: one sample covers 0, samples at both edges cover 1. A window of
    zero length holding a sample is fully covered. Callers with no samples use 0.
    """
    window = end - start
    if window <= 0.0:
        return 1.0
    return min(max((last_ts - first_ts) / window, 0.0), 1.0)
