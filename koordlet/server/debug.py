"""Read-only JSON views of the koordlet's state, for an operator on the node.

=========================  ====================================================================
``/debug``                 the list of endpoints
``/debug/capabilities``    what the start-up probe found supported, and why not
``/debug/config``          the effective configuration
``/debug/workloads``       pods (uid, name, namespace, QoS, kube QoS, cgroup, containers) and
                           host applications (QoS, cgroup, present)
``/debug/metrics``         latest value, timestamp and age of every series, by entity;
                           ``?entity=pod/<uid>`` keeps one entity
``/debug/query``           ``?metric=&entity=&window=300``: count, avg, p50, p90, p95, p99, last,
                           min, max over the last ``window`` seconds; 400 on bad parameters,
                           404 when the window holds no sample
``/debug/tasks``           the supervisor's tasks: state, runs, errors, last error
``/debug/audit``           the most recent audit entries, newest first: every change written,
                           every eviction, every dry-run decision; ``?limit=100`` (at most
                           1000), ``&strategy=<name>``, ``&kind=write|evict|decision``
``/debug/qos``             the QoS strategies: dry-run settings, rounds, errors, stale rounds,
                           each one's last inputs, decision and result; disabled ones and why
``/debug/runtimehooks``    the runtime hooks: by point, the hook server, NRI, the reconciler's
                           last round and node files (``TerwayQoS``), what is unsupported
=========================  ====================================================================

The server answers them to loopback peers only (unless configured otherwise):
:func:`is_loopback_peer` decides from the socket's peer address, never from a header.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from koordlet.server.http import Handler, Request, Response
from koordlet.statesinformer.model import WorkloadSnapshot

if TYPE_CHECKING:
    from koordlet.server.app import ServerDeps

DEFAULT_AUDIT_LIMIT = 100
"""Entries ``/debug/audit`` returns when ``limit`` is not given."""
MAX_AUDIT_LIMIT = 1000
"""The largest ``limit`` ``/debug/audit`` accepts."""
_AUDIT_PARAMS = frozenset({"limit", "strategy", "kind"})
_AUDIT_KINDS = ("write", "evict", "decision")
_STRATEGY_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
DEFAULT_QUERY_WINDOW = 300.0
"""Seconds aggregated by ``/debug/query`` when ``window`` is not given."""
_QUERY_PARAMS = frozenset({"metric", "entity", "window"})
_METRIC_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_:]{0,127}")
_ENTITY_RE = re.compile(r"[\w.:/@-]{1,256}")

_dumps = partial(json.dumps, default=str)


def is_loopback_peer(peername: object) -> bool:
    """True when a socket peer address (``transport.get_extra_info("peername")``) is loopback.

    Accepts ``127.0.0.0/8``, ``::1`` and IPv4-mapped loopback (``::ffff:127.0.0.1``, what a
    dual-stack socket reports). Anything else, including no address at all, is not loopback.
    """
    if not isinstance(peername, tuple | list) or not peername:
        return False
    host = peername[0]
    if not isinstance(host, str):
        return False
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])  # drop an IPv6 zone (fe80::1%eth0)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


def workloads_payload(snapshot: WorkloadSnapshot) -> dict[str, Any]:
    """The inventory snapshot as JSON-ready data, pods ordered by namespace and name."""
    pods = sorted(snapshot.pods.values(), key=lambda p: (p.namespace, p.name, p.uid))
    return {
        "generation": snapshot.generation,
        "taken_at": snapshot.taken_at,
        "pods": [
            {
                "uid": p.uid,
                "name": p.name,
                "namespace": p.namespace,
                "qos": str(p.qos),
                "kube_qos": str(p.kube_qos),
                "priority_class": p.priority_class,
                "cgroup_dir": p.cgroup_dir,
                "cpu_request_milli": p.cpu_request_milli,
                "memory_request_bytes": p.memory_request_bytes,
                "source": p.source,
                "containers": [
                    {"id": c.id, "name": c.name, "runtime": c.runtime, "cgroup_dir": c.cgroup_dir}
                    for c in p.containers
                ],
            }
            for p in pods
        ],
        "host_apps": [
            {
                "name": a.name,
                "qos": str(a.qos),
                "priority_class": a.priority_class,
                "cgroup_dir": a.cgroup_dir,
                "present": a.present,
            }
            for a in snapshot.host_apps
        ],
    }


def parse_query(pairs: Iterable[tuple[str, str]], max_window: float) -> tuple[str, str, float]:
    """``(metric, entity, window)`` from ``/debug/query``'s parameters, as sent (repeats kept).

    Raises ``ValueError`` with a message for the client on a missing, repeated, unknown or
    malformed parameter.
    """
    sent = list(pairs)
    names = [k for k, _ in sent]
    unknown = sorted(set(names) - _QUERY_PARAMS)
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown}; expected metric, entity, window")
    repeated = sorted({k for k in names if names.count(k) > 1})
    if repeated:
        raise ValueError(f"parameter(s) {repeated} given more than once")
    params = dict(sent)
    metric = params.get("metric", "")
    if not _METRIC_RE.fullmatch(metric):
        raise ValueError(f"metric must be a series name such as pod_cpu_usage, got {metric!r}")
    entity = params.get("entity", "")
    if not _ENTITY_RE.fullmatch(entity):
        raise ValueError(
            "entity must be an entity id (node, system, be, pod/<uid>, container/<uid>/<id>),"
            f" got {entity!r}"
        )
    raw = params.get("window", "")
    if not raw:
        return metric, entity, DEFAULT_QUERY_WINDOW
    try:
        window = float(raw)
    except ValueError:
        raise ValueError(f"window must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(window) or not 0 < window <= max_window:
        raise ValueError(f"window must be in (0, {max_window:g}] seconds, got {raw!r}")
    return metric, entity, window


def parse_audit_query(pairs: Iterable[tuple[str, str]]) -> tuple[int, str | None, str | None]:
    """``(limit, strategy, kind)`` from ``/debug/audit``'s parameters; ``ValueError`` with a
    message for the client on an unknown, repeated or malformed one."""
    sent = list(pairs)
    names = [k for k, _ in sent]
    unknown = sorted(set(names) - _AUDIT_PARAMS)
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown}; expected limit, strategy, kind")
    repeated = sorted({k for k in names if names.count(k) > 1})
    if repeated:
        raise ValueError(f"parameter(s) {repeated} given more than once")
    params = dict(sent)
    raw = params.get("limit", "")
    limit = DEFAULT_AUDIT_LIMIT
    if raw:
        if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_AUDIT_LIMIT:
            raise ValueError(f"limit must be a whole number in 1..{MAX_AUDIT_LIMIT}, got {raw!r}")
        limit = int(raw)
    strategy = params.get("strategy")
    if strategy is not None and not _STRATEGY_RE.fullmatch(strategy):
        raise ValueError(f"strategy must be a strategy table name, got {strategy!r}")
    kind = params.get("kind")
    if kind is not None and kind not in _AUDIT_KINDS:
        raise ValueError(f"kind must be one of {', '.join(_AUDIT_KINDS)}, got {kind!r}")
    return limit, strategy, kind


def _finite(value: float) -> float | None:
    """JSON has no NaN or infinity: they become null."""
    return value if math.isfinite(value) else None


def json_response(data: Any, status: int = 200) -> Response:
    """``data`` as JSON (``application/json; charset=utf-8``); what is not JSON becomes its
    ``str``."""
    body = _dumps(data).encode()
    return Response(status, body, {"Content-Type": "application/json; charset=utf-8"})


_json = json_response


def _json_bytes(body: bytes) -> Response:
    return Response(200, body, {"Content-Type": "application/json"})


class DebugHandlers:
    """The ``/debug`` request handlers over the server's dependencies."""

    def __init__(self, deps: ServerDeps, extra: Sequence[str] = ()) -> None:
        self._deps = deps
        self._extra = tuple(extra)  # further /debug paths the index lists (the UI's)
        self._workloads: tuple[WorkloadSnapshot, bytes] | None = None
        self._metrics: tuple[object, float, bytes] | None = None

    def routes(self) -> list[tuple[str, Handler]]:
        """``(path, handler)`` of every ``/debug/...`` endpoint."""
        return [
            ("/debug/capabilities", self.capabilities),
            ("/debug/config", self.config),
            ("/debug/workloads", self.workloads),
            ("/debug/metrics", self.metrics),
            ("/debug/query", self.query),
            ("/debug/tasks", self.tasks),
            ("/debug/audit", self.audit),
            ("/debug/qos", self.qos),
            ("/debug/runtimehooks", self.runtimehooks),
        ]

    async def index(self, request: Request) -> Response:
        return _json({"endpoints": [*(path for path, _ in self.routes()), *self._extra]})

    async def capabilities(self, request: Request) -> Response:
        return _json(dict(self._deps.capabilities()))

    async def config(self, request: Request) -> Response:
        return _json(dict(self._deps.config()))

    async def workloads(self, request: Request) -> Response:
        # Served from the bytes of the current snapshot (immutable, replaced whole on a change).
        snapshot = self._deps.workloads()
        cached = self._workloads
        if cached is None or cached[0] is not snapshot:
            cached = self._workloads = (snapshot, _dumps(workloads_payload(snapshot)).encode())
        return _json_bytes(cached[1])

    async def tasks(self, request: Request) -> Response:
        return _json({"tasks": [dict(t) for t in self._deps.tasks()]})

    async def audit(self, request: Request) -> Response:
        source = self._deps.audit
        if source is None:
            return _json({"error": "this koordlet has no audit log"}, 404)
        try:
            limit, strategy, kind = parse_audit_query(request.query)
        except ValueError as err:
            return _json({"error": str(err)}, 400)
        return _json(dict(source(limit, strategy, kind)))

    async def qos(self, request: Request) -> Response:
        source = self._deps.qos
        if source is None:
            return _json({"error": "this koordlet runs no QoS manager"}, 404)
        return _json(dict(source()))

    async def runtimehooks(self, request: Request) -> Response:
        source = self._deps.runtimehooks
        if source is None:
            return _json({"error": "this koordlet runs no runtime hooks"}, 404)
        return _json(dict(source()))

    async def metrics(self, request: Request) -> Response:
        deps = self._deps
        only = request.param("entity")
        if only is not None and not _ENTITY_RE.fullmatch(only):
            return _json({"error": "entity must be an entity id such as pod/<uid>"}, 400)
        if only is not None:
            return _json(self._metrics_view(only))
        # The full view (every series) is built once per collection tick, or once an interval.
        tick, now = deps.tick(), deps.clock()
        cached = self._metrics
        if cached is None or cached[0] != tick or now - cached[1] >= deps.collect_interval:
            cached = self._metrics = (tick, now, _dumps(self._metrics_view(None)).encode())
        return _json_bytes(cached[2])

    def _metrics_view(self, only: str | None) -> dict[str, Any]:
        deps = self._deps
        now = deps.clock()
        by_entity: dict[str, dict[str, Any]] = {}
        for metric in deps.metric_names:
            for entity in (only,) if only else deps.cache.entities(metric):
                sample = deps.cache.last_sample(metric, entity)
                if sample is None:
                    continue
                ts, value = sample
                by_entity.setdefault(entity, {})[metric] = {
                    "value": _finite(value),
                    "ts": ts,
                    "age_s": round(now - ts, 3),
                }
        return {
            "now": now,
            "entities": {e: by_entity[e] for e in sorted(by_entity)},
            "cache": dict(deps.cache.stats()),
        }

    async def query(self, request: Request) -> Response:
        deps = self._deps
        try:
            metric, entity, window = parse_query(request.query, deps.max_query_window)
        except ValueError as err:
            return _json({"error": str(err)}, 400)
        end = deps.clock()
        start = end - window
        agg = deps.cache.aggregate(metric, entity, start, end)
        if agg is None or agg.count == 0:
            return _json(
                {
                    "error": f"no samples of {metric} for {entity} in the last {window:g}s",
                    "known_metrics": list(deps.metric_names),
                },
                404,
            )
        return _json(
            {
                "metric": metric,
                "entity": entity,
                "window": window,
                "start": start,
                "end": end,
                "count": agg.count,
                "avg": _finite(agg.avg),
                "p50": _finite(agg.p50),
                "p90": _finite(agg.p90),
                "p95": _finite(agg.p95),
                "p99": _finite(agg.p99),
                "last": _finite(agg.last),
                "min": _finite(agg.min),
                "max": _finite(agg.max),
                "first_ts": agg.first_ts,
                "last_ts": agg.last_ts,
            }
        )
