"""Go durations (``time.Duration``), as Kubernetes and Koordinator write them in flags and objects.

One grammar, Go's ``time.ParseDuration`` (``src/time/format.go``): an optional sign, then one or
more ``<number><unit>`` parts, where a number is ``12``, ``1.5``, ``.5`` or ``1.`` and a unit is
``ns``, ``us`` (or ``µs`` U+00B5, or ``μs`` U+03BC), ``ms``, ``s``, ``m`` or ``h``: ``"300ms"``,
``"-1.5h"``, ``"2h45m"``, ``"1m30.5s"``. ``"0"`` alone needs no unit. A fraction is truncated to
whole nanoseconds, as Go truncates it; a value past ``int64`` nanoseconds is an error. Nothing
else is accepted: no spaces, no exponent, no plain number other than ``0``.

:func:`format_duration` is ``Duration.String()``: ``"1h0m0s"``, ``"1m30s"``, ``"1.5s"``,
``"300ms"``, ``"1.5µs"``, ``"0s"``. ``metav1.Duration`` marshals the same way, so a NodeMetric's
``aggregatedNodeUsages[].duration`` reads ``"5m0s"``.
"""

from __future__ import annotations

import re

NANOSECOND = 1
MICROSECOND = 1000 * NANOSECOND
MILLISECOND = 1000 * MICROSECOND
SECOND = 1000 * MILLISECOND
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE

_UNITS = {
    "ns": NANOSECOND,
    "us": MICROSECOND,
    "\u00b5s": MICROSECOND,  # micro sign, the one Go prints
    "\u03bcs": MICROSECOND,  # Greek small letter mu, which Go also reads
    "ms": MILLISECOND,
    "s": SECOND,
    "m": MINUTE,
    "h": HOUR,
}
_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")
_MAX_NS = (1 << 63) - 1


def parse_duration_ns(text: str) -> int:
    """``time.ParseDuration(text)`` in whole nanoseconds; ``ValueError`` naming the text."""
    s = text
    negative = s[:1] == "-"
    if s[:1] in ("-", "+"):
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total = 0
    pos = 0
    while pos < len(s):
        m = _PART.match(s, pos)
        assert m is not None  # every group may be empty, so the pattern always matches
        whole, frac, unit = m.group(1), m.group(2), m.group(3)
        if not whole and not frac:
            raise ValueError(f"invalid duration {text!r}")
        if not unit:
            raise ValueError(f"missing unit in duration {text!r}")
        scale = _UNITS.get(unit)
        if scale is None:
            raise ValueError(f"unknown unit {unit!r} in duration {text!r}")
        total += int(whole or "0") * scale
        if frac:
            total += int(frac) * scale // 10 ** len(frac)  # truncated, as Go truncates
        if total > _MAX_NS + (1 if negative else 0):
            raise ValueError(f"invalid duration {text!r} (out of range)")
        pos = m.end()
    return -total if negative else total


def parse_duration(text: str) -> float:
    """``time.ParseDuration(text)`` in seconds (exact to the nanosecond for any realistic value);
    ``ValueError`` naming the text."""
    return parse_duration_ns(text) / SECOND


def format_duration_ns(ns: int) -> str:
    """``time.Duration(ns).String()``."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u < SECOND:
        for unit, size in (("ns", NANOSECOND), ("\u00b5s", MICROSECOND), ("ms", MILLISECOND)):
            if u < size * 1000:
                return f"{sign}{_decimal(u, size)}{unit}"
    hours, rest = divmod(u, HOUR)
    minutes, rest = divmod(rest, MINUTE)
    out = f"{_decimal(rest, SECOND)}s"
    if hours or minutes:
        out = f"{minutes}m{out}"
    if hours:
        out = f"{hours}h{out}"
    return sign + out


def format_duration(seconds: float) -> str:
    """``Duration.String()`` of ``seconds`` rounded to the nanosecond (``300`` → ``"5m0s"``)."""
    return format_duration_ns(round(seconds * SECOND))


def _decimal(value: int, size: int) -> str:
    """``value / size`` with the fraction's trailing zeros (and then the point) dropped."""
    whole, frac = divmod(value, size)
    if not frac:
        return str(whole)
    digits = len(str(size)) - 1
    return f"{whole}.{frac:0{digits}d}".rstrip("0")
