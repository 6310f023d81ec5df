"""Kubernetes quantities and Go durations, as the API server writes and reads them.

Quantities: :func:`format_cpu` is ``resource.NewMilliQuantity(int64(cores*1000), DecimalSI)``
printed canonically (``"250m"``, ``"2"``: whole cores lose the suffix); :func:`format_bytes` is
``resource.NewQuantity(int64(bytes), BinarySI)`` printed canonically (the largest binary suffix
that divides the value exactly: ``"1Gi"``, ``"1536Ki"``, else plain bytes ``"1000"``).
:func:`parse_quantity` reads any quantity (``"100m"``, ``"1.5Gi"``, ``"2e3"``, ``"1k"``).

Durations: ``metav1.Duration`` is Go's ``time.Duration`` string (``"5m0s"``, ``"1h0m0s"``,
``"90s"`` accepted on input).
"""

from __future__ import annotations

import math
import re

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "": 1.0,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
}
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)


def parse_quantity(text: str | int | float) -> float:
    """The value of a quantity in base units (cores, bytes). Raises ``ValueError``."""
    if isinstance(text, int | float):
        return float(text)
    m = _QUANTITY.match(text.strip())
    if m is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, exponent, suffix = m.groups()
    value = float(number)
    if exponent:
        return value * 10.0 ** int(exponent[1:])
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    return value * _DECIMAL[suffix or ""]


def cpu_milli(text: str | int | float) -> int:
    """A CPU quantity in milli-cores, rounded up as ``Quantity.MilliValue()`` does."""
    return math.ceil(round(parse_quantity(text) * 1000, 6))


def memory_bytes(text: str | int | float) -> int:
    """A memory quantity in bytes, rounded up as ``Quantity.Value()`` does."""
    return math.ceil(round(parse_quantity(text), 6))


def format_cpu(cores: float) -> str:
    """Cores as Koordinator reports them: truncated to whole milli-cores, canonical form."""
    milli = int(cores * 1000)
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli}m"


def format_bytes(value: float) -> str:
    """Bytes as Koordinator reports them: truncated to a whole byte, canonical binary form."""
    n = int(value)
    if n == 0:
        return "0"
    for suffix, size in reversed(_BINARY.items()):
        if n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds of a Go duration string (``"5m0s"``, ``"1h"``, ``"1.5s"``). Raises ValueError."""
    s = text.strip()
    if s in ("0", ""):
        if s == "":
            raise ValueError("empty duration")
        return 0.0
    pos = 0
    total = 0.0
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise ValueError(f"not a Go duration: {text!r}")
    return total


def format_duration(seconds: float) -> str:
    """Go's ``time.Duration.String()`` for whole seconds (``300`` → ``"5m0s"``)."""
    total = int(seconds)
    if total == 0:
        return "0s"
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{s}s"
    if m:
        return f"{m}m{s}s"
    return f"{s}s"


def parse_go_bool(text: str) -> bool:
    """A boolean flag value as Go's ``strconv.ParseBool`` reads it (``1``, ``t``, ``true``,
    ``TRUE``, ``True`` and their false forms); raises ValueError otherwise."""
    if text in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if text in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise ValueError(f"not a boolean: {text!r}")
