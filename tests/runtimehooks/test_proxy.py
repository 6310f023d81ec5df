"""koord-runtime-proxy against a fake runtime and the koordlet's real hook server: forwarding of
every method as raw bytes (unknown methods, streams, errors), the hook server's answer merged into
RunPodSandbox and CreateContainer with the fields the proxy does not define carried through,
fail open when the koordlet is down or hangs, and reconnection when it comes back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from apis.cri.v1 import api_pb2 as cri
from apis.runtime.v1alpha1 import api_pb2 as hookapi
from apis.slo_inforce import NodeSLOInForce
from koordlet.runtimehooks.framework import HookDispatcher
from koordlet.runtimehooks.hookserver import HookServer
from koordlet.runtimehooks.metrics import HookMetrics
from koordlet.runtimehooks.table import HOOKS, HookContext
from runtimeproxy.server import ProxyConfig, RuntimeProxy
from tests.runtimehooks.fakecri import RUNTIME, FakeCri
from tests.runtimehooks.helpers import BE_LABELS, batch, spec_annotation

# Fields this repo's CRI proto does not define, encoded by hand from the CRI's field numbers:
DNS_CONFIG = b"\x22\x09\x0a\x077.7.7.7"  # PodSandboxConfig.dns_config (4) {servers: "7.7.7.7"}
MOUNT = b"\x3a\x07\x0a\x05/data"  # ContainerConfig.mounts (7) {container_path: "/data"}


def make_koordlet(path: str) -> HookServer:
    dispatcher = HookDispatcher(
        HOOKS,
        HookContext(node_slo=NodeSLOInForce),
        enabled=lambda gate: True,
        metrics=HookMetrics(CollectorRegistry()),
    )
    return HookServer(dispatcher, path)


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[FakeCri]:
    fake = FakeCri(str(tmp_path / "runtime.sock"))
    await fake.start()
    yield fake
    await fake.stop()


async def start_proxy(
    tmp_path: Path, backend: FakeCri, **cfg: Any
) -> tuple[RuntimeProxy, CollectorRegistry]:
    registry = CollectorRegistry()
    defaults: dict[str, Any] = {
        "listen": str(tmp_path / "proxy.sock"),
        "runtime_endpoint": backend.path,
        "image_endpoint": backend.path,
        "hook_endpoint": str(tmp_path / "koordlet.sock"),
        "hook_config_dir": str(tmp_path / "hookserver.d"),
        "hook_timeout": 1.0,
    }
    proxy = RuntimeProxy(ProxyConfig(**(defaults | cfg)), registry)
    await proxy.start()
    return proxy, registry


async def unary(sock: str, method: str, data: bytes) -> bytes:
    async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
        out: bytes = await channel.unary_unary(method)(data, timeout=5)
        return out


def sandbox_config(annotations: dict[str, str]) -> cri.PodSandboxConfig:
    cfg = cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name="be-1", namespace="default", uid="u1"),
        labels=BE_LABELS,
        annotations=annotations,
    )
    cfg.linux.cgroup_parent = "/kubepods/besteffort/podu1"
    return cfg


def create_request(annotations: dict[str, str]) -> bytes:
    req = cri.CreateContainerRequest(
        pod_sandbox_id="sandbox1",
        config=cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name="main"), image=cri.ImageSpec(image="busybox")
        ),
        sandbox_config=sandbox_config(annotations),
    )
    req.config.linux.resources.cpu_shares = 2
    req.config.linux.resources.oom_score_adj = 1000
    # append the unknown field inside ContainerConfig (field 2 of the request): re-frame it
    config = req.config.SerializeToString() + MOUNT
    rest = cri.CreateContainerRequest(
        pod_sandbox_id=req.pod_sandbox_id, sandbox_config=req.sandbox_config
    ).SerializeToString()
    assert len(config) < 128
    return rest + b"\x12" + bytes([len(config)]) + config


async def test_any_method_is_forwarded_as_raw_bytes_with_the_runtimes_answer_and_status(
    tmp_path: Path, backend: FakeCri
) -> None:
    proxy, _ = await start_proxy(tmp_path, backend)
    try:
        out = await unary(proxy.cfg.listen, RUNTIME + "Frobnicate", b"\x10\x01")
        assert out == b"\x0a\x03abc\x10\x01"
        assert backend.received("Frobnicate") == [b"\x10\x01"]
        version = cri.VersionResponse.FromString(
            await unary(proxy.cfg.listen, RUNTIME + "Version", b"")
        )
        assert version.runtime_name == "fakecri"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await unary(proxy.cfg.listen, "/runtime.v1.ImageService/Fail", b"")
        assert err.value.code() is grpc.StatusCode.NOT_FOUND
        assert err.value.details() == "no such thing"
        async with grpc.aio.insecure_channel(f"unix://{proxy.cfg.listen}") as channel:
            stream = channel.unary_stream(RUNTIME + "GetContainerEvents")(b"", timeout=5)
            events = [cri.ContainerEventResponse.FromString(m).container_id async for m in stream]
        assert events == ["c0", "c1", "c2"]
    finally:
        await proxy.stop()


async def test_create_container_carries_the_hook_answer_and_every_unknown_field(
    tmp_path: Path, backend: FakeCri
) -> None:
    koordlet = make_koordlet(str(tmp_path / "koordlet.sock"))
    await koordlet.start()
    proxy, registry = await start_proxy(tmp_path, backend)
    try:
        ann = spec_annotation({"main": batch("1000", "2000", "1Gi")})
        out = await unary(proxy.cfg.listen, RUNTIME + "CreateContainer", create_request(ann))
        assert cri.CreateContainerResponse.FromString(out).container_id
        [sent] = backend.received("CreateContainer")
        got = cri.CreateContainerRequest.FromString(sent)
        res = got.config.linux.resources
        assert (res.cpu_shares, res.cpu_quota, res.cpu_period) == (1024, 200_000, 100_000)
        assert res.memory_limit_in_bytes == 1 << 30
        assert res.oom_score_adj == 1000
        assert MOUNT in got.config.SerializeToString()  # the mount the proxy cannot name
        value = registry.get_sample_value(
            "koord_runtime_proxy_hook_calls_total", {"stage": "PreCreateContainer", "result": "ok"}
        )
        assert value == 1
    finally:
        await proxy.stop()
        await koordlet.stop()


async def test_run_pod_sandbox_keeps_the_fields_the_proxy_does_not_define(
    tmp_path: Path, backend: FakeCri
) -> None:
    koordlet = make_koordlet(str(tmp_path / "koordlet.sock"))
    await koordlet.start()
    proxy, _ = await start_proxy(tmp_path, backend)
    try:
        cfg = sandbox_config(spec_annotation({"main": batch("1000", "2000", "1Gi")}))
        config = cfg.SerializeToString() + DNS_CONFIG
        req = b"\x0a" + _varint(len(config)) + config + b"\x12\x04runc"
        out = await unary(proxy.cfg.listen, RUNTIME + "RunPodSandbox", req)
        sandbox_id = cri.RunPodSandboxResponse.FromString(out).pod_sandbox_id
        [sent] = backend.received("RunPodSandbox")
        got = cri.RunPodSandboxRequest.FromString(sent)
        assert DNS_CONFIG in got.config.SerializeToString()
        assert got.runtime_handler == "runc"
        assert dict(got.config.labels) == BE_LABELS
        assert sandbox_id in proxy.store.pods
    finally:
        await proxy.stop()
        await koordlet.stop()


async def test_with_the_koordlet_down_calls_pass_through_unchanged_and_are_counted(
    tmp_path: Path, backend: FakeCri
) -> None:
    proxy, registry = await start_proxy(tmp_path, backend)  # nothing listens on koordlet.sock
    try:
        data = create_request(spec_annotation({"main": batch("1000", "2000", "1Gi")}))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await unary(proxy.cfg.listen, RUNTIME + "CreateContainer", data)
        assert loop.time() - t0 < proxy.cfg.hook_timeout
        assert backend.received("CreateContainer") == [data]  # byte for byte
        value = registry.get_sample_value(
            "koord_runtime_proxy_hook_fail_open_total",
            {"stage": "PreCreateContainer", "reason": "unavailable"},
        )
        assert value == 1
        # the koordlet comes back: the next call is adjusted again
        koordlet = make_koordlet(str(tmp_path / "koordlet.sock"))
        await koordlet.start()
        try:
            for _ in range(50):
                await unary(proxy.cfg.listen, RUNTIME + "CreateContainer", data)
                last = cri.CreateContainerRequest.FromString(
                    backend.received("CreateContainer")[-1]
                )
                if last.config.linux.resources.cpu_shares == 1024:
                    break
                await asyncio.sleep(0.1)
            assert last.config.linux.resources.cpu_shares == 1024
        finally:
            await koordlet.stop()
    finally:
        await proxy.stop()


async def test_a_koordlet_that_hangs_costs_at_most_the_hook_timeout(
    tmp_path: Path, backend: FakeCri
) -> None:
    hang = asyncio.Event()

    class Hanging(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any]:
            async def never(_data: bytes, _ctx: Any) -> bytes:
                await hang.wait()
                return b""

            return grpc.unary_unary_rpc_method_handler(never)

    stuck = grpc.aio.server()
    stuck.add_generic_rpc_handlers((Hanging(),))
    stuck.add_insecure_port(f"unix://{tmp_path / 'koordlet.sock'}")
    await stuck.start()
    proxy, registry = await start_proxy(tmp_path, backend, hook_timeout=0.2)
    try:
        data = create_request({})
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await unary(proxy.cfg.listen, RUNTIME + "CreateContainer", data)
        assert 0.15 < loop.time() - t0 < 1.0
        assert backend.received("CreateContainer") == [data]
        labels = {"stage": "PreCreateContainer", "reason": "deadline_exceeded"}
        assert registry.get_sample_value("koord_runtime_proxy_hook_fail_open_total", labels) == 1
    finally:
        hang.set()
        await proxy.stop()
        await stuck.stop(0)


async def test_the_hook_server_is_found_through_koordlet_json(
    tmp_path: Path, backend: FakeCri
) -> None:
    koordlet = make_koordlet(str(tmp_path / "elsewhere.sock"))
    await koordlet.start()
    folder = tmp_path / "hookserver.d"
    folder.mkdir()
    (folder / "koordlet.json").write_text(
        json.dumps(
            {
                "remote-endpoint": str(tmp_path / "elsewhere.sock"),
                "failure-policy": "Ignore",
                "runtime-hooks": ["PreCreateContainer"],
            }
        )
    )
    proxy, _ = await start_proxy(tmp_path, backend, hook_endpoint="")
    try:
        ann = spec_annotation({"main": batch("500", "1000", "1Gi")})
        await unary(proxy.cfg.listen, RUNTIME + "CreateContainer", create_request(ann))
        got = cri.CreateContainerRequest.FromString(backend.received("CreateContainer")[-1])
        assert got.config.linux.resources.cpu_shares == 512
        assert proxy.hooks.server_for("PreRunPodSandbox") is None  # not registered for it
    finally:
        await proxy.stop()
        await koordlet.stop()


async def test_update_container_resources_is_adjusted_from_what_create_recorded(
    tmp_path: Path, backend: FakeCri
) -> None:
    koordlet = make_koordlet(str(tmp_path / "koordlet.sock"))
    await koordlet.start()
    proxy, _ = await start_proxy(tmp_path, backend)
    try:
        ann = spec_annotation({"main": batch("1000", "2000", "1Gi")})
        out = await unary(proxy.cfg.listen, RUNTIME + "CreateContainer", create_request(ann))
        cid = cri.CreateContainerResponse.FromString(out).container_id
        update = cri.UpdateContainerResourcesRequest(container_id=cid)
        update.linux.cpu_shares = 2
        await unary(
            proxy.cfg.listen, RUNTIME + "UpdateContainerResources", update.SerializeToString()
        )
        got = cri.UpdateContainerResourcesRequest.FromString(
            backend.received("UpdateContainerResources")[-1]
        )
        assert got.linux.cpu_shares == 1024
        assert got.linux.cpu_quota == 200_000
        await unary(
            proxy.cfg.listen,
            RUNTIME + "RemoveContainer",
            cri.RemoveContainerRequest(container_id=cid).SerializeToString(),
        )
        assert cid not in proxy.store.containers
    finally:
        await proxy.stop()
        await koordlet.stop()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def test_the_hook_apis_resources_are_the_cris_field_for_field() -> None:
    # convert.hook_resources relies on LinuxContainerResources having the same numbers in both
    full = cri.LinuxContainerResources(
        cpu_period=1, cpu_quota=2, cpu_shares=3, memory_limit_in_bytes=4, oom_score_adj=5,
        cpuset_cpus="0-1", cpuset_mems="0", unified={"a": "b"}, memory_swap_limit_in_bytes=10,
    )  # fmt: skip
    full.hugepage_limits.add(page_size="2MB", limit=7)
    as_hook = hookapi.LinuxContainerResources.FromString(full.SerializeToString())
    assert as_hook.SerializeToString() == full.SerializeToString()
    assert as_hook.hugepage_limits[0].limit == 7
