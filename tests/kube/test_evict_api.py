"""The Eviction API backend against the fake API server, alone and under the QoS evictor."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from apis.extension import KubeQOS, QoSClass
from koordlet.qos.evict_api import EVENT_REASON_SUCCESS, EvictionApiBackend
from koordlet.qos.evictor import EvictionFailed, Evictor, Victim
from koordlet.statesinformer.model import HostAppInfo, PodInfo
from kubeclient.client import KubeClient
from tests.kubefake import FakeApiServer, Fault

REASON = "EvictPodByNodeMemoryUsage"


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def _store_pod(api: FakeApiServer, name: str) -> PodInfo:
    stored = api.put("pods", {"metadata": {"name": name, "namespace": "ns"}, "spec": {}})
    uid = stored["metadata"]["uid"]
    return PodInfo(
        uid=uid,
        name=name,
        namespace="ns",
        qos=QoSClass.BE,
        kube_qos=KubeQOS.BESTEFFORT,
        cgroup_dir=f"kubepods/besteffort/pod{uid}",
    )


def _evictions(api: FakeApiServer) -> int:
    return len(api.writes("POST", "/eviction"))


async def test_an_accepted_eviction_deletes_the_pod_and_is_remembered(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    pod = _store_pod(kube_api, "batch-1")
    clock = Clock()
    backend = EvictionApiBackend(kube_client, node_name="node-1", clock=clock)
    detail = await backend.evict(Victim.of_pod(pod), reason=REASON, message="used 1 GiB")
    assert "accepted" in detail
    assert kube_api.get("pods", "batch-1", "ns") is None
    request = kube_api.writes("POST", "/eviction")[0]
    assert request.path == "/api/v1/namespaces/ns/pods/batch-1/eviction"
    assert request.body["apiVersion"] == "policy/v1"
    assert request.body["deleteOptions"] == {"preconditions": {"uid": pod.uid}}
    assert backend.is_evicted(pod.uid)

    # asked again: no second request; it is terminating, reported gone
    assert await backend.evict(Victim.of_pod(pod), reason=REASON, message="") == "gone"
    assert _evictions(kube_api) == 1
    clock.now += backend.remember
    assert not backend.is_evicted(pod.uid)

    events = [o for (plural, _, _), o in kube_api.objects.items() if plural == "events"]
    assert len(events) == 1
    assert events[0]["reason"] == EVENT_REASON_SUCCESS
    assert events[0]["involvedObject"]["uid"] == pod.uid
    assert REASON in events[0]["message"]


async def test_a_disruption_budget_429_fails_the_round_and_waits_for_retry_after(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    pod = _store_pod(kube_api, "batch-1")
    kube_api.faults.append(Fault(status=429, retry_after=30, path_contains="/eviction"))
    clock = Clock()
    backend = EvictionApiBackend(kube_client, clock=clock)
    with pytest.raises(EvictionFailed, match="429"):
        await backend.evict(Victim.of_pod(pod), reason=REASON, message="")
    assert kube_api.get("pods", "batch-1", "ns") is not None  # not killed, not deleted
    clock.now += 10
    with pytest.raises(EvictionFailed, match="retry in 20s"):
        await backend.evict(Victim.of_pod(pod), reason=REASON, message="")
    assert _evictions(kube_api) == 1  # Retry-After honoured: nothing sent
    clock.now += 21
    await backend.evict(Victim.of_pod(pod), reason=REASON, message="")
    assert _evictions(kube_api) == 2
    assert kube_api.get("pods", "batch-1", "ns") is None


async def test_a_budget_refusal_without_retry_after_waits_the_default(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    pod = _store_pod(kube_api, "batch-1")
    kube_api.eviction_blocked.add("batch-1")
    clock = Clock()
    backend = EvictionApiBackend(kube_client, clock=clock, retry_after_default=15)
    with pytest.raises(EvictionFailed, match="disruption budget"):
        await backend.evict(Victim.of_pod(pod), reason=REASON, message="")
    assert backend.retry_at[pod.uid] == clock.now + 15


async def test_a_pod_already_gone_or_replaced_is_reported_gone(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    pod = _store_pod(kube_api, "batch-1")
    backend = EvictionApiBackend(kube_client)
    kube_api.remove("pods", "batch-1", "ns")
    assert await backend.evict(Victim.of_pod(pod), reason=REASON, message="") == "gone"
    # a new pod took the name: the UID precondition protects it
    _store_pod(kube_api, "batch-1")
    assert await backend.evict(Victim.of_pod(pod), reason=REASON, message="") == "gone"
    assert kube_api.get("pods", "batch-1", "ns") is not None


async def test_an_unreachable_api_server_fails_the_eviction(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    pod = _store_pod(kube_api, "batch-1")
    kube_api.faults.append(Fault(status=503, path_contains="/eviction"))
    backend = EvictionApiBackend(kube_client)
    with pytest.raises(EvictionFailed, match="503"):
        await backend.evict(Victim.of_pod(pod), reason=REASON, message="")
    assert kube_api.get("pods", "batch-1", "ns") is not None


async def test_a_host_application_cannot_be_evicted_through_the_api(
    kube_client: KubeClient,
) -> None:
    app = HostAppInfo(name="nginx", qos=QoSClass.BE, cgroup_dir="host-latency-sensitive/nginx")
    with pytest.raises(EvictionFailed, match="not a pod"):
        await EvictionApiBackend(kube_client).evict(
            Victim.of_host_app(app), reason=REASON, message=""
        )


async def test_under_the_evictor_a_refusal_is_a_failed_outcome_and_success_is_counted(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    blocked = _store_pod(kube_api, "blocked")
    free = _store_pod(kube_api, "free")
    kube_api.eviction_blocked.add("blocked")
    evictor = Evictor(EvictionApiBackend(kube_client, record_events=False))
    outcomes = await evictor.evict(
        [Victim.of_pod(blocked), Victim.of_pod(free)], strategy="memoryevict", reason=REASON
    )
    assert [o.status for o in outcomes] == ["failed", "evicted"]
    assert kube_api.get("pods", "blocked", "ns") is not None
    assert kube_api.get("pods", "free", "ns") is None
    assert evictor.metrics.evicted == {REASON: 1}
