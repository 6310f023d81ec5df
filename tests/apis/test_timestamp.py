"""Kubernetes timestamps as the other side reads and writes them.

Reading follows Go's ``time.Parse(time.RFC3339, s)`` (what ``metav1.Time.UnmarshalJSON`` calls,
apimachinery ``pkg/apis/meta/v1/time.go``) and ``time.Parse(RFC3339Micro, s)`` (``MicroTime``,
``micro_time.go``). The accepted and refused strings come from Go's own tests
(``src/time/format_test.go``: ``parseTests``, ``parseErrorTests``, ``dayOutOfRangeTests``) and
from the rules of ``src/time/format.go`` (``parse``, ``getnum``, ``parseNanoseconds``, the
``stdISO8601ColonTZ`` case: "The range test use > rather than >=") and ``format_rfc3339.go``
(``parseStrictRFC3339`` lists what ``Parse`` lets through: a one-digit hour, a comma before the
fraction, a zone hour of 24, a zone minute of 60; go.dev/issue/54580). Writing follows
apimachinery's ``TestTimeMarshalJSON`` and ``TestMicroTimeMarshalJSON``/``MarshalCBOR`` cases.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.errors import FieldError
from apis.timestamp import (
    TimestampError,
    format_micro_time,
    format_time,
    is_openapi_date_time,
    parse_micro_time,
    parse_time,
    parse_time_datetime,
)

PST = timezone(timedelta(hours=-8))


def _epoch(*args: int, tz: timezone = UTC, nanos: int = 0) -> float:
    return datetime(*args, tzinfo=tz).timestamp() + nanos / 1e9


@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        # Go's parseTests: the RFC3339 rows (Thu Feb 4 21:00:57 PST 2010, 0 and 9 digits)
        ("2010-02-04T21:00:57-08:00", _epoch(2010, 2, 4, 21, 0, 57, tz=PST)),
        (
            "2010-02-04T21:00:57.012345678-08:00",
            _epoch(2010, 2, 4, 21, 0, 57, tz=PST, nanos=12345678),
        ),
        # what the API server writes (tests/golden/captures)
        ("2026-11-25T20:46:49Z", _epoch(2026, 11, 25, 20, 46, 49)),
        ("1998-05-05T05:05:05.000005Z", _epoch(1998, 5, 5, 5, 5, 5, nanos=5000)),
        ("2006-01-02T15:04:05-00:00", _epoch(2006, 1, 2, 15, 4, 5)),
        ("2006-01-02T15:04:05+05:30", _epoch(2006, 1, 2, 9, 34, 5)),
        # Parse's leniencies (parseStrictRFC3339's list)
        ("2006-01-02T1:04:05Z", _epoch(2006, 1, 2, 1, 4, 5)),  # stdHour: getnum(value, false)
        ("2006-01-02T15:04:05,5Z", _epoch(2006, 1, 2, 15, 4, 5, nanos=500_000_000)),  # comma
        ("2006-01-02T15:04:05+24:00", _epoch(2006, 1, 1, 15, 4, 5)),  # hr > 24 is the error
        ("2006-01-02T15:04:05-23:60", _epoch(2006, 1, 3, 15, 4, 5)),  # mm > 60 is the error
        # parseNanoseconds: any number of digits, truncated past nine
        ("2006-01-02T15:04:05.1234567899Z", _epoch(2006, 1, 2, 15, 4, 5, nanos=123456789)),
        ("2006-01-02T15:04:05.1Z", _epoch(2006, 1, 2, 15, 4, 5, nanos=100_000_000)),
        # the calendar: leap days (dayOutOfRangeTests' Feb 29 2012), the year's full range
        ("2012-02-29T21:00:57Z", _epoch(2012, 2, 29, 21, 0, 57)),
        ("2000-02-29T00:00:00Z", _epoch(2000, 2, 29)),
        ("0000-01-01T00:00:00Z", -62167219200.0),  # parseRFC3339: year 0..9999
        ("0001-01-01T00:00:00Z", _epoch(1, 1, 1)),
        ("9999-12-31T23:59:59Z", _epoch(9999, 12, 31, 23, 59, 59)),
    ],
)
def test_what_go_parses_as_rfc3339_reads_to_the_same_instant(text: str, epoch: float) -> None:
    assert parse_time(text) == pytest.approx(epoch, abs=1e-6)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        # Go's parseErrorTests, RFC3339 rows
        ("2006-01-02T15:04:05Z07:00", "extra text"),
        ("2006-01-02T15:04_abc", "cannot parse"),
        ("2006-01-02T15:04:05_abc", "cannot parse"),
        ("2006-01-02T15:04:05Z_abc", "extra text"),
        ("2010-02-04T21:00:67.012345678-08:00", "second out of range"),
        # ranges checked by parse (hour, minute, second, month) and after it (day)
        ("2010-02-04T24:00:00Z", "hour out of range"),
        ("2010-02-04T21:60:00Z", "minute out of range"),
        ("2010-02-04T21:00:60Z", "second out of range: no leap second"),
        ("2010-13-04T21:00:00Z", "month out of range"),
        ("2010-00-04T21:00:00Z", "month out of range"),
        ("2010-02-29T21:00:57Z", "day out of range (dayOutOfRangeTests)"),
        ("2010-04-31T21:00:57Z", "day out of range (dayOutOfRangeTests)"),
        ("2010-12-00T21:00:57Z", "day out of range (dayOutOfRangeTests)"),
        ("2100-02-29T00:00:00Z", "day out of range: 2100 is no leap year"),
        ("2006-01-02T15:04:05+25:00", "time zone offset hour out of range"),
        ("2006-01-02T15:04:05+23:61", "time zone offset minute out of range"),
        # the layout's literals and fixed widths
        ("2006-01-02", "a date alone"),
        ("2006-01-02 15:04:05Z", "a space for T"),
        ("2006-01-02t15:04:05Z", "lower-case t"),
        ("2006-01-02T15:04:05z", "lower-case z"),
        ("2006-01-02T15:04:05", "no zone"),
        ("2006-01-02T15:04:05+0000", "a zone without a colon"),
        ("2006-01-02T15:04:05+05", "a zone hour alone"),
        ("2006-01-02T15:04:05+05:30:15", "zone seconds"),
        ("2006-01-02T15:04Z", "no seconds"),
        ("2006-01-02T15:04:5Z", "a one-digit second (stdZeroSecond is fixed)"),
        ("2006-1-02T15:04:05Z", "a one-digit month"),
        ("06-01-02T15:04:05Z", "a two-digit year"),
        ("+2006-01-02T15:04:05Z", "a signed year"),
        ("20060102T150405Z", "ISO 8601 basic format"),
        ("2006-W01-1T15:04:05Z", "a week date"),
        ("2006-01-02T015:04:05Z", "a three-digit hour"),
        ("2006-01-02T15:04:05.Z", "a point without digits"),
        (" 2006-01-02T15:04:05Z", "a leading space"),
        ("2006-01-02T15:04:05Z ", "a trailing space"),
        ("\uff12\uff10\uff10\uff16-01-02T15:04:05Z", "digits other than ASCII"),
        ("", "nothing"),
    ],
)
def test_what_go_refuses_is_refused(text: str, why: str) -> None:
    with pytest.raises(TimestampError, match="must be an RFC 3339 time"):
        parse_time(text)
    with pytest.raises(TimestampError):
        parse_time_datetime(text)


@pytest.mark.parametrize(
    "text",
    [
        "2006-01-02",
        "2006-01-02 15:04:05Z",
        "2006-01-02T15:04:05",
        "2006-01-02T15:04:05+0000",
        "20060102T150405Z",
        "2006-W01-1T15:04:05Z",
        "2006-01-02T15:04Z",
        "2006-01-02T15:04:05.Z",
    ],
)
def test_the_extras_of_fromisoformat_are_refused(text: str) -> None:
    # the copies this module replaced read all of these (a naive one in local time)
    datetime.fromisoformat(text.replace("Z", "+00:00"))
    with pytest.raises(TimestampError):
        parse_time(text)


def test_the_error_names_source_and_field_and_is_a_value_error() -> None:
    with pytest.raises(TimestampError) as caught:
        parse_time("yesterday", source="pod default/p", field="metadata.creationTimestamp")
    err = caught.value
    assert isinstance(err, FieldError)
    assert isinstance(err, ValueError)
    assert (err.source, err.field) == ("pod default/p", "metadata.creationTimestamp")
    assert err.message == "must be an RFC 3339 time (2006-01-02T15:04:05Z), got 'yesterday'"
    assert str(err) == f"pod default/p: metadata.creationTimestamp: {err.message}"


@pytest.mark.parametrize(("value", "shown"), [(1700000000, "1700000000"), (None, "None")])
def test_a_value_that_is_not_text_is_refused_by_type(value: object, shown: str) -> None:
    with pytest.raises(TimestampError, match=f"must be an RFC 3339 time string, got {shown}"):
        parse_time(value)


def test_a_range_error_says_which_field() -> None:
    with pytest.raises(TimestampError, match=r"\(day out of range\)"):
        parse_time("2010-02-29T21:00:57Z")
    with pytest.raises(TimestampError, match=r"\(time zone offset out of range\)"):
        parse_time("2010-02-04T21:00:57+25:00")


def test_a_yaml_datetime_is_taken_as_it_is_and_a_naive_one_as_utc() -> None:
    # PyYAML turns an unquoted timestamp into a datetime; YAML reads one without a zone as UTC
    aware = datetime(2026, 11, 25, 20, 46, 49, tzinfo=PST)
    assert parse_time(aware) == aware.timestamp()
    assert parse_time_datetime(aware) is aware
    naive = datetime(2026, 11, 25, 20, 46, 49)
    assert parse_time(naive) == _epoch(2026, 11, 25, 20, 46, 49)
    assert parse_time_datetime(naive) == datetime(2026, 11, 25, 20, 46, 49, tzinfo=UTC)


def test_the_datetime_form_is_utc_and_keeps_microseconds() -> None:
    got = parse_time_datetime("2010-02-04T21:00:57.012345678-08:00")
    assert got == datetime(2010, 2, 5, 5, 0, 57, 12345, tzinfo=UTC)
    assert got.tzinfo is UTC


def test_year_zero_reads_as_an_epoch_but_not_as_a_python_datetime() -> None:
    assert parse_time("0000-03-01T00:00:00Z") == -62162035200.0
    with pytest.raises(TimestampError, match="outside the years a Python datetime holds"):
        parse_time_datetime("0000-03-01T00:00:00Z")


@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        # apimachinery micro_time_test.go: TestMicroTimeUnmarshalJSON, MarshalCBOR
        ("1998-05-05T05:05:05.000000Z", _epoch(1998, 5, 5, 5, 5, 5)),
        ("1998-05-05T05:05:05.000005Z", _epoch(1998, 5, 5, 5, 5, 5, nanos=5000)),
        ("1998-05-05T01:05:05.000000-04:00", _epoch(1998, 5, 5, 5, 5, 5)),
        ("1998-05-05T05:05:05,123456Z", _epoch(1998, 5, 5, 5, 5, 5, nanos=123456000)),
    ],
)
def test_micro_time_reads_six_fraction_digits(text: str, epoch: float) -> None:
    assert parse_micro_time(text) == pytest.approx(epoch, abs=1e-6)


@pytest.mark.parametrize(
    "text",
    [
        "1998-05-05T05:05:05Z",  # stdFracSecond0 needs its digits
        "1998-05-05T05:05:05.00000Z",
        "1998-05-05T05:05:05.0000000Z",  # then "0Z" cannot parse as Z07:00
        "1998-05-05T05:05:05.+12345Z",  # Go's atoi takes the sign; we do not (module docstring)
        "hello",  # apimachinery's "malformed timestamp" case
    ],
)
def test_micro_time_refuses_any_other_fraction(text: str) -> None:
    with pytest.raises(TimestampError, match="with microseconds"):
        parse_micro_time(text)


@pytest.mark.parametrize(
    ("when", "time_text", "micro_text"),
    [
        # apimachinery TestTimeMarshalJSON / TestMicroTimeMarshalJSON: UTC, no fraction in Time
        (
            datetime(1998, 5, 5, 5, 5, 5, tzinfo=UTC),
            "1998-05-05T05:05:05Z",
            "1998-05-05T05:05:05.000000Z",
        ),
        (  # DateMicro(1998, May, 5, 1, 5, 5, 50, FixedZone(-4h)): converted to UTC
            datetime(1998, 5, 5, 1, 5, 5, tzinfo=timezone(timedelta(hours=-4))),
            "1998-05-05T05:05:05Z",
            "1998-05-05T05:05:05.000000Z",
        ),
        (  # MarshalCBOR's "nanoseconds truncated": 5050 ns
            _epoch(1998, 5, 5, 5, 5, 5, nanos=5050),
            "1998-05-05T05:05:05Z",
            "1998-05-05T05:05:05.000005Z",
        ),
        (_epoch(2026, 11, 25, 20, 46, 49) + 0.999999, "2026-11-25T20:46:49Z", None),
        (-0.5, "1969-12-31T23:59:59Z", "1969-12-31T23:59:59.500000Z"),  # floor, as Go's abs
        (-62167219200, "0000-01-01T00:00:00Z", None),  # appendInt(year, 4)
        (_epoch(99, 3, 1), "0099-03-01T00:00:00Z", None),  # glibc strftime("%Y") says "99"
    ],
)
def test_the_writers_marshal_as_apimachinery_does(
    when: float | datetime, time_text: str, micro_text: str | None
) -> None:
    assert format_time(when) == time_text
    if micro_text is not None:
        assert format_micro_time(when) == micro_text


def test_a_float_epoch_is_rounded_to_the_microsecond_before_truncation() -> None:
    # 1700000000.000005 is stored as ...0000050068; 1.000005 as ...0000049999999
    assert format_micro_time(1.000005) == "1970-01-01T00:00:01.000005Z"
    assert format_micro_time(1_700_000_000.000005) == "2023-11-14T22:13:20.000005Z"
    assert format_micro_time(1.0000004) == "1970-01-01T00:00:01.000000Z"


EPOCHS = st.integers(min_value=-62167219200, max_value=253402300799)  # years 0000 to 9999
"""Whole seconds that ``metav1.Time`` can write and read back."""


@given(EPOCHS)
def test_format_then_parse_gives_the_second_back(seconds: int) -> None:
    assert parse_time(format_time(seconds)) == seconds
    assert format_time(parse_time(format_time(seconds))) == format_time(seconds)


@given(st.floats(min_value=-62167219200, max_value=253402300799, allow_nan=False))
def test_any_epoch_written_as_a_time_reads_back_as_its_second(epoch: float) -> None:
    back = parse_time(format_time(epoch))
    assert back == math.floor(back)
    assert epoch - 1 < back <= epoch + 5e-7  # the second it falls in (to the microsecond)


ZONES = st.sampled_from([UTC, PST, timezone(timedelta(hours=5, minutes=45))])


@given(st.datetimes(datetime(1, 1, 2), datetime(9999, 12, 30), timezones=ZONES))
def test_a_datetime_round_trips_to_the_microsecond_and_the_second(when: datetime) -> None:
    assert parse_time_datetime(format_micro_time(when)) == when
    assert parse_time_datetime(format_time(when)) == when.replace(microsecond=0)
    assert parse_micro_time(format_micro_time(when)) == pytest.approx(when.timestamp(), abs=1e-6)


@given(st.floats(min_value=0, max_value=4_102_444_800, allow_nan=False))  # 1970 to 2100
def test_a_clock_reading_written_as_micro_time_reads_back_to_the_microsecond(now: float) -> None:
    # rounded to the microsecond, give or take what a float of that size holds
    assert abs(parse_micro_time(format_micro_time(now)) - now) <= 1e-6 + math.ulp(now)


@given(
    st.integers(-62135596800 + 86400, 253402300799 - 86400),  # a local year 0001 to 9999
    st.integers(0, 999_999_999),
    st.integers(-24 * 60, 24 * 60),
)
def test_any_offset_and_fraction_reads_as_the_same_instant(
    seconds: int, nanos: int, offset_minutes: int
) -> None:
    # text written the way Go's appendFormatRFC3339 writes a time in a fixed zone
    local = datetime(1970, 1, 1) + timedelta(seconds=seconds + offset_minutes * 60)
    sign = "-" if offset_minutes < 0 else "+"
    hours, minutes = divmod(abs(offset_minutes), 60)
    text = (
        f"{local.year:04d}-{local.month:02d}-{local.day:02d}T"
        f"{local.hour:02d}:{local.minute:02d}:{local.second:02d}.{nanos:09d}"
        f"{sign}{hours:02d}:{minutes:02d}"
    )
    assert parse_time(text) == pytest.approx(seconds + nanos / 1e9, abs=1e-6)


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        # kube-openapi strfmt IsDateTime: lower-cased, split at "t", IsDate, DateTimePattern
        ("2026-11-21T20:00:00Z", True),
        ("2026-11-21T20:00:00.123+08:00", True),
        ("2026-11-21t20:00:00z", True),  # ToLower first
        ("2026-11-21T20:00:00x5Z", True),  # the pattern's "." is any character
        ("2026-11-21T20:00:00Zt anything", True),  # only the part before the next "t" counts
        ("2026-11-21T20:00:00+25:61", True),  # the zone is matched, not range-checked
        ("2026-11-21", False),
        ("2026-11-21T24:00:00Z", False),
        ("2026-11-21T20:60:00Z", False),
        ("2026-02-30T20:00:00Z", False),  # IsDate is time.Parse("2006-01-02")
        ("2026-11-21T20:00:00", False),
        ("2026-11-21T20:00:00+0800", False),
        ("2026-11-21T1:00:00Z", False),
        ("2026-11-21 20:00:00Z", False),
        ("yesterday", False),
        ("", False),
    ],
)
def test_the_crd_date_time_format_is_kube_openapis(text: str, valid: bool) -> None:
    assert is_openapi_date_time(text) is valid
