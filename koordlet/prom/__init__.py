"""The Prometheus data model and text formats the koordlet exports its own metrics in.

prometheus-client's package imports its HTTP servers, WSGI and push-gateway code (``http.server``,
``wsgiref``, ``urllib.request``, ``email``) whatever part of it is used: 2.9 MiB of the
koordlet's resident memory for a registry, four instruments, three family classes and two
encoders (issue 26, docs/benchmarks.md). This package holds those, compatible with
prometheus-client's (a family of one is collected and encoded by the other; tests check it):

- :mod:`~koordlet.prom.families`: :class:`Metric`, :class:`Sample` and the gauge, counter and
  unknown families collectors build;
- :mod:`~koordlet.prom.instruments`: :class:`Counter`, :class:`Gauge`, :class:`Histogram`,
  :class:`Info`;
- :mod:`~koordlet.prom.registry`: :class:`CollectorRegistry`;
- :mod:`~koordlet.prom.encode`: the text format 0.0.4 and OpenMetrics 1.0.0.
"""

from koordlet.prom.families import (
    Collector,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    Sample,
    UnknownMetricFamily,
)
from koordlet.prom.instruments import Counter, Gauge, Histogram, Info
from koordlet.prom.registry import CollectorRegistry

__all__ = [
    "Collector",
    "CollectorRegistry",
    "Counter",
    "CounterMetricFamily",
    "Gauge",
    "GaugeMetricFamily",
    "Histogram",
    "Info",
    "Metric",
    "Sample",
    "UnknownMetricFamily",
]
