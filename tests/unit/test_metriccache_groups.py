"""How the metric cache lays out columns (``MetricCache.append_columns``): groups of a pod's
series, re-formed on churn without cutting the series into short chunks, with their first seals
spread over the phases. What every read answers is checked against per-sample appends in
``test_metriccache_columns.py``; here, the layout that keeps memory and the seal work bounded."""

from __future__ import annotations

import random
from collections import Counter
from typing import cast

from koordlet.metriccache.chunks import CHUNK, PHASES, Stamps
from koordlet.metriccache.series import (
    CONTAINER_CPU_USAGE,
    POD_CPU_USAGE,
    Sample,
    SeriesKey,
    container_entity,
    pod_entity,
)
from koordlet.metriccache.store import MetricCache

T0 = 1_700_000_000.0


def plan_of(pods: list[int]) -> tuple[SeriesKey, ...]:
    """One column as the pod collectors build it: each pod and its three containers."""
    keys: list[SeriesKey] = []
    for p in pods:
        uid = f"uid-{p}"
        keys.append(SeriesKey(POD_CPU_USAGE, pod_entity(uid)))
        keys += [SeriesKey(CONTAINER_CPU_USAGE, container_entity(uid, f"c{c}")) for c in range(3)]
    return tuple(keys)


def chunk_lengths(cache: MetricCache, key: SeriesKey) -> list[int]:
    s = cache._series[key]
    return [len(cast(Stamps, st).ts) for st in s.chunks[::2]]


def test_churn_leaves_no_chunk_shorter_than_half_a_chunk() -> None:
    """A pod replaced every 5 ticks for 400 ticks: the groups of the pods concerned dissolve and
    re-form each time, and yet every chunk of a series, past its first (which the phases
    shorten at the start), holds at least half a chunk."""
    now = [T0]
    cache = MetricCache(clock=lambda: now[0])
    rng = random.Random(7)
    pods = list(range(50))
    plan = plan_of(pods)
    survivors = set(range(50))
    for tick in range(400):
        now[0] = T0 + tick
        if tick and tick % 5 == 0:
            gone = pods.pop(rng.randrange(len(pods)))
            survivors.discard(gone)
            cache.drop_entity(f"pod/uid-{gone}")
            cache.drop_prefix(f"container/uid-{gone}/")
            pods.append(1000 + tick)
            plan = plan_of(pods)
        cache.append_columns(now[0], [(plan, [rng.random() for _ in plan])])

    kept = list(plan_of(sorted(survivors)))
    assert len(kept) >= 12  # a few pods lived through all 79 replacements
    shortest = min(min(chunk_lengths(cache, k)[1:], default=CHUNK) for k in plan)
    assert shortest >= CHUNK // 2
    # and nothing was lost: every surviving series holds all 400 ticks (300 s retention for
    # containers, 600 for pods: the cache's defaults)
    for key in kept:
        points = cache.points(key.metric, key.entity, T0, now[0])
        want = 400 if key.metric == POD_CPU_USAGE else 301
        assert len(points) == want, key


def test_a_start_spreads_the_first_seals_over_the_phases() -> None:
    """Fresh series (a koordlet starting with 200 pods): the groups' first seals fall in
    different ticks, so no tick seals every series at once."""
    now = [T0]
    cache = MetricCache(clock=lambda: now[0])
    plan = plan_of(list(range(200)))
    for tick in range(CHUNK + 1):
        now[0] = T0 + tick
        cache.append_columns(now[0], [(plan, [float(tick)] * len(plan))])
    first = Counter(chunk_lengths(cache, key)[0] for key in plan if chunk_lengths(cache, key))
    sealed = sum(first.values())
    assert len(first) >= PHASES // 2  # several first-chunk lengths: several seal ticks
    assert max(first.values()) <= sealed // 2  # no one tick sealed most of them


def test_a_pod_added_re_forms_only_the_groups_of_its_pod() -> None:
    """A new keys tuple with one pod more keeps every other group: the series of pods that did
    not change stay where they were, their rows not copied out (the group objects are kept)."""
    now = [T0]
    cache = MetricCache(clock=lambda: now[0])
    pods = list(range(200))
    plan = plan_of(pods)
    for tick in range(3):
        now[0] = T0 + tick
        cache.append_columns(now[0], [(plan, [1.0] * len(plan))])
    before = {key: cache._series[key].group for key in plan}
    assert all(g is not None for g in before.values())

    now[0] = T0 + 3
    bigger = plan_of([*pods, 999])
    cache.append_columns(now[0], [(bigger, [2.0] * len(bigger))])
    moved = {key for key in plan if cache._series[key].group is not before[key]}
    groups = {id(g) for g in before.values()}
    assert len(moved) <= len(plan) // len(groups) * 2  # about one group's series
    assert cache.last(CONTAINER_CPU_USAGE, container_entity("uid-999", "c0")) == 2.0
    for key in plan:
        assert cache.points(key.metric, key.entity, T0, now[0])[-2:] == [
            (T0 + 2, 1.0),
            (T0 + 3, 2.0),
        ]


def test_samples_on_their_own_for_every_member_keep_the_group() -> None:
    """The collectors' file-by-file path (a tick where one cgroup seeds) appends samples one by
    one: when they cover a whole group, it goes in as a row and the group is kept."""
    now = [T0]
    cache = MetricCache(clock=lambda: now[0])
    plan = plan_of(list(range(40)))
    for tick in range(2):
        now[0] = T0 + tick
        cache.append_columns(now[0], [(plan, [1.0] * len(plan))])
    groups = {key: cache._series[key].group for key in plan}
    now[0] = T0 + 2
    cache.append(now[0], [Sample(key, 3.0) for key in plan])
    assert all(cache._series[key].group is groups[key] for key in plan)
    assert cache.last_values(list(plan), T0 + 2) == [3.0] * len(plan)
