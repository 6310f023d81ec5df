"""CPU lists as the kernel writes and reads them (``Documentation/admin-guide/cgroup-v1/
cpusets.rst``; ``bitmap_parselist`` in ``lib/bitmap.c``), and as ``k8s.io/utils/cpuset`` prints
them (``CPUSet.String``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.cpulist import MAX_CPU_ID, format_cpulist, parse_cpulist


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8-11", {0, 1, 2, 3, 8, 9, 10, 11}),  # the cpusets.rst example
        ("0-3,8-11\n", {0, 1, 2, 3, 8, 9, 10, 11}),  # as read from cpuset.cpus
        ("5", {5}),
        ("", set()),  # an empty cpuset.cpus
        ("\n", set()),
        ("4,0-1,1", {0, 1, 4}),  # overlaps and disorder, as the kernel accepts on write
        ("1-1", {1}),
        ("0-1,,4", {0, 1, 4}),  # the kernel skips empty regions between commas
        (" 0-1, 4 ", {0, 1, 4}),  # and whitespace around them
        (b"2-3\n", {2, 3}),
    ],
)
def test_a_cpulist_reads_as_the_kernel_reads_it(text: str | bytes, cpus: set[int]) -> None:
    assert parse_cpulist(text) == frozenset(cpus)


@pytest.mark.parametrize(
    "text", ["0-", "-1", "3-1", "a", "0-3,x", "+1", "0-7:2/4", "1 - 2", "٣", f"0-{MAX_CPU_ID + 1}"]
)
def test_a_malformed_cpulist_is_refused_naming_the_element(text: str) -> None:
    with pytest.raises(ValueError, match="cpulist"):
        parse_cpulist(text)


def test_cpulists_are_printed_in_the_kernels_canonical_form() -> None:
    assert format_cpulist([11, 0, 1, 2, 3, 8, 9, 10]) == "0-3,8-11"
    assert format_cpulist({8, 0, 1, 2, 3, 10, 11}) == "0-3,8,10-11"
    assert format_cpulist([7]) == "7"
    assert format_cpulist([1, 2]) == "1-2"
    assert format_cpulist([]) == ""


@given(st.frozensets(st.integers(0, 4096), max_size=200))
def test_a_cpulist_round_trips_through_its_canonical_text(ids: frozenset[int]) -> None:
    text = format_cpulist(ids)
    assert parse_cpulist(text) == ids
    assert format_cpulist(parse_cpulist(text)) == text


@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 20)), max_size=20))
def test_any_list_of_ranges_reads_as_their_union(ranges: list[tuple[int, int]]) -> None:
    text = ",".join(f"{lo}-{lo + span}" if span else str(lo) for lo, span in ranges)
    expected = {cpu for lo, span in ranges for cpu in range(lo, lo + span + 1)}
    assert parse_cpulist(text) == expected
