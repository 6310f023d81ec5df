"""The validators and file codecs of the knob table (:mod:`koordlet.system.knobs`).

A :class:`Validator` says which logical values a knob takes; a :class:`FileCodec` turns a
logical value into the text of one file on one cgroup version and back; :class:`Codec` pairs a
knob's v1 and v2 codecs. The per-device codecs of the blkio and io files are in
:mod:`koordlet.system.devcodec`. The lossy conversions (shares in ``cpu.weight``) are explained
in the knob table's docstring.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

from apis.cpulist import MAX_CPU_ID, format_cpulist, parse_cpulist
from apis.records import frozen
from koordlet.system.cgroups import CgroupVersion

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

INT64_MAX = (1 << 63) - 1
"""Go's ``math.MaxInt64``."""
V1_UNLIMITED_MIN = (1 << 63) - (1 << 20)
"""v1 reports "no limit" as ``PAGE_COUNTER_MAX * PAGE_SIZE`` (9223372036854771712 with 4 KiB
pages, less with bigger pages); any value at or above this (pages up to 1 MiB) means unlimited."""

_INT = re.compile(r"-?\d+")


def _parse_int(text: str) -> int:
    text = text.strip()
    if not _INT.fullmatch(text):
        raise ValueError("not a decimal integer")
    return int(text)


# Validators -----------------------------------------------------------------------------------


class Validator(Protocol[T_co]):
    """The valid logical values of a knob."""

    def normalize(self, value: object) -> T_co:
        """The canonical form of ``value``; raises ``TypeError``/``ValueError`` when invalid."""
        ...

    def describe(self) -> str:
        """The valid values in words (``2..262144``)."""
        ...


def _check_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int, got {type(value).__name__}")
    return value


@frozen
class Range:
    """Integers in ``[lo, hi]``."""

    lo: int
    """Smallest valid value."""
    hi: int
    """Largest valid value."""

    def normalize(self, value: object) -> int:
        n = _check_int(value)
        if not self.lo <= n <= self.hi:
            raise ValueError(f"outside {self.lo}..{self.hi}")
        return n

    def describe(self) -> str:
        return f"{self.lo}..{self.hi}"


@frozen
class RangeOrUnlimited:
    """Integers in ``[lo, hi]`` or ``None`` (unlimited); ``-1`` is read as ``None``."""

    lo: int
    """Smallest valid value."""
    hi: int
    """Largest valid limited value."""
    saturate: bool = False
    """Values above ``hi`` up to ``INT64_MAX`` mean unlimited (Go's ``math.MaxInt64``)."""

    def normalize(self, value: object) -> int | None:
        if value is None:
            return None
        n = _check_int(value)
        if n == -1 or (self.saturate and self.hi < n <= INT64_MAX):
            return None
        if not self.lo <= n <= self.hi:
            raise ValueError(f"outside {self.lo}..{self.hi}")
        return n

    def describe(self) -> str:
        return f"{self.lo}..{self.hi} or None/-1 (unlimited)"


@frozen
class CpuList:
    """A set of CPU (or NUMA node) ids, from a set of ints or a cpulist string."""

    def normalize(self, value: object) -> frozenset[int]:
        if isinstance(value, str):
            return parse_cpulist(value)
        if not isinstance(value, Iterable):
            raise TypeError(f"expected a set of ids or a cpulist, got {type(value).__name__}")
        ids = frozenset(_check_int(i) for i in value)
        bad = [i for i in ids if not 0 <= i <= MAX_CPU_ID]
        if bad:
            raise ValueError(f"ids {sorted(bad)} outside 0..{MAX_CPU_ID}")
        return ids

    def describe(self) -> str:
        return f"a set of ids in 0..{MAX_CPU_ID} or a cpulist"


@frozen
class AnyText:
    """Any string (read-only sources)."""

    def normalize(self, value: object) -> str:
        if not isinstance(value, str):
            raise TypeError(f"expected a str, got {type(value).__name__}")
        return value

    def describe(self) -> str:
        return "text"


# File codecs ----------------------------------------------------------------------------------


class FileCodec(Protocol[T]):
    """Text of one file on one cgroup version ↔ the logical value."""

    @property
    def needs_current(self) -> bool:
        """The file holds more than this value: ``encode`` must see its current text."""
        ...

    def decode(self, text: str) -> T:
        """The logical value; raises ``ValueError`` when the text is malformed."""
        ...

    def encode(self, value: T, current: str | None) -> str:
        """The text to write for a valid ``value``; ``ValueError`` on malformed ``current``."""
        ...


@frozen
class IntCodec:
    """A plain decimal integer."""

    needs_current: bool = False

    def decode(self, text: str) -> int:
        return _parse_int(text)

    def encode(self, value: int, current: str | None) -> str:
        return str(value)


@frozen
class LimitCodec:
    """A non-negative integer or its "unlimited" spelling, which reads as ``None``.

    v1 (``unlimited="-1"``) is written ``-1`` and reads back as the page-counter maximum, so any
    value from :data:`V1_UNLIMITED_MIN` up reads as ``None`` too; v2 (``unlimited="max"``) is
    ``max`` both ways.
    """

    unlimited: str
    needs_current: bool = False

    def decode(self, text: str) -> int | None:
        text = text.strip()
        if text == self.unlimited:
            return None
        n = _parse_int(text)
        if self.unlimited == "-1" and n >= V1_UNLIMITED_MIN:
            return None
        if n < 0:
            raise ValueError("negative limit")
        return n

    def encode(self, value: int | None, current: str | None) -> str:
        return self.unlimited if value is None else str(value)


@frozen
class ConvertedCodec:
    """An integer kept in the file in another unit (shares in ``cpu.weight`` and back)."""

    to_file: Callable[[int], int]
    from_file: Callable[[int], int]
    file_range: Range
    """Values the kernel shows in the file."""
    needs_current: bool = False

    def decode(self, text: str) -> int:
        return self.from_file(self.file_range.normalize(_parse_int(text)))

    def encode(self, value: int, current: str | None) -> str:
        return str(self.to_file(value))


def _cpu_max_fields(text: str) -> tuple[str, str]:
    """The two fields of v2 ``cpu.max``; exactly two, as upstream's ``ParseCPUCFSQuotaV2`` and
    ``ParseCPUCFSPeriodV2`` require (``pkg/koordlet/util/system/cgroup2.go``: one field, or
    ``max`` alone, is an error)."""
    fields = text.split()
    if len(fields) != 2:
        raise ValueError("cpu.max is '<quota|max> <period>'")
    return fields[0], fields[1]


def _cpu_max_quota(text: str) -> int | None:
    """The quota from the first field alone (``100000 not_a_number`` is 100000, upstream's
    ``TestParseCPUCFSQuotaV2``); None for ``max``."""
    first = _cpu_max_fields(text)[0]
    quota = None if first == "max" else _parse_int(first)
    if quota is not None and quota < 0:
        raise ValueError("negative quota")
    return quota


def _cpu_max_period(text: str) -> int:
    """The period from the second field alone."""
    return _parse_int(_cpu_max_fields(text)[1])


@frozen
class CpuMaxQuotaCodec:
    """The quota half of v2 ``cpu.max``, read from its first field as upstream reads it; a
    write keeps the period of the current text (when it has none that is a number, only the
    quota is written, and the kernel keeps the period itself)."""

    needs_current: bool = False

    def decode(self, text: str) -> int | None:
        return _cpu_max_quota(text)

    def encode(self, value: int | None, current: str | None) -> str:
        quota = "max" if value is None else str(value)
        if current is None:
            return quota
        period = _cpu_max_fields(current)[1]
        return f"{quota} {period}" if period.isdigit() else quota


@frozen
class CpuMaxPeriodCodec:
    """The period half of v2 ``cpu.max``; a write needs the current text to keep the quota."""

    needs_current: bool = True

    def decode(self, text: str) -> int:
        return _cpu_max_period(text)

    def encode(self, value: int, current: str | None) -> str:
        quota = _cpu_max_quota(current or "")
        return f"{'max' if quota is None else quota} {value}"


@frozen
class CpuListCodec:
    """A cpulist file (``cpuset.cpus``, ``cpuset.mems``), written in canonical form."""

    needs_current: bool = False

    def decode(self, text: str) -> frozenset[int]:
        return parse_cpulist(text)

    def encode(self, value: frozenset[int], current: str | None) -> str:
        return format_cpulist(value)


@frozen
class RawTextCodec:
    """A read-only file handed to its parser (a collector) as text."""

    needs_current: bool = False

    def decode(self, text: str) -> str:
        return text

    def encode(self, value: str, current: str | None) -> str:
        raise ValueError("read-only")


@frozen
class Codec(Generic[T]):
    """The two file codecs of one knob: its text on cgroup v1 and on cgroup v2."""

    v1: FileCodec[T]
    """How the v1 file's text maps to the logical value."""
    v2: FileCodec[T]
    """How the v2 file's text maps to the logical value."""

    def for_version(self, version: CgroupVersion) -> FileCodec[T]:
        """The codec of ``version``."""
        return self.v2 if version is CgroupVersion.V2 else self.v1
