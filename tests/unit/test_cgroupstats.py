"""The cgroup statistics parsers, on golden files from a real kernel and the documented v2 formats.

Expected values come from an independent naive parser (split every line into a dict), never from
numbers copied out of the implementation.
"""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koordlet.errors import CgroupGoneError, HostError, ParseError
from koordlet.system import cgroupstats
from koordlet.system.cgroupstats import (
    CpuStat,
    MemoryUsage,
    cpu_throttled_ratio,
    lru_of_memory_stat,
    parse_cgroup_procs,
    parse_cpu_stat,
    parse_cpu_throttling,
    parse_int_file,
    parse_memory_lru_v1,
    parse_memory_numa_stat,
    parse_memory_stat_v1,
    parse_memory_stat_v2,
    read_cpuacct_usage_ns,
    read_file_bytes,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "parsers"


def golden(name: str) -> tuple[bytes, str]:
    path = GOLDEN / name
    return path.read_bytes(), str(path)


def naive(data: bytes) -> dict[str, int]:
    """The obvious full parse of a flat-keyed file: the oracle of the selective parsers."""
    result = {}
    for line in data.decode().splitlines():
        if line.strip():
            key, value = line.split()
            result[key] = int(value)
    return result


def naive_numa(data: bytes) -> dict[str, dict[int, int]]:
    """``{line key: {node: value}}`` of a memory.numa_stat, either version."""
    result: dict[str, dict[int, int]] = {}
    for line in data.decode().splitlines():
        fields = line.split()  # v1: "total=38400 N0=25600 ..."; v2: "anon N0=73400320 ..."
        nodes = (field[1:].split("=") for field in fields[1:])
        result[fields[0].split("=")[0]] = {int(node): int(value) for node, value in nodes}
    return result


# read_file_bytes ---------------------------------------------------------------------------


def test_reading_a_file_larger_than_the_buffer_returns_all_of_it(tmp_path: Path) -> None:
    content = b"".join(b"key%06d %d\n" % (i, i * 7) for i in range(20000))
    assert len(content) > 4 * cgroupstats.READ_BUFFER
    (tmp_path / "big").write_bytes(content)
    assert read_file_bytes(str(tmp_path / "big")) == content


def test_reading_a_file_of_exactly_the_buffer_size_returns_it_whole(tmp_path: Path) -> None:
    content = b"x" * cgroupstats.READ_BUFFER
    (tmp_path / "exact").write_bytes(content)
    assert read_file_bytes(str(tmp_path / "exact")) == content


def test_a_vanished_file_raises_cgroup_gone_chained_to_the_os_error(tmp_path: Path) -> None:
    path = str(tmp_path / "pod" / "memory.stat")
    with pytest.raises(CgroupGoneError, match=r"memory\.stat") as info:
        read_file_bytes(path)
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_other_os_errors_are_host_errors_not_a_cgroup_race(tmp_path: Path) -> None:
    with pytest.raises(HostError) as info:
        read_file_bytes(str(tmp_path))  # a directory: EISDIR
    assert not isinstance(info.value, CgroupGoneError)
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.EISDIR


@pytest.fixture
def real_cpuacct_cgroup() -> Iterator[str]:
    """A fresh, empty v1 cpuacct cgroup on this machine, removed afterwards."""
    root = "/sys/fs/cgroup/cpuacct"
    if os.geteuid() != 0 or not os.access(root, os.W_OK):
        pytest.skip("needs root and a writable cgroup v1 cpuacct hierarchy")
    path = os.path.join(root, f"kpytest-{uuid.uuid4().hex[:12]}")
    os.mkdir(path)
    try:
        yield path
    finally:
        if os.path.isdir(path):
            os.rmdir(path)


@pytest.mark.realcgroup
def test_a_removed_real_cgroup_reads_as_gone(real_cpuacct_cgroup: str) -> None:
    usage_path = os.path.join(real_cpuacct_cgroup, "cpuacct.usage")
    assert read_cpuacct_usage_ns(usage_path) == 0  # nothing ever ran in it
    os.rmdir(real_cpuacct_cgroup)
    with pytest.raises(CgroupGoneError, match=real_cpuacct_cgroup):
        read_cpuacct_usage_ns(usage_path)


# single values -----------------------------------------------------------------------------


def test_cpuacct_usage_is_read_as_nanoseconds_from_the_golden_file() -> None:
    data, path = golden("v1/cpuacct.usage")
    assert read_cpuacct_usage_ns(path) == int(data.decode())


def test_a_non_integer_cpuacct_usage_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "cpuacct.usage").write_bytes(b"12ab\n")
    with pytest.raises(ParseError, match=r"cpuacct\.usage"):
        read_cpuacct_usage_ns(str(tmp_path / "cpuacct.usage"))


@pytest.mark.parametrize(("raw", "expected"), [(b"max\n", None), (b"1024\n", 1024), (b"-1\n", -1)])
def test_int_files_read_max_as_unlimited(raw: bytes, expected: int | None) -> None:
    assert parse_int_file(raw, "memory.max") == expected


def test_a_garbled_int_file_raises_parse_error_naming_it() -> None:
    with pytest.raises(ParseError, match=r"cpu\.shares"):
        parse_int_file(b"lots\n", "cpu.shares")


def test_cgroup_procs_lists_every_pid() -> None:
    assert parse_cgroup_procs(b"1\n42\n31337\n") == [1, 42, 31337]
    assert parse_cgroup_procs(b"") == []


def test_a_garbled_cgroup_procs_names_the_file() -> None:
    with pytest.raises(ParseError, match=r"cgroup\.procs"):
        parse_cgroup_procs(b"1\nzombie\n", "x/cgroup.procs")


# cpu.stat ----------------------------------------------------------------------------------


def test_v1_cpu_stat_of_a_throttled_cgroup_keeps_nanoseconds() -> None:
    data, path = golden("v1/cpu.stat.throttled")
    raw = naive(data)
    stat = parse_cpu_stat(data, path)
    assert stat == CpuStat(
        usage_ns=None,
        nr_periods=raw["nr_periods"],
        nr_throttled=raw["nr_throttled"],
        throttled_ns=raw["throttled_time"],
        nr_bursts=raw["nr_bursts"],
        burst_ns=raw["burst_time"],
    )
    assert stat.nr_throttled > 0


def test_v1_cpu_stat_of_an_old_kernel_without_burst_keys_reads_them_as_zero() -> None:
    stat = parse_cpu_stat(b"nr_periods 10\nnr_throttled 3\nthrottled_time 999\n", "cpu.stat")
    assert (stat.nr_periods, stat.nr_throttled, stat.throttled_ns) == (10, 3, 999)
    assert (stat.nr_bursts, stat.burst_ns) == (0, 0)


def test_v2_cpu_stat_converts_microseconds_to_nanoseconds() -> None:
    data, path = golden("v2/cpu.stat")
    raw = naive(data)
    assert parse_cpu_stat(data, path) == CpuStat(
        usage_ns=raw["usage_usec"] * 1000,
        nr_periods=raw["nr_periods"],
        nr_throttled=raw["nr_throttled"],
        throttled_ns=raw["throttled_usec"] * 1000,
        nr_bursts=raw["nr_bursts"],
        burst_ns=raw["burst_usec"] * 1000,
    )


def test_v2_cpu_stat_without_the_cpu_controller_has_usage_and_no_throttling() -> None:
    data, path = golden("v2/cpu.stat.nocontroller")
    stat = parse_cpu_stat(data, path)
    assert stat.usage_ns == naive(data)["usage_usec"] * 1000
    assert (stat.nr_periods, stat.nr_throttled, stat.throttled_ns) == (0, 0, 0)


def test_cpu_stat_layouts_can_alternate_between_calls() -> None:
    v1, v1_path = golden("v1/cpu.stat.throttled")
    reordered = b"nr_throttled 2\nthrottled_time 5\nnr_periods 9\n"
    first = parse_cpu_stat(v1, v1_path)
    assert parse_cpu_stat(reordered, "other/cpu.stat")[1:4] == (9, 2, 5)
    assert parse_cpu_stat(v1, v1_path) == first


def test_cpu_stat_missing_a_required_key_names_file_and_key() -> None:
    with pytest.raises(ParseError, match=r"pod1/cpu\.stat.*nr_throttled"):
        parse_cpu_stat(b"nr_periods 1\nthrottled_time 2\n", "pod1/cpu.stat")


@pytest.mark.parametrize(
    "raw", [b"nr_periods 1\nnr_throttled x\nthrottled_time 2\n", b"nr_periods\n", b""]
)
def test_malformed_cpu_stat_raises_parse_error_with_the_path(raw: bytes) -> None:
    with pytest.raises(ParseError, match=r"pod2/cpu\.stat"):
        parse_cpu_stat(raw, "pod2/cpu.stat")


def test_throttled_ratio_is_throttled_periods_over_elapsed_periods() -> None:
    before = CpuStat(None, 100, 10, 0, 0, 0)
    after = CpuStat(None, 140, 20, 0, 0, 0)
    assert cpu_throttled_ratio(after, before) == pytest.approx(10 / 40)
    assert cpu_throttled_ratio(before, before) == 0.0


# memory.stat -------------------------------------------------------------------------------


def test_v1_memory_stat_uses_the_hierarchical_total_keys() -> None:
    data, path = golden("v1/memory.stat")
    raw = naive(data)
    usage = parse_memory_stat_v1(data, path)
    assert usage.anon == raw["total_active_anon"] + raw["total_inactive_anon"]
    assert usage.unevictable == raw["total_unevictable"]
    assert (usage.active_file, usage.inactive_file) == (
        raw["total_active_file"],
        raw["total_inactive_file"],
    )
    assert (usage.cache, usage.rss) == (raw["total_cache"], raw["total_rss"])


def test_memory_usage_excludes_page_cache_and_the_other_rule_includes_it() -> None:
    data, path = golden("v2/memory.stat")
    raw = naive(data)
    usage = parse_memory_stat_v2(data, path)
    anon_and_locked = raw["active_anon"] + raw["inactive_anon"] + raw["unevictable"]
    assert usage.usage == anon_and_locked
    assert usage.usage_with_page_cache == (
        anon_and_locked + raw["active_file"] + raw["inactive_file"]
    )
    assert (usage.cache, usage.rss) == (raw["file"], raw["anon"])


def test_memory_stat_missing_a_key_names_file_and_key() -> None:
    data, _ = golden("v1/memory.stat")
    broken = data.replace(b"\ntotal_unevictable ", b"\ntotal_unevictablx ")
    with pytest.raises(ParseError, match=r"pod3/memory\.stat.*total_unevictable"):
        parse_memory_stat_v1(broken, "pod3/memory.stat")


def test_memory_stat_with_a_bad_value_names_file_and_line() -> None:
    data, _ = golden("v2/memory.stat")
    broken = data.replace(b"\nactive_file ", b"\nactive_file 12x")
    with pytest.raises(ParseError, match=r"pod4/memory\.stat.*active_file 12x"):
        parse_memory_stat_v2(broken, "pod4/memory.stat")


def test_a_v1_memory_stat_given_to_the_v2_parser_is_rejected() -> None:
    data, path = golden("v1/memory.stat")
    with pytest.raises(ParseError, match="anon"):
        parse_memory_stat_v2(data, path)


# memory.numa_stat --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["v1/memory.numa_stat", "v1/memory.numa_stat.2nodes"])
def test_v1_numa_stat_counts_hierarchical_pages_in_bytes(name: str) -> None:
    data, path = golden(name)
    pages = naive_numa(data)["hierarchical_total"]
    assert parse_memory_numa_stat(data, path, 1) == {
        node: count * os.sysconf("SC_PAGE_SIZE") for node, count in pages.items()
    }


def test_v1_numa_stat_of_a_kernel_without_hierarchical_lines_uses_total() -> None:
    data, path = golden("v1/memory.numa_stat.2nodes")
    flat = b"".join(
        line + b"\n" for line in data.splitlines() if not line.startswith(b"hierarchical")
    )
    pages = naive_numa(flat)["total"]
    assert parse_memory_numa_stat(flat, path, 1) == {
        node: count * os.sysconf("SC_PAGE_SIZE") for node, count in pages.items()
    }


def test_v2_numa_stat_sums_anon_and_file_bytes_per_node() -> None:
    data, path = golden("v2/memory.numa_stat")
    lines = naive_numa(data)
    assert parse_memory_numa_stat(data, path, 2) == {
        node: lines["anon"][node] + lines["file"][node] for node in (0, 1)
    }


@pytest.mark.parametrize(
    ("raw", "version"),
    [(b"file=1 N0=1\n", 1), (b"anon N0=1\n", 2), (b"total=3 N0=x\n", 1), (b"total=3\n", 1)],
)
def test_malformed_numa_stat_raises_parse_error_with_the_path(raw: bytes, version: int) -> None:
    with pytest.raises(ParseError, match=r"pod5/memory\.numa_stat"):
        parse_memory_numa_stat(raw, "pod5/memory.numa_stat", version)


# memory.numa_stat's hierarchical LRU lines (the stat table's memory_lru on v1) -----------------

PAGE = os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("name", ["v1/memory.numa_stat", "v1/memory.numa_stat.2nodes"])
def test_the_lru_sums_are_the_hierarchical_anon_unevictable_and_file_pages_in_bytes(
    name: str,
) -> None:
    data, path = golden(name)
    lines = naive_numa(data)
    total = {key: sum(nodes.values()) * PAGE for key, nodes in lines.items()}

    lru = parse_memory_lru_v1(data, path)

    assert lru == (
        total["hierarchical_anon"],
        total["hierarchical_unevictable"],
        total["hierarchical_file"],
    )
    assert lru.usage == total["hierarchical_anon"] + total["hierarchical_unevictable"]
    assert lru.usage_with_page_cache == total["hierarchical_total"]  # the kernel's own sum


def test_the_lru_sums_of_the_numa_stat_match_the_memory_stat_read_beside_it() -> None:
    # tests/golden/v1 holds the same root cgroup's memory.stat and memory.numa_stat, read one
    # after the other on a live host: anon and unevictable agree to the byte, file to a page.
    numa, numa_path = (GOLDEN.parent / "v1" / "memory.numa_stat").read_bytes(), "numa_stat"
    stat = parse_memory_stat_v1((GOLDEN.parent / "v1" / "memory.stat").read_bytes(), "stat")

    from_numa = parse_memory_lru_v1(numa, numa_path)
    from_stat = lru_of_memory_stat(stat, "stat")

    assert (from_numa.anon, from_numa.unevictable) == (from_stat.anon, from_stat.unevictable)
    assert abs(from_numa.file - from_stat.file) <= PAGE


def test_lru_lines_in_another_order_parse_to_the_same_sums() -> None:
    data, path = golden("v1/memory.numa_stat.2nodes")
    lines = data.splitlines(keepends=True)
    shuffled = b"".join([lines[7], lines[0], lines[5], lines[4], lines[6], *lines[1:4]])

    assert parse_memory_lru_v1(shuffled, path) == parse_memory_lru_v1(data, path)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"total=3 N0=3\nfile=1 N0=1\nanon=1 N0=1\nunevictable=1 N0=1\n", "no hierarchical"),
        (
            b"hierarchical_total=2 N0=2\nhierarchical_file=1 N0=1\nhierarchical_anon=1 N0=1\n",
            "missing hierarchical_unevictable",
        ),
        (
            b"hierarchical_total=2 N0=2\nhierarchical_file=1 N0=1\nhierarchical_anon=x N0=1\n"
            b"hierarchical_unevictable=0 N0=0\n",
            "bad value 'hierarchical_anon=x'",
        ),
    ],
)
def test_a_numa_stat_without_usable_lru_lines_names_the_file(raw: bytes, match: str) -> None:
    with pytest.raises(ParseError, match=rf"pod6/memory\.numa_stat: .*{match}"):
        parse_memory_lru_v1(raw, "pod6/memory.numa_stat")


@given(st.lists(st.tuples(*(st.integers(0, 2**40) for _ in range(3))), min_size=1, max_size=4))
def test_kernel_ordered_numa_stat_parses_like_the_naive_parse(
    nodes: list[tuple[int, int, int]],
) -> None:
    # Per node: (anon, unevictable, file) pages; the kernel prints the cgroup's own four lines,
    # then the four hierarchical ones, each with the sum and one field per node.
    def line(key: str, values: list[int]) -> bytes:
        fields = " ".join(f"N{i}={v}" for i, v in enumerate(values))
        return f"{key}={sum(values)} {fields}\n".encode()

    anon, unevictable, file = ([n[i] for n in nodes] for i in range(3))
    total = [a + u + f for a, u, f in nodes]
    groups = (("total", total), ("file", file), ("anon", anon), ("unevictable", unevictable))
    data = b"".join(line(k, [v // 2 for v in vs]) for k, vs in groups)
    data += b"".join(line(f"hierarchical_{k}", vs) for k, vs in groups)
    expected = {k: sum(n.values()) * PAGE for k, n in naive_numa(data).items()}

    assert parse_memory_lru_v1(data, "x") == (
        expected["hierarchical_anon"],
        expected["hierarchical_unevictable"],
        expected["hierarchical_file"],
    )


def test_the_lru_sums_of_a_memory_stat_follow_its_usage_rules() -> None:
    data, path = golden("v2/memory.stat")
    usage: MemoryUsage = parse_memory_stat_v2(data, path)

    lru = lru_of_memory_stat(usage, path)

    assert lru.usage == usage.usage
    assert lru.usage_with_page_cache == usage.usage_with_page_cache


def test_an_unknown_cgroup_version_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="version"):
        parse_memory_numa_stat(b"", "x", 3)


# property: the selective parsers equal the naive full parse --------------------------------

V1_KEYS = [
    "total_cache",
    "total_rss",
    "total_inactive_anon",
    "total_active_anon",
    "total_inactive_file",
    "total_active_file",
    "total_unevictable",
]
V2_KEYS = ["anon", "file", "inactive_anon", "active_anon", "inactive_file", "active_file"]
V2_KEYS.append("unevictable")
# Names that contain a wanted key as a prefix, suffix or substring must never be taken for it.
DECOYS = ["total_cache_x", "xtotal_rss", "anon_thp", "file_mapped", "shmem", "total_dirty"]
DECOYS += ["inactive_anonx", "zactive_file", "unevictable_pages", "cache", "rss", "nr_periodsx"]

values = st.integers(min_value=0, max_value=2**63 - 1)


def render(pairs: list[tuple[str, int]], trailing_newline: bool) -> bytes:
    text = "\n".join(f"{k} {v}" for k, v in pairs)
    return (text + "\n" if trailing_newline else text).encode()


@st.composite
def flat_files(draw: st.DrawFn, wanted: list[str]) -> bytes:
    """A flat-keyed file holding ``wanted`` and decoys, in a random order, random values."""
    decoys = draw(st.lists(st.sampled_from(DECOYS), unique=True))
    keys = draw(st.permutations(wanted + decoys))
    pairs = [(key, draw(values)) for key in keys]
    return render(pairs, draw(st.booleans()))


@given(flat_files(V1_KEYS))
def test_selective_v1_memory_parse_equals_the_naive_parse(data: bytes) -> None:
    raw = naive(data)
    usage = parse_memory_stat_v1(data, "memory.stat")
    assert usage.anon == raw["total_active_anon"] + raw["total_inactive_anon"]
    assert (usage.unevictable, usage.cache, usage.rss) == (
        raw["total_unevictable"],
        raw["total_cache"],
        raw["total_rss"],
    )
    assert (usage.active_file, usage.inactive_file) == (
        raw["total_active_file"],
        raw["total_inactive_file"],
    )


@given(flat_files(V2_KEYS))
def test_selective_v2_memory_parse_equals_the_naive_parse(data: bytes) -> None:
    raw = naive(data)
    usage = parse_memory_stat_v2(data, "memory.stat")
    assert usage.anon == raw["active_anon"] + raw["inactive_anon"]
    assert (usage.unevictable, usage.cache, usage.rss) == (
        raw["unevictable"],
        raw["file"],
        raw["anon"],
    )
    assert (usage.active_file, usage.inactive_file) == (raw["active_file"], raw["inactive_file"])


@given(
    flat_files(["nr_periods", "nr_throttled", "throttled_time"]),
    st.sampled_from([b"", b"nr_bursts 4\nburst_time 77\n"]),
)
def test_selective_v1_cpu_parse_equals_the_naive_parse(data: bytes, tail: bytes) -> None:
    if not data.endswith(b"\n"):
        data += b"\n"
    data += tail
    raw = naive(data)
    assert parse_cpu_stat(data, "cpu.stat") == CpuStat(
        None,
        raw["nr_periods"],
        raw["nr_throttled"],
        raw["throttled_time"],
        raw.get("nr_bursts", 0),
        raw.get("burst_time", 0),
    )


@given(flat_files(["usage_usec", "user_usec", "nr_periods", "nr_throttled", "throttled_usec"]))
def test_selective_v2_cpu_parse_equals_the_naive_parse(data: bytes) -> None:
    raw = naive(data)
    stat = parse_cpu_stat(data, "cpu.stat")
    assert stat == CpuStat(
        raw["usage_usec"] * 1000,
        raw["nr_periods"],
        raw["nr_throttled"],
        raw["throttled_usec"] * 1000,
        0,
        0,
    )


@st.composite
def kernel_ordered_v1(draw: st.DrawFn) -> bytes:
    """A v1 memory.stat in the kernel's order (the runs the fast path expects), decoys between."""

    def decoys() -> list[tuple[str, int]]:
        names = draw(st.lists(st.sampled_from(DECOYS), unique=True, max_size=3))
        return [(name, draw(values)) for name in names]

    head = [(key, draw(values)) for key in V1_KEYS[:2]]
    lru = [(key, draw(values)) for key in V1_KEYS[2:]]
    return render(decoys() + head + decoys() + lru + decoys(), draw(st.booleans()))


@given(kernel_ordered_v1())
def test_kernel_ordered_v1_memory_stat_parses_like_the_naive_parse(data: bytes) -> None:
    raw = naive(data)
    usage = parse_memory_stat_v1(data, "memory.stat")
    assert (
        usage.usage
        == raw["total_active_anon"] + raw["total_inactive_anon"] + raw["total_unevictable"]
    )
    assert (usage.cache, usage.rss, usage.active_file, usage.inactive_file) == (
        raw["total_cache"],
        raw["total_rss"],
        raw["total_active_file"],
        raw["total_inactive_file"],
    )


def test_a_memory_stat_with_reordered_lru_lines_is_still_parsed() -> None:
    data, path = golden("v2/memory.stat")
    swapped = data.replace(b"\nactive_anon ", b"\nactive_anoX ").replace(
        b"\ninactive_file ", b"\nactive_anon "
    )
    swapped = swapped.replace(b"\nactive_anoX ", b"\ninactive_file ")
    raw = naive(swapped)
    usage = parse_memory_stat_v2(swapped, path)
    assert (usage.anon, usage.inactive_file) == (
        raw["active_anon"] + raw["inactive_anon"],
        raw["inactive_file"],
    )


# fast paths: the kernel's own layout, and the same values and errors off it ----------------


@st.composite
def kernel_tail_v1(draw: st.DrawFn) -> bytes:
    """A v1 memory.stat in the kernel's order that ENDS with the LRU lines (no debug keys)."""
    names = draw(st.lists(st.sampled_from(DECOYS), unique=True, max_size=3))
    pairs = [(name, draw(values)) for name in names]
    pairs += [(key, draw(values)) for key in V1_KEYS]
    return render(pairs, draw(st.booleans()))


@given(kernel_tail_v1(), st.sampled_from([b"", b"recent_rotated_anon 5\n"]))
def test_v1_memory_stat_ending_in_the_lru_lines_or_not_parses_like_the_naive_parse(
    data: bytes, debug_tail: bytes
) -> None:
    if debug_tail and not data.endswith(b"\n"):
        data += b"\n"
    data += debug_tail
    raw = naive(data)
    usage = parse_memory_stat_v1(data, "memory.stat")
    assert usage.anon == raw["total_active_anon"] + raw["total_inactive_anon"]
    assert (usage.unevictable, usage.active_file, usage.inactive_file) == (
        raw["total_unevictable"],
        raw["total_active_file"],
        raw["total_inactive_file"],
    )
    assert (usage.cache, usage.rss) == (raw["total_cache"], raw["total_rss"])


def test_the_golden_v1_memory_stat_with_a_debug_vm_tail_parses_to_the_same_usage() -> None:
    data, path = golden("v1/memory.stat")
    plain = parse_memory_stat_v1(data, path)
    debug = data.rstrip(b"\n") + b"\nrecent_rotated_anon 1\nrecent_scanned_file 2\n"
    assert parse_memory_stat_v1(debug, path) == plain
    raw = naive(data)
    assert plain.usage == (
        raw["total_active_anon"] + raw["total_inactive_anon"] + raw["total_unevictable"]
    )


@pytest.mark.parametrize(
    "bad",
    [b"total_unevictable 12x", b"total_rss oops", b"total_inactive_anon -"],
)
def test_a_bad_value_in_a_kernel_ordered_v1_memory_stat_still_names_file_and_line(
    bad: bytes,
) -> None:
    data, _ = golden("v1/memory.stat")
    key = bad.split()[0]
    start = data.index(b"\n" + key + b" ") + 1
    end = data.index(b"\n", start)
    broken = data[:start] + bad + data[end:]
    with pytest.raises(ParseError, match=r"pod7/memory\.stat.*" + key.decode()):
        parse_memory_stat_v1(broken, "pod7/memory.stat")


@given(
    flat_files(["nr_periods", "nr_throttled", "throttled_time"]),
    st.sampled_from([b"", b"nr_bursts 4\nburst_time 77\n"]),
)
def test_throttling_pair_equals_the_full_cpu_stat_parse(data: bytes, tail: bytes) -> None:
    if not data.endswith(b"\n"):
        data += b"\n"
    data += tail
    raw = naive(data)
    for _ in range(2):  # the second call takes the learned-layout path
        assert parse_cpu_throttling(data, "cpu.stat") == (raw["nr_periods"], raw["nr_throttled"])


def test_throttling_pair_of_a_v2_cpu_stat_comes_from_its_cfs_keys() -> None:
    data, path = golden("v2/cpu.stat")
    raw = naive(data)
    assert parse_cpu_throttling(data, path) == (raw["nr_periods"], raw["nr_throttled"])


def test_a_bad_throttling_value_raises_parse_error_after_the_layout_was_learned() -> None:
    data, _ = golden("v1/cpu.stat")
    parse_cpu_throttling(data, "pod1/cpu.stat")  # learns the layout
    broken = data.replace(b"nr_throttled ", b"nr_throttled x", 1)
    with pytest.raises(ParseError, match=r"pod2/cpu\.stat"):
        parse_cpu_throttling(broken, "pod2/cpu.stat")


def test_a_cpu_stat_without_throttling_keys_is_rejected_by_the_pair_parse() -> None:
    with pytest.raises(ParseError, match=r"pod3/cpu\.stat.*nr_periods"):
        parse_cpu_throttling(b"throttled_time 5\n", "pod3/cpu.stat")
