"""The embedded metric cache: bounded in-process time series, kept per entity kind.

Koordinator's koordlet keeps its metrics in an embedded TSDB (``pkg/koordlet/metriccache``) with
``--MetricExpireSeconds`` (1800 s) and a garbage collection every ``--MetricGCIntervalSeconds``
(300 s); readers query a window ``[start, end]`` and aggregate it. This module keeps the same
contract in a few MiB of ``array.array`` buffers; what the layout costs is measured in
docs/benchmarks.md ("Metric cache").

Layout, per series: sealed chunks and an open tail, oldest first.

* The tail: timestamps as ``array('I')``, unsigned 32-bit milliseconds from the tail's base
  (millisecond resolution is what Koordinator's TSDB stores), values as ``array('d')``.
* Once the tail holds 64 samples, or before it would span more than a quarter of the retention,
  it is sealed into a chunk. A chunk's timestamps are interned: the series that one collector
  tick appends seal in the same tick with the same timestamps, and share one array. Its values
  are kept in the smallest exact form: one float when all are the same bit for bit (an idle
  container's throttling ratio), the float64 bytes deflated when a quarter of them are zero and
  deflate saves a quarter (memory in bytes: about 2 bytes a sample instead of 8), else
  ``array('d')`` (CPU usage: noisy floats). Reads get every value back bit for bit.

Columns (:meth:`MetricCache.append_columns`): the pod collectors hand over one column of values
a tick for hundreds of series, with the same keys tuple each tick. Such a column is split into
groups (a pod's series in one group, at most ``MAX_GROUPS`` a column) and a group's members share
one open tail, row after row (:class:`~koordlet.metriccache.chunks.Group`): a tick costs a C-level
gather and two array appends a group, not a dictionary lookup and two appends a sample. The group
seals into one chunk per member, as a series' own tail does. A pod added or removed, a sample
appended to a member on its own, a member dropped: the groups concerned dissolve, their rows go
back on the members' own tails, and the next column re-forms them; a member's own tail leads its
first chunk in the new group, so churn does not cut series into short chunks. Every read answers
what the same samples appended one by one would give (``tests/unit/test_metriccache_columns.py``
drives both side by side).

Samples older than the retention of the series' entity kind (:class:`RetentionPolicy`) are hidden
from every read at once (reads bound the window by ``clock() - retention``) and deleted a chunk
at a time, when the chunk's newest sample expires: a series holds at most one chunk (64 samples,
or a quarter of its retention) of expired samples; a grouped one is trimmed when its group seals,
so up to a chunk more.
:meth:`MetricCache.gc` (run by ``append`` every ``gc_interval`` seconds) trims series that no
longer receive samples and removes the empty ones.

All timestamps, of samples and of query bounds, are rounded to the millisecond; window edges are
inclusive. A sample not newer than the series' last one is dropped and counted (out of order when
older, duplicate when at the same millisecond), as a TSDB rejects it; non-finite values and
unknown entity kinds are dropped and counted as invalid.

Thread safety: none, by design. The cache belongs to the event loop: ``append``, ``gc`` and the
``drop_*`` methods run there. A worker thread may read only while the loop is not mutating it
(the collector runner reads through ``Tick.last`` while the loop awaits the collectors).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from array import array
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields
from itertools import repeat
from operator import add, itemgetter
from typing import Any, cast
from weakref import WeakValueDictionary

from apis.records import frozen
from koordlet.errors import ConfigError
from koordlet.metriccache.aggregate import Aggregate, coverage, summarize
from koordlet.metriccache.chunks import (
    CHUNK,
    PHASES,
    SPAN_DIVISOR,
    TS_TYPECODE,
    Group,
    Payload,
    Series,
    Stamps,
    pack_values,
    span_of,
    to_ms,
    unpack_values,
)
from koordlet.metriccache.series import Column, Sample, SeriesKey

logger = logging.getLogger(__name__)

_MAX_RETENTION_S = 30 * 24 * 3600.0
"""Retention must stay well below the 49.7 days a 32-bit millisecond offset spans: a tail spans
at most a quarter of it."""
_KINDS = ("node", "system", "numa", "be", "hostapp", "pod", "container")

MIN_GROUP = 16
"""A column of fewer keys is stored sample by sample; a longer one is split into groups of about
``MIN_GROUP`` series or more, at most ``MAX_GROUPS``."""
MAX_GROUPS = 32
"""Groups a column is split into at most: their first seals are spread over ``PHASES`` ticks,
and a pod added or removed re-forms the groups of its own series only (the series of one pod
share a group: :func:`_owner`), about one in ``MAX_GROUPS`` of each column."""
_PLAN_IDLE_MS = 60_000
"""A column's plan not used for this long is forgotten (its keys tuple was replaced)."""


class _ColumnPlan:
    """How one column's keys map onto groups: each group with the getter that picks its row
    out of the column's values, and the indices stored sample by sample (``rest``)."""

    __slots__ = ("keys", "parts", "rest", "used_ms")

    def __init__(
        self,
        keys: tuple[SeriesKey, ...],
        parts: list[tuple[Group, Callable[[Sequence[float]], Sequence[float]]]],
        rest: list[int],
        used_ms: int,
    ) -> None:
        self.keys = keys
        """Held so that ``id(keys)``, the plan's key, is not reused while the plan lives."""
        self.parts = parts
        self.rest = rest
        self.used_ms = used_ms

    def valid(self) -> bool:
        return all(g.alive for g, _ in self.parts)


def _owner(entity: str) -> str:
    """What an entity belongs to, for grouping: the pod uid of ``pod/<uid>`` and of
    ``container/<uid>/<id>``, the name of ``hostapp/<name>``, else the entity itself."""
    parts = entity.split("/", 2)
    return parts[1] if len(parts) > 1 else entity


def _picker(indices: Sequence[int]) -> Callable[[Sequence[float]], Sequence[float]]:
    """A C-level gather of ``values[i] for i in indices``, always a sequence."""
    if len(indices) == 1:
        only = indices[0]
        return lambda values: (values[only],)
    return itemgetter(*indices)


@frozen
class RetentionPolicy:
    """How long samples are kept, per entity kind (the entity id's prefix before ``/``)."""

    node: float = 1800.0
    """Seconds for ``node``: NodeMetric's longest aggregation window is 30 min (Koordinator's
    ``--MetricExpireSeconds`` default)."""
    system: float = 1800.0
    """Seconds for ``system`` (reported in NodeMetric like the node)."""
    numa: float = 1800.0
    """Seconds for ``numa/<id>``."""
    be: float = 1800.0
    """Seconds for ``be`` (the BE suppression and CPU-evict strategies' windows)."""
    hostapp: float = 1800.0
    """Seconds for ``hostapp/<name>`` (reported in NodeMetric)."""
    pod: float = 600.0
    """Seconds for ``pod/<uid>``."""
    container: float = 300.0
    """Seconds for ``container/<uid>/<id>``."""
    gc_interval: float = 300.0
    """Seconds between sweeps that trim idle series and remove empty ones (Koordinator's
    ``--MetricGCIntervalSeconds``)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not 0.0 < value <= _MAX_RETENTION_S:
                raise ConfigError(
                    f"must be in (0, {_MAX_RETENTION_S:.0f}] seconds, got {value!r}",
                    source="metric cache retention",
                    field=f.name,
                )

    def seconds_for(self, entity: str) -> float | None:
        """Retention of the entity's kind; None for an entity id of no known kind."""
        kind = entity.partition("/")[0]
        if kind not in _KINDS:
            return None
        seconds: float = getattr(self, kind)
        return seconds


class MetricCache:
    """Bounded time series keyed by ``SeriesKey(metric, entity)``, plus latest info values.

    Single-threaded (see the module docstring). ``clock`` returns ``time.time()``-like seconds; it
    decides retention and ``max_age``, and is injected in tests.
    """

    def __init__(
        self,
        retention: RetentionPolicy = RetentionPolicy(),
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._retention = retention
        self._clock = clock
        self._series: dict[SeriesKey, Series] = {}
        self._by_entity: dict[str, dict[str, Series]] = {}
        self._per_metric: dict[str, int] = {}
        """Metric name → how many series of it are stored (names with none are absent)."""
        self._entities: list[str] = []
        """Entity ids, sorted, so that a prefix is one contiguous run."""
        self._info: dict[str, object] = {}
        self._dropped_out_of_order = 0
        self._dropped_duplicate = 0
        self._dropped_invalid = 0
        self._unknown_kinds: set[str] = set()
        self._stamps: WeakValueDictionary[tuple[int, bytes], Stamps] = WeakValueDictionary()
        """Interned chunk timestamps: the chunks of series appended in the same ticks share one."""
        self._keep_ms: dict[float, tuple[int, int]] = {}
        """Retention seconds → (retention, tail span) in ms, one int object each for all series."""
        self._created = 0
        self._ints: dict[int, int] = {}
        """Millisecond values set on series during one ``append`` or ``gc`` call, one int object
        for each value: the series sealed, created or trimmed together share their ``base_ms``
        and ``next_trim`` instead of holding a 32-byte int each (0.2 MiB at 200 pods)."""
        self._groups: dict[tuple[SeriesKey, ...], Group] = {}
        """Live groups by their members' keys, so that a column whose keys tuple was rebuilt
        (a pod added) keeps the groups whose members did not change."""
        self._plans: dict[int, _ColumnPlan] = {}
        """Column plans by ``id`` of the caller's keys tuple."""
        self._groups_created = 0
        self._gc_interval_ms = to_ms(retention.gc_interval)
        self._last_gc_ms = self._now_ms()

    def _now_ms(self) -> int:
        return to_ms(self._clock())

    # Writing ---------------------------------------------------------------------------------
    def append(self, ts: float, samples: Iterable[Sample]) -> None:
        """Store one collector tick: every sample at timestamp ``ts`` (seconds).

        O(1) amortized per sample. Drops (and counts) samples not newer than their series' last
        one, non-finite values and entities of no known kind.
        """
        now_ms = self._now_ms()
        self._ints.clear()
        self._store(ts, samples, now_ms)
        if now_ms - self._last_gc_ms >= self._gc_interval_ms:
            self.gc()

    def _store(self, ts: float, samples: Iterable[Sample], now_ms: int) -> None:
        """``append`` without its gc: also the loose samples of ``append_columns``, whose gc
        runs once all its columns are in."""
        tms = to_ms(ts)
        series = self._series
        isfinite = math.isfinite
        before = self._dropped_out_of_order + self._dropped_duplicate + self._dropped_invalid
        rows: dict[Group, list[float | None]] = {}
        append_own = self._append_own
        for key, value in samples:
            s = series.get(key)
            if s is None:
                s = self._create(key, tms)
                if s is None:
                    continue
            if s.group is not None:
                self._pend(rows, s, tms, value)
                continue
            if tms <= s.last_ms:
                if tms < s.last_ms:
                    self._dropped_out_of_order += 1
                else:
                    self._dropped_duplicate += 1
                continue
            if not isfinite(value):
                self._dropped_invalid += 1
                continue
            append_own(s, tms, value, now_ms)  # a call a sample: the pod series come as columns
        if rows:
            self._flush(rows, tms, now_ms)
        dropped = self._dropped_out_of_order + self._dropped_duplicate + self._dropped_invalid
        if dropped != before:
            logger.debug(
                "metric cache: dropped %d of the samples at %.3f (totals: %d out of order, "
                "%d duplicate, %d invalid)",
                dropped - before,
                ts,
                self._dropped_out_of_order,
                self._dropped_duplicate,
                self._dropped_invalid,
            )

    def append_columns(self, ts: float, columns: Iterable[Column]) -> None:
        """Store columns of one tick at timestamp ``ts`` (seconds): for every read, the same as
        ``append(ts, samples)`` of each key with its value, in order.

        A long column is stored as groups of series that share one tail (:class:`Group`): the
        column's plan (its keys split into groups, the series resolved or created) is made once
        per ``keys`` tuple object; each tick then costs a C-level gather and one row append per
        group instead of a dictionary lookup and two array appends per sample. A row that
        cannot go in whole (a non-finite value, a sample not newer than its series' last one)
        goes sample by sample, which drops and counts what ``append`` drops.
        """
        tms = to_ms(ts)
        now_ms = self._now_ms()
        self._ints.clear()
        isfinite = math.isfinite
        for keys, values in columns:
            if len(values) != len(keys):
                raise ValueError(
                    f"metric cache: a column of {len(keys)} keys came with {len(values)} values"
                )
            plan = self._plans.get(id(keys))
            if plan is None or not plan.valid():
                plan = self._plan(keys, tms, now_ms)
            plan.used_ms = now_ms
            loose: list[Sample] = []
            for g, pick in plan.parts:
                row = pick(values)
                if tms > g.last_ms and isfinite(sum(row)):
                    self._append_row(g, tms, row, now_ms)
                else:
                    loose.extend(map(Sample, g.keys, row))
            loose.extend(Sample(keys[i], values[i]) for i in plan.rest)
            if loose:  # before the next column: a key in two columns keeps the first value
                self._store(ts, loose, now_ms)  # drops and counts as append does
        if now_ms - self._last_gc_ms >= self._gc_interval_ms:
            self.gc()

    def _plan(self, keys: tuple[SeriesKey, ...], tms: int, now_ms: int) -> _ColumnPlan:
        """Split a column's keys into groups (by a hash of their pod, :func:`_owner`, so that a
        pod added or removed changes the groups of its own series only), reusing live groups
        whose members are the same; create the series it does not have yet."""
        self._forget_plans(now_ms)
        n = len(keys)
        parts: list[tuple[Group, Callable[[Sequence[float]], Sequence[float]]]] = []
        rest: list[int] = []
        if n < MIN_GROUP or len(set(keys)) != n:
            rest = list(range(n))
        else:
            nbuckets = min(MAX_GROUPS, n // MIN_GROUP)
            buckets: list[list[int]] = [[] for _ in range(nbuckets)]
            for i, key in enumerate(keys):
                buckets[hash(_owner(key[1])) % nbuckets].append(i)
            for indices in buckets:
                members: list[Series] = []
                taken: list[int] = []
                for i in indices:
                    key = keys[i]
                    s = self._series.get(key)
                    if s is None:
                        if self._retention.seconds_for(key[1]) is None:
                            rest.append(i)  # counted as invalid each tick, as append does
                            continue
                        s = self._create(key, tms)
                    assert s is not None  # a known kind: created
                    members.append(s)
                    taken.append(i)
                if len(members) < 2:
                    rest.extend(taken)
                    continue
                member_keys = tuple(s.key for s in members)
                g = self._groups.get(member_keys)
                if g is None:
                    g = self._form(member_keys, members, tms, now_ms)
                parts.append((g, _picker(taken)))
            rest.sort()
        plan = self._plans[id(keys)] = _ColumnPlan(keys, parts, rest, now_ms)
        return plan

    def _forget_plans(self, now_ms: int) -> None:
        """Drop the plans of keys tuples not handed over for a while, or with a group gone."""
        for pid, plan in list(self._plans.items()):
            if plan.used_ms < now_ms - _PLAN_IDLE_MS or not plan.valid():
                del self._plans[pid]

    def _form(
        self, keys: tuple[SeriesKey, ...], members: list[Series], tms: int, now_ms: int
    ) -> Group:
        """A new group of ``members``, its rows from ``tms`` on. A member leaves the group it
        was in (which dissolves: its rows go back on the members' own tails). A member's own
        tail stays in place, and the group's first seal makes one chunk of it and of the
        member's rows, so that a pod added or removed does not cut every series it touches
        into short chunks; an own tail of half a chunk or more is sealed now instead."""
        for s in members:
            if s.group is not None:
                self._dissolve(s.group)
        base_ms = self._share(tms - 1)
        self._groups_created += 1
        had_own, longest = False, 0
        for s in members:
            if not s.ts:
                continue
            had_own = True
            if len(s.ts) >= CHUNK // 2 or base_ms - s.base_ms > s.span_ms // 2:
                self._seal(s, tms)
            else:
                longest = max(longest, len(s.ts))
        # New series only (a start): the first seals spread over PHASES ticks. Otherwise the
        # members' own tails already are (a merged chunk holds at most CHUNK samples, and at
        # least half as many for a member without an own tail).
        limit = (
            CHUNK - longest
            if had_own
            else CHUNK - self._groups_created % PHASES * (CHUNK // PHASES)
        )
        g = Group(keys, members, base_ms, limit, min(s.span_ms for s in members))
        for slot, s in enumerate(members):
            s.group = g
            s.slot = slot
        self._groups[keys] = g
        return g

    def _append_row(self, g: Group, tms: int, row: Sequence[float], now_ms: int) -> None:
        off = tms - g.base_ms
        if off > g.span_ms or len(g.ts) >= g.limit:
            self._seal_group(g, tms, now_ms)
            off = 1
        g.ts.append(off)
        g.vals.extend(row)
        g.last_ms = tms
        g.appended = True

    def _seal_group(self, g: Group, tms: int, now_ms: int) -> None:
        """Seal the group's rows into a chunk per member (timestamps shared and interned, each
        member's column in its smallest exact form; a member's own tail from before the group
        formed leads its chunk), trim the members, and start an empty tail based just before
        ``tms``: from then on, rows up to a full chunk and the members' shortest span."""
        ts = g.ts
        if ts:
            stamps = self._intern(g.base_ms, ts)
            vals, n = g.vals, g.n
            for slot, s in enumerate(g.members):
                if s.ts:
                    self._merge_own(s, g, vals[slot::n])
                else:
                    s.chunks += (stamps, pack_values(vals[slot::n]))
                if now_ms >= s.next_trim:
                    s.trim(now_ms)
                    s.next_trim = self._share(s.next_trim)
            del ts[:]
            del vals[:]
        g.limit = CHUNK
        g.span_ms = min(s.span_ms for s in g.members)
        g.base_ms = self._share(tms - 1)

    def _intern(self, base_ms: int, ts: array[int]) -> Stamps:
        """The chunk timestamps ``base_ms + ts``, one object for every chunk that has them."""
        key = (base_ms, ts.tobytes())
        stamps = self._stamps.get(key)
        if stamps is None:
            stamps = self._stamps[key] = Stamps(base_ms, array(TS_TYPECODE, ts))
        return stamps

    def _merge_own(self, s: Series, g: Group, column: array[float]) -> None:
        """Put the group's rows (``column``, the member's values) after the member's own tail,
        rebased on the own tail's base: on dissolving the group (the own tail goes on), or
        sealed with it into one chunk when the group seals."""
        delta = g.base_ms - s.base_ms
        s.ts.extend(map(add, g.ts, repeat(delta)))
        s.vals.extend(column)
        if g.alive:
            s.chunks += (self._intern(s.base_ms, s.ts), pack_values(s.vals))
            del s.ts[:]
            del s.vals[:]

    def _dissolve(self, g: Group) -> None:
        """End a group: each member's rows go back on its own tail (after what was there), so
        that the member goes on sample by sample, or joins another group, without a chunk
        sealed early."""
        if not g.alive:
            return
        g.alive = False
        del self._groups[g.keys]
        ts, vals, n = g.ts, g.vals, g.n
        for slot, s in enumerate(g.members):
            s.group = None
            if ts:
                if not s.ts:
                    s.base_ms = g.base_ms
                self._merge_own(s, g, vals[slot::n])
            if g.appended:
                s.last_ms = g.last_ms
            if not s.ts:
                s.base_ms = self._share(s.last_ms)
            s.limit = CHUNK

    def _pend(
        self, rows: dict[Group, list[float | None]], s: Series, tms: int, value: float
    ) -> None:
        """A sample of a grouped series, held until the end of ``append``: a group that gets a
        value for every member goes in as a row (:meth:`_flush`)."""
        g = cast(Group, s.group)
        last = g.last_ms if g.appended else s.last_ms
        if tms <= last:
            if tms < last:
                self._dropped_out_of_order += 1
            else:
                self._dropped_duplicate += 1
            return
        row = rows.get(g)
        if row is not None and row[s.slot] is not None:
            self._dropped_duplicate += 1  # the series' sample of this timestamp is in
            return
        if not math.isfinite(value):
            self._dropped_invalid += 1
            return
        if row is None:
            row = rows[g] = [None] * g.n
        row[s.slot] = value

    def _flush(self, rows: dict[Group, list[float | None]], tms: int, now_ms: int) -> None:
        """Rows gathered by :meth:`_pend`: whole ones appended; a partial one dissolves its
        group and its values go on the members' own tails."""
        for g, row in rows.items():
            if g.alive and None not in row:
                self._append_row(g, tms, cast(list[float], row), now_ms)
                continue
            self._dissolve(g)
            for s, value in zip(g.members, row, strict=True):
                if value is not None:
                    self._append_own(s, tms, value, now_ms)

    def _append_own(self, s: Series, tms: int, value: float, now_ms: int) -> None:
        """One checked sample onto the series' own tail."""
        off = tms - s.base_ms
        if off > s.span_ms or len(s.ts) >= s.limit:
            self._seal(s, tms)
            off = 1
        s.ts.append(off)
        s.vals.append(value)
        s.last_ms = tms
        if now_ms >= s.next_trim:
            s.trim(now_ms)
            s.next_trim = self._share(s.next_trim)

    def _create(self, key: SeriesKey, tms: int) -> Series | None:
        metric, entity = key
        keep = self._retention.seconds_for(entity)
        if keep is None:
            self._dropped_invalid += 1
            kind = entity.partition("/")[0]
            if kind not in self._unknown_kinds:
                self._unknown_kinds.add(kind)
                logger.warning(
                    "metric cache: unknown entity kind %r; its samples are dropped", kind
                )
            return None
        # One string object per distinct entity and metric, however many copies callers make;
        # the caller's key itself when it holds those (the collectors' plans keep theirs).
        imetric, ientity = sys.intern(metric), sys.intern(entity)
        if not (type(key) is SeriesKey and metric is imetric and entity is ientity):
            key = SeriesKey(imetric, ientity)
        keep_ms = self._keep_ms.get(keep)
        if keep_ms is None:
            keep_ms = self._keep_ms[keep] = (to_ms(keep), to_ms(keep) // SPAN_DIVISOR)
        self._created += 1
        phase = (self._created % PHASES) * (CHUNK // PHASES)
        s = Series(key, keep_ms[0], keep_ms[1], tms, CHUNK - phase)
        s.base_ms = s.last_ms = self._share(s.base_ms)
        s.next_trim = self._share(s.next_trim)
        self._series[key] = s
        self._per_metric[key.metric] = self._per_metric.get(key.metric, 0) + 1
        metrics = self._by_entity.get(key.entity)
        if metrics is None:
            metrics = self._by_entity[key.entity] = {}
            insort(self._entities, key.entity)
        metrics[key.metric] = s
        return s

    def _seal(self, s: Series, tms: int) -> None:
        """Seal the tail into a chunk (values in their smallest exact form, timestamps interned)
        and start an empty tail based just before ``tms``."""
        ts = s.ts
        if ts:
            key = (s.base_ms, ts.tobytes())
            stamps = self._stamps.get(key)
            if stamps is None:
                stamps = self._stamps[key] = Stamps(s.base_ms, array(TS_TYPECODE, ts))
            s.chunks += (stamps, pack_values(s.vals))
            del ts[:]
            del s.vals[:]
            s.limit = CHUNK
        s.base_ms = self._share(tms - 1)

    def _share(self, value: int) -> int:
        """``value``, as the int object already set on another series in this call if any."""
        return self._ints.setdefault(value, value)

    def gc(self) -> int:
        """Trim every series to its retention and remove the empty ones; returns how many."""
        now_ms = self._now_ms()
        self._last_gc_ms = now_ms
        self._ints.clear()
        removed = 0
        self._forget_plans(now_ms)
        for s in list(self._series.values()):
            g = s.group
            last = g.last_ms if g is not None and g.appended else s.last_ms
            if last < now_ms - s.keep_ms or (g is None and not s.ts and not s.chunks):
                if g is not None:
                    self._dissolve(g)
                self._remove(s)
                removed += 1
            elif now_ms >= s.next_trim:
                s.trim(now_ms)
                s.next_trim = self._share(s.next_trim)
        if removed:
            logger.debug("metric cache gc: removed %d expired series", removed)
        return removed

    def _forget(self, key: SeriesKey) -> None:
        del self._series[key]
        left = self._per_metric[key.metric] - 1
        if left:
            self._per_metric[key.metric] = left
        else:
            del self._per_metric[key.metric]

    def _remove(self, s: Series) -> None:
        metric, entity = s.key
        self._forget(s.key)
        metrics = self._by_entity[entity]
        del metrics[metric]
        if not metrics:
            del self._by_entity[entity]
            del self._entities[bisect_left(self._entities, entity)]

    def _leave_group(self, s: Series) -> None:
        if s.group is not None:
            self._dissolve(s.group)

    def drop_entity(self, entity: str) -> int:
        """Remove every series of one entity; returns how many."""
        metrics = self._by_entity.pop(entity, None)
        if metrics is None:
            return 0
        for s in metrics.values():
            self._leave_group(s)
            self._forget(s.key)
        del self._entities[bisect_left(self._entities, entity)]
        return len(metrics)

    def drop_prefix(self, prefix: str) -> int:
        """Remove every series whose entity id starts with ``prefix`` (e.g. ``container/<uid>/``).

        Costs a binary search plus the removed series. Raises ``ValueError`` for an empty prefix.
        """
        if not prefix:
            raise ValueError("drop_prefix needs a non-empty prefix")
        entities = self._entities
        lo = bisect_left(entities, prefix)
        hi = lo
        removed = 0
        while hi < len(entities) and entities[hi].startswith(prefix):
            for s in self._by_entity.pop(entities[hi]).values():
                self._leave_group(s)
                self._forget(s.key)
                removed += 1
            hi += 1
        del entities[lo:hi]
        return removed

    def set_info(self, name: str, value: object) -> None:
        """Store the latest structured value under ``name`` (node info, CPU topology)."""
        self._info[name] = value

    # Reading ---------------------------------------------------------------------------------
    def get_info(self, name: str) -> object | None:
        """The latest value stored by :meth:`set_info`, or None."""
        return self._info.get(name)

    def last_sample(self, metric: str, entity: str) -> tuple[float, float] | None:
        """``(ts, value)`` of the newest unexpired sample of the series, or None."""
        s = self._series.get(SeriesKey(metric, entity))
        newest = None if s is None else s.newest()
        if newest is None:
            return None
        last_ms, value = newest
        if last_ms < self._now_ms() - cast(Series, s).keep_ms:
            return None
        return last_ms / 1000.0, value

    def last_values(self, keys: Sequence[SeriesKey], since: float) -> list[float | None]:
        """The newest value of each series when its timestamp is ``since`` or later and it is
        unexpired, else None; in the order of ``keys``.

        What the exporter reads at each build: one call per family, the clock read once, no
        tuple built per series (``last_sample`` costs several times as much per series).
        """
        now_ms = self._now_ms()
        since_ms = to_ms(since)
        get = self._series.get
        out: list[float | None] = []
        push = out.append
        for key in keys:
            s = get(key)
            if s is None:
                push(None)
                continue
            g = s.group
            if g is not None and g.appended:
                last_ms = g.last_ms
                value = g.vals[s.slot - g.n]
            elif s.ts:
                last_ms = s.base_ms + s.ts[-1]
                value = s.vals[-1]
            else:
                newest = s.newest()
                if newest is None:
                    push(None)
                    continue
                last_ms, value = newest
            push(value if last_ms >= since_ms and last_ms >= now_ms - s.keep_ms else None)
        return out

    def last(self, metric: str, entity: str, *, max_age: float | None = None) -> float | None:
        """Newest value of the series; None when absent, expired, or older than ``max_age`` s."""
        sample = self.last_sample(metric, entity)
        if sample is None:
            return None
        if max_age is not None and self._clock() - sample[0] > max_age:
            return None
        return sample[1]

    def _window(
        self, metric: str, entity: str, start: float, end: float
    ) -> list[tuple[int, array[int], Payload, int, int]]:
        s = self._series.get(SeriesKey(metric, entity))
        if s is None:
            return []
        return s.window(max(to_ms(start), self._now_ms() - s.keep_ms), to_ms(end))

    def aggregate(self, metric: str, entity: str, start: float, end: float) -> Aggregate | None:
        """Aggregates of the unexpired samples with ``start <= ts <= end``; None if none."""
        parts = self._window(metric, entity, start, end)
        if not parts:
            return None
        if len(parts) == 1:
            _, ts, payload, lo, hi = parts[0]
            values = unpack_values(payload, len(ts))[lo:hi]
        else:
            values = array("d")
            for _, ts, payload, lo, hi in parts:
                values += unpack_values(payload, len(ts))[lo:hi]
        first_ms, last_ms = span_of(parts)
        return summarize(values, first_ms / 1000.0, last_ms / 1000.0)

    def coverage(self, metric: str, entity: str, start: float, end: float) -> float:
        """Fraction of ``[start, end]`` spanned by the window's samples (0 with none).

        ``(last_ts - first_ts) / (end - start)`` clamped to [0, 1]: see
        :func:`koordlet.metriccache.aggregate.coverage`. NodeMetric reports a window only when
        this is at least :data:`~koordlet.metriccache.aggregate.MIN_VALID_COVERAGE`.
        """
        parts = self._window(metric, entity, start, end)
        if not parts:
            return 0.0
        first_ms, last_ms = span_of(parts)
        return coverage(first_ms / 1000.0, last_ms / 1000.0, start, end)

    def points(
        self, metric: str, entity: str, start: float, end: float
    ) -> list[tuple[float, float]]:
        """The unexpired ``(ts, value)`` samples with ``start <= ts <= end``, oldest first."""
        out: list[tuple[float, float]] = []
        for base, ts, payload, lo, hi in self._window(metric, entity, start, end):
            values = unpack_values(payload, len(ts))[lo:hi]
            out += [((base + t) / 1000.0, v) for t, v in zip(ts[lo:hi], values, strict=True)]
        return out

    def entities(self, metric: str | None = None) -> list[str]:
        """Sorted ids of the entities with stored series (of ``metric`` when given)."""
        if metric is None:
            return list(self._entities)
        return [e for e in self._entities if metric in self._by_entity[e]]

    def has_series(self, metric: str) -> bool:
        """Whether any series of ``metric`` is stored (expired samples awaiting a trim count)."""
        return metric in self._per_metric

    def series_count(self) -> int:
        """Number of stored series (empty ones linger until the next :meth:`gc`)."""
        return len(self._series)

    def memory_bytes(self) -> int:
        """Bytes held by the stored series: buffers as allocated, chunks, series objects, keys,
        indexes, and the interned chunk timestamps once each.

        ``sys.getsizeof`` of an ``array`` counts its whole allocation, spare capacity included.
        Info values are not counted (the collectors own those objects). O(series + chunks).
        """
        size = sys.getsizeof
        total = size(self._series) + size(self._by_entity) + size(self._entities)
        metric_names: set[str] = set()
        for entity, metrics in self._by_entity.items():
            total += size(entity) + size(metrics)
            for metric, s in metrics.items():
                metric_names.add(metric)
                total += size(s) + size(s.key) + size(s.ts) + size(s.vals)
                total += size(s.chunks) + sum(map(size, s.chunks[1::2]))
        for (base, raw), stamps in self._stamps.items():
            total += size(stamps) + size(stamps.ts) + size(raw) + size(base) + 56  # key tuple
        for g in self._groups.values():
            total += size(g) + size(g.ts) + size(g.vals) + size(g.members) + size(g.keys)
        return total + sum(size(m) for m in metric_names)

    def stats(self) -> dict[str, Any]:
        """Counters for ``/debug`` and ``/metrics``.

        ``samples`` counts the stored samples, including expired ones awaiting their trim (at
        most one chunk per series; reads never see them).
        """
        return {
            "series": len(self._series),
            "entities": len(self._entities),
            "samples": sum(
                s.unsealed() + sum(len(cast(Stamps, st).ts) for st in s.chunks[::2])
                for s in self._series.values()
            ),
            "dropped_out_of_order": self._dropped_out_of_order,
            "dropped_duplicate": self._dropped_duplicate,
            "dropped_invalid": self._dropped_invalid,
            "memory_bytes": self.memory_bytes(),
        }
