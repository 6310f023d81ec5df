"""The koordlet's HTTP server: ``/metrics``, ``/healthz``, ``/readyz`` and read-only ``/debug``.

The server depends on interfaces only. :class:`ServerDeps` gathers what it reads, as callables
and protocols (:class:`MetricStore` for the metric cache's read side, :class:`ReadinessView` for
the start-up stages), so the daemon wires the real components and tests pass small fakes.

Routes (GET and HEAD only; anything else is 405):

- ``/metrics``: the registry's families (self metrics, the strategies', the evictor's), the
  request limiters' counters and the exporter's usage families, in the format the ``Accept``
  header asks for (OpenMetrics or text 0.0.4, :mod:`koordlet.server.textformat`), gzip'd when
  ``Accept-Encoding`` allows it. Bodies are built at most once per collection tick and served
  as bytes (:mod:`.exposition`).
- ``/healthz``: 200 ``ok`` whenever the event loop answers.
- ``/readyz``: 200 once every start-up stage is done and no protective loop is behind
  (:mod:`.health`), else 503 naming the stage still pending or the loops behind; either answer
  ends with ``; degraded: ...`` while something works but not as it should (the state directory
  refusing writes).
- ``/debug/...``: JSON views (see :mod:`koordlet.server.debug`) and the ``/debug/ui`` page with
  its views (:mod:`koordlet.server.ui`), answered to loopback clients only unless
  ``deps.debug_allow_remote``; others get 403.

Every request goes through a :class:`~koordlet.server.limiter.RequestLimiter` first (the probes
through their own): the server shares the event loop with the collection tick and the QoS
strategies, and no request load may take more than a bounded share of its CPU. Beyond the
limits a request is answered ``503`` with ``Retry-After``.

Building a body reads the metric cache, which belongs to the event loop, so it runs on the loop;
it runs at most once per tick, whatever the number of requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import field
from typing import Any, Protocol

from apis.records import frozen
from koordlet.prom import Collector, Metric
from koordlet.server.connection import HttpServer
from koordlet.server.debug import DebugHandlers, is_loopback_peer, json_response
from koordlet.server.exporter import EXPORTED_SERIES, KoordletExporter, SampleReader
from koordlet.server.exposition import Exposition
from koordlet.server.health import LoopHealth
from koordlet.server.http import (
    App,
    AppKey,
    Handler,
    HttpLimits,
    Middleware,
    Request,
    Response,
    text_response,
)
from koordlet.server.limiter import LimitConfig, LimiterFamilies, Refusal, RequestLimiter
from koordlet.server.render import FamilyRenderer
from koordlet.server.summary import UiDeps
from koordlet.server.textformat import accepts_gzip, content_type, negotiate
from koordlet.statesinformer.model import WorkloadSnapshot

logger = logging.getLogger(__name__)


class AggregateView(Protocol):
    """A window aggregate of one series, as the metric cache computes it."""

    @property
    def count(self) -> int: ...
    @property
    def avg(self) -> float: ...
    @property
    def p50(self) -> float: ...
    @property
    def p90(self) -> float: ...
    @property
    def p95(self) -> float: ...
    @property
    def p99(self) -> float: ...
    @property
    def last(self) -> float: ...
    @property
    def min(self) -> float: ...
    @property
    def max(self) -> float: ...
    @property
    def first_ts(self) -> float: ...
    @property
    def last_ts(self) -> float: ...


class MetricStore(SampleReader, Protocol):
    """The read side of the metric cache that the server uses."""

    def aggregate(
        self, metric: str, entity: str, start: float, end: float, /
    ) -> AggregateView | None:
        """Aggregate of the samples with ``start <= ts <= end``; None when there are none."""
        ...

    def stats(self) -> Mapping[str, Any]:
        """Sizes and counters of the cache, for ``/debug/metrics``."""
        ...


class ReadinessView(Protocol):
    """The start-up stages (``koordlet.selfmetrics.Readiness``)."""

    def ready(self) -> bool: ...

    def pending(self) -> Sequence[str]:
        """Stages not yet done, the one being waited on first."""
        ...


AuditQuery = Callable[[int, str | None, str | None], Mapping[str, Any]]
"""``/debug/audit``'s source: ``(limit, strategy or None, kind or None)`` → JSON-ready data with
``entries`` (newest first) and ``log`` (the audit log's counters)."""


PROBE_PATHS = frozenset({"/healthz", "/readyz"})
"""Paths limited as probes, apart from the other requests: a scrape storm must not fail the
kubelet's probes."""


PROBE_LIMITS = LimitConfig(max_in_flight=4, cpu_share=0.02, burst=0.01)
"""The probes' limits: 4 in flight, 2 % of one core."""


@frozen
class ServerLimits:
    """The request limits (:class:`~koordlet.server.limiter.LimitConfig`), per class."""

    reads: LimitConfig = field(default_factory=LimitConfig)
    """``/metrics`` and ``/debug``: 8 in flight, 10 % of one core."""
    probes: LimitConfig = field(default_factory=lambda: PROBE_LIMITS)
    """``/healthz`` and ``/readyz``: 4 in flight, 2 % of one core."""


@frozen
class ServerDeps:
    """Everything the server reads; the daemon builds it from the real components."""

    registry: Collector
    """What ``/metrics`` exposes first: a ``CollectorRegistry`` holding the self metrics (not the
    exporter: see ``exporter``)."""
    readiness: ReadinessView
    """Start-up stages behind ``/readyz``."""
    cache: MetricStore
    """The metric cache (read side)."""
    workloads: Callable[[], WorkloadSnapshot]
    """The inventory's current snapshot."""
    capabilities: Callable[[], Mapping[str, Any]]
    """The start-up probe's result as JSON-ready data (``Capabilities.as_dict``)."""
    config: Callable[[], Mapping[str, Any]]
    """The effective configuration as JSON-ready data (``config_as_dict``)."""
    tasks: Callable[[], Sequence[Mapping[str, object]]]
    """The supervisor's task states (``Supervisor.describe``)."""
    audit: AuditQuery | None = None
    """``(limit, strategy, kind)`` → the most recent audit entries and the log's counters, for
    ``/debug/audit``; None answers 404."""
    qos: Callable[[], Mapping[str, Any]] | None = None
    """The QoS manager's state (``QoSManager.describe``) for ``/debug/qos``; None answers 404."""
    exporter: KoordletExporter | None = None
    """The usage families, written after the registry's by the fast renderer (it must not also
    be registered in ``registry``); None serves the registry alone."""
    tick: Callable[[], object] = lambda: 0
    """The collection tick's number: ``/metrics`` bodies and the full ``/debug/metrics`` view
    are rebuilt when it changes."""
    collect_interval: float = 1.0
    """Seconds between collection ticks: a body is also rebuilt when it is this old."""
    health: LoopHealth | None = None
    """The protective loops' health behind ``/readyz`` (None: start-up stages only)."""
    degraded: Callable[[], Sequence[str]] | None = None
    """What works but not as it should, one line each (the state directory refusing writes:
    ``StateFiles.problems``): ``/readyz`` still answers 200 and adds the lines; so does
    ``/debug/summary`` (``koordlet status``)."""
    limits: ServerLimits = field(default_factory=ServerLimits)
    """The request limits."""
    runtimehooks: Callable[[], Mapping[str, Any]] | None = None
    """The runtime hooks' state (``RuntimeHooks.describe``) for ``/debug/runtimehooks``; None
    answers 404."""
    metric_names: Sequence[str] = EXPORTED_SERIES
    """Series that ``/debug/metrics`` lists (default: every series the exporter knows)."""
    debug_allow_remote: bool = False
    """Serve ``/debug`` to non-loopback clients too (default False: loopback only)."""
    max_query_window: float = 86400.0
    """Largest ``window`` (s) ``/debug/query`` accepts."""
    clock: Callable[[], float] = time.time
    """Wall-clock seconds, the time base of the cache's timestamps."""


DEPS = AppKey("koordlet_server_deps", ServerDeps)
"""Typed application state: the server's dependencies."""
EXPOSITION = AppKey("koordlet_server_exposition", Exposition)
"""The cached ``/metrics`` bodies."""


@frozen
class Limiters:
    """The limiter of each request class."""

    reads: RequestLimiter
    probes: RequestLimiter

    def of(self, path: str) -> RequestLimiter:
        return self.probes if path in PROBE_PATHS else self.reads

    def families(self) -> LimiterFamilies:
        """Their counters as ``/metrics`` families."""
        return LimiterFamilies({"reads": self.reads, "probes": self.probes})


class _Chain:
    """Several collectors read as one registry by the encoders (the registry's families first)."""

    def __init__(self, *collectors: Collector) -> None:
        self._collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for collector in self._collectors:
            yield from collector.collect()


LIMITERS = AppKey("koordlet_server_limiters", Limiters)
"""The request limiters."""


def _limit(limiters: Limiters) -> Middleware:
    """Admit each request under its class's limits, serve and write it, and charge its CPU."""

    async def limit(request: Request, handler: Handler) -> Response:
        limiter = limiters.of(request.path)
        refusal = await limiter.admit()
        cpu0 = limiter.cpu_now()
        if refusal is not None:
            refused = _refused(refusal, limiter.config.retry_after)
            limiter.charge(limiter.cpu_now() - cpu0)
            return refused
        try:
            response = await handler(request)
            # Written here, so that the transfer is charged to the request too.
            await request.respond(response)
            return response
        finally:
            limiter.release(limiter.cpu_now() - cpu0)

    return limit


def _refused(refusal: Refusal, retry_after: int) -> Response:
    why = "too many requests in flight" if refusal.reason == "busy" else "request budget spent"
    response = text_response(
        f"busy: {why}; retry later\n", 503, **{"Retry-After": str(retry_after)}
    )
    response.close = refusal.close
    return response


def _debug_guard(deps: ServerDeps) -> Middleware:
    """403 for ``/debug`` requests from non-loopback peers, unless remote access is allowed."""

    async def guard(request: Request, handler: Handler) -> Response:
        if request.path == "/debug" or request.path.startswith("/debug/"):
            peer = request.peer
            if not deps.debug_allow_remote and not is_loopback_peer(peer):
                logger.debug("refused %s to non-loopback peer %s", request.path, peer)
                return json_response(
                    {"error": "/debug is served to loopback clients only"}, status=403
                )
        return await handler(request)

    return guard


def _metrics(exposition: Exposition) -> Handler:
    async def metrics(request: Request) -> Response:
        fmt = negotiate(request.headers.get("Accept", ""))
        gzipped = accepts_gzip(request.headers.get("Accept-Encoding", ""))
        body = exposition.body(fmt, gzipped=gzipped)
        headers = {"Content-Type": content_type(fmt), "Vary": "Accept, Accept-Encoding"}
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        return Response(200, body, headers)

    return metrics


async def _healthz(request: Request) -> Response:
    return text_response("ok")


def _readyz(deps: ServerDeps) -> Handler:
    async def readyz(request: Request) -> Response:
        readiness = deps.readiness
        if not readiness.ready():
            pending = list(readiness.pending())
            waiting = pending[0] if pending else "unknown"
            return text_response(
                f"not ready: waiting for {waiting} (pending: {', '.join(pending)})", 503
            )
        behind = deps.health.behind() if deps.health is not None else []
        degraded = list(deps.degraded()) if deps.degraded is not None else []
        note = f"; degraded: {'; '.join(degraded)}" if degraded else ""
        if behind:
            loops = "; ".join(state.describe() for state in behind)
            return text_response(f"not ready: behind: {loops}{note}", 503)
        return text_response(f"ok{note}")

    return readyz


UI_PATHS = ("/debug/ui", "/debug/summary", "/debug/series")
"""The paths of :class:`koordlet.server.ui.UiHandlers`, served through :class:`_LazyUi`."""


class _LazyUi:
    """The ``/debug/ui`` page and its views, imported and built at their first request (in a
    worker thread: it reads the page's file) rather than at start: few koordlets are ever asked
    for them, and the page, its module and what ``/debug/summary`` reads of the strategies cost
    about 0.1 MiB (docs/benchmarks.md)."""

    def __init__(self, deps: ServerDeps, ui: UiDeps) -> None:
        self._deps = deps
        self._ui = ui
        self._handlers: dict[str, Handler] | None = None
        self._lock = asyncio.Lock()

    def routes(self) -> list[tuple[str, Handler]]:
        return [(path, functools.partial(self._handle, path)) for path in UI_PATHS]

    async def _handle(self, path: str, request: Request) -> Response:
        handlers = self._handlers
        if handlers is None:
            async with self._lock:
                if self._handlers is None:
                    self._handlers = await asyncio.to_thread(self._build)
                handlers = self._handlers
        return await handlers[path](request)

    def _build(self) -> dict[str, Handler]:
        from koordlet.server.ui import UiHandlers

        return dict(UiHandlers(self._deps, self._ui).routes())


def build_app(deps: ServerDeps, ui: UiDeps | None = None) -> App:
    """The application serving the routes of the module docstring; with ``ui``, also
    ``/debug/ui`` and the views it polls (:mod:`koordlet.server.ui`)."""
    renderer = FamilyRenderer(deps.exporter) if deps.exporter is not None else None
    limiters = Limiters(
        reads=RequestLimiter(deps.limits.reads), probes=RequestLimiter(deps.limits.probes)
    )
    exposition = Exposition(
        _Chain(deps.registry, limiters.families()),
        renderer,
        generation=deps.tick,
        max_age=deps.collect_interval,
    )
    app = App(middlewares=[_limit(limiters), _debug_guard(deps)])
    app[DEPS] = deps
    app[LIMITERS] = limiters
    app[EXPOSITION] = exposition
    ui_routes = _LazyUi(deps, ui).routes() if ui is not None else []
    debug = DebugHandlers(deps, extra=[path for path, _ in ui_routes])
    app.add_get("/metrics", _metrics(exposition))
    app.add_get("/healthz", _healthz)
    app.add_get("/readyz", _readyz(deps))
    app.add_get("/debug", debug.index)
    app.add_get("/debug/", debug.index)  # as README and --help write it
    for path, handler in [*debug.routes(), *ui_routes]:
        app.add_get(path, handler)
    return app


@frozen
class ServerHandle:
    """A started server; :meth:`stop` closes it."""

    server: HttpServer
    """The listening server (owns its connections)."""

    @property
    def addresses(self) -> list[Any]:
        """The bound socket addresses (``(host, port)`` for IPv4)."""
        return self.server.addresses

    @property
    def port(self) -> int:
        """The bound port (useful after binding port 0)."""
        port: int = self.addresses[0][1]
        return port

    async def stop(self) -> None:
        """Stop accepting, finish in-flight requests (up to the shutdown timeout), close."""
        await self.server.stop()


async def start_server(
    app: App,
    host: str,
    port: int,
    *,
    shutdown_timeout: float = 5.0,
    limits: HttpLimits | None = None,
) -> ServerHandle:
    """Serve ``app`` on ``host:port`` (port 0 picks a free one; ``""`` every interface) until
    ``stop()``; ``limits`` overrides the protocol's bounds (:class:`HttpLimits`).

    No access log: Prometheus scrapes and probes would fill it. Signals are the daemon's.
    """
    limits = limits or HttpLimits()
    server = HttpServer(app, dataclasses.replace(limits, shutdown_timeout=shutdown_timeout))
    await server.start(host, port)
    handle = ServerHandle(server)
    logger.info("serving /metrics, /healthz, /readyz and /debug on %s", handle.addresses)
    return handle
