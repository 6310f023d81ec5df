"""The NRI plugin against the in-repo fake NRI runtime: registration, subscription, adjustments
at creation, pod-level cgroups at sandbox start, fail open within the runtime's budget, and
reconnection after a runtime restart. The wire bytes are checked against NRI's multiplexer and
ttrpc's PROTOCOL.md, encoded here by hand."""

from __future__ import annotations

import asyncio
import concurrent.futures
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from apis.extension import KubeQOS
from apis.nri.v1alpha1 import api_pb2 as nriapi
from apis.slo_inforce import NodeSLOInForce
from koordlet.executor.writer import CgroupWriter
from koordlet.runtimehooks.framework import DispatcherOptions, HookDispatcher
from koordlet.runtimehooks.metrics import HookMetrics
from koordlet.runtimehooks.model import Change, Mount
from koordlet.runtimehooks.nri import NriOptions, NriPlugin
from koordlet.runtimehooks.nrisession import adjustment
from koordlet.runtimehooks.table import HOOKS, HookContext
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from tests.fakehost import FakeHost
from tests.kubefake.fixtures import eventually
from tests.runtimehooks.fakenri import FakeNriRuntime
from tests.runtimehooks.helpers import BE_LABELS, batch, spec_annotation

UID = "11111111-2222-3333-4444-555555555555"


def make_plugin(
    sock: str, writer: object = None, registry: CollectorRegistry | None = None
) -> NriPlugin:
    dispatcher = HookDispatcher(
        HOOKS,
        HookContext(node_slo=NodeSLOInForce),
        enabled=lambda gate: True,
        metrics=HookMetrics(registry or CollectorRegistry()),
        options=DispatcherOptions(timeout=1.0),
        writer=writer,  # type: ignore[arg-type]
    )
    return NriPlugin(
        dispatcher,
        NriOptions(socket=sock, connect_timeout=2.0, backoff_duration=0.05, backoff_cap=0.2),
    )


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[FakeNriRuntime]:
    rt = FakeNriRuntime(str(tmp_path / "nri.sock"))
    await rt.start()
    yield rt
    await rt.stop()


async def running(plugin: NriPlugin) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(plugin.run(), name="nri-plugin-under-test")


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def be_pod(cgroup_parent: str = "/kubepods/besteffort/pod1") -> nriapi.PodSandbox:
    pod = nriapi.PodSandbox(
        id="sandbox1",
        name="be-1",
        namespace="default",
        uid=UID,
        labels=BE_LABELS,
        annotations=spec_annotation({"main": batch("1000", "2000", "1Gi")}),
    )
    pod.linux.cgroup_parent = cgroup_parent
    return pod


async def test_the_registration_frame_is_nris_mux_around_ttrpc_around_protobuf(
    tmp_path: Path,
) -> None:
    got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.set_result(await reader.read(4096))
        writer.close()

    sock = str(tmp_path / "raw.sock")
    server = await asyncio.start_unix_server(accept, sock)
    task = await running(make_plugin(sock))
    data = await asyncio.wait_for(got, 5)
    await stop(task)
    server.close()
    await server.wait_closed()
    # RegisterPluginRequest{plugin_name=1: "koordlet_nri", plugin_idx=2: "00"} by hand
    register = b"\x0a\x0ckoordlet_nri" + b"\x12\x0200"
    service, method = b"nri.pkg.api.v1alpha1.Runtime", b"RegisterPlugin"
    # ttrpc.Request{service=1, method=2, payload=3, timeout_nano=4 (varint)}
    request = (
        b"\x0a" + bytes([len(service)]) + service
        + b"\x12" + bytes([len(method)]) + method
        + b"\x1a" + bytes([len(register)]) + register
    )  # fmt: skip
    assert data[8 + 10 : 8 + 10 + len(request)] == request
    conn, mux_len = struct.unpack(">II", data[:8])
    length, stream, kind, flags = struct.unpack(">IIBB", data[8:18])
    assert conn == 2  # the runtime's service connection
    assert mux_len == 10 + length == len(data) - 8
    assert (stream, kind, flags) == (1, 1, 0)  # first client stream, a request, unary
    assert data[8 + 10 + len(request)] == 0x20  # then timeout_nano (field 4, varint)


async def test_the_plugin_registers_and_subscribes_to_the_events_of_its_hooks(
    runtime: FakeNriRuntime,
) -> None:
    plugin = make_plugin(runtime.path)
    task = await running(plugin)
    try:
        reg = await runtime.wait_ready()
        assert (reg.name, reg.index) == ("koordlet_nri", "00")
        assert reg.synchronized
        for event in (nriapi.RUN_POD_SANDBOX, nriapi.CREATE_CONTAINER, nriapi.UPDATE_CONTAINER):
            assert runtime.subscribed(event), event
        assert not runtime.subscribed(nriapi.STOP_CONTAINER)
        assert plugin.connected
        assert plugin.runtime == "fake-nri v1"
    finally:
        await stop(task)


async def test_create_container_is_answered_with_the_batch_adjustment(
    runtime: FakeNriRuntime,
) -> None:
    task = await running(make_plugin(runtime.path))
    try:
        await runtime.wait_ready()
        container = nriapi.Container(id="c1", pod_sandbox_id="sandbox1", name="main")
        container.linux.resources.cpu.shares.value = 2
        req = nriapi.CreateContainerRequest(pod=be_pod(), container=container)
        resp = await runtime.call("CreateContainer", req, nriapi.CreateContainerResponse)
        res = resp.adjust.linux.resources
        assert res.cpu.shares.value == 1024
        assert res.cpu.quota.value == 200_000
        assert res.cpu.period.value == 100_000
        assert res.memory.limit.value == 1 << 30
        upd = nriapi.UpdateContainerRequest(pod=be_pod(), container=container)
        uresp = await runtime.call("UpdateContainer", upd, nriapi.UpdateContainerResponse)
        [update] = uresp.update
        assert update.container_id == "c1"
        assert update.linux.resources.cpu.quota.value == 200_000
    finally:
        await stop(task)


@pytest.fixture
def fake(host_root: Path) -> FakeHost:
    return FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)


@pytest.fixture
def writer(fake: FakeHost) -> Iterator[CgroupWriter]:
    with CgroupWriter(fake.host) as w:
        yield w


async def test_run_pod_sandbox_writes_the_pods_cgroup(
    runtime: FakeNriRuntime, fake: FakeHost, writer: CgroupWriter
) -> None:
    pod_rel, _ = fake.add_pod(UID, KubeQOS.BESTEFFORT)
    task = await running(make_plugin(runtime.path, writer))
    try:
        await runtime.wait_ready()
        evt = nriapi.StateChangeEvent(event=nriapi.RUN_POD_SANDBOX, pod=be_pod("/" + pod_rel))
        await runtime.call("StateChange", evt, nriapi.Empty)
        assert fake.read("cpu", pod_rel, "cpu.shares").strip() == "1024"
        assert fake.read("cpu", pod_rel, "cpu.cfs_quota_us").strip() == "200000"
        assert fake.read("memory", pod_rel, "memory.limit_in_bytes").strip() == str(1 << 30)
    finally:
        await stop(task)


async def test_an_answer_that_would_outlast_the_runtimes_budget_fails_open(
    runtime: FakeNriRuntime,
) -> None:
    class Stuck:
        def submit(self, *_a: object, **_k: object) -> concurrent.futures.Future[object]:
            return concurrent.futures.Future()

    runtime.request_timeout = 0.2  # the plugin answers within half of it
    registry = CollectorRegistry()
    task = await running(make_plugin(runtime.path, Stuck(), registry))
    try:
        await runtime.wait_ready()
        evt = nriapi.StateChangeEvent(event=nriapi.RUN_POD_SANDBOX, pod=be_pod())
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await runtime.call("StateChange", evt, nriapi.Empty)
        assert loop.time() - t0 < 0.2
        labels = {"mode": "nri", "stage": "PreRunPodSandbox", "reason": "timeout"}
        assert registry.get_sample_value("koordlet_runtime_hook_fail_open_total", labels) == 1
    finally:
        await stop(task)


async def test_the_plugin_reconnects_after_the_runtime_restarts(runtime: FakeNriRuntime) -> None:
    plugin = make_plugin(runtime.path)
    task = await running(plugin)
    try:
        await runtime.wait_ready()
        await runtime.restart()
        await runtime.wait_ready()
        assert len(runtime.registrations) == 2
        await eventually(lambda: plugin.sessions == 2, within=5)
        assert plugin.connected
    finally:
        await stop(task)


async def test_without_the_socket_the_plugin_waits_and_registers_once_it_appears(
    tmp_path: Path,
) -> None:
    rt = FakeNriRuntime(str(tmp_path / "late.sock"))
    plugin = make_plugin(rt.path)
    task = await running(plugin)
    try:
        await eventually(lambda: bool(plugin.last_error), within=5)
        assert "absent" in plugin.last_error
        await rt.start()
        await rt.wait_ready()
    finally:
        await stop(task)
        await rt.stop()


def test_an_adjustment_carries_environment_and_mounts_at_nris_field_numbers() -> None:
    # containerd/nri pkg/api/api.proto: ContainerAdjustment{mounts=3, env=4}, Mount{destination=1,
    # type=2, source=3, options=4}, KeyValue{key=1, value=2}; encoded here by hand
    change = Change(
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
        mounts=(Mount("/d", "/s"),),
    )
    mount = b"\x0a\x02/d" + b"\x12\x04bind" + b"\x1a\x02/s" + b"\x22\x05rbind"
    env = b"\x0a\x16NVIDIA_VISIBLE_DEVICES" + b"\x12\x010"
    want = b"\x1a" + bytes([len(mount)]) + mount + b"\x22" + bytes([len(env)]) + env
    assert adjustment(change).SerializeToString() == want


def test_a_plugin_waiting_for_an_absent_socket_loads_no_protobuf(tmp_path: Path) -> None:
    """The NRI messages and the protobuf runtime (about 2 MiB resident, docs/benchmarks.md)
    load on the first connection: a daemon whose runtime serves no NRI never imports them."""
    code = (
        "import asyncio, sys, koordlet.daemon, koordlet.runtimehooks.stage\n"
        "from koordlet.runtimehooks.nri import NriOptions, NriPlugin\n"
        f"plugin = NriPlugin(None, NriOptions(socket={str(tmp_path / 'nri.sock')!r}))\n"
        "try:\n"
        "    asyncio.run(plugin._session())\n"
        "except FileNotFoundError:\n"
        "    pass\n"
        "loaded = [m for m in ('google.protobuf', 'koordlet.runtimehooks.nrisession') "
        "if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
