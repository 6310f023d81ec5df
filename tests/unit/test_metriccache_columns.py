"""``MetricCache.append_columns`` reads back exactly as ``append`` of the same samples does.

The contract: for every read API, ``append_columns(ts, cols)`` is indistinguishable from
``append(ts, [Sample(k, v) for keys, values in cols for k, v in zip(keys, values)])``. A state
machine drives two caches on one clock, one through ``append`` only and one through
``append_columns``, across ticks (regular, repeated, in the past, after a jump), churn of the
plans' key tuples, per-sample appends to keys the columns hold, deletions and gc, and compares
every read bit for bit. The layout and the timing of trims may differ, so ``memory_bytes`` and
``samples`` are not compared.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import random
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from koordlet.metriccache import MetricCache, RetentionPolicy, Sample, SeriesKey
from koordlet.metriccache.series import (
    CONTAINER_CPU_THROTTLED_RATIO,
    CONTAINER_CPU_USAGE,
    CONTAINER_MEMORY_USAGE,
    CONTAINER_MEMORY_WITH_PAGE_CACHE,
    NODE,
    NODE_CPU_USAGE,
    NODE_MEMORY_USAGE,
    NUMA_CPU_USAGE,
    NUMA_MEMORY_USAGE,
    POD_CPU_THROTTLED_RATIO,
    POD_CPU_USAGE,
    POD_MEMORY_USAGE,
    POD_MEMORY_WITH_PAGE_CACHE,
    container_entity,
    numa_entity,
    pod_entity,
)

T0 = 1_700_000_000.0
SMALL = RetentionPolicy(
    node=40.0,
    system=40.0,
    numa=40.0,
    be=40.0,
    hostapp=40.0,
    pod=20.0,
    container=10.0,
    gc_interval=15.0,
)
"""Retentions short enough that trims, seals (a tail spans at most a quarter of the retention)
and gc sweeps all happen within a few hundred ticks."""

POD_METRICS = (POD_CPU_USAGE, POD_MEMORY_USAGE, POD_MEMORY_WITH_PAGE_CACHE, POD_CPU_THROTTLED_RATIO)
CONTAINER_METRICS = (
    CONTAINER_CPU_USAGE,
    CONTAINER_MEMORY_USAGE,
    CONTAINER_MEMORY_WITH_PAGE_CACHE,
    CONTAINER_CPU_THROTTLED_RATIO,
)
NODE_METRICS = (NODE_CPU_USAGE, NODE_MEMORY_USAGE)
NUMA_METRICS = (NUMA_CPU_USAGE, NUMA_MEMORY_USAGE)
METRICS = (*POD_METRICS, *CONTAINER_METRICS, *NODE_METRICS, *NUMA_METRICS, "never_stored")

PODS = [f"uid-{i:02d}" for i in range(12)]


def containers_of(uid: str) -> list[str]:
    """2 to 5 container ids per pod."""
    return [f"{uid}-c{j}" for j in range(2 + int(uid[-2:]) % 4)]


def keys_of_pod(uid: str) -> list[SeriesKey]:
    """Every key of one pod: its own series and its containers' (12 to 24 keys)."""
    keys = [SeriesKey(m, pod_entity(uid)) for m in POD_METRICS]
    for cid in containers_of(uid):
        keys += [SeriesKey(m, container_entity(uid, cid)) for m in CONTAINER_METRICS]
    return keys


KEYS_BY_POD = {uid: keys_of_pod(uid) for uid in PODS}
NODE_KEYS = [SeriesKey(m, NODE) for m in NODE_METRICS] + [
    SeriesKey(m, numa_entity(n)) for n in (0, 1) for m in NUMA_METRICS
]
ALL_KEYS = [k for uid in PODS for k in KEYS_BY_POD[uid]] + NODE_KEYS
BOGUS_KEYS = [SeriesKey(CONTAINER_CPU_USAGE, "bogus/1"), SeriesKey(POD_CPU_USAGE, "bogus/2")]
"""Keys of an unknown entity kind: every sample of them is dropped and counted invalid."""

Column = tuple[tuple[SeriesKey, ...], Sequence[float]]

# Bit-exact observation of every read ----------------------------------------------------------


def bits(x: Any) -> Any:
    """``x`` with every float as its hex form: -0.0 and 0.0 differ, as do any two bit patterns."""
    if isinstance(x, float):
        return x.hex()
    if isinstance(x, (list, tuple)):
        return [bits(v) for v in x]
    if dataclasses.is_dataclass(x):
        return [(f.name, bits(getattr(x, f.name))) for f in dataclasses.fields(x)]
    return x


def windows(now: float) -> list[tuple[float, float]]:
    return [
        (now - 5.0, now),
        (now - 100.0, now + 10.0),
        (now - 60.0, now - 30.0),  # older than every retention but the node's
        (now - 12.3456, now - 2.5),  # fractional edges
    ]


def observe_key(cache: MetricCache, key: SeriesKey, now: float) -> list[tuple[str, Any]]:
    metric, entity = key
    out: list[tuple[str, Any]] = [
        ("last_sample", bits(cache.last_sample(metric, entity))),
        ("last", bits(cache.last(metric, entity))),
        ("last max_age=0.5", bits(cache.last(metric, entity, max_age=0.5))),
        ("last max_age=5", bits(cache.last(metric, entity, max_age=5.0))),
    ]
    for start, end in windows(now):
        span = f"[now{start - now:+.4f}, now{end - now:+.4f}]"
        out += [
            (f"aggregate {span}", bits(cache.aggregate(metric, entity, start, end))),
            (f"points {span}", bits(cache.points(metric, entity, start, end))),
            (f"coverage {span}", bits(cache.coverage(metric, entity, start, end))),
        ]
    return out


def observe_cache(cache: MetricCache, keys: Sequence[SeriesKey], now: float, ts: float) -> Any:
    stats = cache.stats()
    out: list[tuple[str, Any]] = [
        (
            "stats",
            {
                name: stats[name]
                for name in (
                    "series",
                    "entities",
                    "dropped_out_of_order",
                    "dropped_duplicate",
                    "dropped_invalid",
                )
            },
        ),
        ("entities()", cache.entities()),
    ]
    out += [(f"entities({m!r})", cache.entities(m)) for m in METRICS]
    out += [(f"has_series({m!r})", cache.has_series(m)) for m in METRICS]
    for since in (now + 1.0, ts, now - 0.5, now - 5.0, now - 100.0):
        out.append(
            (f"last_values(since=now{since - now:+.3f})", bits(cache.last_values(keys, since)))
        )
    return out


def difference(want: Any, got: Any, keys: Sequence[SeriesKey] = ()) -> str:
    """Where two observations first differ: the index (and the key, for ``last_values``)."""
    if isinstance(want, list) and isinstance(got, list):
        for i, (w, g) in enumerate(zip(want, got, strict=False)):
            if w != g:
                at = f" ({keys[i]})" if len(want) == len(keys) else ""
                return f"at [{i}]{at}: append_columns gave {g!r}, append gave {w!r}"
        return f"lengths: append_columns gave {len(got)}, append gave {len(want)}"
    return f"append_columns gave {got!r}, append gave {want!r}"


def assert_same_reads(
    a: MetricCache, b: MetricCache, keys: Sequence[SeriesKey], now: float, ts: float
) -> None:
    """Every read of ``b`` equals the same read of ``a``, bit for bit; the message names the
    first one that differs."""
    for (what, want), (_, got) in zip(
        observe_cache(a, keys, now, ts), observe_cache(b, keys, now, ts), strict=True
    ):
        assert got == want, f"{what} {difference(want, got, keys)}"
    for key in keys:
        for (what, want), (_, got) in zip(
            observe_key(a, key, now), observe_key(b, key, now), strict=True
        ):
            assert got == want, f"{key} {what} {difference(want, got)}"


def as_samples(columns: Iterable[Column]) -> list[Sample]:
    return [Sample(k, v) for keys, values in columns for k, v in zip(keys, values, strict=True)]


# Values ---------------------------------------------------------------------------------------


def column_values(rng: random.Random, keys: Sequence[SeriesKey], tick: int) -> list[float]:
    """One tick's values for ``keys``, in the shapes a chunk packs differently: noisy floats,
    constants (0.0, -0.0, 1.5), page-multiple byte counts (deflated), extremes."""
    out = []
    for i, key in enumerate(keys):
        shape = (i * 7 + len(key.metric)) % 6
        if shape == 0:
            v = rng.random() * 8.0
        elif shape == 1:
            v = 0.0
        elif shape == 2:
            v = float(rng.randrange(1 << 18) * 4096)
        elif shape == 3:
            v = -0.0 if tick % 7 else 1.5
        elif shape == 4:
            v = rng.choice((5e-324, 1e308, -2.5, rng.random()))
        else:
            v = 1.5
        out.append(v)
    return out


INVALID = (math.nan, math.inf, -math.inf)


class ColumnsMatchSamples(RuleBasedStateMachine):
    """Cache ``a`` gets samples through ``append``, cache ``b`` the same ones through
    ``append_columns`` (and through ``append`` where the machine does a per-sample append).

    The live plans hold disjoint keys (as the collectors' columns do), though keys move from
    plan to plan over time; :class:`OverlappingColumnsMatchSamples` lifts that."""

    OVERLAP = False
    """Whether plans may share keys, and one call may hold the same plan twice."""

    def __init__(self) -> None:
        super().__init__()
        self.now = [T0]
        self.a = MetricCache(SMALL, clock=lambda: self.now[0])
        self.b = MetricCache(SMALL, clock=lambda: self.now[0])
        self.ts = T0
        """The newest tick's timestamp (seconds)."""
        self.tick_no = 0
        self.plans: list[tuple[SeriesKey, ...]] = []
        """Live plans: key tuples reused tick after tick, disjoint but for bogus keys."""
        self.used: dict[SeriesKey, None] = {}
        """Every key ever appended, in first-use order."""

    # Helpers ----------------------------------------------------------------------------------
    def clock_to(self, t: float) -> None:
        """Move the clock to ``t`` unless it is already past it: time never goes back (with a
        clock going back, ``append``'s eager trims would already make reads differ)."""
        self.now[0] = max(self.now[0], t)

    def live(self) -> set[SeriesKey]:
        return {k for plan in self.plans for k in plan}

    def free_keys(self) -> list[SeriesKey]:
        if self.OVERLAP:
            return ALL_KEYS
        live = self.live()
        return [k for k in ALL_KEYS if k not in live]

    def note(self, keys: Iterable[SeriesKey]) -> None:
        for k in keys:
            self.used.setdefault(k)

    def new_plan(self, rng: random.Random, pods: int, bogus: bool) -> tuple[SeriesKey, ...]:
        live = set() if self.OVERLAP else self.live()
        free_pods = [u for u in PODS if not live.intersection(KEYS_BY_POD[u])]
        keys: list[SeriesKey] = []
        for uid in rng.sample(free_pods, min(pods, len(free_pods))):
            keys += KEYS_BY_POD[uid]
        if bogus:
            keys.insert(rng.randrange(len(keys) + 1), rng.choice(BOGUS_KEYS))
        return tuple(keys)

    def append_both(self, ts: float, columns: list[Column]) -> None:
        self.note(k for keys, _ in columns for k in keys)
        self.a.append(ts, as_samples(columns))
        self.b.append_columns(ts, columns)

    def one_tick(
        self, ts: float, rng: random.Random, invalid: bool, split: bool, as_array: bool
    ) -> None:
        self.tick_no += 1
        columns: list[Column] = []
        for plan in self.plans:
            values = column_values(rng, plan, self.tick_no)
            if invalid and plan and rng.random() < 0.3:
                values[rng.randrange(len(values))] = rng.choice(INVALID)
            columns.append((plan, array("d", values) if as_array else values))
        if self.OVERLAP and columns and rng.random() < 0.2:
            plan = rng.choice(self.plans)  # the same tuple twice in one call: duplicates
            columns.insert(rng.randrange(len(columns) + 1), (plan, [2.0] * len(plan)))
        if split:
            for column in columns:
                self.append_both(ts, [column])
        else:
            self.append_both(ts, columns)

    # Set-up -----------------------------------------------------------------------------------
    @initialize(
        sizes=st.lists(st.integers(2, 6), min_size=1, max_size=3),
        node_plan=st.booleans(),
        bogus=st.lists(st.booleans(), min_size=3, max_size=3),
        seed=st.integers(0, 2**32 - 1),
    )
    def make_plans(self, sizes: list[int], node_plan: bool, bogus: list[bool], seed: int) -> None:
        rng = random.Random(seed)
        for size, with_bogus in zip(sizes, bogus, strict=False):
            plan = self.new_plan(rng, size, with_bogus)
            if plan:
                self.plans.append(plan)
        if node_plan:  # a short column: it may take the per-sample path
            self.plans.append(tuple(NODE_KEYS))

    # Ticks ------------------------------------------------------------------------------------
    @rule(
        n=st.integers(1, 80),
        step=st.sampled_from([1.0, 1.0, 1.0, 0.5, 0.05, 2.5, 0.0004]),
        lag=st.sampled_from([0.0, 0.0, 0.3]),
        invalid=st.booleans(),
        split=st.booleans(),
        as_array=st.booleans(),
        seed=st.integers(0, 2**32 - 1),
    )
    def ticks(
        self,
        n: int,
        step: float,
        lag: float,
        invalid: bool,
        split: bool,
        as_array: bool,
        seed: int,
    ) -> None:
        """``n`` regular ticks ``step`` s apart (0.0004 s: several land on one millisecond and
        are duplicates), the clock ``lag`` s past the tick's timestamp."""
        rng = random.Random(seed)
        for _ in range(n):
            self.ts += step
            self.clock_to(self.ts + lag)
            self.one_tick(self.ts, rng, invalid, split, as_array)

    @rule(
        wait=st.sampled_from([0.0, 0.0, 0.5, 12.0, 30.0]),
        split=st.booleans(),
        seed=st.integers(0, 2**32 - 1),
    )
    def same_tick_again(self, wait: float, split: bool, seed: int) -> None:
        """The newest timestamp again, the clock ``wait`` s on: every sample of a known series
        is a duplicate (and a gc may be due in the same call)."""
        self.now[0] += wait
        self.one_tick(self.ts, random.Random(seed), False, split, False)

    @rule(
        back=st.sampled_from([0.001, 0.5, 3.0, 25.0, 1000.0]),
        wait=st.sampled_from([0.0, 0.0, 12.0, 30.0]),
        split=st.booleans(),
        seed=st.integers(0, 2**32 - 1),
    )
    def tick_in_the_past(self, back: float, wait: float, split: bool, seed: int) -> None:
        """A timestamp older than the newest: out of order for known series, new ones take it."""
        self.now[0] += wait
        self.one_tick(self.ts - back, random.Random(seed), False, split, False)

    @rule(jump=st.floats(30.0, 90.0), seed=st.integers(0, 2**32 - 1))
    def tick_after_a_jump(self, jump: float, seed: int) -> None:
        """A pause longer than every retention but the node's: reads hide what expired."""
        self.ts += round(jump, 3)
        self.clock_to(self.ts)
        self.one_tick(self.ts, random.Random(seed), False, False, False)

    @rule()
    def empty_call(self) -> None:
        """No columns (and an empty column): nothing stored, but the gc timer still runs."""
        self.ts += 1.0
        self.clock_to(self.ts)
        self.a.append(self.ts, [])
        self.b.append_columns(self.ts, [((), [])])

    # Plans change -----------------------------------------------------------------------------
    @precondition(lambda self: self.plans)
    @rule(
        index=st.integers(0, 3),
        remove=st.integers(0, 6),
        add=st.integers(0, 6),
        order=st.sampled_from(["keep", "shuffle", "reverse", "rotate"]),
        seed=st.integers(0, 2**32 - 1),
    )
    def churn(self, index: int, remove: int, add: int, order: str, seed: int) -> None:
        """A plan becomes a new tuple object with keys removed, added or reordered (a pod or a
        container came or went); the old tuple is no longer referenced by the caller."""
        rng = random.Random(seed)
        index %= len(self.plans)
        keys = list(self.plans[index])
        for _ in range(min(remove, len(keys))):
            del keys[rng.randrange(len(keys))]
        free = self.free_keys()
        for key in rng.sample(free, min(add, len(free))):
            keys.insert(rng.randrange(len(keys) + 1), key)
        if order == "shuffle":
            rng.shuffle(keys)
        elif order == "reverse":
            keys.reverse()
        elif order == "rotate" and keys:
            keys = keys[1:] + keys[:1]
        self.plans[index] = ()  # drop the old tuple before building the new one
        gc.collect()
        self.plans[index] = tuple(keys)

    @precondition(lambda self: len(self.plans) < 4)
    @rule(pods=st.integers(1, 5), bogus=st.booleans(), seed=st.integers(0, 2**32 - 1))
    def add_plan(self, pods: int, bogus: bool, seed: int) -> None:
        plan = self.new_plan(random.Random(seed), pods, bogus)
        if plan:
            self.plans.append(plan)

    @precondition(lambda self: self.plans)
    @rule(index=st.integers(0, 3), drop=st.booleans())
    def remove_plan(self, index: int, drop: bool) -> None:
        """A plan stops (its pods went away), its series dropped or left to expire."""
        plan = self.plans.pop(index % len(self.plans))
        if drop:
            for entity in sorted({k.entity for k in plan}):
                assert self.a.drop_entity(entity) == self.b.drop_entity(entity), entity

    # Mixed use --------------------------------------------------------------------------------
    @rule(
        picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=30),
        others=st.integers(0, 3),
        when=st.sampled_from(["same", "next", "past"]),
        seed=st.integers(0, 2**32 - 1),
    )
    def per_sample_append(self, picks: list[int], others: int, when: str, seed: int) -> None:
        """``append`` on both caches, of keys the columns hold (and a few others): the column
        path must cope with series that also receive samples one by one."""
        rng = random.Random(seed)
        live = sorted(self.live())
        keys = [live[p % len(live)] for p in picks] if live else []
        keys += rng.sample(ALL_KEYS, others)
        if when == "next":
            self.ts += 0.5
            self.clock_to(self.ts)
            ts = self.ts
        elif when == "past":
            ts = self.ts - 1.0
        else:
            ts = self.ts
        samples = [Sample(k, rng.random()) for k in keys]
        if samples and rng.random() < 0.3:
            i = rng.randrange(len(samples))
            samples[i] = Sample(samples[i].key, rng.choice(INVALID))
        self.note(keys)
        self.a.append(ts, samples)
        self.b.append(ts, samples)

    # Deletion and gc --------------------------------------------------------------------------
    @rule(
        what=st.sampled_from(["pod", "containers", "pod entity", "container entity", "all"]),
        uid=st.sampled_from(PODS),
        container=st.integers(0, 4),
    )
    def drop(self, what: str, uid: str, container: int) -> None:
        """Deleting series, some of which the column plans still name (they come back)."""
        if what == "pod":
            got = self.a.drop_prefix(pod_entity(uid)), self.b.drop_prefix(pod_entity(uid))
        elif what == "containers":
            prefix = f"container/{uid}/"
            got = self.a.drop_prefix(prefix), self.b.drop_prefix(prefix)
        elif what == "pod entity":
            got = self.a.drop_entity(pod_entity(uid)), self.b.drop_entity(pod_entity(uid))
        elif what == "container entity":
            cids = containers_of(uid)
            entity = container_entity(uid, cids[container % len(cids)])
            got = self.a.drop_entity(entity), self.b.drop_entity(entity)
        else:
            got = self.a.drop_prefix("container/"), self.b.drop_prefix("container/")
        assert got[1] == got[0], f"drop {what} {uid}: removed {got[1]}, append's cache {got[0]}"

    @rule()
    def gc(self) -> None:
        removed = self.a.gc(), self.b.gc()
        assert removed[1] == removed[0], f"gc removed {removed[1]}, append's cache {removed[0]}"

    # Checks -----------------------------------------------------------------------------------
    @invariant()
    def counters_agree(self) -> None:
        sa, sb = self.a.stats(), self.b.stats()
        for name in ("series", "entities", "dropped_out_of_order", "dropped_duplicate"):
            assert sb[name] == sa[name], f"stats {name}: {sb[name]} != {sa[name]}"
        assert sb["dropped_invalid"] == sa["dropped_invalid"]

    @rule()
    def every_read_agrees(self) -> None:
        assert_same_reads(self.a, self.b, list(self.used), self.now[0], self.ts)

    def teardown(self) -> None:
        assert_same_reads(self.a, self.b, list(self.used), self.now[0], self.ts)


class OverlappingColumnsMatchSamples(ColumnsMatchSamples):
    """Plans that share keys, and a plan twice in one call: a key's first sample in a call is
    the one kept, the others are duplicates, whichever path each column takes."""

    OVERLAP = True


# A pass takes seconds; a failure is shrunk for up to Hypothesis's five minutes, which the
# project's 120 s timeout would cut short (reported as a timeout or as flaky, without the example).
shrinking_time = pytest.mark.timeout(900)
ColumnsMatchSamples.TestCase.settings = settings(
    max_examples=50, stateful_step_count=30, deadline=None
)
TestAppendColumnsReadsAsAppend = shrinking_time(ColumnsMatchSamples.TestCase)
OverlappingColumnsMatchSamples.TestCase.settings = settings(
    max_examples=15, stateful_step_count=30, deadline=None
)
TestAppendColumnsOfSharedKeysReadsAsAppend = shrinking_time(OverlappingColumnsMatchSamples.TestCase)


# Examples -------------------------------------------------------------------------------------


def two_caches() -> tuple[list[float], MetricCache, MetricCache]:
    """Two caches with the default retention on one settable clock."""
    now = [T0]
    return (
        now,
        MetricCache(RetentionPolicy(), clock=lambda: now[0]),
        MetricCache(RetentionPolicy(), clock=lambda: now[0]),
    )


def container_keys(n: int) -> tuple[SeriesKey, ...]:
    """``n`` keys: four metrics of ``n // 4`` containers spread over pods of 5 containers."""
    keys = []
    for i in range(n // 4):
        entity = container_entity(f"pod-{i // 5}", f"c{i % 5}")
        keys += [SeriesKey(m, entity) for m in CONTAINER_METRICS]
    return tuple(keys)


def test_a_200_key_column_over_300_ticks_reads_back_every_sample() -> None:
    now, a, b = two_caches()
    plan = container_keys(200)
    rng = random.Random(7)
    expected: dict[SeriesKey, list[tuple[float, float]]] = {k: [] for k in plan}
    for tick in range(300):
        ts = T0 + tick
        now[0] = ts
        values = column_values(rng, plan, tick)
        a.append(ts, as_samples([(plan, values)]))
        b.append_columns(ts, [(plan, values)])
        for k, v in zip(plan, values, strict=True):
            expected[k].append((ts, v))

    start = T0 - 1.0
    for key in plan:
        assert bits(b.points(*key, start, now[0])) == bits(expected[key]), key
        assert bits(b.aggregate(*key, start, now[0])) == bits(a.aggregate(*key, start, now[0]))
        assert bits(b.last_sample(*key)) == bits(expected[key][-1])
    assert b.stats()["series"] == 200
    assert_same_reads(a, b, plan, now[0], now[0])


def test_churn_keeps_the_removed_keys_history_and_continues_the_kept_keys() -> None:
    now, a, b = two_caches()
    old = container_keys(60)
    removed = old[17]
    rng = random.Random(3)
    history: dict[SeriesKey, list[tuple[float, float]]] = {k: [] for k in old}

    def run(plan: tuple[SeriesKey, ...], ticks: range) -> None:
        for tick in ticks:
            ts = T0 + tick
            now[0] = ts
            values = [rng.random() for _ in plan]
            a.append(ts, as_samples([(plan, values)]))
            b.append_columns(ts, [(plan, values)])
            for k, v in zip(plan, values, strict=True):
                history[k].append((ts, v))

    run(old, range(100))
    new = old[:17] + old[18:]  # a new tuple object: a new plan
    run(new, range(100, 150))

    window = (T0 - 1.0, now[0])
    assert b.points(*removed, *window) == history[removed]
    assert len(history[removed]) == 100
    assert b.last_sample(*removed) == history[removed][-1]
    for key in new:
        points = b.points(*key, *window)
        assert points == history[key]
        assert [t for t, _ in points] == [T0 + i for i in range(150)]
    assert_same_reads(a, b, old, now[0], now[0])


def test_a_nan_in_a_column_drops_and_counts_only_that_sample() -> None:
    now, a, b = two_caches()
    plan = container_keys(40)
    for tick in range(3):
        now[0] = T0 + tick
        values = [float(tick * 100 + i) for i in range(len(plan))]
        if tick == 2:
            values[7] = math.nan
        a.append(now[0], as_samples([(plan, values)]))
        b.append_columns(now[0], [(plan, values)])

    stats = b.stats()
    assert stats["dropped_invalid"] == 1
    assert stats["dropped_out_of_order"] == stats["dropped_duplicate"] == 0
    assert b.last_sample(*plan[7]) == (T0 + 1, 107.0)
    assert b.points(*plan[7], T0, T0 + 2) == [(T0, 7.0), (T0 + 1, 107.0)]
    for i, key in enumerate(plan):
        if i != 7:
            assert b.last_sample(*key) == (T0 + 2, float(200 + i))
    assert_same_reads(a, b, plan, now[0], now[0])


def test_a_key_twice_in_one_column_keeps_its_first_value_and_counts_a_duplicate() -> None:
    now, a, b = two_caches()
    plan = container_keys(40)
    twice = (*plan[:20], plan[3], *plan[20:])
    for tick in range(3):
        now[0] = T0 + tick
        cols: list[Column] = [(twice, [float(tick * 100 + i) for i in range(len(twice))])]
        a.append(now[0], as_samples(cols))
        b.append_columns(now[0], cols)

    assert b.stats()["dropped_duplicate"] == a.stats()["dropped_duplicate"] == 3
    assert b.last_sample(*plan[3]) == (T0 + 2, 203.0)
    assert_same_reads(a, b, plan, now[0], now[0])


def test_a_key_in_two_columns_of_one_call_keeps_the_first_columns_value() -> None:
    """The short column goes sample by sample, the long one as a group: the order of the call
    still decides which sample is the duplicate."""
    now, a, b = two_caches()
    long = container_keys(16)
    short = (long[0],)
    for tick in range(3):
        now[0] = T0 + tick
        cols: list[Column] = [(short, [float(tick)]), (long, [-1.0] * len(long))]
        a.append(now[0], as_samples(cols))
        b.append_columns(now[0], cols)

    assert a.last_sample(*long[0]) == (T0 + 2, 2.0)
    assert b.last_sample(*long[0]) == (T0 + 2, 2.0)
    assert b.stats()["dropped_duplicate"] == 3
    assert_same_reads(a, b, long, now[0], now[0])


def test_a_grouped_key_twice_in_one_append_counts_the_non_finite_second_as_a_duplicate() -> None:
    """``append`` checks the order before the value: once a key's sample is in, a second one at
    the same timestamp is a duplicate even when it is NaN, grouped or not."""
    now, a, b = two_caches()
    plan = container_keys(16)
    a.append(T0, as_samples([(plan, [1.0] * 16)]))
    b.append_columns(T0, [(plan, [1.0] * 16)])
    now[0] = T0 + 1.0
    for cache in (a, b):
        cache.append(T0 + 1.0, [Sample(plan[0], 2.0), Sample(plan[0], math.nan)])

    assert a.stats()["dropped_duplicate"] == 1
    assert a.stats()["dropped_invalid"] == 0
    assert_same_reads(a, b, plan, now[0], T0 + 1.0)


def test_a_gc_due_during_a_call_runs_after_all_its_columns() -> None:
    """``append`` runs a due gc once its samples are in: a series expired before the call but
    receiving a duplicate in it is removed at the end, not recreated by a later column."""
    now = [T0]
    retention = RetentionPolicy(container=10.0, gc_interval=15.0)
    a = MetricCache(retention, clock=lambda: now[0])
    b = MetricCache(retention, clock=lambda: now[0])
    first, second = container_keys(64)[:16], container_keys(64)[16:32]
    for values in ([1.0] * 16, [2.0] * 16):
        cols: list[Column] = [(first, values), (second, values)]
        a.append(T0, as_samples(cols))
        b.append_columns(T0, cols)  # the second time: T0 again, 20 s later, gc due
        now[0] = T0 + 20.0

    assert a.stats()["series"] == 0
    assert a.stats()["dropped_duplicate"] == 32
    assert_same_reads(a, b, first + second, now[0], T0)


def test_a_new_tuple_where_a_dead_one_lived_is_a_new_plan() -> None:
    """A plan is keyed by the tuple's identity; a tuple built after the old one died may get its
    address, and must not be taken for it."""
    now, a, b = two_caches()
    keys = container_keys(80)
    first, second = list(keys[:40]), list(keys[40:])
    plan = tuple(first)
    for tick in range(5):
        now[0] = T0 + tick
        a.append(now[0], as_samples([(plan, [1.0] * 40)]))
        b.append_columns(now[0], [(plan, [1.0] * 40)])
    del plan
    gc.collect()
    plan = tuple(second)  # same length: CPython may reuse the dead tuple's memory
    for tick in range(5, 10):
        now[0] = T0 + tick
        a.append(now[0], as_samples([(plan, [2.0] * 40)]))
        b.append_columns(now[0], [(plan, [2.0] * 40)])

    assert all(b.last_sample(*k) == (T0 + 4, 1.0) for k in first)
    assert all(b.points(*k, T0, now[0]) == [(T0 + t, 2.0) for t in range(5, 10)] for k in second)
    assert_same_reads(a, b, first + second, now[0], now[0])
