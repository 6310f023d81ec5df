"""The hook server speaks Koordinator's runtime.v1alpha1.RuntimeHookService on a unix socket:
a gRPC client built from the published service and method names gets BatchResource's values
merged over what it sent, as upstream's proxy expects."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from apis.runtime.v1alpha1 import api_pb2 as hookapi
from apis.slo_inforce import NodeSLOInForce
from koordlet.runtimehooks.framework import HookDispatcher
from koordlet.runtimehooks.hookserver import HookServer, write_hook_server_config
from koordlet.runtimehooks.metrics import HookMetrics
from koordlet.runtimehooks.model import HookPoint
from koordlet.runtimehooks.table import HOOKS, HookContext
from tests.runtimehooks.helpers import BE_LABELS, batch, spec_annotation

SERVICE = "/runtime.v1alpha1.RuntimeHookService/"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[HookServer]:
    dispatcher = HookDispatcher(
        HOOKS,
        HookContext(node_slo=NodeSLOInForce),
        enabled=lambda gate: True,
        metrics=HookMetrics(CollectorRegistry()),
    )
    srv = HookServer(dispatcher, str(tmp_path / "koordlet.sock"))
    await srv.start()
    yield srv
    await srv.stop()


async def call(path: str, method: str, req: object, resp_type: type) -> object:
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        stub = channel.unary_unary(
            SERVICE + method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=resp_type.FromString,  # type: ignore[attr-defined]
        )
        return await stub(req, timeout=5)


def container_hook_request(annotations: dict[str, str]) -> hookapi.ContainerResourceHookRequest:
    req = hookapi.ContainerResourceHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(name="be-1", namespace="default", uid="u1"),
        container_mata=hookapi.ContainerMetadata(name="main", id="c0ffee"),
        container_annotations={"io.kubernetes.container.name": "main"},
        pod_annotations=annotations,
        pod_labels=BE_LABELS,
        pod_cgroup_parent="/kubepods/besteffort/podu1",
    )
    req.container_resources.cpu_shares = 2
    req.container_resources.cpu_period = 100_000
    req.container_resources.oom_score_adj = 1000
    return req


async def test_create_container_gets_the_batch_values_over_the_request(server: HookServer) -> None:
    ann = spec_annotation({"main": batch("1000", "2000", "1Gi")})
    resp = await call(
        server.path,
        "PreCreateContainerHook",
        container_hook_request(ann),
        hookapi.ContainerResourceHookResponse,
    )
    assert isinstance(resp, hookapi.ContainerResourceHookResponse)
    res = resp.container_resources
    assert (res.cpu_shares, res.cpu_quota, res.cpu_period) == (1024, 200_000, 100_000)
    assert res.memory_limit_in_bytes == 1 << 30
    assert res.oom_score_adj == 1000  # what the hooks did not touch comes back as sent
    assert dict(resp.container_annotations) == {"io.kubernetes.container.name": "main"}
    assert resp.pod_cgroup_parent == "/kubepods/besteffort/podu1"


async def test_a_pod_that_is_not_batch_comes_back_as_it_was_sent(server: HookServer) -> None:
    req = container_hook_request({})
    resp = await call(
        server.path, "PreCreateContainerHook", req, hookapi.ContainerResourceHookResponse
    )
    assert isinstance(resp, hookapi.ContainerResourceHookResponse)
    assert resp.container_resources == req.container_resources


async def test_run_pod_sandbox_answers_with_the_pod_values(server: HookServer) -> None:
    ann = spec_annotation({"a": batch("500", "1000", "1Gi"), "b": batch("500", "1000", "1Gi")})
    req = hookapi.PodSandboxHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(name="be-1", namespace="default", uid="u1"),
        labels=BE_LABELS,
        annotations=ann,
        cgroup_parent="/kubepods/besteffort/podu1",
    )
    resp = await call(server.path, "PreRunPodSandboxHook", req, hookapi.PodSandboxHookResponse)
    assert isinstance(resp, hookapi.PodSandboxHookResponse)
    assert resp.resources.cpu_shares == 1024
    assert resp.resources.cpu_quota == 200_000
    assert resp.resources.memory_limit_in_bytes == 2 << 30
    assert resp.cgroup_parent == req.cgroup_parent
    assert dict(resp.labels) == BE_LABELS


def test_koordlet_json_tells_the_proxy_the_endpoint_and_stages(tmp_path: Path) -> None:
    # upstream RuntimeHookConfig: remote-endpoint, failure-policy, runtime-hooks
    points = (HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_CREATE_CONTAINER)
    path = write_hook_server_config(str(tmp_path), "/var/run/koordlet/koordlet.sock", points)
    assert json.loads(Path(path).read_text()) == {
        "remote-endpoint": "/var/run/koordlet/koordlet.sock",
        "failure-policy": "Ignore",
        "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer"],
    }
