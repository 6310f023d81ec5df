"""Prometheus metric families as the koordlet builds them: :class:`Metric` and its samples.

The data model of prometheus-client's ``metrics_core`` and ``samples``, attribute for attribute
(``name``, ``documentation``, ``type``, ``unit``, ``samples``; a :class:`Sample` is the same
six-field tuple), so a family of ours is collected by a prometheus-client registry and encoded by
its encoders unchanged, and the other way round (tests use both). What it does the same way:

- a counter family's name loses a ``_total`` suffix, its samples are ``<name>_total`` and, when
  a creation time is given, ``<name>_created``;
- a ``unit`` is appended to the name when missing; ``untyped`` is ``unknown``;
- label values pair with the family's label names in order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

METRIC_TYPES = frozenset(
    {"counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "info", "stateset"}
)
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


class Sample(NamedTuple):
    """One sample: prometheus-client's ``Sample`` field for field."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None
    exemplar: Any = None
    native_histogram: Any = None


class Metric:
    """One family and its samples."""

    __slots__ = ("documentation", "name", "samples", "type", "unit")

    def __init__(self, name: str, documentation: str, typ: str, unit: str = "") -> None:
        if unit and not name.endswith("_" + unit):
            name += "_" + unit
        if not _NAME.match(name):
            raise ValueError(f"Invalid metric name: {name}")
        if typ == "untyped":
            typ = "unknown"
        if typ not in METRIC_TYPES:
            raise ValueError(f"Invalid metric type: {typ}")
        self.name = name
        self.documentation = documentation
        self.unit = unit
        self.type = typ
        self.samples: list[Sample] = []

    def add_sample(
        self,
        name: str,
        labels: dict[str, str],
        value: float,
        timestamp: float | None = None,
        exemplar: Any = None,
        native_histogram: Any = None,
    ) -> None:
        self.samples.append(Sample(name, labels, value, timestamp, exemplar, native_histogram))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Metric)
            and self.name == other.name
            and self.documentation == other.documentation
            and self.type == other.type
            and self.unit == other.unit
            and self.samples == other.samples
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return (
            f"Metric({self.name}, {self.documentation}, {self.type}, {self.unit}, {self.samples})"
        )


class _Family(Metric):
    __slots__ = ("_labelnames",)

    def __init__(
        self,
        name: str,
        documentation: str,
        typ: str,
        value: float | None,
        labels: Sequence[str] | None,
        unit: str,
    ) -> None:
        super().__init__(name, documentation, typ, unit)
        if labels is not None and value is not None:
            raise ValueError("Can only specify at most one of value and labels.")
        self._labelnames = tuple(labels or ())

    def _pairs(self, values: Sequence[str]) -> dict[str, str]:
        # as prometheus-client: values beyond the names are dropped, missing ones left out
        return dict(zip(self._labelnames, values, strict=False))


class _ValueFamily(_Family):
    """A family of plain values, one a label set: gauges and untyped metrics."""

    __slots__ = ()
    _TYPE = ""

    def __init__(
        self,
        name: str,
        documentation: str,
        value: float | None = None,
        labels: Sequence[str] | None = None,
        unit: str = "",
    ) -> None:
        super().__init__(name, documentation, self._TYPE, value, labels, unit)
        if value is not None:
            self.add_metric([], value)

    def add_metric(
        self, labels: Sequence[str], value: float, timestamp: float | None = None
    ) -> None:
        self.samples.append(Sample(self.name, self._pairs(labels), value, timestamp))


class GaugeMetricFamily(_ValueFamily):
    """A gauge's samples, for a collector."""

    __slots__ = ()
    _TYPE = "gauge"


class UnknownMetricFamily(_ValueFamily):
    """An untyped family's samples, for a collector."""

    __slots__ = ()
    _TYPE = "unknown"


class CounterMetricFamily(_Family):
    """A counter's samples, for a collector (``_total``, and ``_created`` when given)."""

    __slots__ = ()

    def __init__(
        self,
        name: str,
        documentation: str,
        value: float | None = None,
        labels: Sequence[str] | None = None,
        created: float | None = None,
        unit: str = "",
    ) -> None:
        super().__init__(name.removesuffix("_total"), documentation, "counter", value, labels, unit)
        if value is not None:
            self.add_metric([], value, created)

    def add_metric(
        self,
        labels: Sequence[str],
        value: float,
        created: float | None = None,
        timestamp: float | None = None,
    ) -> None:
        pairs = self._pairs(labels)
        self.samples.append(Sample(self.name + "_total", pairs, value, timestamp))
        if created is not None:
            self.samples.append(Sample(self.name + "_created", dict(pairs), created, timestamp))


class Collector(Protocol):
    """What a registry collects from: anything with ``collect()``."""

    def collect(self) -> Iterable[Metric]: ...
