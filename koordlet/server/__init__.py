"""The koordlet's HTTP server: Prometheus metrics, health and readiness probes, /debug views.

``build_app(ServerDeps(...))`` makes the application (routes and middlewares over the small
HTTP/1.1 server of :mod:`koordlet.server.http` and :mod:`.connection`, asyncio plus httptools:
no aiohttp) and ``start_server`` serves it;
``KoordletExporter`` is the prometheus-client collector that turns the metric cache into
``koordlet_*`` families at each scrape.
"""

from koordlet.server.app import (
    AggregateView,
    MetricStore,
    ReadinessView,
    ServerDeps,
    ServerHandle,
    build_app,
    start_server,
)
from koordlet.server.debug import is_loopback_peer
from koordlet.server.exporter import FAMILIES, KoordletExporter, SampleReader

__all__ = [
    "FAMILIES",
    "AggregateView",
    "KoordletExporter",
    "MetricStore",
    "ReadinessView",
    "SampleReader",
    "ServerDeps",
    "ServerHandle",
    "build_app",
    "is_loopback_peer",
    "start_server",
]
