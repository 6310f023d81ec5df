"""The proxy's client of the koordlet's hook server (Koordinator's
``runtime.v1alpha1.RuntimeHookService``), failing open.

Where the hook servers are: ``--runtime-hook-server-endpoint`` if given (every stage), else the
files of ``--runtime-hooks-config-dir`` (``/etc/runtime/hookserver.d/*.json``, each
``{"remote-endpoint", "failure-policy", "runtime-hooks"}`` as the koordlet writes
``koordlet.json``; upstream ``pkg/runtimeproxy/config``), re-read when they change. Every call
is bounded by ``--runtime-hook-timeout``; a hook server that is down, slow or failing leaves the
CRI call unchanged (counted in ``koord_runtime_proxy_hook_fail_open_total``). Connections
reconnect by themselves, within about a second of the koordlet coming back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from typing import TypeVar

import grpc
from google.protobuf.message import Message
from prometheus_client import CollectorRegistry, Counter

from runtimeproxy.errors import ConfigError

logger = logging.getLogger(__name__)

SERVICE = "/runtime.v1alpha1.RuntimeHookService/"
"""Method path prefix of the hook service."""
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
"""Redial a koordlet that went away at most a second apart (gRPC's default backs off to 2 min)."""

R = TypeVar("R", bound=Message)


@dataclass(frozen=True, slots=True)
class HookServerEntry:
    """One hook server and the stages it serves (None: every stage)."""

    endpoint: str
    """Its unix socket."""
    stages: frozenset[str] | None
    """Koordinator's stage names (``PreCreateContainer``...) it wants."""
    source: str
    """The flag or file it came from."""


def parse_hook_server_file(path: str, text: str) -> HookServerEntry:
    """One hook-server file; ConfigError naming the file and field when malformed."""
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise ConfigError(f"not JSON: {err}", source=path) from err
    if not isinstance(doc, dict):
        raise ConfigError("must be a JSON object", source=path)
    endpoint = doc.get("remote-endpoint")
    if not isinstance(endpoint, str) or not endpoint:
        raise ConfigError("must be a socket path", source=path, field="remote-endpoint")
    stages = doc.get("runtime-hooks", [])
    if not isinstance(stages, list) or not all(isinstance(s, str) for s in stages):
        raise ConfigError("must be a list of stage names", source=path, field="runtime-hooks")
    policy = doc.get("failure-policy", "Ignore")
    if policy not in ("Ignore", "Fail", ""):
        raise ConfigError(
            f"must be Ignore or Fail, got {policy!r}", source=path, field="failure-policy"
        )
    if policy == "Fail":
        logger.warning("%s: failure-policy Fail is not honoured: hooks always fail open", path)
    return HookServerEntry(endpoint.removeprefix("unix://"), frozenset(stages), path)


def read_hook_server_dir(folder: str) -> list[HookServerEntry]:
    """Every valid file of ``folder`` (sorted); a bad file is logged and skipped."""
    out: list[HookServerEntry] = []
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    except FileNotFoundError:
        return out
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                out.append(parse_hook_server_file(path, f.read()))
        except (OSError, ConfigError) as err:
            logger.warning("hook-server file skipped: %s", err)
    return out


class HookClient:
    """Calls the hook servers; see the module docstring."""

    def __init__(
        self,
        *,
        endpoint: str = "",
        config_dir: str = "",
        budget: float = 2.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.config_dir = config_dir
        self.budget = budget
        self._servers: list[HookServerEntry] = (
            [HookServerEntry(endpoint, None, "--runtime-hook-server-endpoint")] if endpoint else []
        )
        self._dir_stamp: tuple[tuple[str, float], ...] | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._down: set[str] = set()
        self.calls = Counter(
            "koord_runtime_proxy_hook_calls",
            "Hook server calls, by stage and result (ok, fail_open, no_server).",
            ("stage", "result"),
            registry=registry,
        )
        self.fail_open = Counter(
            "koord_runtime_proxy_hook_fail_open",
            "CRI calls that went on unchanged because the hook server failed, by reason.",
            ("stage", "reason"),
            registry=registry,
        )

    async def refresh(self) -> None:
        """Re-read the hook-server folder if its files changed (off the event loop)."""
        if self.endpoint or not self.config_dir:
            return
        stamp = await asyncio.to_thread(_dir_stamp, self.config_dir)
        if stamp == self._dir_stamp:
            return
        self._dir_stamp = stamp
        servers = await asyncio.to_thread(read_hook_server_dir, self.config_dir)
        if servers != self._servers:
            logger.info(
                "hook servers: %s",
                ", ".join(f"{s.endpoint} ({s.source})" for s in servers) or "none",
            )
        self._servers = servers

    def server_for(self, stage: str) -> HookServerEntry | None:
        """The first hook server that serves ``stage``."""
        for server in self._servers:
            if server.stages is None or stage in server.stages:
                return server
        return None

    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        channel = self._channels.get(endpoint)
        if channel is None:
            channel = grpc.aio.insecure_channel(f"unix://{endpoint}", options=CHANNEL_OPTIONS)
            self._channels[endpoint] = channel
        return channel

    async def call(self, stage: str, method: str, req: Message, resp_type: type[R]) -> R | None:
        """The hook server's answer, or None (no server for the stage, or it failed: the CRI
        call goes on unchanged)."""
        server = self.server_for(stage)
        if server is None:
            self.calls.labels(stage, "no_server").inc()
            return None
        stub = self._channel(server.endpoint).unary_unary(
            SERVICE + method,
            request_serializer=type(req).SerializeToString,
            response_deserializer=resp_type.FromString,
        )
        try:
            resp: R = await stub(req, timeout=self.budget)
        except grpc.aio.AioRpcError as err:
            reason = err.code().name.lower()
            self._failed(server.endpoint, stage, reason, err.details() or "")
            return None
        except Exception as err:  # never let the hook server fail the CRI call
            self._failed(server.endpoint, stage, "error", repr(err))
            return None
        if server.endpoint in self._down:
            self._down.discard(server.endpoint)
            logger.info("hook server %s answers again", server.endpoint)
        self.calls.labels(stage, "ok").inc()
        return resp

    def _failed(self, endpoint: str, stage: str, reason: str, details: str) -> None:
        self.calls.labels(stage, "fail_open").inc()
        self.fail_open.labels(stage, reason).inc()
        if endpoint not in self._down:
            self._down.add(endpoint)
            logger.warning(
                "hook server %s failed at %s (%s: %s); CRI calls go on unchanged until it answers",
                endpoint,
                stage,
                reason,
                details,
            )
        else:
            logger.debug("hook server %s failed at %s (%s)", endpoint, stage, reason)

    async def close(self) -> None:
        """Close the connections."""
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()


def _dir_stamp(folder: str) -> tuple[tuple[str, float], ...]:
    try:
        return tuple(
            sorted(
                (e.name, e.stat().st_mtime) for e in os.scandir(folder) if e.name.endswith(".json")
            )
        )
    except FileNotFoundError:
        return ()
