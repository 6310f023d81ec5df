"""One NRI session: NRI's messages to the hooks' model and back, and the plugin's side of the
connection (the ``Plugin`` service's handlers, ``RegisterPlugin`` on the ``Runtime`` service).

Imported by :class:`koordlet.runtimehooks.nri.NriPlugin` on its first connection, not with the
daemon: the protobuf runtime and the NRI and ttrpc messages cost about 2 MiB of resident memory
on nodes whose runtime serves no NRI. The protocol is drawn in :mod:`koordlet.runtimehooks.nri`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from apis.nri.v1alpha1 import api_pb2 as nriapi
from koordlet.runtimehooks.model import (
    Change,
    ContainerRequest,
    HookPoint,
    PodMeta,
    PodRequest,
    Resources,
)
from koordlet.runtimehooks.nri import MODE, PLUGIN_SERVICE, RUNTIME_SERVICE
from koordlet.runtimehooks.ttrpc import (
    PLUGIN_SERVICE_CONN,
    RUNTIME_SERVICE_CONN,
    Handler,
    Mux,
    TtrpcClient,
    TtrpcServer,
)

if TYPE_CHECKING:
    from koordlet.runtimehooks.nri import NriPlugin

logger = logging.getLogger(__name__)

EVENT_OF_POINT = {
    HookPoint.PRE_RUN_POD_SANDBOX: nriapi.RUN_POD_SANDBOX,
    HookPoint.POST_STOP_POD_SANDBOX: nriapi.STOP_POD_SANDBOX,
    HookPoint.PRE_REMOVE_POD_SANDBOX: nriapi.REMOVE_POD_SANDBOX,
    HookPoint.PRE_CREATE_CONTAINER: nriapi.CREATE_CONTAINER,
    HookPoint.PRE_START_CONTAINER: nriapi.START_CONTAINER,
    HookPoint.POST_START_CONTAINER: nriapi.POST_START_CONTAINER,
    HookPoint.PRE_UPDATE_CONTAINER_RESOURCES: nriapi.UPDATE_CONTAINER,
    HookPoint.POST_STOP_CONTAINER: nriapi.STOP_CONTAINER,
}
"""The NRI event behind each hook point."""
_POD_EVENTS = {
    nriapi.RUN_POD_SANDBOX: HookPoint.PRE_RUN_POD_SANDBOX,
    nriapi.STOP_POD_SANDBOX: HookPoint.POST_STOP_POD_SANDBOX,
    nriapi.REMOVE_POD_SANDBOX: HookPoint.PRE_REMOVE_POD_SANDBOX,
}
_CONTAINER_EVENTS = {
    nriapi.START_CONTAINER: HookPoint.PRE_START_CONTAINER,
    nriapi.POST_START_CONTAINER: HookPoint.POST_START_CONTAINER,
}


def event_mask(points: tuple[HookPoint, ...]) -> int:
    """NRI's subscription mask of the events behind ``points``."""
    mask = 0
    for point in points:
        mask |= 1 << (EVENT_OF_POINT[point] - 1)
    return mask


# Conversions ------------------------------------------------------------------------------------


def resources_of(pb: nriapi.LinuxResources) -> Resources:
    """The model's resources of NRI's (unset optional fields mean "not specified")."""
    cpu, memory = pb.cpu, pb.memory
    return Resources(
        cpu_shares=cpu.shares.value if cpu.HasField("shares") else None,
        cfs_quota=cpu.quota.value if cpu.HasField("quota") else None,
        cfs_period=cpu.period.value if cpu.HasField("period") else None,
        cpuset_cpus=cpu.cpus or None,
        cpuset_mems=cpu.mems or None,
        memory_limit=memory.limit.value if memory.HasField("limit") else None,
    )


def to_linux_resources(res: Resources, out: nriapi.LinuxResources) -> None:
    """Set the fields ``res`` sets (upstream ``ContainerContext.NriDone``)."""
    if res.cpu_shares is not None:
        out.cpu.shares.value = res.cpu_shares
    if res.cfs_quota is not None:
        out.cpu.quota.value = res.cfs_quota
    if res.cfs_period is not None:
        out.cpu.period.value = res.cfs_period
    if res.cpuset_cpus is not None:
        out.cpu.cpus = res.cpuset_cpus
    if res.cpuset_mems is not None:
        out.cpu.mems = res.cpuset_mems
    if res.memory_limit is not None:
        out.memory.limit.value = res.memory_limit


def pod_request(point: HookPoint, pod: nriapi.PodSandbox) -> PodRequest:
    """The model request of an NRI pod."""
    return PodRequest(
        point,
        PodMeta(pod.name, pod.namespace, pod.uid),
        labels=dict(pod.labels),
        annotations=dict(pod.annotations),
        cgroup_parent=pod.linux.cgroup_parent,
        resources=resources_of(pod.linux.pod_resources),
        runtime_handler=pod.runtime_handler,
        sandbox_id=pod.id,
    )


def container_request(
    point: HookPoint,
    pod: nriapi.PodSandbox,
    container: nriapi.Container,
    resources: nriapi.LinuxResources | None = None,
) -> ContainerRequest:
    """The model request of an NRI container (``resources``: an update's new resources)."""
    env = dict(e.split("=", 1) for e in container.env if "=" in e)
    return ContainerRequest(
        point,
        PodMeta(pod.name, pod.namespace, pod.uid),
        container.name,
        container_id=container.id,
        pod_labels=dict(pod.labels),
        pod_annotations=dict(pod.annotations),
        pod_cgroup_parent=pod.linux.cgroup_parent,
        annotations=dict(container.annotations),
        env=env,
        resources=_with_oom_score_adj(
            resources_of(resources if resources is not None else container.linux.resources),
            container,
        ),
    )


def _with_oom_score_adj(res: Resources, container: nriapi.Container) -> Resources:
    """``res`` with the container's ``oom_score_adj`` when the runtime told it."""
    if not container.linux.HasField("oom_score_adj"):
        return res
    return replace(res, oom_score_adj=container.linux.oom_score_adj.value)


def adjustment(change: Change) -> nriapi.ContainerAdjustment:
    """The ``ContainerAdjustment`` of a change."""
    adjust = nriapi.ContainerAdjustment()
    for key, value in change.annotations.items():
        adjust.annotations[key] = value
    for key, value in sorted(change.env.items()):
        adjust.env.add(key=key, value=value)
    for m in change.mounts:
        adjust.mounts.add(
            destination=m.destination, type=m.type, source=m.source, options=list(m.options)
        )
    if change.resources:
        to_linux_resources(change.resources, adjust.linux.resources)
    if change.resources.oom_score_adj is not None:
        adjust.linux.oom_score_adj.value = change.resources.oom_score_adj
    return adjust


# The session ------------------------------------------------------------------------------------


async def serve(
    plugin: NriPlugin, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Register on a connected socket, wait to be configured, serve until the runtime closes the
    connection (the plugin's state is updated as the session goes)."""
    await _Session(plugin).serve(reader, writer)


class _Session:
    """The handlers of one connection; they report to the plugin's state."""

    def __init__(self, plugin: NriPlugin) -> None:
        self.plugin = plugin
        self.dispatcher = plugin.dispatcher

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        plugin = self.plugin
        opts = plugin.options
        mux = Mux(reader, writer)
        client = TtrpcClient(mux.open(RUNTIME_SERVICE_CONN))
        server = TtrpcServer(mux.open(PLUGIN_SERVICE_CONN), self._handlers())
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(mux.run(), name="nri-mux"),
            loop.create_task(server.run(), name="nri-plugin-service"),
            loop.create_task(client.run(), name="nri-runtime-client"),
        ]
        try:
            register = nriapi.RegisterPluginRequest(
                plugin_name=opts.plugin_name, plugin_idx=opts.plugin_index
            )
            await client.call(
                RUNTIME_SERVICE,
                "RegisterPlugin",
                register.SerializeToString(),
                opts.connect_timeout,
            )
            async with asyncio.timeout(opts.connect_timeout):
                await plugin.configured.wait()
            plugin.session_started()
            logger.info(
                "registered with %s as NRI plugin %s-%s, events %s",
                plugin.runtime or "the runtime",
                opts.plugin_index,
                opts.plugin_name,
                ", ".join(p.value for p in self.dispatcher.points()) or "none",
            )
            await mux.closed.wait()
            plugin.last_error = "connection closed by the runtime"
            logger.warning("NRI: the runtime closed the connection; redialling")
        finally:
            await mux.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # Handlers -------------------------------------------------------------------------------

    def _handlers(self) -> dict[tuple[str, str], Handler]:
        methods: dict[str, Callable[[bytes], Awaitable[bytes]]] = {
            "Configure": self._configure,
            "Synchronize": self._synchronize,
            "Shutdown": self._shutdown,
            "CreateContainer": self._create_container,
            "UpdateContainer": self._update_container,
            "StopContainer": self._stop_container,
            "UpdatePodSandbox": self._update_pod_sandbox,
            "StateChange": self._state_change,
        }
        return {(PLUGIN_SERVICE, name): fn for name, fn in methods.items()}

    def _budget(self) -> float:
        return max(0.01, min(self.dispatcher.options.timeout, self.plugin.request_timeout / 2))

    async def _bounded(self, point: HookPoint, work: Awaitable[bytes], empty: bytes) -> bytes:
        """``work`` within the budget; past it (or on any error) the empty answer: fail open."""
        try:
            async with asyncio.timeout(self._budget()):
                return await work
        except TimeoutError:
            self.dispatcher.metrics.fail_open.labels(MODE, point.value, "timeout").inc()
            logger.warning("NRI %s answered empty after %.3fs (fail open)", point, self._budget())
        except Exception:
            self.dispatcher.metrics.fail_open.labels(MODE, point.value, "error").inc()
            logger.exception("NRI %s failed; answered empty (fail open)", point)
        return empty

    async def _configure(self, data: bytes) -> bytes:
        req = nriapi.ConfigureRequest.FromString(data)
        if req.request_timeout > 0:
            self.plugin.request_timeout = req.request_timeout / 1000.0
        self.plugin.runtime = f"{req.runtime_name} {req.runtime_version}".strip()
        mask = event_mask(self.dispatcher.points())
        self.plugin.configured.set()
        return nriapi.ConfigureResponse(events=mask).SerializeToString()

    async def _synchronize(self, data: bytes) -> bytes:
        req = nriapi.SynchronizeRequest.FromString(data)
        logger.info("NRI synchronize: %d pods, %d containers", len(req.pods), len(req.containers))
        return nriapi.SynchronizeResponse(more=req.more).SerializeToString()

    async def _shutdown(self, _data: bytes) -> bytes:
        logger.info("NRI: the runtime is shutting down")
        return nriapi.Empty().SerializeToString()

    async def _create_container(self, data: bytes) -> bytes:
        req = nriapi.CreateContainerRequest.FromString(data)
        point = HookPoint.PRE_CREATE_CONTAINER

        async def work() -> bytes:
            creq = container_request(point, req.pod, req.container)
            outcome = await self.dispatcher.container(creq, mode=MODE)
            resp = nriapi.CreateContainerResponse()
            if outcome.change:
                resp.adjust.CopyFrom(adjustment(outcome.change))
            return resp.SerializeToString()

        empty = nriapi.CreateContainerResponse().SerializeToString()
        return await self._bounded(point, work(), empty)

    async def _update_container(self, data: bytes) -> bytes:
        req = nriapi.UpdateContainerRequest.FromString(data)
        point = HookPoint.PRE_UPDATE_CONTAINER_RESOURCES

        async def work() -> bytes:
            creq = container_request(point, req.pod, req.container, req.linux_resources)
            outcome = await self.dispatcher.container(creq, mode=MODE)
            resp = nriapi.UpdateContainerResponse()
            if outcome.change.resources:
                update = resp.update.add(container_id=req.container.id)
                to_linux_resources(outcome.change.resources, update.linux.resources)
            return resp.SerializeToString()

        empty = nriapi.UpdateContainerResponse().SerializeToString()
        return await self._bounded(point, work(), empty)

    async def _stop_container(self, data: bytes) -> bytes:
        req = nriapi.StopContainerRequest.FromString(data)
        point = HookPoint.POST_STOP_CONTAINER

        async def work() -> bytes:
            await self.dispatcher.container(
                container_request(point, req.pod, req.container), mode=MODE
            )
            return nriapi.StopContainerResponse().SerializeToString()

        return await self._bounded(
            point, work(), nriapi.StopContainerResponse().SerializeToString()
        )

    async def _update_pod_sandbox(self, _data: bytes) -> bytes:
        return nriapi.UpdatePodSandboxResponse().SerializeToString()

    async def _state_change(self, data: bytes) -> bytes:
        evt = nriapi.StateChangeEvent.FromString(data)
        empty = nriapi.Empty().SerializeToString()
        if evt.event in _POD_EVENTS:
            point = _POD_EVENTS[evt.event]

            async def pod_work() -> bytes:
                await self.dispatcher.pod(pod_request(point, evt.pod), mode=MODE)
                return empty

            return await self._bounded(point, pod_work(), empty)
        if evt.event in _CONTAINER_EVENTS:
            cpoint = _CONTAINER_EVENTS[evt.event]

            async def container_work() -> bytes:
                creq = container_request(cpoint, evt.pod, evt.container)
                await self.dispatcher.container(creq, mode=MODE)
                return empty

            return await self._bounded(cpoint, container_work(), empty)
        return empty
