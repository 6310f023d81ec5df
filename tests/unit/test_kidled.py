"""kidled: parsing ``memory.idle_page_stats`` of both kernel generations, cold bytes past the cold
age, the scanner's state and the cold-page source on fake cgroup trees of every layout."""

from __future__ import annotations

import errno
import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.extension import KubeQOS
from koordlet.errors import CgroupGoneError, HostError, ParseError, UnsupportedError
from koordlet.system.cgroupstats import read_file_bytes
from koordlet.system.kidled import (
    COLD_BOUNDARY,
    DEFAULT_BUCKETS,
    DEFAULT_COLD_AGE_SCANS,
    IDLE_PAGE_STATS,
    KidledColdPageSource,
    KidledState,
    kidled_file,
    parse_idle_page_stats,
    probe_kidled,
    read_kidled_state,
)
from koordlet.system.paths import HostPaths
from tests.fakehost import FakeHost

GOLDEN = Path(__file__).parent.parent / "golden" / "kidled"
IDLE_TYPES = tuple(c + s + e + a for a in "ia" for e in "eu" for s in "sf" for c in "cd")
"""csei dsei cfei dfei csui … dfua: the kernel's row order."""
TEMPLATE = (GOLDEN / "memory.idle_page_stats.anolis5.10").read_text()
KOORDINATOR_TOTAL = 1363836928
"""Koordinator's expected sum of every row and bucket of its test data (the 5.10 golden)."""


def golden(name: str) -> bytes:
    return (GOLDEN / f"memory.idle_page_stats.{name}").read_bytes()


def render_idle_page_stats(
    rows: Mapping[str, Sequence[int]],
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    *,
    scans: int = 24,
    scan_period: int = 5,
) -> str:
    """A 5.10 ``memory.idle_page_stats`` with the given rows (missing idle types read 0): the
    golden's header and legend lines, then rows as the kernel prints them."""
    head = []
    for line in TEMPLATE.splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("# page_scans:"):
            line = f"# page_scans: {scans}"
        elif line.startswith("# scan_period_in_seconds:"):
            line = f"# scan_period_in_seconds: {scan_period}"
        elif line.startswith("# buckets:"):
            line = "# buckets: " + ",".join(map(str, buckets))
        elif line.startswith("# |||||"):
            edges = [*map(str, buckets), "+inf"]
            labels = [f"[{a},{b})" for a, b in itertools.pairwise(edges)]
            line = "# |||||   " + "".join(f"{label:>15}" for label in labels)
        head.append(line)
    body = []
    for name in (*IDLE_TYPES, "slab"):
        values = rows.get(name, [0] * len(buckets))
        body.append(f"  {name:<8}" + "".join(f"{v:>15}" for v in values))
    return "\n".join(head + body) + "\n"


# Parsing -----------------------------------------------------------------------------------


def test_the_5_10_format_parses_with_its_scans_hierarchy_and_slab_row() -> None:
    stats = parse_idle_page_stats(golden("anolis5.10"), "idle")

    assert (stats.version, stats.scans, stats.slab_scans) == ("1.0", 24, 0)
    assert (stats.scan_period_seconds, stats.use_hierarchy) == (120, 1)
    assert stats.buckets == DEFAULT_BUCKETS
    assert list(stats.rows) == [*IDLE_TYPES, "slab"]
    assert stats.rows["dfei"] == (0, 0, 4096, 0, 0, 0, 0, 0)
    assert stats.idle_bytes() == KOORDINATOR_TOTAL


def test_the_4_19_format_parses_with_scans_and_without_slab_or_hierarchy() -> None:
    stats = parse_idle_page_stats(golden("anolis4.19"), "idle")

    assert (stats.scans, stats.slab_scans, stats.use_hierarchy) == (1380, None, None)
    assert list(stats.rows) == list(IDLE_TYPES)
    assert stats.rows["cfei"][-1] == 147550208


def test_a_memcg_without_buckets_parses_as_not_accounting() -> None:
    stats = parse_idle_page_stats(golden("nobuckets"), "idle")

    assert not stats.accounting
    assert stats.rows == {}


def test_cold_bytes_sum_every_row_from_koordinators_cold_boundary_on() -> None:
    stats = parse_idle_page_stats(golden("anolis4.19"), "idle")
    # The document's columns [60,120), [120,240) and [240,+inf), row by row.
    cold_columns = {
        "dsei": (49152, 212992, 7741440),
        "cfei": (65536, 122880, 147550208),
        "dfei": (0, 12288, 12288),
        "csea": (372736, 327680, 33284096),
        "dsea": (0, 0, 139264),
        "cfea": (135168, 1683456, 48357376),
    }

    assert DEFAULT_BUCKETS[COLD_BOUNDARY] == DEFAULT_COLD_AGE_SCANS == 60
    assert stats.cold_bytes() == sum(sum(v) for v in cold_columns.values())
    assert stats.cold_bytes(240) == sum(v[-1] for v in cold_columns.values())


def test_the_slab_row_counts_as_cold_like_every_other_row() -> None:
    stats = parse_idle_page_stats(golden("anolis5.10-slab"), "idle")
    without_slab = sum(v[5] for name, v in stats.rows.items() if name != "slab")

    assert stats.cold_bytes() == without_slab + 763819160


def test_a_bucket_straddling_the_cold_age_is_not_counted() -> None:
    text = render_idle_page_stats({"cfei": [1, 10, 100]}, buckets=[1, 10, 100])
    stats = parse_idle_page_stats(text.encode(), "idle")

    assert stats.cold_bytes(50) == 100
    assert stats.cold_bytes(10) == 110
    assert stats.cold_bytes(101) == 0


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda t: t.replace("# buckets:", "# bucket:"), "no buckets header"),
        (lambda t: t.replace("# page_scans: 24\n", ""), r"no page_scans \(or scans\) header"),
        (lambda t: t.replace("# version: 1.0\n", ""), "no version header"),
        (lambda t: t.replace("4657152", "46x7152"), "csei value is not an integer"),
        (lambda t: t.replace("  dfua                  0", "  dfua"), "row dfua has 7 columns"),
        (lambda t: t.replace("1,2,5,15", "1,5,2,15"), "buckets are not increasing"),
        (lambda t: t.replace("1,2,5,15,30,60,120,240", "no valid bucket available"), "without"),
        (lambda t: t.replace("  csei", "  CSEI"), "bad row"),
        (lambda t: t + "  csei  1 2 3 4 5 6 7 8\n", "row csei appears twice"),
        (
            lambda t: t.replace("# scan_period_in_seconds: 120", "# scan_period_in_seconds: -1"),
            "neg",
        ),
    ],
)
def test_malformed_files_raise_a_parse_error_naming_the_file(mutate: object, match: str) -> None:
    assert callable(mutate)
    text = mutate(golden("anolis5.10").decode())

    with pytest.raises(ParseError, match=match) as info:
        parse_idle_page_stats(text.encode(), "/cg/memory.idle_page_stats")
    assert "/cg/memory.idle_page_stats" in str(info.value)


def test_binary_garbage_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="not ASCII"):
        parse_idle_page_stats(b"\xff\xfe\x00", "idle")


@given(
    st.lists(st.integers(1, 255), min_size=1, max_size=8, unique=True).map(sorted),
    st.data(),
)
def test_rendered_histograms_parse_back_and_cold_bytes_shrink_with_age(
    buckets: list[int], data: st.DataObject
) -> None:
    values = st.lists(st.integers(0, 1 << 40), min_size=len(buckets), max_size=len(buckets))
    rows = {name: data.draw(values) for name in data.draw(st.sets(st.sampled_from(IDLE_TYPES)))}

    stats = parse_idle_page_stats(render_idle_page_stats(rows, buckets).encode(), "idle")

    assert stats.buckets == tuple(buckets)
    assert {k: list(v) for k, v in stats.rows.items() if k in rows} == rows
    ages = [1, *buckets, 256]
    colds = [stats.cold_bytes(age) for age in ages]
    assert colds == sorted(colds, reverse=True)
    assert colds[0] == stats.idle_bytes()
    assert colds[-1] == 0


# The scanner -------------------------------------------------------------------------------


def set_kidled(paths: HostPaths, period: int | None, hierarchy: int | None) -> None:
    for name, value in (("scan_period_in_seconds", period), ("use_hierarchy", hierarchy)):
        path = Path(kidled_file(paths, name))
        if value is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{value}\n")


def test_a_scanning_hierarchical_kidled_is_read_as_its_state(fake_host: FakeHost) -> None:
    set_kidled(fake_host.paths, 5, 1)

    assert read_kidled_state(read_file_bytes, fake_host.paths) == KidledState(5, 1)
    assert probe_kidled(fake_host.paths)[:2] == (True, "scanning every 5 s, use_hierarchy 1")


@pytest.mark.parametrize(
    ("period", "hierarchy", "reason"),
    [
        (None, None, "scan_period_in_seconds absent: kernel without kidled"),
        (5, None, "use_hierarchy absent: kernel without kidled"),
        (0, 1, "scanning is off: .*scan_period_in_seconds is 0"),
        (5, 0, "use_hierarchy is 0: a parent's histogram would miss its children"),
    ],
)
def test_kidled_that_cannot_measure_is_unsupported_with_the_reason(
    fake_host: FakeHost, period: int | None, hierarchy: int | None, reason: str
) -> None:
    set_kidled(fake_host.paths, period, hierarchy)

    with pytest.raises(UnsupportedError, match=reason):
        read_kidled_state(read_file_bytes, fake_host.paths)
    supported, why, path = probe_kidled(fake_host.paths)
    assert not supported
    assert path.endswith("kernel/mm/kidled/scan_period_in_seconds")
    assert why


def failing_reader(code: int) -> Callable[[str], bytes]:
    """A reader failing as ``read_file_bytes`` does for ``code``: a HostError caused by the
    OSError (kidled's files cannot exist on this mainline host)."""

    def read(path: str) -> bytes:
        err = HostError(f"{path}: {os.strerror(code)}")
        err.__cause__ = OSError(code, os.strerror(code), path)
        raise err

    return read


def test_a_kernel_refusing_reads_is_unsupported_with_the_errno(fake_host: FakeHost) -> None:
    refusing = failing_reader(errno.EOPNOTSUPP)

    with pytest.raises(UnsupportedError, match=f"refuses reads .*errno {errno.EOPNOTSUPP}"):
        read_kidled_state(refusing, fake_host.paths)


def test_other_read_failures_are_host_errors_not_unsupported(fake_host: FakeHost) -> None:
    failing = failing_reader(errno.EIO)

    with pytest.raises(HostError, match="Input/output error") as info:
        read_kidled_state(failing, fake_host.paths)
    assert not isinstance(info.value, UnsupportedError)


# The source --------------------------------------------------------------------------------


def test_the_source_reads_each_memcg_file_of_every_layout(fake_host: FakeHost) -> None:
    set_kidled(fake_host.paths, 5, 1)
    pod, _ = fake_host.add_pod("1b2c3d4e-0000-4000-8000-000000000001", KubeQOS.BURSTABLE)
    fake_host.write("memory", pod, IDLE_PAGE_STATS, render_idle_page_stats({"cfei": _cold(7)}))
    fake_host.write("memory", "", IDLE_PAGE_STATS, render_idle_page_stats({"csea": _cold(9)}))
    source = KidledColdPageSource(fake_host.layout, fake_host.paths)

    assert source.check(read_file_bytes) == {
        "source": "kidled",
        "scan_period_seconds": 5,
        "cold_age_scans": 60,
        "cold_age_seconds": 300,
    }
    assert source.cold_bytes(read_file_bytes, pod) == 7 * 3
    assert source.cold_bytes(read_file_bytes, "") == 9 * 3
    assert source.path(pod) == fake_host.path("memory", pod, IDLE_PAGE_STATS)


def test_the_source_refuses_memcgs_without_accounting_or_a_finished_scan(
    fake_host: FakeHost,
) -> None:
    source = KidledColdPageSource(fake_host.layout, fake_host.paths)
    fake_host.write("memory", "", IDLE_PAGE_STATS, golden("nobuckets").decode())
    with pytest.raises(UnsupportedError, match="accounting is off"):
        source.cold_bytes(read_file_bytes, "")

    fake_host.write("memory", "", IDLE_PAGE_STATS, render_idle_page_stats({}, scans=0))
    with pytest.raises(UnsupportedError, match="no kidled scan has completed"):
        source.cold_bytes(read_file_bytes, "")

    with pytest.raises(CgroupGoneError):
        source.cold_bytes(read_file_bytes, "kubepods/burstable/podgone")


def test_a_cold_age_below_one_scan_is_refused(fake_host: FakeHost) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        KidledColdPageSource(fake_host.layout, fake_host.paths, cold_age_scans=0)


def _cold(unit: int) -> list[int]:
    """Bytes per default bucket: young buckets hold 1000x more than each cold one (60, 120,
    240 scans), which hold ``unit``."""
    return [1000 * unit] * 5 + [unit] * 3
