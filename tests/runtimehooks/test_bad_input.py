"""A pod with malformed batch quantities is left unchanged: through the hook server the answer is
the request as sent, koordlet_runtime_hook_bad_input_total counts it, and in cluster mode a
Warning Event names the field on the pod (the fake API server records it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from apis.extension import ANNOTATION_EXTENDED_RESOURCE_SPEC
from apis.runtime.v1alpha1 import api_pb2 as hookapi
from apis.slo_inforce import NodeSLOInForce
from koordlet.executor.audit import AuditLog
from koordlet.runtimehooks.events import KubeEventSink
from koordlet.runtimehooks.framework import HookDispatcher
from koordlet.runtimehooks.hookserver import HookServer
from koordlet.runtimehooks.metrics import HookMetrics
from koordlet.runtimehooks.table import HOOKS, HookContext
from kubeclient.client import KubeClient
from tests.kubefake.fixtures import eventually, kube_api, kube_client, kubeconfig
from tests.kubefake.server import FakeApiServer
from tests.runtimehooks.helpers import BE_LABELS

__all__ = ["kube_api", "kube_client", "kubeconfig"]  # the fixtures

BAD = '{"containers": {"main": {"limits": {"kubernetes.io/batch-cpu": "two cores"}}}}'


@pytest.fixture
async def server(
    tmp_path: Path, kube_client: KubeClient
) -> AsyncIterator[tuple[HookServer, CollectorRegistry, AuditLog]]:
    registry = CollectorRegistry()
    audit = AuditLog(None)
    events = KubeEventSink(kube_client, "node-1")
    dispatcher = HookDispatcher(
        HOOKS,
        HookContext(node_slo=NodeSLOInForce),
        enabled=lambda gate: True,
        metrics=HookMetrics(registry),
        audit=audit,
        events=events,
    )
    srv = HookServer(dispatcher, str(tmp_path / "koordlet.sock"))
    await srv.start()
    yield srv, registry, audit
    await srv.stop()
    await events.close()


async def test_malformed_batch_quantities_leave_the_container_unchanged_with_an_event(
    server: tuple[HookServer, CollectorRegistry, AuditLog], kube_api: FakeApiServer
) -> None:
    srv, registry, audit = server
    req = hookapi.ContainerResourceHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(name="be-1", namespace="default", uid="u1"),
        container_mata=hookapi.ContainerMetadata(name="main"),
        pod_labels=BE_LABELS,
        pod_annotations={ANNOTATION_EXTENDED_RESOURCE_SPEC: BAD},
    )
    req.container_resources.cpu_shares = 2
    async with grpc.aio.insecure_channel(f"unix://{srv.path}") as channel:
        call = channel.unary_unary(
            "/runtime.v1alpha1.RuntimeHookService/PreCreateContainerHook",
            request_serializer=hookapi.ContainerResourceHookRequest.SerializeToString,
            response_deserializer=hookapi.ContainerResourceHookResponse.FromString,
        )
        resp = await call(req, timeout=5)
    assert resp.container_resources == req.container_resources
    labels = {
        "hook": "BatchResource",
        "stage": "PreCreateContainer",
        "reason": "InvalidExtendedResourceSpec",
    }
    assert registry.get_sample_value("koordlet_runtime_hook_bad_input_total", labels) == 1

    def events() -> list[dict[str, object]]:
        return [o for (plural, _, _), o in kube_api.objects.items() if plural == "events"]

    await eventually(lambda: len(events()) == 1, within=5)
    [event] = events()
    assert event["type"] == "Warning"
    assert event["reason"] == "InvalidExtendedResourceSpec"
    assert "batch-cpu" in str(event["message"])
    assert event["involvedObject"] == {  # type: ignore[comparison-overlap]
        "apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": "be-1", "uid": "u1"
    }  # fmt: skip
    assert any("InvalidExtendedResourceSpec" in e.reason for e in audit.recent())
