"""The proxy's client of the koordlet's hook server (Koordinator's
``runtime.v1alpha1.RuntimeHookService``), failing open.

Where the hook servers are: ``--runtime-hook-server-endpoint`` if given (every stage), else the
files of ``--runtime-hooks-config-dir`` (``/etc/runtime/hookserver.d/*.json``, each
``{"remote-endpoint", "failure-policy", "runtime-hooks"}`` as the koordlet writes
``koordlet.json``; upstream ``pkg/runtimeproxy/config``), re-read when they change. Every call
is bounded by ``--runtime-hook-timeout``; a hook server that is down, slow or failing leaves the
CRI call unchanged (counted in ``koord_runtime_proxy_hook_fail_open_total``). A connection
that broke is dialled again by the next call, so a koordlet that comes back is used at once.

The calls speak gRPC through grpclib (pure Python over h2: about 2.4 MiB of resident memory
against grpcio's 16.6, issue 26). The counters are kept here and exported through
prometheus-client only when a registry is given (``--metrics-addr``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from google.protobuf.message import Message
from grpclib.client import Channel, UnaryUnaryMethod
from grpclib.exceptions import GRPCError, StreamTerminatedError

from apis.records import frozen
from runtimeproxy.errors import ConfigError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

logger = logging.getLogger(__name__)

SERVICE = "/runtime.v1alpha1.RuntimeHookService/"
"""Method path prefix of the hook service."""

R = TypeVar("R", bound=Message)


@frozen
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
        self._channels: dict[str, Channel] = {}
        self._down: set[str] = set()
        self.calls: Counter[tuple[str, str]] = Counter()
        """(stage, result) -> hook server calls; result ``ok``, ``fail_open`` or ``no_server``."""
        self.fail_open: Counter[tuple[str, str]] = Counter()
        """(stage, reason) -> CRI calls that went on unchanged because the hook server failed."""
        if registry is not None:
            registry.register(_HookCounters(self))

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

    def _channel(self, endpoint: str) -> Channel:
        channel = self._channels.get(endpoint)
        if channel is None:
            channel = Channel(path=endpoint)
            self._channels[endpoint] = channel
        return channel

    async def call(self, stage: str, method: str, req: Message, resp_type: type[R]) -> R | None:
        """The hook server's answer, or None (no server for the stage, or it failed: the CRI
        call goes on unchanged)."""
        server = self.server_for(stage)
        if server is None:
            self.calls[stage, "no_server"] += 1
            return None
        stub = UnaryUnaryMethod(
            self._channel(server.endpoint), SERVICE + method, type(req), resp_type
        )
        try:
            resp: R = await stub(req, timeout=self.budget)
        except GRPCError as err:
            self._failed(server.endpoint, stage, err.status.name.lower(), err.message or "")
            return None
        except TimeoutError as err:
            self._failed(server.endpoint, stage, "deadline_exceeded", repr(err))
            return None
        except (OSError, StreamTerminatedError) as err:  # nothing listens, or it went away
            self._failed(server.endpoint, stage, "unavailable", repr(err))
            return None
        except Exception as err:  # never let the hook server fail the CRI call
            self._failed(server.endpoint, stage, "error", repr(err))
            return None
        if server.endpoint in self._down:
            self._down.discard(server.endpoint)
            logger.info("hook server %s answers again", server.endpoint)
        self.calls[stage, "ok"] += 1
        return resp

    def _failed(self, endpoint: str, stage: str, reason: str, details: str) -> None:
        self.calls[stage, "fail_open"] += 1
        self.fail_open[stage, reason] += 1
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
            channel.close()


class _HookCounters:
    """The hook client's counters as prometheus-client families (a registry's collector)."""

    def __init__(self, client: HookClient, clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self._clock = clock
        self._created: dict[tuple[str, str, str], float] = {}
        """When each series was first seen: its ``_created`` sample, as a prometheus-client
        ``Counter`` child writes it."""

    def _since(self, family: str, labels: tuple[str, str]) -> float:
        return self._created.setdefault((family, *labels), self._clock())

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import CounterMetricFamily

        calls = CounterMetricFamily(
            "koord_runtime_proxy_hook_calls",
            "Hook server calls, by stage and result (ok, fail_open, no_server).",
            labels=("stage", "result"),
        )
        for labels, value in sorted(self._client.calls.items()):
            calls.add_metric(labels, value, created=self._since("calls", labels))
        fail_open = CounterMetricFamily(
            "koord_runtime_proxy_hook_fail_open",
            "CRI calls that went on unchanged because the hook server failed, by reason.",
            labels=("stage", "reason"),
        )
        for labels, value in sorted(self._client.fail_open.items()):
            fail_open.add_metric(labels, value, created=self._since("fail_open", labels))
        yield calls
        yield fail_open


def _dir_stamp(folder: str) -> tuple[tuple[str, float], ...]:
    try:
        return tuple(
            sorted(
                (e.name, e.stat().st_mtime) for e in os.scandir(folder) if e.name.endswith(".json")
            )
        )
    except FileNotFoundError:
        return ()
