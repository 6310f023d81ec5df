"""The registry the koordlet's families are collected from: prometheus-client's
``CollectorRegistry`` without its global default, target info or restricted views.

Collectors are collected in registration order. A collector with ``describe()`` (every
instrument of :mod:`koordlet.prom.instruments`) names its series at registration, and a name
another collector already produces is refused (``ValueError``), as prometheus-client refuses it;
a collector without ``describe()`` is not checked.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from koordlet.prom.families import Metric

_TYPE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "info": ("_info",),
}


class CollectorRegistry:
    """See the module docstring."""

    def __init__(self) -> None:
        self._collectors: dict[Any, list[str]] = {}
        self._names: dict[str, Any] = {}
        self._lock = threading.Lock()

    def register(self, collector: Any) -> None:
        with self._lock:
            names = _names(collector)
            clash = set(self._names).intersection(names)
            if clash:
                raise ValueError(f"Duplicated timeseries in CollectorRegistry: {clash}")
            for name in names:
                self._names[name] = collector
            self._collectors[collector] = names

    def unregister(self, collector: Any) -> None:
        with self._lock:
            for name in self._collectors.pop(collector):
                del self._names[name]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            collectors = list(self._collectors)
        for collector in collectors:
            yield from collector.collect()

    def get_sample_value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """The value of one sample, or None (for tests: it collects everything)."""
        wanted = labels or {}
        for metric in self.collect():
            for s in metric.samples:
                if s.name == name and s.labels == wanted:
                    return s.value
        return None


def _names(collector: Any) -> list[str]:
    describe = getattr(collector, "describe", None)
    if describe is None:
        return []
    out = []
    for metric in describe():
        out.append(metric.name)
        out.extend(metric.name + suffix for suffix in _TYPE_SUFFIXES.get(metric.type, ()))
    return out
