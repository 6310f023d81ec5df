"""The koordlet's one Warning Event writer for pods (kubeclient.events.PodEventSink), as the QoS
strategies' malformed-annotation warnings use it in cluster mode: the fake API server records a
core/v1 Event in client-go's recorder shape (``tools/record/event.go``, ``makeEvent``), the
warning is logged on the caller's logger, and an API error is logged, never raised."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from apis.extension import KubeQOS, QoSClass
from koordlet.qos.podwarnings import EVENT_REASON, KubeEventSink, PodAnnotationWarnings
from koordlet.statesinformer.model import PodInfo
from kubeclient.client import KubeClient
from tests.kubefake import FakeApiServer, Fault
from tests.kubefake.fixtures import eventually

ANNOTATION = "koordinator.sh/oom-score-adj"


def _pod() -> PodInfo:
    return PodInfo(
        uid="u-1",
        name="be-1",
        namespace="ns",
        qos=QoSClass.BE,
        kube_qos=KubeQOS.BESTEFFORT,
        cgroup_dir="kubepods/besteffort/podu-1",
        annotations={ANNOTATION: "lots"},
    )


def _events(api: FakeApiServer) -> list[dict[str, Any]]:
    return [o for (plural, _, _), o in api.objects.items() if plural == "events"]


async def test_a_malformed_annotation_is_a_warning_event_on_the_pod_and_a_log_line(
    kube_api: FakeApiServer, kube_client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="koordlet.qos.podwarnings")
    sink = KubeEventSink(kube_client, "node-1")
    warnings = PodAnnotationWarnings(sink)
    warnings.report("oomscoreadj", _pod(), ANNOTATION, "not an integer")
    await eventually(lambda: len(_events(kube_api)) == 1, within=5)
    await sink.close()

    [event] = _events(kube_api)
    assert event["type"] == "Warning"
    assert event["reason"] == EVENT_REASON
    assert event["message"] == (
        f"annotation {ANNOTATION} ignored, the pod keeps its QoS class defaults: not an integer"
    )
    assert event["involvedObject"] == {
        "apiVersion": "v1", "kind": "Pod", "namespace": "ns", "name": "be-1", "uid": "u-1"
    }  # fmt: skip
    assert event["source"] == {"component": "koordlet", "host": "node-1"}
    assert event["metadata"]["namespace"] == "ns"
    assert str(event["metadata"]["name"]).startswith("be-1.")
    [line] = [r for r in caplog.records if r.name == "koordlet.qos.podwarnings"]
    assert line.getMessage().startswith(f"pod ns/be-1: {EVENT_REASON}: annotation {ANNOTATION}")


async def test_an_api_error_on_the_event_is_logged_and_not_raised(
    kube_api: FakeApiServer, kube_client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="koordlet.qos.podwarnings")
    kube_api.faults.append(Fault(status=403, method="POST", path_contains="/events"))
    sink = KubeEventSink(kube_client, "node-1")
    sink.warn(_pod(), EVENT_REASON, "bad value")

    def refused() -> bool:
        return any("not recorded" in r.getMessage() for r in caplog.records)

    await eventually(refused, within=5)
    await sink.close()
    assert _events(kube_api) == []
    [line] = [r for r in caplog.records if "not recorded" in r.getMessage()]
    assert line.name == "koordlet.qos.podwarnings"
    assert line.getMessage().startswith(f"event {EVENT_REASON} on pod ns/be-1 not recorded: ")
