"""The knob table: codecs round-trip on both cgroup versions, ranges are enforced."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.cpulist import MAX_CPU_ID
from koordlet.errors import InvalidValueError, ParseError, UnsupportedError
from koordlet.system.cgroups import V1_CONTROLLERS, CgroupVersion
from koordlet.system.cgroupstats import parse_cpu_max
from koordlet.system.devcodec import DeviceParamSet, DeviceRange
from koordlet.system.knobs import (
    CPU_CFS_PERIOD,
    CPU_CFS_QUOTA,
    CPU_SHARES,
    CPU_SHARES_MAX,
    CPU_SHARES_MIN,
    CPU_WEIGHT,
    CPU_WEIGHT_MAX,
    CPU_WEIGHT_MIN,
    CPUSET_CPUS,
    INT64_MAX,
    KNOBS,
    MEMORY_IDLE_PAGE_STATS,
    MEMORY_LIMIT,
    CpuList,
    Knob,
    Range,
    RangeOrUnlimited,
    knob,
    shares_to_weight,
    weight_to_shares,
)

V1, V2 = CgroupVersion.V1, CgroupVersion.V2
WRITABLE = sorted(name for name, k in KNOBS.items() if k.writable)
WRITABLE_FILES = [
    (name, version) for name in WRITABLE for version in (V1, V2) if KNOBS[name].file_for(version)
]
"""Knobs with a file on that version (``net_cls.classid`` is v1 only, ``io.latency`` v2 only)."""
LOSSY = {("cpu_shares", V2), ("cpu_weight", V1)}
"""Conversions between shares and weight: exact only in the weight-first direction."""


def values_of(k: Knob[Any]) -> st.SearchStrategy[Any]:
    """Every valid canonical value of ``k``."""
    valid = k.valid
    if isinstance(valid, Range):
        return st.integers(valid.lo, valid.hi)
    if isinstance(valid, RangeOrUnlimited):
        return st.none() | st.integers(valid.lo, valid.hi)
    if isinstance(valid, CpuList):
        return st.frozensets(st.integers(0, MAX_CPU_ID), max_size=64)
    if isinstance(valid, DeviceRange):
        return st.dictionaries(DEVICES, st.integers(valid.lo, valid.hi), max_size=4).map(
            valid.normalize
        )
    if isinstance(valid, DeviceParamSet):
        params = st.dictionaries(st.sampled_from(valid.keys), PARAM, min_size=1)
        if "enable" in valid.keys:  # a device counts as set while its switch is on
            params = params.map(lambda p: {**p, "enable": "1"})
        else:
            params = params.map(lambda p: {**p, "ctrl": "user"})
        return st.dictionaries(DEVICES, params, max_size=3).map(valid.normalize)
    raise AssertionError(f"no strategy for {type(valid).__name__}")


DEVICES = st.builds(lambda a, b: f"{a}:{b}", st.integers(0, 300), st.integers(0, 255))
PARAM = st.integers(1, 10**6).map(str) | st.sampled_from(["95.00", "99.5", "auto", "user"])

cfs_quota_text = st.none() | st.integers(1000, 10**9)
cfs_period_text = st.integers(1000, 1_000_000)
cpu_max_text = st.builds(
    lambda q, p: f"{'max' if q is None else q} {p}\n", cfs_quota_text, cfs_period_text
)


def current_of(k: Knob[Any], version: CgroupVersion) -> st.SearchStrategy[str | None]:
    """A current file text as the kernel shows it, for codecs that read it back."""
    if k.file_for(version) == "cpu.max":
        return cpu_max_text
    if k.keyed:  # an empty file: tests/unit/test_devcodec.py writes over full ones
        return st.just("")
    return st.none()


# Round trips -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "version"), WRITABLE_FILES)
@given(data=st.data())
def test_decoding_what_was_encoded_gives_the_value_back(
    name: str, version: CgroupVersion, data: st.DataObject
) -> None:
    k = KNOBS[name]
    value = data.draw(values_of(k))
    text = k.encode(value, version, data.draw(current_of(k, version)))
    if (name, version) in LOSSY:
        assert k.encode(k.decode(text, version), version) == text
    else:
        assert k.decode(text, version) == value


@pytest.mark.parametrize(("name", "version"), WRITABLE_FILES)
@given(data=st.data())
def test_values_outside_the_valid_range_are_refused(
    name: str, version: CgroupVersion, data: st.DataObject
) -> None:
    k = KNOBS[name]
    valid = k.valid
    if isinstance(valid, Range | RangeOrUnlimited):
        # Above hi, a saturating range reads Go's MaxInt64 and below as "unlimited".
        top = INT64_MAX if isinstance(valid, RangeOrUnlimited) and valid.saturate else valid.hi
        below = st.integers(max_value=valid.lo - 1).filter(lambda v: v != -1)
        bad: object = data.draw(below | st.integers(min_value=top + 1))
    else:
        bad = data.draw(st.integers(MAX_CPU_ID + 1).map(lambda i: {0, i}) | st.just({-1}))
    with pytest.raises(InvalidValueError, match=name):
        k.encode(bad, version, "max 100000")


WRONG_TYPES = [
    (name, bad)
    for name in WRITABLE
    for bad in (True, 1.5, object(), "12")
    if not (isinstance(bad, str) and isinstance(KNOBS[name].valid, CpuList))  # cpulist text is ok
]


@pytest.mark.parametrize(("name", "bad"), WRONG_TYPES)
def test_values_of_the_wrong_type_are_refused(name: str, bad: object) -> None:
    with pytest.raises(InvalidValueError, match=name):
        KNOBS[name].validate(bad)


# Shares and weight -----------------------------------------------------------------------------


@given(st.integers(CPU_SHARES_MIN, CPU_SHARES_MAX), st.integers(CPU_SHARES_MIN, CPU_SHARES_MAX))
def test_shares_to_weight_is_monotonic_and_within_weight_bounds(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert CPU_WEIGHT_MIN <= shares_to_weight(lo) <= shares_to_weight(hi) <= CPU_WEIGHT_MAX


@given(st.integers(CPU_WEIGHT_MIN, CPU_WEIGHT_MAX), st.integers(CPU_WEIGHT_MIN, CPU_WEIGHT_MAX))
def test_weight_to_shares_is_monotonic_and_within_share_bounds(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert CPU_SHARES_MIN <= weight_to_shares(lo) <= weight_to_shares(hi) <= CPU_SHARES_MAX


@given(st.integers(CPU_WEIGHT_MIN, CPU_WEIGHT_MAX))
def test_a_weight_survives_the_trip_through_shares(weight: int) -> None:
    assert shares_to_weight(weight_to_shares(weight)) == weight
    assert CPU_WEIGHT.decode(CPU_WEIGHT.encode(weight, V1), V1) == weight


@given(st.integers(CPU_SHARES_MIN, CPU_SHARES_MAX))
def test_shares_read_back_from_cgroup_v2_are_at_most_one_weight_step_below(shares: int) -> None:
    back = CPU_SHARES.decode(CPU_SHARES.encode(shares, V2), V2)
    assert 0 <= shares - back < 262142 / 9999 + 1


def test_shares_map_onto_weight_as_runc_documents_it() -> None:
    # runc / kubelet KEP-2254: 2 → 1, 1024 (one CPU) → 39, 262144 → 10000.
    assert [CPU_SHARES.encode(s, V2) for s in (2, 1024, 262144)] == ["1", "39", "10000"]
    assert CPU_SHARES.encode(1024, V1) == "1024"


# Quota and period ------------------------------------------------------------------------------


@given(cfs_quota_text, cfs_period_text, st.integers(1000, 10**9))
def test_writing_the_quota_on_v2_keeps_the_period_in_cpu_max(
    old_quota: int | None, period: int, quota: int
) -> None:
    current = f"{'max' if old_quota is None else old_quota} {period}\n"
    text = CPU_CFS_QUOTA.encode(quota, V2, current)
    assert CPU_CFS_QUOTA.decode(text, V2) == quota
    assert CPU_CFS_PERIOD.decode(text, V2) == period


@given(cfs_quota_text, cfs_period_text, cfs_period_text)
def test_writing_the_period_on_v2_keeps_the_quota_in_cpu_max(
    quota: int | None, old_period: int, period: int
) -> None:
    current = f"{'max' if quota is None else quota} {old_period}\n"
    text = CPU_CFS_PERIOD.encode(period, V2, current)
    assert CPU_CFS_PERIOD.decode(text, V2) == period
    assert CPU_CFS_QUOTA.decode(text, V2) == quota


def test_unlimited_quota_is_minus_one_on_v1_and_max_on_v2() -> None:
    assert CPU_CFS_QUOTA.encode(None, V1) == "-1"
    assert CPU_CFS_QUOTA.encode(-1, V1) == "-1"
    assert CPU_CFS_QUOTA.encode(None, V2, "50000 100000") == "max 100000"
    assert CPU_CFS_QUOTA.decode("-1\n", V1) is None
    assert CPU_CFS_QUOTA.decode("max 100000\n", V2) is None


def test_a_v2_quota_without_the_current_text_is_written_alone() -> None:
    assert CPU_CFS_QUOTA.encode(50000, V2) == "50000"


def test_a_v2_period_without_the_current_text_is_refused() -> None:
    with pytest.raises(InvalidValueError, match="cpu_cfs_period"):
        CPU_CFS_PERIOD.encode(100000, V2)


def test_a_malformed_cpu_max_is_a_parse_error_naming_the_file() -> None:
    with pytest.raises(ParseError, match=re.escape("/cg/cpu.max")):
        CPU_CFS_QUOTA.encode(50000, V2, "one two three", path="/cg/cpu.max")
    with pytest.raises(ParseError, match=re.escape("cpu.max")):
        CPU_CFS_PERIOD.decode("max", V2)


# Memory ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["-1", "9223372036854771712\n", "9223372036854710272"], ids=["-1", "4k", "64k"]
)
def test_the_v1_unlimited_spellings_decode_as_none(text: str) -> None:
    assert MEMORY_LIMIT.decode(text, V1) is None


def test_unlimited_memory_is_minus_one_on_v1_and_max_on_v2() -> None:
    assert MEMORY_LIMIT.encode(None, V1) == "-1"
    assert MEMORY_LIMIT.encode(None, V2) == "max"
    assert MEMORY_LIMIT.decode("max\n", V2) is None


def test_go_max_int64_means_unlimited_memory() -> None:
    assert MEMORY_LIMIT.validate((1 << 63) - 1) is None


# Cpulists --------------------------------------------------------------------------------------


def test_cpulists_are_written_in_the_kernel_canonical_form() -> None:
    assert CPUSET_CPUS.encode({8, 0, 1, 2, 3, 10, 11}, V1) == "0-3,8,10-11"
    assert CPUSET_CPUS.encode("3,2,1", V2) == "1-3"
    assert CPUSET_CPUS.decode("\n", V2) == frozenset()


def test_empty_cpulist_elements_are_skipped_as_the_kernel_skips_them() -> None:
    # lib/bitmap.c bitmap_parselist steps over commas between regions; the write is canonical.
    assert CPUSET_CPUS.encode("1,,2", V1) == "1-2"


@pytest.mark.parametrize("text", ["3-1", "-1", "a", "0-", "1 2"])
def test_malformed_cpulists_are_refused(text: str) -> None:
    with pytest.raises(InvalidValueError, match="cpuset_cpus"):
        CPUSET_CPUS.validate(text)
    with pytest.raises(ParseError, match=re.escape("cpuset.cpus")):
        CPUSET_CPUS.decode(text, V1)


# The table -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(KNOBS))
def test_every_knob_is_declared_for_a_known_controller_on_both_versions(name: str) -> None:
    k = knob(name)
    assert k.name == name
    assert k.controller in V1_CONTROLLERS
    assert k.file_for(V1) == k.v1_file
    assert k.file_for(V2) == k.v2_file
    assert k.doc


def test_anolis_only_knobs_say_so_per_version() -> None:
    assert knob("cpu_bvt_warp_ns").anolis_only_on(V2)
    assert knob("memory_min").anolis_only_on(V1)
    assert not knob("memory_min").anolis_only_on(V2)
    assert not knob("cpu_shares").anolis_only_on(V1)


@pytest.mark.parametrize(
    ("name", "version"),
    [(n, v) for n in WRITABLE for v in (V1, V2) if KNOBS[n].file_for(v) is None],
)
def test_a_knob_without_a_file_on_a_version_is_unsupported_there(
    name: str, version: CgroupVersion
) -> None:
    with pytest.raises(UnsupportedError, match=f"cgroup {version} has no file"):
        KNOBS[name].encode({}, version, "")


def test_read_only_knobs_cannot_be_encoded() -> None:
    with pytest.raises(UnsupportedError, match="read-only"):
        MEMORY_IDLE_PAGE_STATS.encode("x", V1)
    assert MEMORY_IDLE_PAGE_STATS.decode("cfei 0 0\n", V1) == "cfei 0 0\n"


def test_an_unknown_knob_name_is_unsupported() -> None:
    with pytest.raises(UnsupportedError, match="no_such_knob"):
        knob("no_such_knob")


def test_garbage_in_an_integer_file_is_a_parse_error_naming_the_file() -> None:
    with pytest.raises(ParseError, match=re.escape("cpu.shares")):
        CPU_SHARES.decode("lots\n", V1)
    with pytest.raises(ParseError, match=re.escape("/x/cpu.weight")):
        CPU_SHARES.decode("0", V2, path="/x/cpu.weight")


@pytest.mark.parametrize(
    ("text", "quota"),
    [
        # upstream's TestParseCPUCFSQuotaV2 (pkg/koordlet/util/system/cgroup2_test.go), row by row
        ("max 100000", None),
        ("100000 100000", 100000),
        ("999999 100000", 999999),
        ("0 100000", 0),
        ("100000 not_a_number", 100000),
        ("100000", ParseError),  # missing fields
        ("max", ParseError),  # missing quota value
        ("not_a_number 100000", ParseError),  # invalid quota value
    ],
)
def test_the_v2_quota_is_read_from_cpu_max_as_upstream_reads_it(
    text: str, quota: int | type[ParseError] | None
) -> None:
    if quota is ParseError:
        with pytest.raises(ParseError):
            CPU_CFS_QUOTA.decode(text, V2)
        with pytest.raises(ParseError):
            parse_cpu_max(text.encode(), "/cg/cpu.max")
    else:
        assert CPU_CFS_QUOTA.decode(text, V2) == quota
        assert parse_cpu_max(text.encode(), "/cg/cpu.max")[0] == quota


def test_a_period_that_is_no_number_is_the_periods_error_alone() -> None:
    with pytest.raises(ParseError, match=re.escape("cpu_cfs_period")):
        CPU_CFS_PERIOD.decode("100000 not_a_number", V2)
    # writing the quota over such a file writes the quota alone: the kernel keeps its period
    assert CPU_CFS_QUOTA.encode(50000, V2, "100000 not_a_number") == "50000"
