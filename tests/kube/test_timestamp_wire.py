"""The timestamps our writers put in Kubernetes objects, against the other side's bytes.

``metav1.Time``: every timestamp in ``tests/golden/captures`` (request bodies a stock
kube-scheduler v1.25 sent; it decoded the Pods and Nodes from the API server and encoded them
again with apimachinery's ``Time.MarshalJSON``) is the real thing: ``creationTimestamp``, the
kubelet-style Node conditions' ``lastHeartbeatTime``/``lastTransitionTime``, managedFields'
``time``. Our writers must produce exactly those bytes for the same instant.

``metav1.MicroTime``: no capture holds one (the scheduler extender protocol carries no Event or
Lease), so the writers are held to apimachinery's own vectors (``micro_time_test.go``:
``DateMicro(1998, May, 5, 5, 5, 5, 5050, UTC)`` marshals as ``1998-05-05T05:05:05.000005Z``) and
must read back through ``time.Parse(RFC3339Micro)``'s grammar.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from apis.node_conditions import CONDITION_BE_EVICTION_PRESSURE, REASON_EVICTING_BE_PODS
from apis.timestamp import format_time, parse_micro_time, parse_time
from koordlet.metriccache import MetricCache
from koordlet.reporter.evictioncondition import with_condition
from koordlet.reporter.nodemetric import build_status
from koordlet.statesinformer.kube import CollectPolicy
from kubeclient.client import KubeClient
from kubeclient.events import core_event
from kubeclient.leaderelection import LeaderElectionConfig, LeaderElector
from scheduler_plugins.reporting import EventRecorder
from scheduler_plugins.snapshot import parse_pod
from tests.kubefake import FakeApiServer

CAPTURES = Path(__file__).resolve().parents[1] / "golden" / "captures"
TIME_FIELDS = frozenset({"creationTimestamp", "lastHeartbeatTime", "lastTransitionTime", "time"})
"""The ``metav1.Time`` fields the captured Pods and Nodes carry."""
MICRO = datetime(1998, 5, 5, 5, 5, 5, tzinfo=UTC).timestamp() + 5050e-9
"""apimachinery's ``DateMicro(1998, time.May, 5, 5, 5, 5, 5050, time.UTC)``."""
MICRO_TEXT = "1998-05-05T05:05:05.000005Z"
"""What ``MicroTime.MarshalJSON`` writes for it (``TestMicroTimeMarshalCBOR``)."""


def _bodies() -> Iterator[Any]:
    for path in sorted(CAPTURES.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            yield json.loads(line)["body"]


def _times(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key in TIME_FIELDS and isinstance(item, str):
                yield item
            else:
                yield from _times(item)
    elif isinstance(value, list):
        for item in value:
            yield from _times(item)


CAPTURED = sorted({t for body in _bodies() for t in _times(body)})


def _captured_node() -> dict[str, Any]:
    for body in _bodies():
        for node in ((body.get("Nodes") or {}).get("items")) or []:
            if node["status"].get("conditions"):
                return dict(node)
    raise AssertionError("no Node with conditions in the captures")


def _captured_pod() -> dict[str, Any]:
    return dict(next(body["Pod"] for body in _bodies() if body.get("Pod")))


def test_the_captures_hold_the_api_servers_timestamps() -> None:
    assert len(CAPTURED) >= 5
    assert all(t.endswith("Z") and len(t) == len("2006-01-02T15:04:05Z") for t in CAPTURED)


@pytest.mark.parametrize("text", CAPTURED)
def test_each_captured_time_reads_and_is_written_back_byte_for_byte(text: str) -> None:
    assert format_time(parse_time(text)) == text
    assert format_time(parse_time(text) + 0.999) == text  # MarshalJSON drops the fraction


def test_the_koordlets_nodemetric_update_time_is_written_as_captured() -> None:
    text = CAPTURED[-1]
    now = parse_time(text) + 0.75
    status = build_status(MetricCache(clock=lambda: now), CollectPolicy(), [], [], now)
    assert status["updateTime"] == text


def test_the_eviction_condition_is_stamped_as_the_kubelets_own_conditions_are() -> None:
    node = _captured_node()
    kubelet = node["status"]["conditions"][0]
    text = kubelet["lastHeartbeatTime"]
    status = with_condition(
        node["status"], True, REASON_EVICTING_BE_PODS, "evicting", parse_time(text) + 0.4
    )
    assert status is not None
    ours = next(c for c in status["conditions"] if c["type"] == CONDITION_BE_EVICTION_PRESSURE)
    assert (ours["lastHeartbeatTime"], ours["lastTransitionTime"]) == (text, text)
    assert kubelet in status["conditions"]  # the kubelet's own bytes kept as they were


def test_a_core_event_is_stamped_as_the_api_server_stamps_the_pod() -> None:
    pod = _captured_pod()
    meta = pod["metadata"]
    text = meta["creationTimestamp"]
    involved = {"kind": "Pod", "namespace": meta["namespace"], "name": meta["name"]}
    event = core_event(
        involved, reason="R", message="m", component="koordlet", now=parse_time(text) + 0.2
    )
    assert (event["firstTimestamp"], event["lastTimestamp"]) == (text, text)


async def test_the_schedulers_event_time_is_a_micro_time(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    recorder = EventRecorder(kube_client, clock=lambda: MICRO, instance="ks")
    recorder.warn(parse_pod(_captured_pod(), "capture"), "FailedScheduling", "no fit")
    await recorder.flush()
    [event] = [o for (plural, _, _), o in kube_api.objects.items() if plural == "events"]
    assert event["eventTime"] == MICRO_TEXT
    assert parse_micro_time(event["eventTime"]) == pytest.approx(MICRO, abs=1e-6)


async def test_the_lease_renew_and_acquire_times_are_micro_times(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    config = LeaderElectionConfig("koordinator-system", "koord-manager", "a")
    elector = LeaderElector(kube_client, config, wall_clock=lambda: MICRO)
    assert await elector.try_acquire_or_renew()
    lease = kube_api.get("leases", "koord-manager", "koordinator-system")
    assert lease is not None
    assert (lease["spec"]["acquireTime"], lease["spec"]["renewTime"]) == (MICRO_TEXT, MICRO_TEXT)
