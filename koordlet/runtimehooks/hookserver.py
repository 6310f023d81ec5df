"""The hook server koord-runtime-proxy calls: Koordinator's ``runtime.v1alpha1.RuntimeHookService``
on a unix socket (upstream ``pkg/koordlet/runtimehooks/proxyserver``), so upstream's proxy and
ours both talk to it.

Each RPC becomes a model request, the dispatcher runs the hooks (mode ``proxy``), and the response
is the request's own values with the merged change applied: upstream's proxy merges a response
over what it holds, so an empty change gives back what came in. Changes to the container's
environment and mounts cannot be sent (the service has no such field at the published field
numbers; see apis/runtime/v1alpha1/api.proto) and are logged.

At start the server also writes ``koordlet.json`` (endpoint, ``failure-policy: Ignore``, the
stages it serves) into the proxy's hook-server folder when that folder exists, as upstream's
``Register`` does; the proxy reads it to find this socket.

gRPC is grpclib's (pure Python over h2), as koord-runtime-proxy's: grpcio's core would add
16.6 MiB to the koordlet's resident memory on every node that runs the proxy (issue 26).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from google.protobuf.message import Message
from grpclib.const import Cardinality, Handler
from grpclib.protocol import H2Protocol
from grpclib.server import Server, Stream

from apis.runtime.v1alpha1 import api_pb2 as hookapi
from koordlet.runtimehooks.framework import HookDispatcher
from koordlet.runtimehooks.model import (
    Change,
    ContainerRequest,
    HookPoint,
    PodMeta,
    PodRequest,
    Resources,
)

logger = logging.getLogger(__name__)

SERVICE = "runtime.v1alpha1.RuntimeHookService"
"""The gRPC service name (package ``runtime.v1alpha1``)."""
MODE = "proxy"
"""The ``mode`` label of this mode's metrics and audit entries."""
CONFIG_FILE = "koordlet.json"
"""The file written into the proxy's hook-server folder (upstream's name)."""

_POD_METHODS = {
    "PreRunPodSandboxHook": HookPoint.PRE_RUN_POD_SANDBOX,
    "PostStopPodSandboxHook": HookPoint.POST_STOP_POD_SANDBOX,
}
_CONTAINER_METHODS = {
    "PreCreateContainerHook": HookPoint.PRE_CREATE_CONTAINER,
    "PreStartContainerHook": HookPoint.PRE_START_CONTAINER,
    "PostStartContainerHook": HookPoint.POST_START_CONTAINER,
    "PostStopContainerHook": HookPoint.POST_STOP_CONTAINER,
    "PreUpdateContainerResourcesHook": HookPoint.PRE_UPDATE_CONTAINER_RESOURCES,
}


# Conversions ------------------------------------------------------------------------------------


def resources_of(pb: hookapi.LinuxContainerResources) -> Resources:
    """The model's resources of a hook-API message (0 and "" mean "not specified")."""
    memory = pb.memory_limit_in_bytes
    return Resources(
        cpu_shares=pb.cpu_shares or None,
        cfs_quota=pb.cpu_quota or None,
        cfs_period=pb.cpu_period or None,
        cpuset_cpus=pb.cpuset_cpus or None,
        cpuset_mems=pb.cpuset_mems or None,
        memory_limit=(-1 if memory < 0 else memory) or None,
        oom_score_adj=pb.oom_score_adj or None,
    )


def apply_resources(pb: hookapi.LinuxContainerResources, res: Resources) -> None:
    """Set every field ``res`` sets on ``pb`` (upstream ``Resources.ProxyDone``)."""
    if res.cpu_shares is not None:
        pb.cpu_shares = res.cpu_shares
    if res.cfs_quota is not None:
        pb.cpu_quota = res.cfs_quota
    if res.cfs_period is not None:
        pb.cpu_period = res.cfs_period
    if res.cpuset_cpus is not None:
        pb.cpuset_cpus = res.cpuset_cpus
    if res.cpuset_mems is not None:
        pb.cpuset_mems = res.cpuset_mems
    if res.memory_limit is not None:
        pb.memory_limit_in_bytes = res.memory_limit
    if res.oom_score_adj is not None:
        pb.oom_score_adj = res.oom_score_adj  # 0 reads "unset": the proxy keeps the kubelet's


def _pod_meta(pb: hookapi.PodSandboxMetadata) -> PodMeta:
    return PodMeta(pb.name, pb.namespace, pb.uid, pb.attempt)


def pod_request(point: HookPoint, pb: hookapi.PodSandboxHookRequest) -> PodRequest:
    """The model request of a ``PodSandboxHookRequest``."""
    return PodRequest(
        point,
        _pod_meta(pb.pod_meta),
        labels=dict(pb.labels),
        annotations=dict(pb.annotations),
        cgroup_parent=pb.cgroup_parent,
        resources=resources_of(pb.resources),
        runtime_handler=pb.runtime_handler,
    )


def container_request(
    point: HookPoint, pb: hookapi.ContainerResourceHookRequest
) -> ContainerRequest:
    """The model request of a ``ContainerResourceHookRequest``."""
    return ContainerRequest(
        point,
        _pod_meta(pb.pod_meta),
        pb.container_mata.name,
        container_id=pb.container_mata.id,
        pod_labels=dict(pb.pod_labels),
        pod_annotations=dict(pb.pod_annotations),
        pod_cgroup_parent=pb.pod_cgroup_parent,
        annotations=dict(pb.container_annotations),
        resources=resources_of(pb.container_resources),
    )


def pod_response(
    pb: hookapi.PodSandboxHookRequest, change: Change
) -> hookapi.PodSandboxHookResponse:
    """The request's labels, annotations, cgroup parent and resources with ``change`` applied."""
    resp = hookapi.PodSandboxHookResponse(
        labels=dict(pb.labels),
        annotations={**pb.annotations, **change.annotations},
        cgroup_parent=change.cgroup_parent or pb.cgroup_parent,
    )
    if pb.HasField("resources") or change.resources:
        resp.resources.CopyFrom(pb.resources)
        apply_resources(resp.resources, change.resources)
    return resp


def container_response(
    pb: hookapi.ContainerResourceHookRequest, change: Change
) -> hookapi.ContainerResourceHookResponse:
    """The request's container annotations and resources with ``change`` applied."""
    resp = hookapi.ContainerResourceHookResponse(
        container_annotations={**pb.container_annotations, **change.annotations},
        pod_cgroup_parent=pb.pod_cgroup_parent,
    )
    if pb.HasField("container_resources") or change.resources:
        resp.container_resources.CopyFrom(pb.container_resources)
        apply_resources(resp.container_resources, change.resources)
    if change.env or change.mounts:
        logger.warning(
            "pod %s container %s: environment %s and mounts %s not sent (the hook service has "
            "no such fields; NRI mode applies them)",
            f"{pb.pod_meta.namespace}/{pb.pod_meta.name}",
            pb.container_mata.name,
            sorted(change.env),
            [m.destination for m in change.mounts],
        )
    return resp


# The server -------------------------------------------------------------------------------------


class _Server(Server):
    """grpclib's server, closing the connections it accepted at stop (it closes its listener and
    cancels the calls, but leaves a client's connection open until the client closes it; a
    private hook of grpclib 0.4, pinned in requirements/lock.txt)."""

    def __init__(self, handler: HookServer) -> None:
        super().__init__([handler])
        self._protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        self._protocols.add(protocol)
        return protocol

    def close_connections(self) -> None:
        for protocol in list(self._protocols):
            if hasattr(protocol, "processor"):  # connected
                protocol.processor.close("koordlet hook server stopping")


class HookServer:
    """The gRPC server on ``path``; :meth:`start` and :meth:`stop` on the event loop."""

    def __init__(self, dispatcher: HookDispatcher, path: str) -> None:
        self.dispatcher = dispatcher
        self.path = path
        self._server: _Server | None = None
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def __mapping__(self) -> dict[str, Handler]:
        """grpclib's method table: path -> handler."""
        methods: dict[str, Handler] = {}
        for name, point in _POD_METHODS.items():
            methods[f"/{SERVICE}/{name}"] = Handler(
                self._unary(self._pod_handler(point)),
                Cardinality.UNARY_UNARY,
                hookapi.PodSandboxHookRequest,
                hookapi.PodSandboxHookResponse,
            )
        for name, point in _CONTAINER_METHODS.items():
            methods[f"/{SERVICE}/{name}"] = Handler(
                self._unary(self._container_handler(point)),
                Cardinality.UNARY_UNARY,
                hookapi.ContainerResourceHookRequest,
                hookapi.ContainerResourceHookResponse,
            )
        return methods

    def _unary(
        self, handle: Callable[[Any], Awaitable[Message]]
    ) -> Callable[[Stream[Any, Any]], Awaitable[None]]:
        async def serve(call: Stream[Any, Any]) -> None:
            self._in_flight += 1
            self._idle.clear()
            try:
                request = await call.recv_message()
                await call.send_message(await handle(request))
            finally:
                self._in_flight -= 1
                if not self._in_flight:
                    self._idle.set()

        return serve

    def _pod_handler(
        self, point: HookPoint
    ) -> Callable[[hookapi.PodSandboxHookRequest], Awaitable[hookapi.PodSandboxHookResponse]]:
        async def handle(pb: hookapi.PodSandboxHookRequest) -> hookapi.PodSandboxHookResponse:
            outcome = await self.dispatcher.pod(pod_request(point, pb), mode=MODE)
            return pod_response(pb, outcome.change)

        return handle

    def _container_handler(
        self, point: HookPoint
    ) -> Callable[
        [hookapi.ContainerResourceHookRequest], Awaitable[hookapi.ContainerResourceHookResponse]
    ]:
        async def handle(
            pb: hookapi.ContainerResourceHookRequest,
        ) -> hookapi.ContainerResourceHookResponse:
            outcome = await self.dispatcher.container(container_request(point, pb), mode=MODE)
            return container_response(pb, outcome.change)

        return handle

    async def start(self) -> None:
        """Listen on the socket (a stale one from an earlier run is replaced)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        server = _Server(self)
        await server.start(path=self.path)
        self._server = server
        logger.info(
            "runtime hook server on %s: %s",
            self.path,
            ", ".join(p.value for p in self.dispatcher.points()) or "no hooks",
        )

    async def stop(self, grace: float = 1.0) -> None:
        """Stop listening; requests in flight get ``grace`` seconds, then are cancelled."""
        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace)
            server.close()
            server.close_connections()
            await server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def hook_server_config(endpoint: str, points: tuple[HookPoint, ...]) -> Mapping[str, Any]:
    """The content of ``koordlet.json`` (upstream ``RuntimeHookConfig``'s JSON keys)."""
    return {
        "remote-endpoint": endpoint,
        "failure-policy": "Ignore",
        "runtime-hooks": [p.value for p in points],
    }


def write_hook_server_config(folder: str, endpoint: str, points: tuple[HookPoint, ...]) -> str:
    """Write ``koordlet.json`` into ``folder`` (atomically); returns its path."""
    path = os.path.join(folder, CONFIG_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(hook_server_config(endpoint, points), f, indent="\t")
    os.replace(tmp, path)
    return path
