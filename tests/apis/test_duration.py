"""Go durations as ``time.ParseDuration`` reads and ``Duration.String`` prints them
(``src/time/format.go``, ``src/time/time.go``); the examples are Go's documented ones."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.duration import (
    HOUR,
    MICROSECOND,
    MILLISECOND,
    MINUTE,
    SECOND,
    format_duration,
    format_duration_ns,
    parse_duration,
    parse_duration_ns,
)


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("1h30m", 90 * MINUTE),
        ("1.5s", 1500 * MILLISECOND),
        ("300ms", 300 * MILLISECOND),
        ("-1.5h", -90 * MINUTE),
        ("2h45m", 2 * HOUR + 45 * MINUTE),
        ("-1s", -SECOND),
        ("+3s", 3 * SECOND),
        ("0", 0),
        ("-0", 0),
        ("0s", 0),
        (".5s", 500 * MILLISECOND),
        ("1.s", SECOND),
        ("1m30.5s", 90 * SECOND + 500 * MILLISECOND),
        ("250us", 250 * MICROSECOND),
        ("250\u00b5s", 250 * MICROSECOND),  # micro sign
        ("250\u03bcs", 250 * MICROSECOND),  # Greek mu
        ("10ns", 10),
        ("1.0000000001s", SECOND),  # Go truncates below the nanosecond
        ("9223372036854775807ns", (1 << 63) - 1),
        ("-9223372036854775808ns", -(1 << 63)),
    ],
)
def test_durations_read_as_go_reads_them(text: str, ns: int) -> None:
    assert parse_duration_ns(text) == ns
    assert parse_duration(text) == ns / SECOND


@pytest.mark.parametrize(
    "text",
    ["", "s", ".", ".s", "1", "1x", "1 s", " 1s", "1s2", "--1s", "+", "1e3s", "inf", "1.5", "1d"],
)
def test_anything_but_gos_grammar_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration_ns(text)


def test_a_duration_past_int64_nanoseconds_is_refused() -> None:
    with pytest.raises(ValueError, match="out of range"):
        parse_duration_ns("9223372036854775808ns")
    with pytest.raises(ValueError, match="out of range"):
        parse_duration_ns("2562048h")


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (1, "1ns"),
        (1100, "1.1\u00b5s"),
        (2200 * MICROSECOND, "2.2ms"),
        (3300 * MILLISECOND, "3.3s"),
        (-(4 * MINUTE + 5 * SECOND), "-4m5s"),
        (4 * MINUTE + 5001 * MILLISECOND, "4m5.001s"),
        (5 * HOUR + 6 * MINUTE + 7001 * MILLISECOND, "5h6m7.001s"),
        (8 * MINUTE + 1, "8m0.000000001s"),
        (HOUR, "1h0m0s"),
        (5 * MINUTE, "5m0s"),
        ((1 << 63) - 1, "2562047h47m16.854775807s"),
        (-(1 << 63), "-2562047h47m16.854775808s"),
    ],
)
def test_durations_print_as_gos_duration_string(ns: int, text: str) -> None:
    assert format_duration_ns(ns) == text
    assert parse_duration_ns(text) == ns


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(300, "5m0s"), (1800, "30m0s"), (3600, "1h0m0s"), (45, "45s"), (1.5, "1.5s")],
)
def test_seconds_print_as_metav1_duration_does(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


@given(st.integers(-(1 << 63), (1 << 63) - 1))
def test_every_duration_round_trips_through_its_string(ns: int) -> None:
    assert parse_duration_ns(format_duration_ns(ns)) == ns


@given(
    st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from(["h", "m", "s", "ms", "us", "ns"])),
        min_size=1,
        max_size=5,
    )
)
def test_a_duration_is_the_sum_of_its_parts(parts: list[tuple[int, str]]) -> None:
    unit = {"h": HOUR, "m": MINUTE, "s": SECOND, "ms": MILLISECOND, "us": MICROSECOND, "ns": 1}
    text = "".join(f"{n}{u}" for n, u in parts)
    total = sum(n * unit[u] for n, u in parts)
    if total > 2**63 - 1:
        # time.ParseDuration: "invalid duration" past what int64 nanoseconds hold (~2,562,047 h).
        with pytest.raises(ValueError, match="invalid duration"):
            parse_duration_ns(text)
        return
    assert parse_duration_ns(text) == total
