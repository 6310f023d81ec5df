"""Counters, gauges, histograms and info the koordlet updates as it runs.

The same instruments as prometheus-client's ``Counter``, ``Gauge``, ``Histogram`` and ``Info``,
with the same samples in the same order (so ``/metrics`` reads as before; tests compare the two
byte for byte): a labelled instrument is a parent whose ``labels(...)`` makes or finds one child
per label values, in first-use order; an unlabelled one is its own child from the start.

- counter ``x``: ``x_total`` and ``x_created`` (the child's creation time); ``inc`` refuses a
  negative amount; a name ending in ``_total`` loses it;
- gauge ``x``: ``x``;
- histogram ``x``: ``x_bucket{le=...}`` cumulated (``+Inf`` added), ``x_count``, ``x_sum`` when
  the first bound is not negative, ``x_created``;
- info ``x``: ``x_info`` with the given labels and the value 1.

Each child has its own lock: the executor's writer thread observes durations while the event
loop collects. An instrument registers itself in the ``registry`` it is given (any object with
``register``: ours or prometheus-client's); None registers nowhere.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from koordlet.prom.families import Metric, Sample
from koordlet.prom.textvalue import go_float

C = TypeVar("C", bound="_Child")


class _Registry(Protocol):
    def register(self, collector: Any) -> None: ...


class _Child:
    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def samples(self) -> Iterable[tuple[str, dict[str, str], float]]:
        raise NotImplementedError


class _Instrument(Generic[C]):
    """A family of children keyed by label values."""

    _type = ""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Iterable[str] = (),
        *,
        registry: _Registry | None = None,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], C] = {}
        self._lock = threading.Lock()
        Metric(name, documentation, self._type)  # validates the name as prometheus-client does
        self._self: C | None = None if self._labelnames else self._new_child()
        if registry is not None:
            registry.register(self)

    def _new_child(self) -> C:
        raise NotImplementedError

    def labels(self, *values: object, **named: object) -> C:
        """The child of these label values (made on first use)."""
        if not self._labelnames:
            raise ValueError(f"No label names were set when constructing {self._name}")
        if values and named:
            raise ValueError("Can't pass both *args and **kwargs")
        if named:
            if sorted(named) != sorted(self._labelnames):
                raise ValueError("Incorrect label names")
            values = tuple(named[n] for n in self._labelnames)
        if len(values) != len(self._labelnames):
            raise ValueError("Incorrect label count")
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            with self._lock:
                child = self._children.get(key)
                if child is None:
                    child = self._children[key] = self._new_child()
        return child

    def remove(self, *values: object) -> None:
        """Forget the child of these label values."""
        with self._lock:
            self._children.pop(tuple(str(v) for v in values), None)

    def clear(self) -> None:
        """Forget every child."""
        with self._lock:
            self._children = {}

    def _child(self) -> C:
        if self._self is None:
            raise ValueError(f"{self._type} metric is missing label values")
        return self._self

    def describe(self) -> list[Metric]:
        return [Metric(self._name, self._documentation, self._type)]

    def collect(self) -> list[Metric]:
        metric = Metric(self._name, self._documentation, self._type)
        name = metric.name
        if self._self is not None:
            for suffix, labels, value in self._self.samples():
                metric.samples.append(Sample(name + suffix, labels, value))
            return [metric]
        with self._lock:
            children = list(self._children.items())
        names = self._labelnames
        for values, child in children:
            for suffix, labels, value in child.samples():
                pairs = dict(zip(names, values, strict=True))
                pairs.update(labels)
                metric.samples.append(Sample(name + suffix, pairs, value))
        return [metric]


class CounterChild(_Child):
    __slots__ = ("_created", "_value")

    def __init__(self) -> None:
        super().__init__()
        self._value = 0.0
        self._created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        with self._lock:
            self._value += amount

    def samples(self) -> Iterable[tuple[str, dict[str, str], float]]:
        return (("_total", {}, self._value), ("_created", {}, self._created))


class Counter(_Instrument[CounterChild]):
    """A monotonic count (prometheus-client's ``Counter``)."""

    _type = "counter"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Iterable[str] = (),
        *,
        registry: _Registry | None = None,
    ) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames, registry=registry)

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def inc(self, amount: float = 1.0) -> None:
        self._child().inc(amount)


class GaugeChild(_Child):
    __slots__ = ("_value",)

    def __init__(self) -> None:
        super().__init__()
        self._value = 0.0

    def set(self, value: float) -> None:
        with self._lock:
            self._value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self._value += amount

    def dec(self, amount: float = 1.0) -> None:
        with self._lock:
            self._value -= amount

    def samples(self) -> Iterable[tuple[str, dict[str, str], float]]:
        return (("", {}, self._value),)


class Gauge(_Instrument[GaugeChild]):
    """A value that goes up and down (prometheus-client's ``Gauge``)."""

    _type = "gauge"

    def _new_child(self) -> GaugeChild:
        return GaugeChild()

    def set(self, value: float) -> None:
        self._child().set(value)

    def inc(self, amount: float = 1.0) -> None:
        self._child().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._child().dec(amount)


DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
"""prometheus-client's default buckets (seconds)."""


class HistogramChild(_Child):
    __slots__ = ("_bounds", "_counts", "_created", "_les", "_sum")

    def __init__(self, bounds: tuple[float, ...], les: tuple[str, ...]) -> None:
        super().__init__()
        self._bounds = bounds
        self._les = les
        self._counts = [0.0] * len(bounds)
        self._sum = 0.0
        self._created = time.time()

    def observe(self, amount: float) -> None:
        with self._lock:
            self._sum += amount
            for i, bound in enumerate(self._bounds):
                if amount <= bound:
                    self._counts[i] += 1
                    break

    def samples(self) -> Iterable[tuple[str, dict[str, str], float]]:
        out: list[tuple[str, dict[str, str], float]] = []
        acc = 0.0
        with self._lock:
            counts, total = list(self._counts), self._sum
        for le, count in zip(self._les, counts, strict=True):
            acc += count
            out.append(("_bucket", {"le": le}, acc))
        out.append(("_count", {}, acc))
        if self._bounds[0] >= 0:
            out.append(("_sum", {}, total))
        out.append(("_created", {}, self._created))
        return out


class Histogram(_Instrument[HistogramChild]):
    """Observations counted in buckets (prometheus-client's ``Histogram``)."""

    _type = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Iterable[str] = (),
        *,
        registry: _Registry | None = None,
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        if bounds and bounds[-1] != math.inf:
            bounds.append(math.inf)
        if len(bounds) < 2:
            raise ValueError("Must have at least two buckets")
        if "le" in tuple(labelnames):
            raise ValueError("Invalid label metric name: le")
        self._bounds = tuple(bounds)
        self._les = tuple(go_float(b) for b in bounds)
        super().__init__(name, documentation, labelnames, registry=registry)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self._bounds, self._les)

    def observe(self, amount: float) -> None:
        self._child().observe(amount)


class InfoChild(_Child):
    __slots__ = ("_value",)

    def __init__(self) -> None:
        super().__init__()
        self._value: dict[str, str] = {}

    def info(self, value: Mapping[str, str]) -> None:
        if any(v is None for v in value.values()):
            raise ValueError("Label value cannot be None")
        with self._lock:
            self._value = dict(value)

    def samples(self) -> Iterable[tuple[str, dict[str, str], float]]:
        with self._lock:
            return (("_info", dict(self._value), 1.0),)


class Info(_Instrument[InfoChild]):
    """Key-value pairs as the labels of a sample of value 1 (prometheus-client's ``Info``)."""

    _type = "info"

    def _new_child(self) -> InfoChild:
        return InfoChild()

    def info(self, value: Mapping[str, str]) -> None:
        if set(self._labelnames) & set(value):
            raise ValueError(f"Overlapping labels for Info metric: {sorted(value)}")
        self._child().info(value)
