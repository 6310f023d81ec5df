"""The daemon's server stage: the HTTP server (``/metrics``, the probes, ``/debug/*`` and the UI)
wired to the daemon's components, and the ``/debug`` views that gather from several of them
(capabilities, audit, QoS, runtime hooks).
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

from koordlet.collectors.nodeinfo import INFO_KEY as NODE_INFO_KEY
from koordlet.collectors.table import export_max_ages
from koordlet.config import config_as_dict
from koordlet.errors import ConfigError
from koordlet.server.app import ServerDeps, ServerLimits, build_app, start_server
from koordlet.server.exporter import KoordletExporter
from koordlet.server.limiter import LimitConfig
from koordlet.server.summary import UiDeps, thresholds_of

if TYPE_CHECKING:
    from koordlet.daemon import Daemon

SERVER_SHUTDOWN_TIMEOUT = 2.0
"""Seconds the HTTP server waits for in-flight requests when stopping."""


async def start_serving(daemon: Daemon) -> None:
    """Stage 7: the HTTP server on ``--addr``; a port it cannot bind is a configuration error."""
    cache = daemon.need(daemon.cache)
    server = daemon.cfg.server
    interval = daemon.cfg.collect.res_used_interval
    exporter = KoordletExporter(
        cache,
        daemon.snapshot,
        node_name=daemon.cfg.node_name,
        collect_interval=interval,
        max_ages=export_max_ages(daemon.collector_table, daemon.cfg.collect),
    )
    deps = ServerDeps(
        registry=daemon.registry,
        readiness=daemon.readiness,
        cache=cache,
        workloads=daemon.snapshot,
        capabilities=lambda: describe_capabilities(daemon),
        config=lambda: config_as_dict(daemon.cfg),
        tasks=lambda: [t for s in daemon._supervisors for t in s.describe()],
        audit=functools.partial(describe_audit, daemon),
        qos=lambda: describe_qos(daemon),
        runtimehooks=lambda: describe_runtimehooks(daemon),
        debug_allow_remote=server.debug_allow_remote,
        exporter=exporter,
        tick=lambda: daemon.collect_ticks,
        collect_interval=interval,
        health=daemon.health,
        degraded=daemon.state_files.problems if daemon.state_files is not None else None,
        limits=ServerLimits(
            reads=LimitConfig(
                max_in_flight=server.max_requests_in_flight, cpu_share=server.cpu_share
            )
        ),
    )
    ui = UiDeps(
        config=daemon.cfg,
        thresholds=thresholds_of(daemon.node_slo),
        node_info=lambda: cache.get_info(NODE_INFO_KEY),
        points=cache.points,
    )
    try:
        handle = await start_server(
            build_app(deps, ui),
            server.host,
            server.port,
            shutdown_timeout=SERVER_SHUTDOWN_TIMEOUT,
        )
    except OSError as err:
        why = os.strerror(err.errno).lower() if err.errno else str(err)
        raise ConfigError(f"cannot listen on {server.addr}: {why}", source="--addr") from err
    daemon.server = handle
    daemon.on_stop("server", lambda t: handle.stop())


def describe_capabilities(daemon: Daemon) -> dict[str, Any]:
    """``/debug/capabilities``: the start-up probe's verdicts, plus what was found
    unsupported while running: collector sources (``collector/<name>/<source>``) and
    refused pressure watches (``events/<watch>``), each with its reason; a capability lost
    since start (:class:`~koordlet.daemon.host.CapabilityWatch`) has ``"lost": true``."""
    out: dict[str, Any] = dict(daemon.need(daemon.capabilities).as_dict())
    if daemon.runner is not None:
        for key, reason in sorted(daemon.runner.unsupported.items()):
            out[f"collector/{key}"] = {"supported": False, "reason": reason, "runtime": True}
    if daemon.events is not None:
        for key, reason in sorted(daemon.events.unsupported.items()):
            out[f"events/{key}"] = {"supported": False, "reason": reason, "runtime": True}
    if daemon.runtime_hooks is not None:
        for key, reason in sorted(daemon.runtime_hooks.unsupported.items()):
            out[f"runtimehooks/{key}"] = {"supported": False, "reason": reason}
    if daemon.capability_watch is not None:
        for key, reason in sorted(daemon.capability_watch.lost().items()):
            out[key] = {"supported": False, "reason": f"lost since start: {reason}", "lost": True}
    return out


def describe_audit(
    daemon: Daemon, limit: int, strategy: str | None, kind: str | None
) -> dict[str, Any]:
    """``/debug/audit``: the most recent entries, newest first, and the log's counters."""
    audit = daemon.need(daemon.audit)
    entries = audit.recent(limit, strategy=strategy, kind=kind)
    return {"entries": [e.as_dict() for e in entries], "log": audit.stats()}


def describe_qos(daemon: Daemon) -> dict[str, Any]:
    """``/debug/qos``: the QoS manager's view, and the BE eviction condition's in cluster mode."""
    out = daemon.need(daemon.qos).describe()
    if daemon.eviction_condition is not None:
        out["be_eviction_condition"] = daemon.eviction_condition.describe()
    return out


def describe_runtimehooks(daemon: Daemon) -> dict[str, Any]:
    """``/debug/runtimehooks``."""
    hooks = daemon.runtime_hooks
    if hooks is None:
        return {"error": "the runtime hooks have not started"}
    return hooks.describe()
