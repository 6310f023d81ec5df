"""Koordinator's percentile rule, window summaries and coverage, on hand-checked examples."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koordlet.metriccache.aggregate import (
    MIN_VALID_COVERAGE,
    AggregationType,
    coverage,
    percentile,
    percentile_index,
    summarize,
)


def _go_float32_index(n: int, p: float) -> int:
    """Go's ``int(float32(n) * percentile) - 1`` floored at 0, with float32 rounding emulated."""

    def f32(x: float) -> float:
        rounded: float = struct.unpack("f", struct.pack("f", x))[0]
        return rounded

    return max(int(f32(f32(float(n)) * f32(p))) - 1, 0)


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.0),  # int(4 * 0.5) - 1 = 1, no interpolation
        ([5.0], 0.5, 5.0),  # int(0.5) - 1 = -1, floored at index 0
        ([5.0], 0.99, 5.0),
        ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 0.9, 9.0),  # index 8
        ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 0.99, 9.0),  # int(9.9) - 1 = 8
        ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 1.0, 10.0),
        ([10.0, 20.0, 30.0], 0.5, 10.0),  # int(1.5) - 1 = 0
        ([10.0, 20.0, 30.0], 0.95, 20.0),  # int(2.85) - 1 = 1
    ],
)
def test_percentile_takes_the_element_at_int_n_times_p_minus_one(
    values: list[float], p: float, expected: float
) -> None:
    assert percentile(values, p) == expected


def test_p95_of_twenty_values_is_the_nineteenth_and_p99_of_a_hundred_the_ninety_ninth() -> None:
    twenty = [float(i) for i in range(1, 21)]
    hundred = [float(i) for i in range(1, 101)]
    assert percentile(twenty, 0.95) == 19.0
    assert percentile(hundred, 0.99) == 99.0
    assert percentile(hundred, 0.5) == 50.0


@pytest.mark.parametrize("p", [0.0, -0.1, 1.01])
def test_percentile_rejects_a_fraction_outside_zero_to_one(p: float) -> None:
    with pytest.raises(ValueError, match="not in"):
        percentile([1.0, 2.0], p)


def test_percentile_of_no_values_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile_index(0, 0.5)


@pytest.mark.parametrize("p", [0.5, 0.9, 0.95, 0.99])
def test_float64_index_equals_gos_float32_arithmetic_for_the_reported_percentiles(
    p: float,
) -> None:
    mismatches = [n for n in range(1, 20_001) if percentile_index(n, p) != _go_float32_index(n, p)]
    assert mismatches == []


def test_summarize_reports_every_aggregate_of_an_unsorted_window() -> None:
    values = [3.0, 1.0, 4.0, 1.0, 5.0]  # sorted: 1 1 3 4 5
    agg = summarize(values, first_ts=100.0, last_ts=140.0)
    assert agg.count == 5
    assert agg.avg == pytest.approx(2.8)
    assert agg.p50 == 1.0  # int(2.5) - 1 = 1
    assert agg.p90 == 4.0  # int(4.5) - 1 = 3
    assert agg.p95 == 4.0  # int(4.75) - 1 = 3
    assert agg.p99 == 4.0  # int(4.95) - 1 = 3
    assert (agg.min, agg.max) == (1.0, 5.0)
    assert agg.last == 5.0  # the newest, not the largest
    assert (agg.first_ts, agg.last_ts, agg.duration) == (100.0, 140.0, 40.0)


def test_last_is_the_newest_value_even_when_it_is_not_the_largest() -> None:
    agg = summarize([9.0, 2.0], first_ts=0.0, last_ts=1.0)
    assert agg.last == 2.0
    assert agg.max == 9.0


def test_summarize_of_no_values_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        summarize([], 0.0, 0.0)


def test_value_looks_up_an_aggregate_by_koordinator_aggregation_type() -> None:
    agg = summarize([1.0, 2.0, 3.0, 4.0], first_ts=0.0, last_ts=3.0)
    assert agg.value(AggregationType.P50) == agg.p50 == 2.0
    assert agg.value(AggregationType.AVG) == agg.avg == 2.5
    assert agg.value(AggregationType.LAST) == 4.0
    assert agg.value(AggregationType.COUNT) == 4.0
    assert agg.value(AggregationType.P99) == agg.p99


def test_coverage_is_the_span_of_the_samples_over_the_window_length() -> None:
    assert coverage(100.0, 250.0, 0.0, 300.0) == 0.5
    assert coverage(0.0, 300.0, 0.0, 300.0) == 1.0
    assert coverage(42.0, 42.0, 0.0, 300.0) == 0.0  # one sample spans nothing


def test_just_under_half_a_window_is_a_cold_start_and_half_is_not() -> None:
    assert coverage(0.0, 149.0, 0.0, 300.0) < MIN_VALID_COVERAGE
    assert coverage(0.0, 150.0, 0.0, 300.0) >= MIN_VALID_COVERAGE


def test_coverage_is_clamped_to_one_and_a_zero_length_window_is_covered() -> None:
    assert coverage(0.0, 500.0, 100.0, 200.0) == 1.0
    assert coverage(5.0, 5.0, 5.0, 5.0) == 1.0


def test_aggregate_coverage_uses_its_own_first_and_last_timestamps() -> None:
    agg = summarize([1.0, 2.0], first_ts=60.0, last_ts=120.0)
    assert agg.coverage(0.0, 120.0) == 0.5


@given(
    st.lists(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False), min_size=1, max_size=300),
    st.sampled_from([0.5, 0.9, 0.95, 0.99]),
)
def test_percentile_is_a_value_with_at_least_the_ranked_count_at_or_below_it(
    values: list[float], p: float
) -> None:
    ordered = sorted(values)
    result = percentile(ordered, p)
    at_or_below = sum(1 for v in values if v <= result)
    assert result in values
    assert at_or_below >= max(int(len(values) * p), 1)
