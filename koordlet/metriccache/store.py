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

Samples older than the retention of the series' entity kind (:class:`RetentionPolicy`) are hidden
from every read at once (reads bound the window by ``clock() - retention``) and deleted a chunk
at a time, when the chunk's newest sample expires: a series holds at most one chunk (64 samples,
or a quarter of its retention) of expired samples. :meth:`MetricCache.gc` (run by ``append``
every ``gc_interval`` seconds) trims series that no longer receive samples and removes the empty
ones.

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
import zlib
from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeAlias, cast
from weakref import WeakValueDictionary

from koordlet.errors import ConfigError
from koordlet.metriccache.aggregate import Aggregate, coverage, summarize
from koordlet.metriccache.series import Sample, SeriesKey

logger = logging.getLogger(__name__)

_TS_TYPECODE = "I"
_MAX_RETENTION_S = 30 * 24 * 3600.0
"""Retention must stay well below the 49.7 days a 32-bit millisecond offset spans: a tail spans
at most a quarter of it."""
_CHUNK = 64
"""Samples the open tail of a series holds before it is sealed into a chunk."""
_PHASES = 16
"""Series are dealt round-robin into this many groups whose first chunk is shorter by a multiple
of ``_CHUNK / _PHASES``: series created in one tick then seal in 16 different ticks, not all in
one (3,200 seals at once would hold the loop for about 15 ms), and the series of one group still
seal together and share their chunks' timestamps."""
_SPAN_DIVISOR = 4
"""A tail is also sealed once it spans a quarter of the series' retention, so that a series
holds at most that much, or one chunk, of expired samples."""
_KINDS = ("node", "system", "numa", "be", "hostapp", "pod", "container")


@dataclass(frozen=True, slots=True)
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


class _Stamps:
    """The timestamps of one sealed chunk: ``base`` (absolute ms) plus ``array('I')`` offsets.

    Immutable once built, and shared by every chunk with the same timestamps (the series of one
    collector tick seal together): :meth:`MetricCache._seal` interns them.
    """

    __slots__ = ("__weakref__", "base", "ts")

    def __init__(self, base: int, ts: array[int]) -> None:
        self.base = base
        self.ts = ts


Payload: TypeAlias = "array[float] | bytes | float"
"""A sealed chunk's values: one float when all are the same bit for bit, the float64 bytes
deflated when that pays, else ``array('d')``."""

_DEFLATE_WBITS = -9
"""Raw deflate with a 512-byte window, the size of a full chunk: the compressor's set-up (its
window and hash tables) costs about 4 µs a chunk where the default 32 KiB window costs 8-13."""


_ZERO = 0.0
"""The one float object every all-zero chunk holds (the commonest constant: throttling, idle
containers): 24 bytes a chunk less."""
_ZERO_BYTES = bytes(8)
"""+0.0 as float64 bytes (-0.0 differs, and keeps its own float)."""


def _pack(vals: array[float]) -> Payload:
    """The smallest exact form of a chunk's values.

    Only C-level work: a compare for a constant chunk; deflate only when at least a quarter of
    the bytes are zero (byte counts in pages, ratios mostly 0: float64's low mantissa bytes are
    zero), never for noisy floats such as CPU usage, which deflate cannot shrink.
    """
    raw = vals.tobytes()
    first = raw[:8]
    if raw == first * len(vals):
        return _ZERO if first == _ZERO_BYTES else vals[0]
    if raw.count(0) * 4 >= len(raw):
        packed = zlib.compress(raw, 1, _DEFLATE_WBITS)
        if len(packed) * 4 <= len(raw) * 3:
            return packed
    return array("d", vals)


def _unpack(payload: Payload, n: int) -> array[float]:
    """A chunk's ``n`` values as ``array('d')``."""
    if isinstance(payload, float):
        return array("d", (payload,)) * n
    if isinstance(payload, bytes):
        values = array("d")
        values.frombytes(zlib.decompress(payload, -15))
        return values
    return payload


def _last_ms(stamps: _Stamps | Payload) -> int:
    """Absolute ms of a chunk's newest sample (``stamps`` is a chunk's first entry)."""
    st = cast(_Stamps, stamps)
    return st.base + st.ts[-1]


class _Series:
    """One series: sealed chunks (``chunks``, oldest first) and an open tail (``ts``: ms offsets
    from ``base_ms``; ``vals``), all in time order."""

    __slots__ = (
        "base_ms",
        "chunks",
        "keep_ms",
        "key",
        "last_ms",
        "limit",
        "next_trim",
        "span_ms",
        "ts",
        "vals",
    )

    def __init__(
        self, key: SeriesKey, keep_ms: int, span_ms: int, first_ms: int, limit: int
    ) -> None:
        self.key = key
        self.limit = limit
        """Samples the tail holds before it is sealed: ``_CHUNK`` after the first seal."""
        self.keep_ms = keep_ms
        self.span_ms = span_ms
        """The tail is sealed before a sample more than this past ``base_ms`` joins it."""
        self.ts: array[int] = array(_TS_TYPECODE)
        self.vals: array[float] = array("d")
        self.chunks: list[_Stamps | Payload] = []
        """Sealed chunks, flat: ``[stamps, values, stamps, values, ...]`` (one list rather than
        two: about 120 bytes less a series, which is most of what a series costs)."""
        self.base_ms = first_ms - 1
        self.last_ms = first_ms - 1
        self.next_trim = first_ms + keep_ms + 1
        """When ``now`` reaches this (absolute ms), a sample or a chunk may have expired: the
        next append trims (never later than needed, possibly earlier)."""

    def trim(self, now_ms: int) -> None:
        """Delete the chunks whose newest sample expired (and, with no chunk left, the expired
        head of the tail)."""
        cutoff = now_ms - self.keep_ms
        chunks = self.chunks
        n = 0
        while n < len(chunks) and _last_ms(chunks[n]) < cutoff:
            n += 2
        if n:
            del chunks[:n]
        ts = self.ts
        if not chunks and ts:
            cut = bisect_left(ts, cutoff - self.base_ms)
            if cut:
                del ts[:cut]
                del self.vals[:cut]
        if chunks:
            self.next_trim = _last_ms(chunks[0]) + self.keep_ms + 1
        elif ts:
            self.next_trim = self.base_ms + ts[0] + self.keep_ms + 1
        else:
            self.next_trim = now_ms + self.keep_ms

    def segments(self, start_ms: int) -> list[tuple[int, array[int], Payload]]:
        """``(base, offsets, values)`` of the chunks and the tail that hold samples at or after
        ``start_ms``, oldest first (the tail's values are its live ``array('d')``)."""
        out: list[tuple[int, array[int], Payload]] = []
        ts = self.ts
        if ts:
            out.append((self.base_ms, ts, self.vals))
            if self.base_ms + ts[0] <= start_ms:
                return out
        chunks = self.chunks
        for i in range(len(chunks) - 2, -1, -2):
            st = cast(_Stamps, chunks[i])
            if st.base + st.ts[-1] < start_ms:
                break
            out.append((st.base, st.ts, cast(Payload, chunks[i + 1])))
            if st.base + st.ts[0] <= start_ms:
                break
        out.reverse()
        return out

    def window(self, start_ms: int, end_ms: int) -> list[tuple[int, array[int], Payload, int, int]]:
        """The segments holding samples with ``start_ms <= t <= end_ms`` (absolute ms), each with
        the index range ``lo:hi`` of those samples; oldest first, none when the window is empty."""
        out = []
        for base, ts, payload in self.segments(start_ms):
            lo = bisect_left(ts, start_ms - base)
            hi = bisect_right(ts, end_ms - base, lo)
            if lo < hi:
                out.append((base, ts, payload, lo, hi))
            if hi < len(ts):
                break
        return out


def _ms(seconds: float) -> int:
    return round(seconds * 1000.0)


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
        self._series: dict[SeriesKey, _Series] = {}
        self._by_entity: dict[str, dict[str, _Series]] = {}
        self._per_metric: dict[str, int] = {}
        """Metric name → how many series of it are stored (names with none are absent)."""
        self._entities: list[str] = []
        """Entity ids, sorted, so that a prefix is one contiguous run."""
        self._info: dict[str, object] = {}
        self._dropped_out_of_order = 0
        self._dropped_duplicate = 0
        self._dropped_invalid = 0
        self._unknown_kinds: set[str] = set()
        self._stamps: WeakValueDictionary[tuple[int, bytes], _Stamps] = WeakValueDictionary()
        """Interned chunk timestamps: the chunks of series appended in the same ticks share one."""
        self._keep_ms: dict[float, tuple[int, int]] = {}
        """Retention seconds → (retention, tail span) in ms, one int object each for all series."""
        self._created = 0
        self._gc_interval_ms = _ms(retention.gc_interval)
        self._last_gc_ms = self._now_ms()

    def _now_ms(self) -> int:
        return _ms(self._clock())

    # Writing ---------------------------------------------------------------------------------
    def append(self, ts: float, samples: Iterable[Sample]) -> None:
        """Store one collector tick: every sample at timestamp ``ts`` (seconds).

        O(1) amortized per sample. Drops (and counts) samples not newer than their series' last
        one, non-finite values and entities of no known kind.
        """
        tms = _ms(ts)
        now_ms = self._now_ms()
        series = self._series
        isfinite = math.isfinite
        before = self._dropped_out_of_order + self._dropped_duplicate + self._dropped_invalid
        for key, value in samples:
            s = series.get(key)
            if s is None:
                s = self._create(key, tms)
                if s is None:
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
            off = tms - s.base_ms
            if off > s.span_ms or len(s.ts) >= s.limit:
                self._seal(s, tms)
                off = 1
            s.ts.append(off)
            s.vals.append(value)
            s.last_ms = tms
            if now_ms >= s.next_trim:
                s.trim(now_ms)
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
        if now_ms - self._last_gc_ms >= self._gc_interval_ms:
            self.gc()

    def _create(self, key: SeriesKey, tms: int) -> _Series | None:
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
            keep_ms = self._keep_ms[keep] = (_ms(keep), _ms(keep) // _SPAN_DIVISOR)
        self._created += 1
        phase = (self._created % _PHASES) * (_CHUNK // _PHASES)
        s = _Series(key, keep_ms[0], keep_ms[1], tms, _CHUNK - phase)
        self._series[key] = s
        self._per_metric[key.metric] = self._per_metric.get(key.metric, 0) + 1
        metrics = self._by_entity.get(key.entity)
        if metrics is None:
            metrics = self._by_entity[key.entity] = {}
            insort(self._entities, key.entity)
        metrics[key.metric] = s
        return s

    def _seal(self, s: _Series, tms: int) -> None:
        """Seal the tail into a chunk (values in their smallest exact form, timestamps interned)
        and start an empty tail based just before ``tms``."""
        ts = s.ts
        if ts:
            key = (s.base_ms, ts.tobytes())
            stamps = self._stamps.get(key)
            if stamps is None:
                stamps = self._stamps[key] = _Stamps(s.base_ms, array(_TS_TYPECODE, ts))
            s.chunks += (stamps, _pack(s.vals))
            del ts[:]
            del s.vals[:]
            s.limit = _CHUNK
        s.base_ms = tms - 1

    def gc(self) -> int:
        """Trim every series to its retention and remove the empty ones; returns how many."""
        now_ms = self._now_ms()
        self._last_gc_ms = now_ms
        removed = 0
        for s in list(self._series.values()):
            if not s.ts or s.last_ms < now_ms - s.keep_ms:
                self._remove(s)
                removed += 1
            elif now_ms >= s.next_trim:
                s.trim(now_ms)
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

    def _remove(self, s: _Series) -> None:
        metric, entity = s.key
        self._forget(s.key)
        metrics = self._by_entity[entity]
        del metrics[metric]
        if not metrics:
            del self._by_entity[entity]
            del self._entities[bisect_left(self._entities, entity)]

    def drop_entity(self, entity: str) -> int:
        """Remove every series of one entity; returns how many."""
        metrics = self._by_entity.pop(entity, None)
        if metrics is None:
            return 0
        for s in metrics.values():
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
        if s is None or not s.ts:
            return None
        last_ms = s.base_ms + s.ts[-1]
        if last_ms < self._now_ms() - s.keep_ms:
            return None
        return last_ms / 1000.0, s.vals[-1]

    def last_values(self, keys: Sequence[SeriesKey], since: float) -> list[float | None]:
        """The newest value of each series when its timestamp is ``since`` or later and it is
        unexpired, else None; in the order of ``keys``.

        What the exporter reads at each build: one call per family, the clock read once, no
        tuple built per series (``last_sample`` costs several times as much per series).
        """
        now_ms = self._now_ms()
        since_ms = _ms(since)
        get = self._series.get
        out: list[float | None] = []
        push = out.append
        for key in keys:
            s = get(key)
            if s is None or not s.ts:
                push(None)
                continue
            last_ms = s.base_ms + s.ts[-1]
            push(s.vals[-1] if last_ms >= since_ms and last_ms >= now_ms - s.keep_ms else None)
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
        return s.window(max(_ms(start), self._now_ms() - s.keep_ms), _ms(end))

    def aggregate(self, metric: str, entity: str, start: float, end: float) -> Aggregate | None:
        """Aggregates of the unexpired samples with ``start <= ts <= end``; None if none."""
        parts = self._window(metric, entity, start, end)
        if not parts:
            return None
        if len(parts) == 1:
            _, ts, payload, lo, hi = parts[0]
            values = _unpack(payload, len(ts))[lo:hi]
        else:
            values = array("d")
            for _, ts, payload, lo, hi in parts:
                values += _unpack(payload, len(ts))[lo:hi]
        first_ms, last_ms = _span(parts)
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
        first_ms, last_ms = _span(parts)
        return coverage(first_ms / 1000.0, last_ms / 1000.0, start, end)

    def points(
        self, metric: str, entity: str, start: float, end: float
    ) -> list[tuple[float, float]]:
        """The unexpired ``(ts, value)`` samples with ``start <= ts <= end``, oldest first."""
        out: list[tuple[float, float]] = []
        for base, ts, payload, lo, hi in self._window(metric, entity, start, end):
            values = _unpack(payload, len(ts))[lo:hi]
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
                len(s.ts) + sum(len(cast(_Stamps, st).ts) for st in s.chunks[::2])
                for s in self._series.values()
            ),
            "dropped_out_of_order": self._dropped_out_of_order,
            "dropped_duplicate": self._dropped_duplicate,
            "dropped_invalid": self._dropped_invalid,
            "memory_bytes": self.memory_bytes(),
        }


def _span(parts: Sequence[tuple[int, array[int], Payload, int, int]]) -> tuple[int, int]:
    """Absolute ms of the first and the last sample of a window's non-empty parts."""
    base0, ts0, _, lo, _ = parts[0]
    base1, ts1, _, _, hi = parts[-1]
    return base0 + ts0[lo], base1 + ts1[hi - 1]
