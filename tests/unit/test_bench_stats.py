"""The benchmarks' one percentile rule: the nearest rank, always a measured sample."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench._stats import latency_figures, percentile, print_result


@pytest.mark.parametrize(
    ("pct", "expected"),
    [(0, 1.0), (10, 1.0), (11, 2.0), (50, 5.0), (90, 9.0), (91, 10.0), (99, 10.0), (100, 10.0)],
)
def test_nearest_rank_of_one_to_ten(pct: float, expected: float) -> None:
    # rank = ceil(pct / 100 * n): p50 of 10 samples is the 5th, p91 the 10th.
    assert percentile([float(v) for v in (7, 3, 10, 1, 5, 9, 2, 8, 4, 6)], pct) == expected


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1), st.floats(0, 100))
def test_a_percentile_is_a_sample_with_enough_at_or_below_it(
    values: list[float], pct: float
) -> None:
    got = percentile(values, pct)
    assert got in values
    assert sum(v <= got for v in values) >= pct / 100 * len(values)


def test_print_result_json_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    print_result({"a_ms": 1.5, "b": "x"}, as_json=True)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {"a_ms": 1.5, "b": "x"}
    print_result({"a_ms": 1.5}, as_json=False, width=6)
    assert capsys.readouterr().out == "  a_ms: 1.5\n"


def test_latency_figures_are_nearest_rank_max_and_mean_under_one_prefix() -> None:
    ms = [float(v) for v in range(1, 11)]
    assert latency_figures("evict", ms) == {
        "evict_p50_ms": 5.0,
        "evict_p99_ms": 10.0,
        "evict_max_ms": 10.0,
        "evict_mean_ms": 5.5,
    }
