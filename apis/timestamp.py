"""Kubernetes timestamps as text: ``metav1.Time``, ``metav1.MicroTime``, and the OpenAPI
``date-time`` format the API server checks on CRD fields. docs/apis.md has the rules in short.

Reading. ``metav1.Time`` unmarshals with ``time.Parse(time.RFC3339, s)`` (apimachinery
``pkg/apis/meta/v1/time.go``); :func:`parse_time` takes what that takes, as Go's
``src/time/format.go`` (``parse``, after the ``format_rfc3339.go`` fast path) reads the layout
``2006-01-02T15:04:05Z07:00``, and nothing more:

- the date ``YYYY-MM-DD``: year 0000-9999, month 01-12, a day that month has (not ``02-30``);
- ``T``, upper case only (a literal in the layout);
- ``hh:mm:ss``: hour 0-23, which Go also takes with one digit (``T1:04:05``; go.dev/issue/54580);
  minute and second two digits each, 00-59 (no leap second);
- an optional fraction: ``.`` or ``,`` then one digit or more, truncated to nanoseconds;
- the zone: ``Z`` (upper case only) or ``+hh:mm`` / ``-hh:mm``, two digits each, which Go checks
  with ``>`` rather than ``>=`` (``+24:00`` and ``+23:60`` read).

So ``datetime.fromisoformat``'s extras are refused: a date alone, a space for ``T``, no zone,
``+0000`` or ``+05``, ``t``/``z``, ``20240101T000000Z``, week dates, a time without seconds.

``metav1.MicroTime`` (``eventTime`` of an events.k8s.io Event, a Lease's ``renewTime``) unmarshals
with ``time.Parse(RFC3339Micro, s)``, ``RFC3339Micro = "2006-01-02T15:04:05.000000Z07:00"``
(``micro_time.go``): the same grammar with exactly six fraction digits (:func:`parse_micro_time`).
Go's ``atoi`` would also take a sign among those six (``.+12345``); that is refused here.

A decoded YAML document may hold a ``datetime`` where the text was an unquoted timestamp; the
parsers take one as it is, a naive one as UTC (YAML's rule for a timestamp without a zone).

Writing. ``Time.MarshalJSON`` writes ``t.UTC()`` in the RFC 3339 layout, which has no fraction:
the time truncated to the second, ``2026-11-25T20:46:49Z`` (:func:`format_time`).
``MicroTime.MarshalJSON`` writes ``t.UTC().Format(RFC3339Micro)``: six digits always, truncated,
``1998-05-05T05:05:05.000005Z`` (:func:`format_micro_time`). Both zero-pad the year to four
digits. An epoch given as float seconds is first rounded to the microsecond, as
``datetime.fromtimestamp`` does: a float near 1.7e9 holds about 0.2 µs, so truncating it would
turn ``x.000005`` into ``x.000004`` half the time.

CRD fields. :func:`is_openapi_date_time` is what the API server checks for ``format: date-time``
(kube-openapi ``pkg/validation/strfmt/time.go``, ``IsDateTime``, and ``date.go``, ``IsDate``): a
different, looser rule than ``metav1.Time``'s (lower-case ``t``/``z``, any character before the
fraction digits, no zone offset range).

Bad text raises :class:`TimestampError`, a :class:`~apis.errors.FieldError` naming the source and
field the caller passed, and a ``ValueError`` as the other notation parsers' errors are.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from apis.errors import FieldError

EXAMPLE = "2006-01-02T15:04:05Z"
"""A ``metav1.Time`` as the API server writes it (Go's reference time), for messages."""

_TIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{1,2}):([0-9]{2}):([0-9]{2})"
    r"(?:[.,]([0-9]+))?(?:Z|([+-])([0-9]{2}):([0-9]{2}))"
)
_MICRO_TIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{1,2}):([0-9]{2}):([0-9]{2})"
    r"[.,]([0-9]{6})(?:Z|([+-])([0-9]{2}):([0-9]{2}))"
)
_FULL_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_OPENAPI_TIME = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))")
"""kube-openapi's ``DateTimePattern`` (its ``.`` is any character, as there)."""
_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_SECOND = timedelta(seconds=1)


class TimestampError(FieldError, ValueError):
    """Text that is not the timestamp asked for; ``source`` and ``field`` as the caller named
    them, the message quotes the text."""


def parse_time(value: object, *, source: str = "", field: str = "") -> float:
    """A ``metav1.Time`` (``time.Parse(time.RFC3339, value)``) in epoch seconds."""
    if isinstance(value, datetime):
        return _aware(value).timestamp()
    seconds, nanos = _parse(_TIME, value, "an RFC 3339 time", source, field)
    return seconds + nanos / 1e9


def parse_time_datetime(value: object, *, source: str = "", field: str = "") -> datetime:
    """A ``metav1.Time`` as an aware ``datetime`` (in UTC when read from text; Python keeps
    microseconds, so a finer fraction is truncated)."""
    if isinstance(value, datetime):
        return _aware(value)
    seconds, nanos = _parse(_TIME, value, "an RFC 3339 time", source, field)
    try:
        return _EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)
    except OverflowError:
        raise TimestampError(
            f"{value!r} is outside the years a Python datetime holds (1-9999)",
            source=source,
            field=field,
        ) from None


def parse_micro_time(value: object, *, source: str = "", field: str = "") -> float:
    """A ``metav1.MicroTime`` (``time.Parse(RFC3339Micro, value)``: six fraction digits) in
    epoch seconds."""
    if isinstance(value, datetime):
        return _aware(value).timestamp()
    seconds, nanos = _parse(_MICRO_TIME, value, "an RFC 3339 time with microseconds", source, field)
    return seconds + nanos / 1e9


def format_time(when: float | datetime) -> str:
    """``metav1.Time`` as it marshals: UTC, truncated to the second (``2026-11-25T20:46:49Z``)."""
    seconds, _ = _split(when)
    return _text(seconds) + "Z"


def format_micro_time(when: float | datetime) -> str:
    """``metav1.MicroTime`` as it marshals: UTC, six fraction digits
    (``1998-05-05T05:05:05.000005Z``)."""
    seconds, micros = _split(when)
    return f"{_text(seconds)}.{micros:06d}Z"


def is_openapi_date_time(text: str) -> bool:
    """The API server's ``format: date-time`` check (kube-openapi ``strfmt.IsDateTime``): the
    text lower-cased and split at ``t``; the first part a full date (``IsDate``, which is
    ``time.Parse("2006-01-02")``), the second ``DateTimePattern`` with hour <= 23, minute and
    second <= 59."""
    if len(text) < 4:
        return False
    parts = text.lower().split("t")
    if len(parts) < 2 or not _is_full_date(parts[0]):
        return False
    m = _OPENAPI_TIME.fullmatch(parts[1])
    return m is not None and m[1] <= "23" and m[2] <= "59" and m[3] <= "59"


def _parse(
    pattern: re.Pattern[str], value: object, what: str, source: str, field: str
) -> tuple[int, int]:
    """Epoch seconds (UTC) and nanoseconds of ``value``; TimestampError naming it."""
    if not isinstance(value, str):
        raise TimestampError(f"must be {what} string, got {value!r}", source=source, field=field)
    m = pattern.fullmatch(value)
    if m is None:
        raise TimestampError(
            f"must be {what} ({EXAMPLE}), got {value!r}", source=source, field=field
        )
    # a two-digit hour is the shape fromisoformat reads, with the same range checks as Go's
    seconds = _quick_seconds(value) if m.end(4) == 13 else None
    bad = ""
    if seconds is None:
        seconds, bad = _seconds_of(m)
    if m[8]:
        zone_hours, zone_minutes = int(m[9]), int(m[10])
        if zone_hours > 24 or zone_minutes > 60:  # Go's own bounds (">", not ">=")
            bad = bad or "time zone offset"
        offset = (zone_hours * 60 + zone_minutes) * 60
        seconds += offset if m[8] == "-" else -offset
    if bad:
        raise TimestampError(
            f"must be {what}, got {value!r} ({bad} out of range)", source=source, field=field
        )
    fraction = m[7]
    nanos = int(fraction[:9].ljust(9, "0")) if fraction else 0  # Go truncates past 9 digits
    return seconds, nanos


def _quick_seconds(value: str) -> int | None:
    """Epoch seconds of ``value[:19]`` (``2006-01-02T15:04:05``, matched) as UTC; None where
    ``fromisoformat`` refuses it (year 0, a field out of range)."""
    try:
        return (datetime.fromisoformat(value[:19]) - _EPOCH_NAIVE) // _SECOND
    except ValueError:
        return None


def _seconds_of(m: re.Match[str]) -> tuple[int, str]:
    """Epoch seconds of the matched date and time as UTC, and the first field out of range."""
    year, month, day = int(m[1]), int(m[2]), int(m[3])
    hour, minute, second = int(m[4]), int(m[5]), int(m[6])
    bad = ""
    if not 1 <= month <= 12:
        bad = "month"
    elif not 1 <= day <= _days_in(year, month):
        bad = "day"
    elif hour > 23:
        bad = "hour"
    elif minute > 59:
        bad = "minute"
    elif second > 59:
        bad = "second"
    if bad:
        return 0, bad
    days = _days_from_civil(year, month, day)
    return days * 86400 + hour * 3600 + minute * 60 + second, ""


def _days_in(year: int, month: int) -> int:
    if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        return 29
    return _DAYS_IN_MONTH[month]


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 to the proleptic Gregorian date (any year >= 0, which ``date``
    cannot hold for year 0)."""
    y = year - (month <= 2)
    era, year_of_era = divmod(y, 400)
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def _is_full_date(text: str) -> bool:
    m = _FULL_DATE.fullmatch(text)
    if m is None:
        return False
    month = int(m[2])
    return 1 <= month <= 12 and 1 <= int(m[3]) <= _days_in(int(m[1]), month)


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _split(when: float | datetime) -> tuple[int, int]:
    """Whole epoch seconds (floor) and microseconds of ``when``."""
    if isinstance(when, datetime):
        delta = _aware(when) - _EPOCH
        micros = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    else:
        micros = round(when * 1_000_000)
    seconds, rest = divmod(micros, 1_000_000)
    return seconds, rest


def _text(seconds: int) -> str:
    """``2006-01-02T15:04:05`` of whole epoch seconds in UTC, the year at least four digits as
    Go's ``appendInt(b, year, 4)`` writes it (``strftime("%Y")`` does not promise that: glibc
    writes year 99 as ``99``)."""
    days, rest = divmod(seconds, 86400)
    year, month, day = _civil_from_days(days)
    hour, rest = divmod(rest, 3600)
    minute, second = divmod(rest, 60)
    sign = "-" if year < 0 else ""
    return f"{sign}{abs(year):04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"


def _civil_from_days(days: int) -> tuple[int, int, int]:
    """The proleptic Gregorian date ``days`` after 1970-01-01 (the inverse of
    :func:`_days_from_civil`)."""
    era, day_of_era = divmod(days + 719468, 146097)
    year_of_era = (
        day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096
    ) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    mp = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = year_of_era + era * 400 + (month <= 2)
    return year, month, day
