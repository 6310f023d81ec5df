"""The proxy: a CRI gRPC server on its own socket that forwards every RuntimeService and
ImageService call to the runtime, consulting the koordlet's hook server on the way.

Every method is forwarded as raw bytes by one generic handler (unary, or server-streaming for
the streaming methods of ``runtime.v1``), so the proxy needs no definition of a message it does
not look into, and the runtime's status reaches the kubelet unchanged. gRPC is grpclib's (pure
Python over h2, both the server and the clients): the proxy sits on every node, and grpcio's
core cost it 16.6 of its 49 MiB resident (issue 26; docs/runtimehooks.md). Intercepted
(``runtime.v1.RuntimeService``): ``RunPodSandbox`` and ``CreateContainer`` (the hook server's
answer merged into the request before it goes on), ``UpdateContainerResources`` (likewise),
``StartContainer`` (asked before, told after), ``StopContainer`` and ``StopPodSandbox`` (told
after), ``RemoveContainer`` and ``RemovePodSandbox`` (forgotten). Hook calls never fail a CRI
call (:mod:`runtimeproxy.hookclient`). ``runtime.v1alpha2`` calls are forwarded unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from google.protobuf.message import Message
from grpclib.client import Channel
from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.metadata import Deadline
from grpclib.protocol import H2Protocol
from grpclib.server import Server, Stream

from apis.cri.v1 import api_pb2 as cri
from apis.records import frozen
from apis.runtime.v1alpha1 import api_pb2 as hookapi
from runtimeproxy import convert
from runtimeproxy.hookclient import HookClient
from runtimeproxy.store import Store

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

logger = logging.getLogger(__name__)

RUNTIME = "/runtime.v1.RuntimeService/"
IMAGE_PREFIXES = ("/runtime.v1.ImageService/", "/runtime.v1alpha2.ImageService/")
STREAMING = frozenset(
    {
        RUNTIME + "GetContainerEvents",
        RUNTIME + "StreamPodSandboxes",
        RUNTIME + "StreamContainers",
        RUNTIME + "StreamContainerStats",
        RUNTIME + "StreamPodSandboxStats",
        RUNTIME + "StreamPodSandboxMetrics",
        "/runtime.v1.ImageService/StreamImages",
        "/runtime.v1alpha2.RuntimeService/GetContainerEvents",
    }
)
"""Server-streaming CRI methods; every other method is forwarded as unary."""
REFRESH_INTERVAL = 5.0
"""Seconds between looks at the hook-server folder."""
CALL_TIMEOUT = 10.0
"""Seconds the proxy's own calls to the runtime (the recovery at start) may take."""

Unary = Callable[[bytes, Deadline | None], Awaitable[bytes]]
"""An intercept: the request's bytes and the kubelet's deadline in, the answer's bytes out."""


class RawCodec(CodecBase):
    """Messages as the bytes on the wire: the proxy forwards what it does not look into."""

    __content_subtype__ = "proto"  # accepts ``application/grpc`` and ``application/grpc+proto``

    def encode(self, message: Any, message_type: Any) -> bytes:
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


class _Methods(dict[str, Handler]):
    """The server's method table: every path, an intercept or plain forwarding (grpclib looks a
    method up with ``get``; the kubelet may call a method newer than this proxy's CRI copy)."""

    def __init__(self, proxy: RuntimeProxy) -> None:
        super().__init__()
        self._proxy = proxy

    def get(self, path: str, default: Any = None) -> Handler:
        handler = super().get(path)
        if handler is None:
            handler = self._proxy.handler_for(path)
            self[path] = handler
        return handler


class _ProxyServer(Server):
    """grpclib's server with two changes, on its private hooks (grpclib 0.4, pinned in
    requirements/lock.txt; tests/runtimehooks/test_proxy.py covers both): every method path is
    answered (:class:`_Methods` replaces the table it copies its handlers' methods into), and
    the connections it accepted are closed at stop (it closes its listener and cancels the
    calls, but leaves a client's connection open until the client closes it)."""

    def __init__(self, proxy: RuntimeProxy, codec: CodecBase) -> None:
        super().__init__([], codec=codec)
        self._mapping = _Methods(proxy)
        self._protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        self._protocols.add(protocol)
        return protocol

    def close_connections(self) -> None:
        for protocol in list(self._protocols):
            if hasattr(protocol, "processor"):  # connected
                protocol.processor.close("koord-runtime-proxy stopping")


@frozen
class ProxyConfig:
    """What koord-runtime-proxy is started with (runtimeproxy.cli)."""

    listen: str = "/var/run/koord-runtimeproxy/runtimeproxy.sock"
    """The proxy's socket, which the kubelet's ``--container-runtime-endpoint`` names;
    Koordinator's ``--koord-runtimeproxy-endpoint``."""
    runtime_endpoint: str = "/var/run/containerd/containerd.sock"
    """The runtime's CRI socket; Koordinator's ``--remote-runtime-service-endpoint``."""
    image_endpoint: str = "/var/run/containerd/containerd.sock"
    """The runtime's image service socket; Koordinator's ``--remote-image-service-endpoint``."""
    hook_endpoint: str = ""
    """The koordlet's hook socket for every stage; empty: read ``hook_config_dir``;
    ``--runtime-hook-server-endpoint``, ours."""
    hook_config_dir: str = "/etc/runtime/hookserver.d"
    """Where hook servers register (``koordlet.json``); upstream's default folder."""
    hook_timeout: float = 2.0
    """Seconds a hook call may take before the CRI call goes on unchanged;
    ``--runtime-hook-timeout``, ours."""


class RuntimeProxy:
    """The server and its clients; :meth:`start` and :meth:`stop` on the event loop."""

    def __init__(self, cfg: ProxyConfig, registry: CollectorRegistry | None = None) -> None:
        """``registry``: where the hook client's counters are registered (None: not kept for
        an exposition; prometheus-client is then not loaded)."""
        self.cfg = cfg
        self.hooks = HookClient(
            endpoint=cfg.hook_endpoint,
            config_dir=cfg.hook_config_dir,
            budget=cfg.hook_timeout,
            registry=registry,
        )
        self.store = Store()
        self._runtime: Channel | None = None
        self._image: Channel | None = None
        self._server: _ProxyServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._intercepts: dict[str, Unary] = {
            RUNTIME + "RunPodSandbox": self._run_pod_sandbox,
            RUNTIME + "CreateContainer": self._create_container,
            RUNTIME + "StartContainer": self._start_container,
            RUNTIME + "UpdateContainerResources": self._update_container_resources,
            RUNTIME + "StopContainer": self._stop_container,
            RUNTIME + "RemoveContainer": self._remove_container,
            RUNTIME + "StopPodSandbox": self._stop_pod_sandbox,
            RUNTIME + "RemovePodSandbox": self._remove_pod_sandbox,
        }

    # Lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover the store from the runtime (best effort), then listen."""
        codec = RawCodec()
        self._runtime = Channel(path=self.cfg.runtime_endpoint, codec=codec)
        self._image = (
            self._runtime
            if self.cfg.image_endpoint == self.cfg.runtime_endpoint
            else Channel(path=self.cfg.image_endpoint, codec=codec)
        )
        await self._recover()
        await self.hooks.refresh()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.cfg.listen)
        server = _ProxyServer(self, codec)
        await server.start(path=self.cfg.listen)
        self._server = server
        self._spawn(self._refresh_loop(), "hook-servers-refresh")
        logger.info(
            "koord-runtime-proxy on %s -> %s (images: %s)",
            self.cfg.listen,
            self.cfg.runtime_endpoint,
            self.cfg.image_endpoint,
        )

    async def stop(self, grace: float = 2.0) -> None:
        """Stop (calls in flight get ``grace`` seconds, then are cancelled) and close the
        clients."""
        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace)
            server.close()
            server.close_connections()
            await server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.hooks.close()
        for channel in {id(c): c for c in (self._runtime, self._image) if c is not None}.values():
            channel.close()
        self._runtime = self._image = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.cfg.listen)

    async def _recover(self) -> None:
        try:
            pods = await self._call(
                RUNTIME + "ListPodSandbox", cri.ListPodSandboxRequest(), cri.ListPodSandboxResponse
            )
            containers = await self._call(
                RUNTIME + "ListContainers", cri.ListContainersRequest(), cri.ListContainersResponse
            )
        except GRPCError as err:
            logger.warning("runtime not answering at start (%s): nothing recovered", err.message)
            return
        self.store.recover(pods, containers)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_INTERVAL)
            try:
                await self.hooks.refresh()
            except OSError as err:
                logger.warning(
                    "hook-server folder %s unreadable: %s", self.cfg.hook_config_dir, err
                )

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # Forwarding -----------------------------------------------------------------------------

    def handler_for(self, method: str) -> Handler:
        """The server's handler of ``method``: streaming, intercepted or forwarded."""
        if method in STREAMING:

            async def stream(call: Stream[bytes, bytes]) -> None:
                await self._serve(call, self._forward_stream(method, call))

            return Handler(stream, Cardinality.UNARY_STREAM, None, None)
        intercept = self._intercepts.get(method)
        if intercept is None:

            async def forward(data: bytes, deadline: Deadline | None) -> bytes:
                return await self.forward(method, data, deadline)

            intercept = forward
        unary_fn = intercept

        async def unary(call: Stream[bytes, bytes]) -> None:
            async def answer() -> None:
                data = await call.recv_message()
                await call.send_message(await unary_fn(data or b"", call.deadline))

            await self._serve(call, answer())

        return Handler(unary, Cardinality.UNARY_UNARY, None, None)

    async def _serve(self, call: Stream[bytes, bytes], work: Awaitable[None]) -> None:
        self._in_flight += 1
        self._idle.clear()
        try:
            await work
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    def _channel(self, method: str) -> Channel:
        channel = self._image if method.startswith(IMAGE_PREFIXES) else self._runtime
        if channel is None:
            raise GRPCError(Status.UNAVAILABLE, "koord-runtime-proxy is not started")
        return channel

    async def _call(self, method: str, req: Message, resp_type: type[Any]) -> Any:
        deadline = Deadline.from_timeout(CALL_TIMEOUT)
        return resp_type.FromString(await self.forward(method, req.SerializeToString(), deadline))

    async def forward(self, method: str, data: bytes, deadline: Deadline | None) -> bytes:
        """``data`` to the runtime as is; its answer, or its status (a :class:`GRPCError`
        the server sends on), back."""
        try:
            async with self._channel(method).request(
                method, Cardinality.UNARY_UNARY, bytes, bytes, deadline=deadline
            ) as call:
                await call.send_message(data, end=True)
                out: bytes | None = await call.recv_message()
                await call.recv_trailing_metadata()
        except GRPCError as err:
            raise GRPCError(err.status, err.message) from err
        except (OSError, StreamTerminatedError) as err:
            raise GRPCError(Status.UNAVAILABLE, f"runtime: {err}") from err
        return out or b""

    async def _forward_stream(self, method: str, call: Stream[bytes, bytes]) -> None:
        """A server-streaming call, message by message."""
        data = await call.recv_message()
        try:
            async with self._channel(method).request(
                method, Cardinality.UNARY_STREAM, bytes, bytes, deadline=call.deadline
            ) as upstream:
                await upstream.send_message(data or b"", end=True)
                async for item in upstream:
                    await call.send_message(item)
        except GRPCError as err:
            raise GRPCError(err.status, err.message) from err
        except (OSError, StreamTerminatedError) as err:
            raise GRPCError(Status.UNAVAILABLE, f"runtime: {err}") from err

    # Intercepts -----------------------------------------------------------------------------

    async def _run_pod_sandbox(self, data: bytes, deadline: Deadline | None) -> bytes:
        req = cri.RunPodSandboxRequest.FromString(data)
        hreq = convert.pod_hook_request(req)
        resp = await self.hooks.call(
            "PreRunPodSandbox", "PreRunPodSandboxHook", hreq, hookapi.PodSandboxHookResponse
        )
        if resp is not None:
            convert.apply_pod_response(req, resp)
            data = req.SerializeToString()
            hreq = convert.pod_hook_request(req)
        out = await self.forward(RUNTIME + "RunPodSandbox", data, deadline)
        self.store.add_pod(cri.RunPodSandboxResponse.FromString(out).pod_sandbox_id, hreq)
        return out

    async def _create_container(self, data: bytes, deadline: Deadline | None) -> bytes:
        req = cri.CreateContainerRequest.FromString(data)
        hreq = convert.container_hook_request(req)
        resp = await self.hooks.call(
            "PreCreateContainer",
            "PreCreateContainerHook",
            hreq,
            hookapi.ContainerResourceHookResponse,
        )
        if resp is not None:
            convert.apply_container_response(req.config, resp)
            data = req.SerializeToString()
            hreq = convert.container_hook_request(req)
        out = await self.forward(RUNTIME + "CreateContainer", data, deadline)
        cid = cri.CreateContainerResponse.FromString(out).container_id
        self.store.add_container(cid, req.pod_sandbox_id, hreq)
        return out

    async def _start_container(self, data: bytes, deadline: Deadline | None) -> bytes:
        cid = cri.StartContainerRequest.FromString(data).container_id
        hreq = self.store.container(cid)
        if hreq is not None:
            await self.hooks.call(
                "PreStartContainer",
                "PreStartContainerHook",
                hreq,
                hookapi.ContainerResourceHookResponse,
            )
        out = await self.forward(RUNTIME + "StartContainer", data, deadline)
        if hreq is not None:
            self._tell("PostStartContainer", "PostStartContainerHook", hreq)
        return out

    async def _update_container_resources(self, data: bytes, deadline: Deadline | None) -> bytes:
        req = cri.UpdateContainerResourcesRequest.FromString(data)
        stored = self.store.container(req.container_id)
        if stored is not None:
            hreq = hookapi.ContainerResourceHookRequest()
            hreq.CopyFrom(stored)
            hreq.container_resources.CopyFrom(convert.hook_resources(req.linux))
            resp = await self.hooks.call(
                "PreUpdateContainerResources",
                "PreUpdateContainerResourcesHook",
                hreq,
                hookapi.ContainerResourceHookResponse,
            )
            if resp is not None and resp.HasField("container_resources"):
                convert.merge_resources(req.linux, resp.container_resources)
                data = req.SerializeToString()
        out = await self.forward(RUNTIME + "UpdateContainerResources", data, deadline)
        if stored is not None:
            stored.container_resources.CopyFrom(convert.hook_resources(req.linux))
            self.store.update_container(req.container_id, stored)
        return out

    async def _stop_container(self, data: bytes, deadline: Deadline | None) -> bytes:
        out = await self.forward(RUNTIME + "StopContainer", data, deadline)
        hreq = self.store.container(cri.StopContainerRequest.FromString(data).container_id)
        if hreq is not None:
            self._tell("PostStopContainer", "PostStopContainerHook", hreq)
        return out

    async def _remove_container(self, data: bytes, deadline: Deadline | None) -> bytes:
        out = await self.forward(RUNTIME + "RemoveContainer", data, deadline)
        self.store.containers.pop(cri.RemoveContainerRequest.FromString(data).container_id, None)
        return out

    async def _stop_pod_sandbox(self, data: bytes, deadline: Deadline | None) -> bytes:
        out = await self.forward(RUNTIME + "StopPodSandbox", data, deadline)
        hreq = self.store.pod(cri.StopPodSandboxRequest.FromString(data).pod_sandbox_id)
        if hreq is not None:
            self._tell("PostStopPodSandbox", "PostStopPodSandboxHook", hreq)
        return out

    async def _remove_pod_sandbox(self, data: bytes, deadline: Deadline | None) -> bytes:
        out = await self.forward(RUNTIME + "RemovePodSandbox", data, deadline)
        self.store.remove_pod(cri.RemovePodSandboxRequest.FromString(data).pod_sandbox_id)
        return out

    def _tell(self, stage: str, method: str, req: Message) -> None:
        """A post-hook, in the background: the kubelet's answer does not wait for it."""
        resp_type: type[Message] = (
            hookapi.PodSandboxHookResponse
            if isinstance(req, hookapi.PodSandboxHookRequest)
            else hookapi.ContainerResourceHookResponse
        )

        async def tell() -> None:
            await self.hooks.call(stage, method, req, resp_type)

        self._spawn(tell(), f"post-hook-{stage}")
