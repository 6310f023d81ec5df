"""Codecs of the cgroup files that hold one line per block device (blkio and io knobs).

Their logical value is the whole set of entries the koordlet wants in the file, a read-only
mapping ``"MAJ:MIN" → value``; a device absent from it must have no entry (no limit, the default
weight, iocost off). The kernel takes **one device per write(2)**: each of these files is parsed
by ``blkg_conf_prep`` (``block/blk-cgroup.c``), which reads one ``MAJ:MIN`` and hands the rest of
the buffer to the policy; a second line in the same write is ignored or refused. So ``encode``
returns one line per device, every device of the value and a removal line for every device the
file has and the value does not, and the writer writes them one at a time
(:attr:`~koordlet.system.knobs.Knob.keyed`). The writer compares ``decode(current)`` with the
value, so a file already holding exactly the value is never written.

The file formats (``Documentation/admin-guide/cgroup-v1/blkio-controller.rst``,
``Documentation/admin-guide/cgroup-v2.rst`` "IO"):

- ``blkio.throttle.{read,write}_{bps,iops}_device``: ``8:16 1048576``; removal ``8:16 0``;
- per-device weights (``blkio.bfq.weight_device``, ``io.bfq.weight``, ``io.weight``,
  ``blkio.weight_device``, Anolis ``blkio.cost.weight``): ``8:16 200`` after a
  ``default 100`` line; removal ``8:16 default`` (CFQ: ``8:16 0``);
- ``io.max``: ``8:16 rbps=2097152 wbps=max riops=max wiops=120``; removal ``8:16 rbps=max``;
- ``io.latency``: ``8:16 target=75``; removal ``8:16 target=max``;
- ``io.cost.qos`` (Anolis v1 ``blkio.cost.qos``): ``8:16 enable=1 ctrl=user rpct=95.00
  rlat=3000 wpct=95.00 wlat=3000 min=50.00 max=150.00``; removal ``8:16 enable=0``;
- ``io.cost.model`` (``blkio.cost.model``): ``8:16 ctrl=user model=linear rbps=... ``;
  removal ``8:16 ctrl=auto``.

``io.max`` holds four values per device; each is its own knob (``blkio_read_bps`` is the
``rbps`` key), and a knob's removal line resets only its own key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TypeVar

from apis.records import frozen

_DEV = re.compile(r"(\d+):(\d+)")
_INT = re.compile(r"\d+")

V = TypeVar("V")

DeviceValues = Mapping[str, int]
"""``"MAJ:MIN"`` → a number (a limit, a weight, a latency target)."""
DeviceParams = Mapping[str, Mapping[str, str]]
"""``"MAJ:MIN"`` → ``key=value`` parameters (blk-iocost's ``qos`` and ``model`` lines)."""


def device_key(value: object) -> str:
    """``"8:16"`` or ``(8, 16)`` → ``"8:16"``; ``ValueError`` otherwise."""
    if isinstance(value, tuple) and len(value) == 2 and all(type(v) is int for v in value):
        major, minor = value
    elif isinstance(value, str) and _DEV.fullmatch(value):
        major, minor = (int(p) for p in value.split(":"))
    else:
        raise ValueError(f"{value!r} is not a device number MAJ:MIN")
    if not (0 <= major < 1 << 12 and 0 <= minor < 1 << 20):
        raise ValueError(f"device {major}:{minor} outside the kernel's 12:20-bit numbers")
    return f"{major}:{minor}"


def _frozen(items: Iterable[tuple[str, V]]) -> Mapping[str, V]:
    return MappingProxyType(dict(sorted(items, key=lambda kv: tuple(map(int, kv[0].split(":"))))))


def _lines(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()]


def _device_of(fields: list[str], text: str) -> str:
    if not _DEV.fullmatch(fields[0]):
        raise ValueError(f"line {' '.join(fields)!r} does not start with MAJ:MIN in {text!r}")
    return fields[0]


# Validators -----------------------------------------------------------------------------------


@frozen
class DeviceRange:
    """A mapping of devices to integers in ``[lo, hi]``; a ``None`` value drops the device."""

    lo: int
    """Smallest valid value."""
    hi: int
    """Largest valid value."""

    def normalize(self, value: object) -> DeviceValues:
        if not isinstance(value, Mapping):
            raise TypeError(f"expected a mapping of MAJ:MIN to int, got {type(value).__name__}")
        out: list[tuple[str, int]] = []
        for dev, item in value.items():
            if item is None:
                continue
            if isinstance(item, bool) or not isinstance(item, int):
                raise TypeError(f"{dev}: expected an int, got {type(item).__name__}")
            if not self.lo <= item <= self.hi:
                raise ValueError(f"{dev}: {item} outside {self.lo}..{self.hi}")
            out.append((device_key(dev), item))
        return _frozen(out)

    def describe(self) -> str:
        return f"a mapping of MAJ:MIN to {self.lo}..{self.hi}"


@frozen
class DeviceParamSet:
    """A mapping of devices to ``key=value`` parameters among ``keys``; values are kept in the
    canonical spelling :func:`canonical_param` gives (``95.00`` and ``95`` are one value)."""

    keys: tuple[str, ...]
    """The parameters the koordlet manages (others in the file are left alone)."""

    def normalize(self, value: object) -> DeviceParams:
        if not isinstance(value, Mapping):
            raise TypeError(f"expected a mapping of MAJ:MIN to parameters, got {value!r}")
        out: list[tuple[str, Mapping[str, str]]] = []
        for dev, params in value.items():
            if params is None:
                continue
            if not isinstance(params, Mapping):
                raise TypeError(f"{dev}: expected a mapping of parameters, got {params!r}")
            unknown = sorted(set(params) - set(self.keys))
            if unknown:
                raise ValueError(f"{dev}: unknown parameters {unknown} (known: {self.keys})")
            out.append(
                (device_key(dev), MappingProxyType({k: canonical_param(params[k]) for k in params}))
            )
        return _frozen(out)

    def describe(self) -> str:
        return f"a mapping of MAJ:MIN to parameters among {', '.join(self.keys)}"


def canonical_param(value: object) -> str:
    """A parameter's canonical text: numbers without trailing zeros (``95.00`` → ``95``)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    text = str(value).strip()
    # imported here: only io/blkio policies get this far, and decimal with its C library is
    # about 0.4 MiB of a daemon that has none (docs/benchmarks.md, issue 26)
    from decimal import Decimal, InvalidOperation

    try:
        number = Decimal(text)
    except InvalidOperation:
        return text
    if not number.is_finite():
        return text
    return f"{number.normalize():f}"


# Codecs --------------------------------------------------------------------------------------


@frozen
class DeviceLinesCodec:
    """``MAJ:MIN VALUE`` lines (v1 throttle files, weight files with their ``default N`` line).

    ``remove`` is what resets a device: ``0`` for a throttle limit (the kernel then shows no
    line), ``default`` for a per-device weight."""

    remove: str
    needs_current: bool = True

    def decode(self, text: str) -> DeviceValues:
        out: list[tuple[str, int]] = []
        for fields in _lines(text):
            if fields[0] == "default":
                continue
            dev = _device_of(fields, text)
            if len(fields) != 2 or not _INT.fullmatch(fields[1]):
                raise ValueError(f"line {' '.join(fields)!r} is not 'MAJ:MIN VALUE'")
            value = int(fields[1])
            if self.remove == "0" and value == 0:
                continue
            out.append((dev, value))
        return _frozen(out)

    def encode(self, value: DeviceValues, current: str | None) -> str:
        have = self.decode(current or "")
        lines = [f"{dev} {v}" for dev, v in value.items()]
        lines += [f"{dev} {self.remove}" for dev in have if dev not in value]
        return "\n".join(lines)


@frozen
class DeviceKeyCodec:
    """One ``key=value`` of ``MAJ:MIN key=value ...`` lines (v2 ``io.max``, ``io.latency``);
    ``unlimited`` (``max``) means no entry."""

    key: str
    unlimited: str = "max"
    needs_current: bool = True

    def decode(self, text: str) -> DeviceValues:
        out: list[tuple[str, int]] = []
        for fields in _lines(text):
            dev = _device_of(fields, text)
            for item in fields[1:]:
                name, sep, raw = item.partition("=")
                if name != self.key:
                    continue
                if not sep or not (raw == self.unlimited or _INT.fullmatch(raw)):
                    raise ValueError(f"{item!r} is not {self.key}=<n|{self.unlimited}>")
                if raw != self.unlimited:
                    out.append((dev, int(raw)))
        return _frozen(out)

    def encode(self, value: DeviceValues, current: str | None) -> str:
        have = self.decode(current or "")
        lines = [f"{dev} {self.key}={v}" for dev, v in value.items()]
        lines += [f"{dev} {self.key}={self.unlimited}" for dev in have if dev not in value]
        return "\n".join(lines)


@frozen
class DeviceParamsCodec:
    """``MAJ:MIN k=v k=v ...`` lines of blk-iocost (``io.cost.qos``, ``io.cost.model``).

    A device counts as configured while ``switch`` has a value other than ``off`` (``enable=1``
    for the QoS, ``ctrl=user`` for the model); only ``keys`` are compared, and when the switch
    is off only the switch is (an ``auto`` model's numbers are the kernel's own)."""

    switch: str
    off: str
    keys: tuple[str, ...]
    needs_current: bool = True

    def decode(self, text: str) -> DeviceParams:
        out: list[tuple[str, Mapping[str, str]]] = []
        for fields in _lines(text):
            dev = _device_of(fields, text)
            params: dict[str, str] = {}
            for item in fields[1:]:
                name, sep, raw = item.partition("=")
                if not sep:
                    raise ValueError(f"{item!r} in {text!r} is not key=value")
                if name in self.keys:
                    params[name] = canonical_param(raw)
            if params.get(self.switch, self.off) == self.off:
                continue
            out.append((dev, MappingProxyType(params)))
        return _frozen(out)

    def encode(self, value: DeviceParams, current: str | None) -> str:
        have = self.decode(current or "")
        lines = [
            " ".join([dev, *(f"{k}={v}" for k, v in params.items())])
            for dev, params in value.items()
        ]
        lines += [f"{dev} {self.switch}={self.off}" for dev in have if dev not in value]
        return "\n".join(lines)
