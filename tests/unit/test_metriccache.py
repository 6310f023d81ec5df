"""The metric cache: windows, retention by entity kind, drops, deletion and its memory bound."""

from __future__ import annotations

import logging
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordlet.errors import ConfigError
from koordlet.metriccache import MetricCache, RetentionPolicy, Sample, SeriesKey
from koordlet.metriccache.series import (
    CONTAINER_CPU_USAGE,
    CONTAINER_MEMORY_USAGE,
    NODE,
    NODE_CPU_USAGE,
    NODE_MEMORY_USAGE,
    POD_CPU_USAGE,
    POD_MEMORY_USAGE,
    container_entity,
    host_app_entity,
    numa_entity,
    pod_entity,
)

T0 = 1_700_000_000.0
DAY = 86_400.0


class FakeClock:
    """A settable ``time.time``."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def cache(clock: FakeClock) -> MetricCache:
    return MetricCache(clock=clock)


def put(
    cache: MetricCache, clock: FakeClock, ts: float, metric: str, entity: str, v: float
) -> None:
    """Append one sample at ``ts`` with the clock at ``ts``."""
    clock.now = max(clock.now, ts)
    cache.append(ts, [Sample(SeriesKey(metric, entity), v)])


def fill(
    cache: MetricCache, clock: FakeClock, keys: list[SeriesKey], start: float, ticks: int
) -> None:
    """One sample a second for every key, the clock following the ticks."""
    for i in range(ticks):
        ts = start + i
        clock.now = ts
        cache.append(ts, [Sample(k, float(i)) for k in keys])


# Windows ---------------------------------------------------------------------------------------
def test_window_edges_are_inclusive(cache: MetricCache, clock: FakeClock) -> None:
    for ts, v in ((T0 + 10, 1.0), (T0 + 20, 2.0), (T0 + 30, 3.0)):
        put(cache, clock, ts, NODE_CPU_USAGE, NODE, v)
    both = cache.aggregate(NODE_CPU_USAGE, NODE, T0 + 10, T0 + 30)
    inner = cache.aggregate(NODE_CPU_USAGE, NODE, T0 + 10.001, T0 + 29.999)
    point = cache.aggregate(NODE_CPU_USAGE, NODE, T0 + 20, T0 + 20)
    assert both is not None
    assert (both.count, both.first_ts, both.last_ts, both.last) == (3, T0 + 10, T0 + 30, 3.0)
    assert inner is not None
    assert (inner.count, inner.avg) == (1, 2.0)
    assert point is not None
    assert point.count == 1


def test_an_empty_window_or_an_unknown_series_aggregates_to_none(
    cache: MetricCache, clock: FakeClock
) -> None:
    put(cache, clock, T0, NODE_CPU_USAGE, NODE, 1.0)
    assert cache.aggregate(NODE_CPU_USAGE, NODE, T0 + 1, T0 + 100) is None
    assert cache.aggregate(NODE_CPU_USAGE, NODE, T0 + 1, T0 - 1) is None
    assert cache.aggregate(NODE_MEMORY_USAGE, NODE, T0 - 10, T0 + 10) is None
    assert cache.coverage(NODE_MEMORY_USAGE, NODE, T0 - 10, T0 + 10) == 0.0


def test_coverage_is_the_span_of_the_window_samples_over_its_length(
    cache: MetricCache, clock: FakeClock
) -> None:
    fill(cache, clock, [SeriesKey(NODE_CPU_USAGE, NODE)], T0, 151)  # T0 .. T0+150
    assert cache.coverage(NODE_CPU_USAGE, NODE, T0 - 150, T0 + 150) == 0.5
    assert cache.coverage(NODE_CPU_USAGE, NODE, T0, T0 + 150) == 1.0
    assert cache.coverage(NODE_CPU_USAGE, NODE, T0 + 150, T0 + 450) == 0.0


def test_points_lists_the_window_samples_oldest_first(cache: MetricCache, clock: FakeClock) -> None:
    for i in range(5):
        put(cache, clock, T0 + i, NODE_CPU_USAGE, NODE, 10.0 * i)
    assert cache.points(NODE_CPU_USAGE, NODE, T0 + 1, T0 + 3) == [
        (T0 + 1, 10.0),
        (T0 + 2, 20.0),
        (T0 + 3, 30.0),
    ]
    assert cache.points(NODE_MEMORY_USAGE, NODE, T0, T0 + 3) == []


def test_large_byte_counts_keep_full_float64_precision(
    cache: MetricCache, clock: FakeClock
) -> None:
    exact = float(64 * 2**30 + 4097)  # not representable in float32
    put(cache, clock, T0, NODE_MEMORY_USAGE, NODE, exact)
    assert cache.last(NODE_MEMORY_USAGE, NODE) == exact


# Latest values ---------------------------------------------------------------------------------
def test_last_sample_is_the_newest_timestamp_and_value(
    cache: MetricCache, clock: FakeClock
) -> None:
    put(cache, clock, T0, NODE_CPU_USAGE, NODE, 1.0)
    put(cache, clock, T0 + 1.5, NODE_CPU_USAGE, NODE, 2.5)
    assert cache.last_sample(NODE_CPU_USAGE, NODE) == (T0 + 1.5, 2.5)
    assert cache.last(NODE_CPU_USAGE, NODE) == 2.5
    assert cache.last_sample(NODE_MEMORY_USAGE, NODE) is None


def test_last_with_max_age_ignores_a_stale_value(cache: MetricCache, clock: FakeClock) -> None:
    put(cache, clock, T0, NODE_CPU_USAGE, NODE, 3.0)
    clock.now = T0 + 10
    assert cache.last(NODE_CPU_USAGE, NODE, max_age=10.0) == 3.0
    assert cache.last(NODE_CPU_USAGE, NODE, max_age=9.9) is None
    assert cache.last(NODE_CPU_USAGE, NODE) == 3.0


def test_last_values_reads_many_series_newer_than_a_bound_in_one_call(
    cache: MetricCache, clock: FakeClock
) -> None:
    put(cache, clock, T0, NODE_CPU_USAGE, NODE, 1.0)
    put(cache, clock, T0 + 5, POD_CPU_USAGE, pod_entity("a"), 2.0)
    keys = [
        SeriesKey(POD_CPU_USAGE, pod_entity("a")),
        SeriesKey(NODE_CPU_USAGE, NODE),
        SeriesKey(POD_CPU_USAGE, pod_entity("never")),
    ]
    assert cache.last_values(keys, T0) == [2.0, 1.0, None]
    assert cache.last_values(keys, T0 + 1) == [2.0, None, None]  # the node's value is older
    clock.now = T0 + 5 + 601  # past the pod retention (600 s); the node keeps 1800 s
    assert cache.last_values(keys, 0.0) == [None, 1.0, None]


def test_has_series_follows_series_created_dropped_and_collected(
    cache: MetricCache, clock: FakeClock
) -> None:
    assert not cache.has_series(POD_CPU_USAGE)
    put(cache, clock, T0, POD_CPU_USAGE, pod_entity("a"), 1.0)
    put(cache, clock, T0, POD_CPU_USAGE, pod_entity("b"), 1.0)
    put(cache, clock, T0, CONTAINER_CPU_USAGE, container_entity("a", "c1"), 1.0)
    assert cache.has_series(POD_CPU_USAGE)
    assert cache.has_series(CONTAINER_CPU_USAGE)

    cache.drop_entity(pod_entity("a"))
    assert cache.has_series(POD_CPU_USAGE)  # b's is left
    cache.drop_prefix(container_entity("a", ""))
    assert not cache.has_series(CONTAINER_CPU_USAGE)
    clock.now = T0 + 700  # b's only sample expired: gc removes the series
    cache.gc()
    assert not cache.has_series(POD_CPU_USAGE)


# Drops -----------------------------------------------------------------------------------------
def test_an_out_of_order_sample_is_dropped_and_counted(
    cache: MetricCache, clock: FakeClock
) -> None:
    put(cache, clock, T0 + 10, NODE_CPU_USAGE, NODE, 1.0)
    put(cache, clock, T0 + 5, NODE_CPU_USAGE, NODE, 99.0)
    agg = cache.aggregate(NODE_CPU_USAGE, NODE, T0, T0 + 20)
    assert agg is not None
    assert (agg.count, agg.max) == (1, 1.0)
    assert cache.stats()["dropped_out_of_order"] == 1


def test_a_second_sample_in_the_same_millisecond_is_a_counted_duplicate(
    cache: MetricCache, clock: FakeClock
) -> None:
    put(cache, clock, T0, NODE_CPU_USAGE, NODE, 1.0)
    put(cache, clock, T0 + 0.0004, NODE_CPU_USAGE, NODE, 2.0)  # rounds to the same ms
    put(cache, clock, T0, NODE_CPU_USAGE, NODE, 3.0)
    assert cache.last(NODE_CPU_USAGE, NODE) == 1.0
    stats = cache.stats()
    assert (stats["dropped_duplicate"], stats["dropped_out_of_order"]) == (2, 0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_value_is_dropped_as_invalid(
    cache: MetricCache, clock: FakeClock, bad: float
) -> None:
    put(cache, clock, T0, NODE_CPU_USAGE, NODE, 1.0)
    put(cache, clock, T0 + 1, NODE_CPU_USAGE, NODE, bad)
    assert cache.last(NODE_CPU_USAGE, NODE) == 1.0
    assert cache.stats()["dropped_invalid"] == 1


def test_an_entity_of_unknown_kind_is_dropped_with_one_warning(
    cache: MetricCache, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="koordlet.metriccache.store"):
        put(cache, clock, T0, NODE_CPU_USAGE, "gpu/0", 1.0)
        put(cache, clock, T0 + 1, NODE_CPU_USAGE, "gpu/1", 1.0)
    assert cache.series_count() == 0
    assert cache.stats()["dropped_invalid"] == 2
    assert [r.getMessage() for r in caplog.records] == [
        "metric cache: unknown entity kind 'gpu'; its samples are dropped"
    ]


# Retention -------------------------------------------------------------------------------------
def test_retention_hides_samples_by_entity_kind(cache: MetricCache, clock: FakeClock) -> None:
    pod = pod_entity("u1")
    ctr = container_entity("u1", "c1")
    clock.now = T0
    cache.append(
        T0,
        [
            Sample(SeriesKey(NODE_CPU_USAGE, NODE), 1.0),
            Sample(SeriesKey(POD_CPU_USAGE, pod), 2.0),
            Sample(SeriesKey(CONTAINER_CPU_USAGE, ctr), 3.0),
        ],
    )

    def visible() -> list[str]:
        keys = [(NODE_CPU_USAGE, NODE), (POD_CPU_USAGE, pod), (CONTAINER_CPU_USAGE, ctr)]
        return [e for m, e in keys if cache.last(m, e) is not None]

    clock.now = T0 + 300  # a sample exactly as old as the retention is kept
    assert visible() == [NODE, pod, ctr]
    clock.now = T0 + 300.001
    assert visible() == [NODE, pod]
    assert cache.aggregate(CONTAINER_CPU_USAGE, ctr, T0 - 1, T0 + 1) is None
    clock.now = T0 + 600.001
    assert visible() == [NODE]
    clock.now = T0 + 1800.001
    assert visible() == []


def test_aggregate_sees_only_the_unexpired_part_of_a_window(
    cache: MetricCache, clock: FakeClock
) -> None:
    ctr = container_entity("u1", "c1")
    fill(cache, clock, [SeriesKey(CONTAINER_CPU_USAGE, ctr)], T0, 400)  # clock ends at T0+399
    agg = cache.aggregate(CONTAINER_CPU_USAGE, ctr, T0, T0 + 399)
    assert agg is not None
    assert (agg.count, agg.first_ts) == (301, T0 + 99)


def test_steady_appends_keep_each_series_bounded_by_its_retention(
    cache: MetricCache, clock: FakeClock
) -> None:
    keys = [SeriesKey(CONTAINER_CPU_USAGE, container_entity("u1", "c1"))]
    fill(cache, clock, keys, T0, 2000)
    stored = cache.stats()["samples"]
    assert 301 <= stored <= 301 + 64  # at most one sealed chunk of expired samples


def test_gc_removes_series_whose_samples_all_expired(cache: MetricCache, clock: FakeClock) -> None:
    pod = pod_entity("u1")
    put(cache, clock, T0, NODE_CPU_USAGE, NODE, 1.0)
    put(cache, clock, T0, POD_CPU_USAGE, pod, 1.0)
    clock.now = T0 + 601
    assert cache.gc() == 1
    assert cache.entities() == [NODE]
    assert cache.series_count() == 1


def test_append_runs_gc_once_per_gc_interval(clock: FakeClock) -> None:
    cache = MetricCache(RetentionPolicy(container=10.0, gc_interval=60.0), clock=clock)
    put(cache, clock, T0, CONTAINER_CPU_USAGE, container_entity("u1", "c1"), 1.0)
    put(cache, clock, T0 + 59, NODE_CPU_USAGE, NODE, 1.0)
    assert cache.series_count() == 2
    put(cache, clock, T0 + 60, NODE_CPU_USAGE, NODE, 1.0)
    assert cache.entities() == [NODE]


def test_a_series_older_than_the_32_bit_millisecond_range_keeps_working(clock: FakeClock) -> None:
    cache = MetricCache(RetentionPolicy(node=10 * DAY), clock=clock)
    for day in range(60):  # 49.7 days of offsets overflow on the way
        put(cache, clock, T0 + day * DAY, NODE_CPU_USAGE, NODE, float(day))
    agg = cache.aggregate(NODE_CPU_USAGE, NODE, T0, T0 + 60 * DAY)
    assert agg is not None
    assert (agg.count, agg.min, agg.last) == (11, 49.0, 59.0)
    assert agg.last_ts == T0 + 59 * DAY


def test_a_series_jumping_past_the_offset_range_keeps_what_its_retention_keeps(
    clock: FakeClock,
) -> None:
    cache = MetricCache(RetentionPolicy(node=30 * DAY), clock=clock)
    put(cache, clock, T0, NODE_CPU_USAGE, NODE, 1.0)
    clock.now = T0
    cache.append(T0 + 60 * DAY, [Sample(SeriesKey(NODE_CPU_USAGE, NODE), 2.0)])
    assert cache.points(NODE_CPU_USAGE, NODE, T0, T0 + 61 * DAY) == [
        (T0, 1.0),  # the clock is still at T0: the old sample has not expired
        (T0 + 60 * DAY, 2.0),
    ]
    clock.now = T0 + 60 * DAY
    assert cache.points(NODE_CPU_USAGE, NODE, T0, T0 + 61 * DAY) == [(T0 + 60 * DAY, 2.0)]


# Deletion --------------------------------------------------------------------------------------
def test_dropping_a_pod_removes_only_that_pods_series(cache: MetricCache, clock: FakeClock) -> None:
    keys = [
        SeriesKey(POD_CPU_USAGE, pod_entity("abc")),
        SeriesKey(POD_MEMORY_USAGE, pod_entity("abc")),
        SeriesKey(CONTAINER_CPU_USAGE, container_entity("abc", "c1")),
        SeriesKey(CONTAINER_MEMORY_USAGE, container_entity("abc", "c2")),
        SeriesKey(POD_CPU_USAGE, pod_entity("abcd")),  # shares the uid's prefix
        SeriesKey(CONTAINER_CPU_USAGE, container_entity("abcd", "c1")),
        SeriesKey(NODE_CPU_USAGE, NODE),
    ]
    fill(cache, clock, keys, T0, 3)
    assert cache.drop_entity(pod_entity("abc")) == 2
    assert cache.drop_prefix(container_entity("abc", "")) == 2
    assert cache.entities() == [
        container_entity("abcd", "c1"),
        NODE,
        pod_entity("abcd"),
    ]
    assert cache.series_count() == 3
    assert cache.last(POD_CPU_USAGE, pod_entity("abcd")) == 2.0
    assert cache.last(POD_CPU_USAGE, pod_entity("abc")) is None


def test_dropping_what_is_not_there_removes_nothing(cache: MetricCache, clock: FakeClock) -> None:
    put(cache, clock, T0, NODE_CPU_USAGE, NODE, 1.0)
    assert cache.drop_entity(pod_entity("nope")) == 0
    assert cache.drop_prefix("container/nope/") == 0
    assert cache.series_count() == 1


def test_drop_prefix_refuses_an_empty_prefix(cache: MetricCache) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        cache.drop_prefix("")


def test_a_dropped_series_starts_afresh_when_samples_return(
    cache: MetricCache, clock: FakeClock
) -> None:
    pod = pod_entity("u1")
    put(cache, clock, T0 + 10, POD_CPU_USAGE, pod, 1.0)
    cache.drop_entity(pod)
    put(cache, clock, T0 + 5, POD_CPU_USAGE, pod, 2.0)  # older than the dropped series' last
    assert cache.last_sample(POD_CPU_USAGE, pod) == (T0 + 5, 2.0)
    assert cache.stats()["dropped_out_of_order"] == 0


# Index, info, stats ----------------------------------------------------------------------------
def test_entities_are_sorted_and_filtered_by_metric(cache: MetricCache, clock: FakeClock) -> None:
    keys = [
        SeriesKey(POD_CPU_USAGE, pod_entity("b")),
        SeriesKey(POD_CPU_USAGE, pod_entity("a")),
        SeriesKey(POD_MEMORY_USAGE, pod_entity("c")),
        SeriesKey(NODE_CPU_USAGE, NODE),
        SeriesKey(NODE_CPU_USAGE, numa_entity(0)),
        SeriesKey(NODE_CPU_USAGE, host_app_entity("nginx")),
    ]
    fill(cache, clock, keys, T0, 1)
    assert cache.entities(POD_CPU_USAGE) == [pod_entity("a"), pod_entity("b")]
    assert cache.entities() == sorted(k.entity for k in keys)
    assert cache.series_count() == 6


def test_info_keeps_the_latest_value_by_name(cache: MetricCache) -> None:
    assert cache.get_info("node") is None
    cache.set_info("node", {"cpus": 8})
    cache.set_info("node", {"cpus": 16})
    assert cache.get_info("node") == {"cpus": 16}


def test_stats_count_series_samples_and_drops(cache: MetricCache, clock: FakeClock) -> None:
    keys = [SeriesKey(NODE_CPU_USAGE, NODE), SeriesKey(POD_CPU_USAGE, pod_entity("u"))]
    fill(cache, clock, keys, T0, 10)
    put(cache, clock, T0, NODE_CPU_USAGE, NODE, 1.0)
    stats = cache.stats()
    assert stats["series"] == 2
    assert stats["entities"] == 2
    assert stats["samples"] == 20
    assert stats["dropped_out_of_order"] == 1
    assert stats["memory_bytes"] == cache.memory_bytes()


# Memory ----------------------------------------------------------------------------------------
def test_memory_grows_with_samples_and_shrinks_after_dropping(
    cache: MetricCache, clock: FakeClock
) -> None:
    empty = cache.memory_bytes()
    keys = [SeriesKey(POD_CPU_USAGE, pod_entity(f"u{i}")) for i in range(20)]
    fill(cache, clock, keys, T0, 10)
    small = cache.memory_bytes()
    fill(cache, clock, keys, T0 + 10, 500)
    large = cache.memory_bytes()
    assert empty < small < large
    assert large - small >= 20 * 500 * 4  # values 0..509 are exact in float32: 4 bytes each
    for i in range(10):
        cache.drop_entity(pod_entity(f"u{i}"))
    assert cache.memory_bytes() < large * 0.6


def test_memory_shrinks_when_samples_expire(cache: MetricCache, clock: FakeClock) -> None:
    keys = [SeriesKey(POD_CPU_USAGE, pod_entity(f"u{i}")) for i in range(10)]
    fill(cache, clock, keys, T0, 600)
    full = cache.memory_bytes()
    clock.now = T0 + 899  # half of each series is past its 600 s retention
    cache.gc()
    half = cache.memory_bytes()
    clock.now = T0 + 1300
    cache.gc()
    assert half < full * 0.75
    assert cache.memory_bytes() < half
    assert cache.series_count() == 0


def test_memory_is_flat_in_steady_state(cache: MetricCache, clock: FakeClock) -> None:
    keys = [SeriesKey(CONTAINER_CPU_USAGE, container_entity("u", f"c{i}")) for i in range(20)]
    fill(cache, clock, keys, T0, 900)
    at_three_retentions = cache.memory_bytes()
    fill(cache, clock, keys, T0 + 900, 900)
    assert cache.memory_bytes() <= at_three_retentions * 1.1


def sealed_bytes_per_sample(values: list[list[float]]) -> float:
    """Memory per sample that 256 more ticks add to pod series appended in the same ticks (value
    ``i % len`` of its list at tick ``i``), measured where the open tails are equally full."""
    clock = FakeClock()
    cache = MetricCache(clock=clock)
    keys = [SeriesKey(POD_CPU_USAGE, pod_entity(f"u{i}")) for i in range(len(values))]
    sizes = []
    for i in range(65 + 256 + 1):
        if i in (65, 65 + 256):
            sizes.append(cache.memory_bytes())
        clock.now = T0 + i
        cache.append(
            clock.now, [Sample(k, v[i % len(v)]) for k, v in zip(keys, values, strict=True)]
        )
    return (sizes[1] - sizes[0]) / (256 * len(values))


def test_sealed_chunks_share_timestamps_and_keep_values_in_their_smallest_exact_form() -> None:
    series = 320  # 20 in each of the 16 groups that seal together
    noisy = [[1.0 / (3 + i + j) for j in range(97)] for i in range(series)]
    pages = [[(1000 + i + j) * 4096.0 for j in range(97)] for i in range(series)]
    idle = [[0.0] for _ in range(series)]
    # 12 bytes a sample in the open tail (and in every sample before chunks). Sealed, the
    # timestamps are shared, noisy floats keep their 8 bytes, byte counts in pages deflate and
    # a constant is one float a chunk.
    assert 8.0 <= sealed_bytes_per_sample(noisy) < 11.0
    assert sealed_bytes_per_sample(pages) < 4.5
    assert sealed_bytes_per_sample(idle) < 2.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(allow_nan=False, allow_infinity=False),
            st.floats(width=32, allow_nan=False, allow_infinity=False),
            st.sampled_from([0.0, -0.0, 4096.0 * 3, 1e-300]),
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(1, 300),
)
def test_every_value_reads_back_bit_for_bit_from_chunks_and_tail(
    palette: list[float], ticks: int
) -> None:
    clock = FakeClock()
    cache = MetricCache(clock=clock)
    key = SeriesKey(POD_CPU_USAGE, pod_entity("u"))
    written = []
    for i in range(ticks):
        clock.now = T0 + i
        v = palette[(i * i) % len(palette)] if i % 100 < 70 else palette[0]  # runs, then mixes
        cache.append(clock.now, [Sample(key, v)])
        written.append(v)
    read = [v for _, v in cache.points(POD_CPU_USAGE, pod_entity("u"), T0, clock.now)]
    assert [struct.pack("<d", v) for v in read] == [struct.pack("<d", v) for v in written]
    agg = cache.aggregate(POD_CPU_USAGE, pod_entity("u"), T0, clock.now)
    assert agg is not None
    assert (agg.count, agg.last, agg.max) == (ticks, written[-1], max(written))


def test_retention_policy_rejects_a_non_positive_or_overlong_retention() -> None:
    with pytest.raises(ConfigError, match="pod"):
        RetentionPolicy(pod=0.0)
    with pytest.raises(ConfigError, match="node"):
        RetentionPolicy(node=40 * DAY)


def test_retention_policy_maps_entity_ids_to_their_kind() -> None:
    policy = RetentionPolicy()
    assert policy.seconds_for(NODE) == 1800.0
    assert policy.seconds_for(pod_entity("u")) == 600.0
    assert policy.seconds_for(container_entity("u", "c")) == 300.0
    assert policy.seconds_for(host_app_entity("x")) == 1800.0
    assert policy.seconds_for("podcast") is None


# Properties ------------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(
    offsets=st.lists(st.integers(0, 1_000_000), min_size=1, max_size=200, unique=True),
    values=st.lists(
        st.floats(min_value=-1e15, max_value=1e15, allow_nan=False), min_size=200, max_size=200
    ),
    bounds=st.tuples(st.integers(-1000, 1_001_000), st.integers(-1000, 1_001_000)),
)
def test_aggregates_equal_a_naive_computation(
    offsets: list[int], values: list[float], bounds: tuple[int, int]
) -> None:
    offsets.sort()
    clock = FakeClock(T0 + 1000)  # every sample within the node retention
    cache = MetricCache(clock=clock)
    key = SeriesKey(NODE_CPU_USAGE, NODE)
    for ms, v in zip(offsets, values, strict=False):
        cache.append(T0 + ms / 1000, [Sample(key, v)])
    start, end = T0 + min(bounds) / 1000, T0 + max(bounds) / 1000
    inside = [
        (T0 + ms / 1000, v)
        for ms, v in zip(offsets, values, strict=False)
        if start <= T0 + ms / 1000 <= end
    ]

    agg = cache.aggregate(NODE_CPU_USAGE, NODE, start, end)
    if not inside:
        assert agg is None
        assert cache.coverage(NODE_CPU_USAGE, NODE, start, end) == 0.0
        return
    assert agg is not None
    vals = [v for _, v in inside]
    ordered = sorted(vals)
    n = len(vals)
    assert agg.count == n
    assert agg.avg == pytest.approx(sum(vals) / n, rel=1e-9, abs=1e-3)
    for p, got in ((0.5, agg.p50), (0.9, agg.p90), (0.95, agg.p95), (0.99, agg.p99)):
        assert got == ordered[max(int(n * p) - 1, 0)]
    assert (agg.min, agg.max, agg.last) == (min(vals), max(vals), vals[-1])
    assert agg.first_ts == pytest.approx(inside[0][0], abs=1e-6)
    assert agg.last_ts == pytest.approx(inside[-1][0], abs=1e-6)
    span = inside[-1][0] - inside[0][0]
    expected = 1.0 if end == start else min(span / (end - start), 1.0)
    assert cache.coverage(NODE_CPU_USAGE, NODE, start, end) == pytest.approx(expected, abs=1e-6)
    points = cache.points(NODE_CPU_USAGE, NODE, start, end)
    assert [v for _, v in points] == vals
    assert [t for t, _ in points] == pytest.approx([t for t, _ in inside], abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 500), min_size=1, max_size=100))
def test_only_strictly_newer_samples_are_kept_whatever_the_arrival_order(
    arrivals: list[int],
) -> None:
    clock = FakeClock(T0 + 500)
    cache = MetricCache(clock=clock)
    key = SeriesKey(NODE_CPU_USAGE, NODE)
    kept: list[int] = []
    older = same = 0
    for i, s in enumerate(arrivals):
        cache.append(T0 + s, [Sample(key, float(i))])
        if kept and s < kept[-1]:
            older += 1
        elif kept and s == kept[-1]:
            same += 1
        else:
            kept.append(s)
    assert [t for t, _ in cache.points(NODE_CPU_USAGE, NODE, T0, T0 + 500)] == [
        T0 + s for s in kept
    ]
    stats = cache.stats()
    assert (stats["dropped_out_of_order"], stats["dropped_duplicate"]) == (older, same)
