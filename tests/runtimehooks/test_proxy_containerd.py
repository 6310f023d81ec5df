"""End to end: the kubelet's CRI calls through koord-runtime-proxy to a real containerd (its CRI
plugin, runc, cgroupfs), with the koordlet's hook server in between; the values end up in the
containers' real cgroup v1 files.

- a BE pod: the sandbox's pod cgroup gets the batch shares, quota and memory limit (written by
  the koordlet through its executor at RunPodSandbox), and its container the container's, in the
  OCI spec at CreateContainer and so in its cgroup when it starts;
- an LSR pod that the scheduler bound to CPU 0 (``scheduling.koordinator.sh/resource-status``)
  gets it in its container's cpuset.cpus from the CPUSetAllocator hook, and no CFS quota on its
  pod (written by the koordlet at RunPodSandbox) nor its container (koordinator#489);
- with the koordlet stopped, containers are created unchanged (and promptly); once it is back,
  adjusted again, through the same proxy.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from google.protobuf.message import Message
from prometheus_client import CollectorRegistry

from apis.cri.v1 import api_pb2 as cri
from apis.extension import ANNOTATION_RESOURCE_STATUS, LABEL_POD_QOS
from apis.slo_inforce import NodeSLOInForce
from koordlet.executor.audit import AuditLog
from koordlet.executor.writer import CgroupWriter
from koordlet.runtimehooks.framework import HookDispatcher
from koordlet.runtimehooks.hookserver import HookServer
from koordlet.runtimehooks.metrics import HookMetrics
from koordlet.runtimehooks.table import HOOKS, HookContext
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths
from runtimeproxy.server import ProxyConfig, RuntimeProxy
from tests.runtimehooks.containerd import BUSYBOX_IMAGE, Containerd, why_not
from tests.runtimehooks.helpers import BE_LABELS, batch, spec_annotation

_WHY = why_not()
pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.containerd,
    pytest.mark.skipif(_WHY is not None, reason=f"containerd cannot run here: {_WHY}"),
]
RUNTIME = "/runtime.v1.RuntimeService/"
GI = 1 << 30
M = TypeVar("M", bound=Message)


@pytest.fixture(scope="module")
def containerd() -> Iterator[Containerd]:
    root = Path(tempfile.mkdtemp(prefix="koordtest-containerd-"))
    ctrd = Containerd(root)
    try:
        ctrd.start()
        yield ctrd
    finally:
        ctrd.close()


@dataclass
class Stack:
    """containerd, the proxy and the koordlet's hook server, and what the test created."""

    ctrd: Containerd
    proxy: RuntimeProxy
    koordlet_sock: str
    writer: CgroupWriter
    koordlet: HookServer | None = None
    sandboxes: list[str] = field(default_factory=list)

    async def call(self, method: str, req: Message, resp_type: type[M]) -> M:
        async with grpc.aio.insecure_channel(f"unix://{self.proxy.cfg.listen}") as channel:
            data = await channel.unary_unary(RUNTIME + method)(req.SerializeToString(), timeout=60)
        return resp_type.FromString(data)

    async def start_koordlet(self) -> None:
        dispatcher = HookDispatcher(
            HOOKS,
            HookContext(node_slo=NodeSLOInForce),
            enabled=lambda gate: True,
            metrics=HookMetrics(CollectorRegistry()),
            writer=self.writer,
        )
        self.koordlet = HookServer(dispatcher, self.koordlet_sock)
        await self.koordlet.start()

    async def stop_koordlet(self) -> None:
        if self.koordlet is not None:
            await self.koordlet.stop()
            self.koordlet = None

    async def run_pod(
        self, labels: dict[str, str], annotations: dict[str, str], *, pod_quota: int = 0
    ) -> tuple[str, cri.PodSandboxConfig, str]:
        uid = str(uuid.uuid4())
        rel = f"besteffort/pod{uid}"
        self.ctrd.make_pod_cgroup(rel)
        if pod_quota:  # the kubelet's pod-level limit, before the sandbox
            (self.ctrd.cgroup("cpu", rel) / "cpu.cfs_quota_us").write_text(str(pod_quota))
        cfg = cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=f"pod-{uid[:8]}", namespace="default", uid=uid),
            labels=labels,
            annotations=annotations,
        )
        cfg.linux.cgroup_parent = f"/{self.ctrd.cgroup_prefix}/{rel}"
        ns = cfg.linux.security_context.namespace_options
        ns.network, ns.pid = cri.NODE, cri.CONTAINER
        resp = await self.call(
            "RunPodSandbox", cri.RunPodSandboxRequest(config=cfg), cri.RunPodSandboxResponse
        )
        self.sandboxes.append(resp.pod_sandbox_id)
        return resp.pod_sandbox_id, cfg, rel

    async def create(
        self,
        sandbox: str,
        cfg: cri.PodSandboxConfig,
        name: str,
        attempt: int = 0,
        *,
        cpu_quota: int = 0,
    ) -> str:
        config = cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name=name, attempt=attempt),
            image=cri.ImageSpec(image=BUSYBOX_IMAGE),
        )
        config.linux.resources.cpu_shares = 2  # what the kubelet sets for a BestEffort container
        config.linux.resources.cpu_period = 100_000
        config.linux.resources.cpu_quota = cpu_quota
        req = cri.CreateContainerRequest(pod_sandbox_id=sandbox, config=config, sandbox_config=cfg)
        return (await self.call("CreateContainer", req, cri.CreateContainerResponse)).container_id

    async def spec_resources(self, cid: str) -> dict[str, object]:
        status = await self.call(
            "ContainerStatus",
            cri.ContainerStatusRequest(container_id=cid, verbose=True),
            cri.ContainerStatusResponse,
        )
        spec = json.loads(status.info["info"])["runtimeSpec"]
        resources: dict[str, object] = spec["linux"]["resources"]
        return resources

    async def start(self, cid: str) -> None:
        await self.call(
            "StartContainer",
            cri.StartContainerRequest(container_id=cid),
            cri.StartContainerResponse,
        )

    def read(self, controller: str, rel: str, name: str) -> str:
        return (self.ctrd.cgroup(controller, rel) / name).read_text().strip()

    async def cleanup(self) -> None:
        for sandbox in self.sandboxes:
            try:
                stop = cri.StopPodSandboxRequest(pod_sandbox_id=sandbox)
                await self.call("StopPodSandbox", stop, cri.StopPodSandboxResponse)
                remove = cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox)
                await self.call("RemovePodSandbox", remove, cri.RemovePodSandboxResponse)
            except grpc.aio.AioRpcError as err:  # Containerd.close still removes it all
                print(f"cleanup of sandbox {sandbox}: {err.details()}")


@pytest.fixture
async def stack(containerd: Containerd, tmp_path: Path) -> AsyncIterator[Stack]:
    host = Host.detect(HostPaths(), version=CgroupVersion.V1, driver=CgroupDriver.CGROUPFS)
    writer = CgroupWriter(host, on_change=AuditLog(None).on_write)
    writer.start()
    proxy = RuntimeProxy(
        ProxyConfig(
            listen=str(tmp_path / "proxy.sock"),
            runtime_endpoint=containerd.socket,
            image_endpoint=containerd.socket,
            hook_endpoint=str(tmp_path / "koordlet.sock"),
            hook_config_dir=str(tmp_path / "none"),
            hook_timeout=2.0,
        )
    )
    await proxy.start()
    s = Stack(containerd, proxy, str(tmp_path / "koordlet.sock"), writer)
    try:
        await s.start_koordlet()
        yield s
    finally:
        try:
            await s.cleanup()
        finally:
            await s.stop_koordlet()
            await proxy.stop()
            writer.stop()
            print(containerd.log_tail(15))


async def test_a_be_pod_gets_its_batch_resources_in_its_real_cgroups(stack: Stack) -> None:
    ann = spec_annotation(
        {"main": batch("1000", "2000", "1Gi"), "side": batch("500", "1000", "1Gi")}
    )
    sandbox, cfg, rel = await stack.run_pod(BE_LABELS, ann)
    # pod level: the koordlet wrote the pod's cgroup through its executor at RunPodSandbox
    assert stack.read("cpu", rel, "cpu.shares") == "1536"
    assert stack.read("cpu", rel, "cpu.cfs_quota_us") == "300000"
    assert stack.read("memory", rel, "memory.limit_in_bytes") == str(2 * GI)
    cid = await stack.create(sandbox, cfg, "main")
    # container level: in the OCI spec at creation...
    resources = await stack.spec_resources(cid)
    assert resources["cpu"] == {"shares": 1024, "quota": 200_000, "period": 100_000}
    assert resources["memory"]["limit"] == GI  # type: ignore[index]
    # ...and so in its cgroup once runc has made it
    await stack.start(cid)
    crel = f"{rel}/{cid}"
    assert stack.read("cpu", crel, "cpu.shares") == "1024"
    assert stack.read("cpu", crel, "cpu.cfs_quota_us") == "200000"
    assert stack.read("cpu", crel, "cpu.cfs_period_us") == "100000"
    assert stack.read("memory", crel, "memory.limit_in_bytes") == str(GI)


async def test_an_lsr_pods_scheduled_cpus_reach_cpuset_cpus_and_its_quota_is_unset(
    stack: Stack,
) -> None:
    bound = {ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "0"})}
    sandbox, cfg, rel = await stack.run_pod({LABEL_POD_QOS: "LSR"}, bound, pod_quota=50_000)
    assert stack.read("cpu", rel, "cpu.cfs_quota_us") == "-1"  # the pod's, by the koordlet
    cid = await stack.create(sandbox, cfg, "main", cpu_quota=50_000)  # as a kubelet limit sets
    assert (await stack.spec_resources(cid))["cpu"]["cpus"] == "0"  # type: ignore[index]
    await stack.start(cid)
    assert stack.read("cpuset", f"{rel}/{cid}", "cpuset.cpus") == "0"
    assert stack.read("cpu", f"{rel}/{cid}", "cpu.cfs_quota_us") == "-1"


async def test_the_proxy_passes_through_while_the_koordlet_is_down_and_adjusts_once_back(
    stack: Stack,
) -> None:
    ann = spec_annotation({"main": batch("1000", "2000", "1Gi")})
    sandbox, cfg, rel = await stack.run_pod(BE_LABELS, ann)
    await stack.stop_koordlet()
    unchanged = await stack.create(sandbox, cfg, "main")
    assert (await stack.spec_resources(unchanged))["cpu"] == {"shares": 2, "period": 100_000}
    await stack.start_koordlet()
    for attempt in range(30):  # the proxy redials within about a second
        cid = await stack.create(sandbox, cfg, "main", attempt + 1)
        if (await stack.spec_resources(cid))["cpu"] == {
            "shares": 1024, "quota": 200_000, "period": 100_000
        }:  # fmt: skip
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("the proxy did not use the koordlet again after it came back")
    await stack.start(cid)
    assert stack.read("cpu", f"{rel}/{cid}", "cpu.shares") == "1024"
