"""An in-repo fake NRI runtime: the runtime side of NRI's protocol (containerd >= 1.7 is not
installable here), on a unix socket the test owns.

It accepts a plugin, serves ``Runtime.RegisterPlugin``/``UpdateContainers`` on multiplexed
connection 2, and once registered calls ``Configure`` and ``Synchronize`` on connection 1, as
containerd's NRI adaptation does; tests then send lifecycle events and read the plugin's answers.
:meth:`restart` drops the connection and the socket, as a runtime restart does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf.message import Message

from apis.nri.v1alpha1 import api_pb2 as nriapi
from koordlet.runtimehooks.nri import PLUGIN_SERVICE, RUNTIME_SERVICE
from koordlet.runtimehooks.ttrpc import (
    PLUGIN_SERVICE_CONN,
    RUNTIME_SERVICE_CONN,
    Mux,
    TtrpcClient,
    TtrpcServer,
)

M = TypeVar("M", bound=Message)


@dataclass
class Registration:
    """What a plugin registered and subscribed to."""

    name: str
    index: str
    events: int = 0
    synchronized: bool = False


@dataclass
class FakeNriRuntime:
    """The runtime; ``request_timeout`` (seconds) is what Configure tells the plugin."""

    path: str
    request_timeout: float = 2.0
    registrations: list[Registration] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _mux: Mux | None = None
    _client: TtrpcClient | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._ready = asyncio.Event()
        self._server = await asyncio.start_unix_server(self._accept, self.path)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        if self._mux is not None:
            await self._mux.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def wait_ready(self, within: float = 10.0) -> Registration:
        async with asyncio.timeout(within):
            await self._ready.wait()
        return self.registrations[-1]

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mux = Mux(reader, writer)
        self._mux = mux
        self._client = TtrpcClient(mux.open(PLUGIN_SERVICE_CONN))
        server = TtrpcServer(
            mux.open(RUNTIME_SERVICE_CONN),
            {
                (RUNTIME_SERVICE, "RegisterPlugin"): self._register,
                (RUNTIME_SERVICE, "UpdateContainers"): self._update_containers,
            },
        )
        self._spawn(mux.run(), "fake-nri-mux")
        self._spawn(server.run(), "fake-nri-runtime-service")
        self._spawn(self._client.run(), "fake-nri-plugin-client")

    async def _register(self, data: bytes) -> bytes:
        req = nriapi.RegisterPluginRequest.FromString(data)
        self.registrations.append(Registration(req.plugin_name, req.plugin_idx))
        self._spawn(self._configure(), "fake-nri-configure")
        return nriapi.Empty().SerializeToString()

    async def _update_containers(self, _data: bytes) -> bytes:
        return nriapi.UpdateContainersResponse().SerializeToString()

    async def _configure(self) -> None:
        reg = self.registrations[-1]
        cfg = nriapi.ConfigureRequest(
            runtime_name="fake-nri",
            runtime_version="v1",
            registration_timeout=5000,
            request_timeout=int(self.request_timeout * 1000),
        )
        resp = await self.call("Configure", cfg, nriapi.ConfigureResponse)
        reg.events = resp.events
        await self.call("Synchronize", nriapi.SynchronizeRequest(), nriapi.SynchronizeResponse)
        reg.synchronized = True
        self._ready.set()

    async def call(self, method: str, req: Message, resp_type: type[M]) -> M:
        assert self._client is not None, "no plugin connected"
        payload = await self._client.call(
            PLUGIN_SERVICE, method, req.SerializeToString(), self.request_timeout
        )
        return resp_type.FromString(payload)

    def subscribed(self, event: int) -> bool:
        return bool(self.registrations and self.registrations[-1].events & (1 << (event - 1)))
