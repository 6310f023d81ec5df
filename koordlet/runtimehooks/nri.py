"""The NRI plugin mode: the koordlet registers with containerd >= 1.7 or CRI-O over the runtime's
NRI socket and answers its container lifecycle events with adjustments.

Protocol (containerd/nri ``pkg/stub``, ``pkg/api`` v1alpha1): connect to the socket, multiplex
it (:mod:`.ttrpc`), serve the ``Plugin`` service on connection 1, call
``Runtime.RegisterPlugin(name, index)`` on connection 2, then the runtime calls ``Configure``
(the plugin answers with the events it subscribes to, one bit ``1 << (event - 1)`` each) and
``Synchronize`` (the pods and containers it has; nothing to adjust here), and from then on the
events. Upstream's koordlet plugin: ``pkg/koordlet/runtimehooks/nri/server.go``.

Events and points: ``RUN_POD_SANDBOX`` (a state change) -> ``PreRunPodSandbox`` (pod-level
cgroups written by the framework), ``CreateContainer`` -> ``PreCreateContainer`` (a
``ContainerAdjustment`` the runtime applies at creation), ``UpdateContainer`` ->
``PreUpdateContainerResources`` (a ``ContainerUpdate``), ``START_CONTAINER`` ->
``PreStartContainer``, ``StopContainer`` -> ``PostStopContainer``, ``STOP_POD_SANDBOX`` ->
``PostStopPodSandbox``. Only the events of points that have hooks are subscribed.

Never blocking: each answer is bounded by the smaller of the dispatcher's timeout and half the
runtime's request timeout (from ``Configure``); past it the answer is empty (the container is
created unchanged) and ``koordlet_runtime_hook_fail_open_total{mode="nri"}`` counts it. A lost
connection (the runtime restarted) is redialled with exponential backoff.

This module is the plugin's loop and state; the messages and the handlers of a session are in
:mod:`.nrisession`, imported on the first connection (with the protobuf runtime: about 2 MiB
resident that a node whose runtime serves no NRI does not pay).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from apis.records import frozen
from koordlet.runtimehooks.errors import ProtocolError, TtrpcError
from koordlet.runtimehooks.framework import HookDispatcher

logger = logging.getLogger(__name__)

RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
"""The runtime's ttrpc service (the plugin calls it)."""
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
"""The plugin's ttrpc service (the runtime calls it)."""
MODE = "nri"
"""The ``mode`` label of this mode's metrics and audit entries."""
DEFAULT_REQUEST_TIMEOUT = 2.0
"""NRI's default request timeout, until ``Configure`` says otherwise."""


# The plugin -------------------------------------------------------------------------------------


@frozen
class NriOptions:
    """Where the runtime is and how to register; from ``--runtime-hooks-nri-*``."""

    socket: str
    """The runtime's NRI socket."""
    plugin_name: str = "koordlet_nri"
    """Registered name."""
    plugin_index: str = "00"
    """Registered index."""
    connect_timeout: float = 6.0
    """Seconds to connect, register and be configured."""
    backoff_duration: float = 1.0
    """First reconnect delay, seconds."""
    backoff_factor: float = 2.0
    """Delay multiplier."""
    backoff_cap: float = 30.0
    """Longest delay, seconds."""


class NriPlugin:
    """The plugin; :meth:`run` is its eternal loop (connect, serve, redial)."""

    def __init__(self, dispatcher: HookDispatcher, options: NriOptions) -> None:
        self.dispatcher = dispatcher
        self.options = options
        self.connected = False
        """Registered, configured and serving."""
        self.sessions = 0
        """Sessions that got configured (reconnects included)."""
        self.last_error = ""
        """Why the last attempt ended."""
        self.runtime = ""
        """``name version`` of the runtime, from Configure."""
        self.request_timeout = DEFAULT_REQUEST_TIMEOUT
        self.configured = asyncio.Event()
        """Set by the session's ``Configure`` handler."""
        self._was_configured = False
        self._warned_absent = False

    def describe(self) -> dict[str, Any]:
        """JSON-ready state for ``/debug``."""
        return {
            "socket": self.options.socket,
            "connected": self.connected,
            "sessions": self.sessions,
            "runtime": self.runtime,
            "request_timeout_seconds": self.request_timeout,
            "last_error": self.last_error,
        }

    async def run(self) -> None:
        """Connect and serve; after each lost connection or failed attempt wait, then redial."""
        delay = self.options.backoff_duration
        while True:
            try:
                await self._session()
            except FileNotFoundError:
                self.last_error = f"{self.options.socket} absent"
                if not self._warned_absent:
                    self._warned_absent = True
                    logger.warning(
                        "NRI socket %s absent: the runtime does not serve NRI (containerd < 1.7 "
                        "or NRI disabled); retrying in the background",
                        self.options.socket,
                    )
            except (OSError, TimeoutError, TtrpcError, ProtocolError, ConnectionError) as err:
                self.last_error = f"{type(err).__name__}: {err}"
                logger.warning("NRI: %s; redialling in %.1fs", self.last_error, delay)
            finally:
                self.connected = False
            if self.last_error == "" or self._was_configured:
                delay = self.options.backoff_duration
            await asyncio.sleep(delay)
            delay = min(delay * self.options.backoff_factor, self.options.backoff_cap)

    async def _session(self) -> None:
        self._was_configured = False
        self.configured.clear()
        async with asyncio.timeout(self.options.connect_timeout):
            reader, writer = await asyncio.open_unix_connection(self.options.socket)
        # The messages and the protobuf runtime, on the first connection (:mod:`.nrisession`).
        from koordlet.runtimehooks import nrisession

        await nrisession.serve(self, reader, writer)

    def session_started(self) -> None:
        """Registered and configured: the session serves from now on."""
        self._was_configured = True
        self.connected = True
        self.sessions += 1
        self.last_error = ""
        self._warned_absent = False
