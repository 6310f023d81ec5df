"""The proxy: a CRI gRPC server on its own socket that forwards every RuntimeService and
ImageService call to the runtime, consulting the koordlet's hook server on the way.

Every method is forwarded as raw bytes by one generic handler (unary, or server-streaming for
the streaming methods of ``runtime.v1``), so the proxy needs no definition of a message it does
not look into, and the runtime's status reaches the kubelet unchanged. Intercepted
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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message
from prometheus_client import CollectorRegistry

from apis.cri.v1 import api_pb2 as cri
from apis.runtime.v1alpha1 import api_pb2 as hookapi
from runtimeproxy import convert
from runtimeproxy.hookclient import HookClient
from runtimeproxy.store import Store

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
MAX_MESSAGE = 16 << 20
"""The kubelet's CRI message size limit (``maxMsgSize``), both ways."""
GRPC_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
)
REFRESH_INTERVAL = 5.0
"""Seconds between looks at the hook-server folder."""

Unary = Callable[[bytes, grpc.aio.ServicerContext[bytes, bytes]], Awaitable[bytes]]


@dataclass(frozen=True, slots=True)
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
        self.cfg = cfg
        self.hooks = HookClient(
            endpoint=cfg.hook_endpoint,
            config_dir=cfg.hook_config_dir,
            budget=cfg.hook_timeout,
            registry=registry,
        )
        self.store = Store()
        self._runtime = grpc.aio.insecure_channel(
            f"unix://{cfg.runtime_endpoint}", options=GRPC_OPTIONS
        )
        self._image = (
            self._runtime
            if cfg.image_endpoint == cfg.runtime_endpoint
            else grpc.aio.insecure_channel(f"unix://{cfg.image_endpoint}", options=GRPC_OPTIONS)
        )
        self._server: grpc.aio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
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
        await self._recover()
        await self.hooks.refresh()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.cfg.listen)
        server = grpc.aio.server(options=GRPC_OPTIONS)
        server.add_generic_rpc_handlers((_Forwarder(self),))
        if server.add_insecure_port(f"unix://{self.cfg.listen}") == 0:
            raise OSError(f"cannot listen on {self.cfg.listen}")
        await server.start()
        self._server = server
        self._spawn(self._refresh_loop(), "hook-servers-refresh")
        logger.info(
            "koord-runtime-proxy on %s -> %s (images: %s)",
            self.cfg.listen,
            self.cfg.runtime_endpoint,
            self.cfg.image_endpoint,
        )

    async def stop(self, grace: float = 2.0) -> None:
        """Stop listening (calls in flight get ``grace`` seconds) and close the clients."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.hooks.close()
        await self._runtime.close()
        if self._image is not self._runtime:
            await self._image.close()
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
        except grpc.aio.AioRpcError as err:
            logger.warning(
                "runtime not answering at start (%s): nothing recovered", err.code().name
            )
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

    def _channel(self, method: str) -> grpc.aio.Channel:
        return self._image if method.startswith(IMAGE_PREFIXES) else self._runtime

    async def _call(self, method: str, req: Message, resp_type: type[Any]) -> Any:
        stub: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = self._channel(method).unary_unary(
            method
        )
        data = await stub(req.SerializeToString(), timeout=10.0)
        return resp_type.FromString(data)

    async def forward(
        self, method: str, data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        """``data`` to the runtime as is; its answer, or its status, back."""
        stub: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = self._channel(method).unary_unary(
            method
        )
        try:
            out: bytes = await stub(data, timeout=context.time_remaining())
        except grpc.aio.AioRpcError as err:
            await context.abort(err.code(), err.details() or "")
        return out

    async def forward_stream(
        self, method: str, data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        """A server-streaming call, message by message."""
        stub: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = self._channel(method).unary_stream(
            method
        )
        call = stub(data, timeout=context.time_remaining())
        try:
            async for item in call:
                yield item
        except grpc.aio.AioRpcError as err:
            await context.abort(err.code(), err.details() or "")

    # Intercepts -----------------------------------------------------------------------------

    async def _run_pod_sandbox(
        self, data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        req = cri.RunPodSandboxRequest.FromString(data)
        hreq = convert.pod_hook_request(req)
        resp = await self.hooks.call(
            "PreRunPodSandbox", "PreRunPodSandboxHook", hreq, hookapi.PodSandboxHookResponse
        )
        if resp is not None:
            convert.apply_pod_response(req, resp)
            data = req.SerializeToString()
            hreq = convert.pod_hook_request(req)
        out = await self.forward(RUNTIME + "RunPodSandbox", data, context)
        self.store.add_pod(cri.RunPodSandboxResponse.FromString(out).pod_sandbox_id, hreq)
        return out

    async def _create_container(
        self, data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
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
        out = await self.forward(RUNTIME + "CreateContainer", data, context)
        cid = cri.CreateContainerResponse.FromString(out).container_id
        self.store.add_container(cid, req.pod_sandbox_id, hreq)
        return out

    async def _start_container(
        self, data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        cid = cri.StartContainerRequest.FromString(data).container_id
        hreq = self.store.container(cid)
        if hreq is not None:
            await self.hooks.call(
                "PreStartContainer",
                "PreStartContainerHook",
                hreq,
                hookapi.ContainerResourceHookResponse,
            )
        out = await self.forward(RUNTIME + "StartContainer", data, context)
        if hreq is not None:
            self._tell("PostStartContainer", "PostStartContainerHook", hreq)
        return out

    async def _update_container_resources(
        self, data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
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
        out = await self.forward(RUNTIME + "UpdateContainerResources", data, context)
        if stored is not None:
            stored.container_resources.CopyFrom(convert.hook_resources(req.linux))
        return out

    async def _stop_container(
        self, data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        out = await self.forward(RUNTIME + "StopContainer", data, context)
        hreq = self.store.container(cri.StopContainerRequest.FromString(data).container_id)
        if hreq is not None:
            self._tell("PostStopContainer", "PostStopContainerHook", hreq)
        return out

    async def _remove_container(
        self, data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        out = await self.forward(RUNTIME + "RemoveContainer", data, context)
        self.store.containers.pop(cri.RemoveContainerRequest.FromString(data).container_id, None)
        return out

    async def _stop_pod_sandbox(
        self, data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        out = await self.forward(RUNTIME + "StopPodSandbox", data, context)
        hreq = self.store.pods.get(cri.StopPodSandboxRequest.FromString(data).pod_sandbox_id)
        if hreq is not None:
            self._tell("PostStopPodSandbox", "PostStopPodSandboxHook", hreq)
        return out

    async def _remove_pod_sandbox(
        self, data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        out = await self.forward(RUNTIME + "RemovePodSandbox", data, context)
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


class _Forwarder(grpc.GenericRpcHandler):
    """Every method: the intercept if there is one, else plain forwarding."""

    def __init__(self, proxy: RuntimeProxy) -> None:
        self._proxy = proxy

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method: str = handler_call_details.method
        proxy = self._proxy
        if method in STREAMING:

            async def stream(
                data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
            ) -> AsyncIterator[bytes]:
                # an async generator function: grpc tells streaming handlers apart by that
                async for item in proxy.forward_stream(method, data, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(stream)
        intercept = proxy._intercepts.get(method)
        if intercept is not None:
            return grpc.unary_unary_rpc_method_handler(intercept)

        async def forward(data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            return await proxy.forward(method, data, context)

        return grpc.unary_unary_rpc_method_handler(forward)
