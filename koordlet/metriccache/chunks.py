"""The storage of one metric cache series: sealed chunks and an open tail (the layout is
described in :mod:`koordlet.metriccache.store`, its costs in docs/benchmarks.md, "Metric cache").

Here: the timestamps a chunk holds (:class:`Stamps`, interned by the cache), the smallest exact
form of a chunk's values (:func:`pack_values`, :func:`unpack_values`), and :class:`Series`, which
trims its expired chunks and finds the segments of a window. Single-threaded, as the cache.
"""

from __future__ import annotations

import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import TypeAlias, cast

from koordlet.metriccache.series import SeriesKey

TS_TYPECODE = "I"
CHUNK = 64
"""Samples the open tail of a series holds before it is sealed into a chunk."""
PHASES = 16
"""Series are dealt round-robin into this many groups whose first chunk is shorter by a multiple
of ``CHUNK / PHASES``: series created in one tick then seal in 16 different ticks, not all in
one (3,200 seals at once would hold the loop for about 15 ms), and the series of one group still
seal together and share their chunks' timestamps."""
SPAN_DIVISOR = 4
"""A tail is also sealed once it spans a quarter of the series' retention, so that a series
holds at most that much, or one chunk, of expired samples."""


class Stamps:
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


def pack_values(vals: array[float]) -> Payload:
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


def unpack_values(payload: Payload, n: int) -> array[float]:
    """A chunk's ``n`` values as ``array('d')``."""
    if isinstance(payload, float):
        return array("d", (payload,)) * n
    if isinstance(payload, bytes):
        values = array("d")
        values.frombytes(zlib.decompress(payload, -15))
        return values
    return payload


def _last_ms(stamps: Stamps | Payload) -> int:
    """Absolute ms of a chunk's newest sample (``stamps`` is a chunk's first entry)."""
    st = cast(Stamps, stamps)
    return st.base + st.ts[-1]


class Series:
    """One series: sealed chunks (``chunks``, oldest first) and an open tail (``ts``: ms offsets
    from ``base_ms``; ``vals``), all in time order."""

    __slots__ = (
        "base_ms",
        "chunks",
        "group",
        "keep_ms",
        "key",
        "last_ms",
        "limit",
        "next_trim",
        "slot",
        "span_ms",
        "ts",
        "vals",
    )

    def __init__(
        self, key: SeriesKey, keep_ms: int, span_ms: int, first_ms: int, limit: int
    ) -> None:
        self.key = key
        self.limit = limit
        """Samples the tail holds before it is sealed: ``CHUNK`` after the first seal."""
        self.keep_ms = keep_ms
        self.span_ms = span_ms
        """The tail is sealed before a sample more than this past ``base_ms`` joins it."""
        self.ts: array[int] = array(TS_TYPECODE)
        self.vals: array[float] = array("d")
        self.chunks: list[Stamps | Payload] = []
        """Sealed chunks, flat: ``[stamps, values, stamps, values, ...]`` (one list rather than
        two: about 120 bytes less a series, which is most of what a series costs)."""
        self.base_ms = first_ms - 1
        self.last_ms = first_ms - 1
        self.next_trim = first_ms + keep_ms + 1
        """When ``now`` reaches this (absolute ms), a sample or a chunk may have expired: the
        next append trims (never later than needed, possibly earlier)."""
        self.group: Group | None = None
        """The group whose shared tail holds this series' newest samples (its own tail then
        holds at most samples from before the group formed, and ``last_ms`` is the group's
        once the group has a row); None: its own tail."""
        self.slot = 0
        """Its place in ``group``'s rows."""

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

    def tails(self) -> list[tuple[int, array[int], array[float]]]:
        """``(base, offsets, values)`` of the unsealed samples, oldest first: the series' own
        tail, then, in a group, its column of the group's rows (a copy of the values). Either
        may be empty."""
        own = (self.base_ms, self.ts, self.vals)
        g = self.group
        if g is not None and g.appended:
            return [own, (g.base_ms, g.ts, g.vals[self.slot :: g.n])]
        return [own]

    def unsealed(self) -> int:
        """How many samples :meth:`tails` holds."""
        g = self.group
        return len(self.ts) + (len(g.ts) if g is not None and g.appended else 0)

    def newest(self) -> tuple[int, float] | None:
        """Absolute ms and value of the newest sample, expired or not; None when it has none."""
        g = self.group
        if g is not None and g.appended:
            return g.last_ms, g.vals[self.slot - g.n]
        if self.ts:
            return self.base_ms + self.ts[-1], self.vals[-1]
        if self.chunks:
            st = cast(Stamps, self.chunks[-2])
            payload = cast(Payload, self.chunks[-1])
            return st.base + st.ts[-1], unpack_values(payload, len(st.ts))[-1]
        return None

    def segments(self, start_ms: int) -> list[tuple[int, array[int], Payload]]:
        """``(base, offsets, values)`` of the chunks and the tails that hold samples at or after
        ``start_ms``, oldest first (an own tail's values are its live ``array('d')``)."""
        out: list[tuple[int, array[int], Payload]] = []
        for base_ms, ts, vals in reversed(self.tails()):
            if ts:
                out.append((base_ms, ts, vals))
                if base_ms + ts[0] <= start_ms:
                    out.reverse()
                    return out
        chunks = self.chunks
        for i in range(len(chunks) - 2, -1, -2):
            st = cast(Stamps, chunks[i])
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


class Group:
    """Series appended together, a column at a time (:meth:`MetricCache.append_columns`): one
    tail for all of them, ``ts`` (ms offsets from ``base_ms``, shared) and ``vals``, row after
    row (``n`` values a timestamp, in ``members`` order). Appending a row costs the same for
    3 series as for 300; sealing copies each member's column out (``vals[slot::n]``) into a
    chunk of its own, with the row timestamps shared by all members."""

    __slots__ = (
        "alive",
        "appended",
        "base_ms",
        "keys",
        "last_ms",
        "limit",
        "members",
        "n",
        "span_ms",
        "ts",
        "vals",
    )

    def __init__(
        self,
        keys: tuple[SeriesKey, ...],
        members: Sequence[Series],
        base_ms: int,
        limit: int,
        span_ms: int,
    ) -> None:
        self.keys = keys
        self.members = tuple(members)
        self.n = len(members)
        self.base_ms = base_ms
        self.limit = limit
        """Rows the tail holds before it is sealed."""
        self.span_ms = span_ms
        """The tail is sealed before a row more than this past ``base_ms`` joins it."""
        self.last_ms = max(s.last_ms for s in members)
        """The newest row's ms once ``appended``; before, the newest of the members' own."""
        self.appended = False
        """Whether a row was appended since the group formed."""
        self.alive = True
        """False once dissolved: its members have their own tails again."""
        self.ts: array[int] = array(TS_TYPECODE)
        self.vals: array[float] = array("d")


def to_ms(seconds: float) -> int:
    """Seconds as whole milliseconds, the resolution of every timestamp the cache keeps."""
    return round(seconds * 1000.0)


def span_of(parts: Sequence[tuple[int, array[int], Payload, int, int]]) -> tuple[int, int]:
    """Absolute ms of the first and the last sample of a window's non-empty parts."""
    base0, ts0, _, lo, _ = parts[0]
    base1, ts1, _, _, hi = parts[-1]
    return base0 + ts0[lo], base1 + ts1[hi - 1]
