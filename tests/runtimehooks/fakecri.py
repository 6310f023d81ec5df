"""A fake CRI runtime for the proxy's tests: records every call's raw bytes and answers the few
methods the tests need (the real runtime is in test_proxy_containerd.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from apis.cri.v1 import api_pb2 as cri

RUNTIME = "/runtime.v1.RuntimeService/"


@dataclass
class FakeCri:
    """A gRPC server on ``path`` answering as a runtime would."""

    path: str
    calls: list[tuple[str, bytes]] = field(default_factory=list)
    _server: grpc.aio.Server | None = None
    _ids: int = 0

    def received(self, method: str) -> list[bytes]:
        return [data for m, data in self.calls if m == RUNTIME + method or m == method]

    async def start(self) -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_Handler(self),))
        server.add_insecure_port(f"unix://{self.path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)

    def answer(self, method: str, data: bytes) -> bytes:
        self.calls.append((method, data))
        self._ids += 1
        if method == RUNTIME + "RunPodSandbox":
            return cri.RunPodSandboxResponse(
                pod_sandbox_id=f"sandbox{self._ids}"
            ).SerializeToString()
        if method == RUNTIME + "CreateContainer":
            return cri.CreateContainerResponse(container_id=f"c{self._ids}").SerializeToString()
        if method == RUNTIME + "Version":
            return cri.VersionResponse(
                runtime_name="fakecri", runtime_version="1"
            ).SerializeToString()
        if method.endswith("/Frobnicate"):
            return b"\x0a\x03abc" + data
        return b""


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, fake: FakeCri) -> None:
        self.fake = fake

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        method: str = details.method
        fake = self.fake
        if method.endswith("/GetContainerEvents"):

            async def events(data: bytes, _ctx: Any) -> AsyncIterator[bytes]:
                fake.calls.append((method, data))
                for i in range(3):
                    yield cri.ContainerEventResponse(container_id=f"c{i}").SerializeToString()
                    await asyncio.sleep(0)

            return grpc.unary_stream_rpc_method_handler(events)

        async def unary(data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            if method.endswith("/Fail"):
                await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
            return fake.answer(method, data)

        return grpc.unary_unary_rpc_method_handler(unary)
