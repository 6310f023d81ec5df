"""A sample value as the exposition formats write it."""

from __future__ import annotations

import math


def go_float(value: float) -> str:
    """``value`` as Go's ``strconv.FormatFloat(v, 'g', -1, 64)`` writes it for the values
    Prometheus clients expose, exactly as prometheus-client's ``floatToGoString`` does:
    ``+Inf``, ``-Inf``, ``NaN``, Python's shortest ``repr`` otherwise, switched to an exponent
    (``1.5e+09``) where a positive value has more than six digits before the point."""
    d = float(value)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if d != d:  # NaN
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s
