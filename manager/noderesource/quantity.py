"""Kubernetes resource quantities (``resource.Quantity``) as exact numbers.

``"500m"``, ``"2"``, ``"1.5Gi"``, ``"1e3"``, ``"100Ki"`` parse to :class:`~fractions.Fraction`;
:func:`milli` and :func:`whole` round up as Go's ``MilliValue()`` and ``Value()`` do. Parsing is
cached: a cluster repeats the same few hundred strings millions of times.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

_SUFFIXES: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)


@lru_cache(maxsize=1 << 16)
def _parse_text(text: str) -> Fraction:
    match = _QUANTITY.match(text.strip())
    if not match:
        raise ValueError(f"not a quantity: {text!r}")
    number, exponent, suffix = match.groups()
    value = Fraction(number)
    if exponent:
        return value * Fraction(10) ** int(exponent[1:])
    return value * _SUFFIXES[suffix or ""]


def parse(value: object) -> Fraction:
    """A quantity given as a string or a JSON/YAML number. Raises ``ValueError``."""
    if isinstance(value, bool):  # bad document content: callers catch ValueError
        raise ValueError(f"not a quantity: {value!r}")  # noqa: TRY004
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a quantity: {value!r}")
        return Fraction(repr(value))
    if isinstance(value, str):
        return _parse_text(value)
    raise ValueError(f"not a quantity: {value!r}")


@lru_cache(maxsize=1 << 16)
def _milli_cached(value: object) -> int:
    return math.ceil(parse(value) * 1000)


@lru_cache(maxsize=1 << 16)
def _whole_cached(value: object) -> int:
    return math.ceil(parse(value))


_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def milli(value: object) -> int:
    """The quantity in thousandths, rounded up (``MilliValue()``): CPU in milli-cores."""
    if type(value) is str:
        if value.isascii() and value.isdigit():  # the shapes metrics use, without a Fraction
            return int(value) * 1000
        if value[-1:] == "m" and value.isascii() and value[:-1].isdigit():
            return int(value[:-1])
        return _milli_cached(value)
    if type(value) is int:
        return _milli_cached(value)
    return math.ceil(parse(value) * 1000)


def whole(value: object) -> int:
    """The quantity in units, rounded up (``Value()``): memory in bytes."""
    if type(value) is str:
        if value.isascii() and value.isdigit():
            return int(value)
        factor = _BINARY.get(value[-2:])
        if factor is not None and value.isascii() and value[:-2].isdigit():
            return int(value[:-2]) * factor
        return _whole_cached(value)
    if type(value) is int:
        return _whole_cached(value)
    return math.ceil(parse(value))
