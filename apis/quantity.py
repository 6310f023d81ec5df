"""Kubernetes resource quantities (``resource.Quantity``): one exact parser, one canonical writer.

Everything here follows ``k8s.io/apimachinery/pkg/api/resource/quantity.go``:

- **Grammar** (the ``Quantity`` doc comment): an optional sign, a number (``12``, ``1.5``,
  ``1.``, ``.5``), then a suffix: binary ``Ki Mi Gi Ti Pi Ei``, decimal ``n u m "" k M G T P E``,
  or an exponent ``e3``/``E-2``. Surrounding whitespace is trimmed, as ``UnmarshalJSON`` trims it.
  A JSON or YAML number (``2``, ``0.5``) reads as its decimal text. Beyond Go, a text with no
  digit (``"."``, ``"+"``, which Go's scanner lets through as zero) and an exponent past ±1000
  are refused.
- **Exact value**: a :class:`~fractions.Fraction`, never a float. As ``ParseQuantity`` does, a
  non-zero value is rounded away from zero to a whole nano (``0.1n`` is ``1n``), a BinarySI
  value is capped at ``2^63-1``, and a BinarySI value between 0 and 1 becomes DecimalSI.
- **Integers**: :attr:`Quantity.milli_value` is ``MilliValue()`` and :attr:`Quantity.int_value`
  is ``Value()``, both ``ceil`` as ``ScaledValue`` documents it (``"0.0001"`` is 1 milli).
  Koordinator's ``getResourceValue`` counts ``cpu`` in milli-cores and every other resource
  (memory, ``kubernetes.io/batch-cpu``...) by ``Value()``: :func:`resource_value`.
- **Canonical text** (``String()``/``CanonicalizeBytes``): zero is ``"0"``; DecimalSI picks the
  largest exponent that is a multiple of 3 and keeps the mantissa whole (``1.5`` → ``"1500m"``,
  ``1000`` → ``"1k"``, ``10^21`` → ``"1e21"``); BinarySI picks the largest power of 1024 that
  divides the value (``1.5Gi`` → ``"1536Mi"``) but prints DecimalSI below 1024 in magnitude or
  when the value is not whole (``NewQuantity(1000, BinarySI)`` → ``"1k"``); DecimalExponent
  prints ``<mantissa>e<exponent>`` (``"1500e-3"``). Go keeps a parsed text that is already
  canonical (and so prints ``"+1"`` back as ``"+1"``); we always print the computed form.

Parsing is cached by text: a cluster repeats the same few hundred strings millions of times, so
:func:`milli_value` costs a cache lookup after the first time; :func:`int_value` reads the common
shapes of byte counts (plain digits, ``Ki``...), which seldom repeat, directly.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fractions import Fraction


class Format(StrEnum):
    """How a quantity prints (``resource.Format``)."""

    DECIMAL_SI = "DecimalSI"
    """``12M``: powers of 1000 with SI suffixes."""
    BINARY_SI = "BinarySI"
    """``12Mi``: powers of 1024."""
    DECIMAL_EXPONENT = "DecimalExponent"
    """``12e6``."""


_DECIMAL_SUFFIXES = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_DECIMAL_BY_EXPONENT = {exp: suffix for suffix, exp in _DECIMAL_SUFFIXES.items()}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_BINARY_BY_POWER = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_GRAMMAR = re.compile(
    r"([+-]?)([0-9]+\.?[0-9]*|\.[0-9]+)"
    r"(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?"
)
_MAX_EXPONENT = 1000
_NANO = 10**9
_MAX_INT64 = (1 << 63) - 1


def _frac(value: Fraction | int | str) -> Fraction:
    """``Fraction(value)``, with :mod:`fractions` imported at the first call: it brings
    :mod:`decimal` and its C library (0.4 MiB), and a standalone koordlet never parses a quantity
    that is not plain digits (docs/benchmarks.md, issue 26)."""
    from fractions import Fraction

    return Fraction(value)


def _ratio(numerator: int, denominator: int) -> Fraction:
    """``Fraction(numerator, denominator)``, imported as :func:`_frac` does."""
    from fractions import Fraction

    return Fraction(numerator, denominator)


@dataclass(frozen=True, slots=True, eq=False)
class Quantity:
    """A quantity's exact value and how it prints. Equal when the values are (``Cmp() == 0``)."""

    amount: Fraction
    """The exact value in base units (cores, bytes, a count)."""
    format: Format = Format.DECIMAL_SI
    """How :func:`str` prints it."""
    milli_value: int = field(init=False, repr=False)
    """``MilliValue()``: ``ceil(amount * 1000)`` (milli-cores for CPU)."""
    int_value: int = field(init=False, repr=False)
    """``Value()``: ``ceil(amount)`` (bytes for memory)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "milli_value", math.ceil(self.amount * 1000))
        object.__setattr__(self, "int_value", math.ceil(self.amount))

    @classmethod
    def of(cls, amount: Fraction | int, fmt: Format = Format.DECIMAL_SI) -> Quantity:
        """A quantity of ``amount``, rounded away from zero to a whole nano as Go stores it."""
        return cls(_round_nano(_frac(amount)), fmt)

    @classmethod
    def from_milli(cls, milli: int) -> Quantity:
        """``resource.NewMilliQuantity(milli, DecimalSI)``: CPU in milli-cores."""
        return cls(_ratio(milli, 1000), Format.DECIMAL_SI)

    @classmethod
    def from_int(cls, value: int, fmt: Format = Format.DECIMAL_SI) -> Quantity:
        """``resource.NewQuantity(value, fmt)``: bytes are ``BinarySI``, counts ``DecimalSI``."""
        return cls(_frac(value), fmt)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self.amount == other.amount
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.amount)

    def __str__(self) -> str:
        return _canonical(self.amount, self.format)


def _round_nano(amount: Fraction) -> Fraction:
    scaled = amount * _NANO
    if scaled.denominator == 1:
        return amount
    whole = math.ceil(scaled) if amount > 0 else math.floor(scaled)
    return _ratio(whole, _NANO)


@lru_cache(maxsize=1 << 16)
def _parse_text(text: str) -> Quantity:
    m = _GRAMMAR.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    sign, number, exponent, suffix = m.groups()
    amount = _frac(number)
    fmt = Format.DECIMAL_SI
    if exponent is not None:
        power = int(exponent[1:])
        if abs(power) > _MAX_EXPONENT:
            raise ValueError(f"quantity exponent out of range: {text!r}")
        amount *= _frac(10) ** power
        fmt = Format.DECIMAL_EXPONENT
    elif suffix in _BINARY_SUFFIXES:
        amount *= 1 << _BINARY_SUFFIXES[suffix]
        fmt = Format.BINARY_SI
    elif suffix:
        amount *= _frac(10) ** _DECIMAL_SUFFIXES[suffix]
    amount = _round_nano(amount)
    if fmt is Format.BINARY_SI:
        amount = min(amount, _frac(_MAX_INT64))
        if 0 < amount < 1:
            fmt = Format.DECIMAL_SI
    return Quantity(-amount if sign == "-" else amount, fmt)


def parse_quantity(value: object) -> Quantity:
    """A quantity given as text (``"500m"``, ``"1.5Gi"``, ``"2e3"``) or as a JSON/YAML number.

    Raises ``ValueError`` naming the value (``bool``, ``None``, NaN and infinities included)."""
    if type(value) is str:
        return _parse_text(value)
    if isinstance(value, bool):  # a JSON true is not a quantity
        raise ValueError(f"not a Kubernetes quantity: {value!r}")  # noqa: TRY004
    if isinstance(value, int):
        return Quantity(_frac(value), Format.DECIMAL_SI)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a Kubernetes quantity: {value!r}")
        return _parse_text(repr(value))
    if isinstance(value, str):
        return _parse_text(str(value))
    raise ValueError(f"not a Kubernetes quantity: {value!r}")


@lru_cache(maxsize=1 << 16)
def _milli_of_text(text: str) -> int:
    if text.isascii() and text.isdigit():  # "2": the shapes metrics use, no Fraction
        return int(text) * 1000
    if text[-1:] == "m" and text.isascii() and text[:-1].isdigit():
        return int(text[:-1])
    return _parse_text(text).milli_value


@lru_cache(maxsize=1 << 16)
def _int_cached(text: str) -> int:
    return _parse_text(text).int_value


_BINARY_FACTORS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def milli_value(value: object) -> int:
    """``parse_quantity(value).milli_value`` (``MilliValue()``). A text is looked up first: CPU
    texts (requests, usage in milli-cores) come from a small set and repeat on every pod."""
    if type(value) is str:
        return _milli_of_text(value)
    if type(value) is int:
        return value * 1000
    return parse_quantity(value).milli_value


def int_value(value: object) -> int:
    """``parse_quantity(value).int_value`` (``Value()``). Byte counts (``"734003200"``, a
    NodeMetric's BinarySI ``"716803Ki"``) seldom repeat: the common shapes are read directly, not
    looked up (a miss in a full cache cost 915 ns against 586 ns read directly)."""
    if type(value) is str:
        if value.isascii() and value.isdigit():
            return int(value)
        factor = _BINARY_FACTORS.get(value[-2:])
        if factor is not None and value.isascii() and value[:-2].isdigit():
            whole = int(value[:-2]) * factor
            if whole <= _MAX_INT64:  # above it, ParseQuantity's BinarySI cap applies
                return whole
        return _int_cached(value)
    if type(value) is int:
        return value
    return parse_quantity(value).int_value


def resource_value(name: str, value: object) -> int:
    """Koordinator's ``getResourceValue``: ``cpu`` in milli-cores, every other resource by
    ``Value()`` (bytes, counts, and the milli-core integers of ``kubernetes.io/batch-cpu``)."""
    return milli_value(value) if name == "cpu" else int_value(value)


# Writing -------------------------------------------------------------------------------------


@lru_cache(maxsize=1 << 14)
def _canonical(amount: Fraction, fmt: Format) -> str:
    # mantissa * 10^exponent with the smallest exponent that makes the mantissa whole
    exponent = 0
    value = amount
    while value.denominator != 1:
        value *= 10
        exponent -= 1
    return _canonical_of(int(value), exponent, fmt)


def _canonical_of(mantissa: int, exponent: int, fmt: Format) -> str:
    """The canonical text of ``mantissa * 10^exponent``, in integers only (the writers of
    milli-cores and bytes call it without a :class:`~fractions.Fraction`)."""
    if mantissa == 0:
        return "0"
    if fmt is Format.BINARY_SI and exponent >= 0:
        whole = mantissa * 10**exponent
        if abs(whole) >= 1024:
            power = 0
            while power < len(_BINARY_BY_POWER) - 1 and whole % 1024 == 0:
                whole //= 1024
                power += 1
            return f"{whole}{_BINARY_BY_POWER[power]}"
    # Decimal: the mantissa whole, the exponent a multiple of 3.
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    shift = exponent % 3
    mantissa *= 10**shift
    exponent -= shift
    if fmt is Format.DECIMAL_EXPONENT:
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    suffix = _DECIMAL_BY_EXPONENT.get(exponent)
    return f"{mantissa}{suffix}" if suffix is not None else f"{mantissa}e{exponent}"


def format_quantity(amount: Fraction | int, fmt: Format = Format.DECIMAL_SI) -> str:
    """``String()`` of a quantity of ``amount`` in ``fmt`` (rounded to the nano first)."""
    if type(amount) is int:  # whole already: no rounding, no Fraction
        return _canonical_of(amount, 0, fmt)
    return str(Quantity.of(amount, fmt))


def format_milli(milli: int) -> str:
    """``NewMilliQuantity(milli, DecimalSI).String()``: ``1500`` → ``"1500m"``, ``2000``
    → ``"2"``."""
    return _canonical_of(milli, -3, Format.DECIMAL_SI)


def format_cpu(cores: float) -> str:
    """Cores as Koordinator reports usage: truncated to whole milli-cores (``int64(cores*1000)``),
    then :func:`format_milli`."""
    return format_milli(int(cores * 1000))


def format_bytes(value: float) -> str:
    """Bytes as Koordinator reports them: truncated to a whole byte, then
    ``NewQuantity(n, BinarySI).String()`` (``"1Gi"``, ``"1536Ki"``, ``"1025"``, ``"1k"``)."""
    return _canonical_of(int(value), 0, Format.BINARY_SI)


# Go's parsed representation ------------------------------------------------------------------
#
# Two things Koordinator's Go code does with a parsed quantity are not functions of its value:
# ``json.Marshal`` prints ``String()``, which is the text as given when ``ParseQuantity`` judged
# it canonical and kept it (``"+1"``, ``"1500"``) and the computed canonical form otherwise
# (``"1000"`` prints ``"1k"``); and ``reflect.DeepEqual`` compares the representation
# (``int64Amount{value, scale}``, the format and the kept text), so ``"1k"`` and ``"1000"`` differ
# and so do ``MustParse("1500")`` and ``NewQuantity(1500, DecimalSI)`` (the latter keeps no
# text). The pod webhook's "annotation unchanged" test is such a DeepEqual.
# k8s.io/apimachinery/pkg/api/resource/quantity.go: parseQuantityString, ParseQuantity.

GoIdentity = tuple[object, ...]
"""What ``reflect.DeepEqual`` compares of a parsed quantity (:func:`go_identity`)."""

_GO_NUMBER = re.compile(r"([+-]?)0*([0-9]*)(?:\.([0-9]*))?(.*)")
_NANO_SCALE = -9
_MAX_INT64_FACTORS = 18


def _go_fast_path(text: str) -> GoIdentity | None:
    """``ParseQuantity``'s int64 path: ``("i", value, scale, format, kept text or None)``; None
    when Go takes its arbitrary-precision path (more than 18 digits, finer than nano, a binary
    fraction, an int64 overflow)."""
    if text == "0":
        return ("i", 0, 0, Format.DECIMAL_SI, "0")
    m = _GO_NUMBER.fullmatch(text)
    if m is None:
        return None
    sign, num, denom, suffix = m.group(1), m.group(2) or "0", m.group(3) or "", m.group(4)
    if suffix in _BINARY_SUFFIXES:
        exponent = _BINARY_SUFFIXES[suffix]
        # 1Mi (2^20) has about 6 decimal digits: Go's precision estimate for the int64 path
        precision = 15 - len(num) - int(exponent * 3 / 10) - 1
        if denom or precision < 0:
            return None
        value = int(num) << exponent
        if value > _MAX_INT64:
            return None
        kept = text if exponent % 10 == 0 and int(num) & 0x07 else None
        return ("i", -value if sign == "-" else value, 0, Format.BINARY_SI, kept)
    fmt = Format.DECIMAL_SI
    if suffix in _DECIMAL_SUFFIXES:
        exponent = _DECIMAL_SUFFIXES[suffix]
    elif suffix[:1] in ("e", "E") and len(suffix) > 1:
        exponent, fmt = int(suffix[1:]), Format.DECIMAL_EXPONENT
    else:
        return None
    if _MAX_INT64_FACTORS - (len(num) + len(denom)) < 0:
        return None
    scale = exponent - len(denom)
    if scale < _NANO_SCALE:
        return None
    shifted = num + denom
    value = int(shifted)
    canonical = scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"
    return ("i", -value if sign == "-" else value, scale, fmt, text if canonical else None)


def go_identity(value: object) -> GoIdentity:
    """What ``reflect.DeepEqual`` sees of ``json.Unmarshal``'s quantity of ``value`` (a JSON
    string or number): equal for two values exactly when Go's are DeepEqual, except that two
    texts Go parses on its arbitrary-precision path are equal here only when identical. Raises
    ``ValueError`` for what is not a quantity."""
    amount = parse_quantity(value)  # validates, and raises for what Go refuses
    text = (value if isinstance(value, str) else repr(value)).strip()
    fast = _go_fast_path(text)
    return fast if fast is not None else ("d", text, amount.amount, amount.format)


def go_identity_of_int(value: int, fmt: Format) -> GoIdentity:
    """``resource.NewQuantity(value, fmt)``: no kept text, scale 0."""
    return ("i", value, 0, fmt, None)


def go_text(value: object) -> str:
    """``String()`` of Go's parse of ``value``: the text itself when ``ParseQuantity`` kept it
    (already canonical: ``"1500"``, ``"4Gi"``, and ``"+1"`` as written), else the canonical form
    (``"1000"`` → ``"1k"``, ``"4096Mi"`` → ``"4Gi"``)."""
    identity = go_identity(value)
    if identity[0] == "i" and identity[4] is not None:
        return str(identity[4])
    return str(parse_quantity(value))
