"""The koordlet's embedded metric cache: bounded time series with window aggregates.

``store`` holds the series (:class:`MetricCache`, :class:`RetentionPolicy`), ``aggregate`` the
window summaries and Koordinator's percentile rule, ``series`` the metric and entity names.
"""

from koordlet.metriccache.aggregate import (
    MIN_VALID_COVERAGE,
    Aggregate,
    AggregationType,
    coverage,
    percentile,
    percentile_index,
    summarize,
)
from koordlet.metriccache.series import Sample, SeriesKey
from koordlet.metriccache.store import MetricCache, RetentionPolicy

__all__ = [
    "MIN_VALID_COVERAGE",
    "Aggregate",
    "AggregationType",
    "MetricCache",
    "RetentionPolicy",
    "Sample",
    "SeriesKey",
    "coverage",
    "percentile",
    "percentile_index",
    "summarize",
]
