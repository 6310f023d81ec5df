"""The koordlet's Kubernetes states source: pods, NodeSLO (persisted), NodeMetric spec."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from apis.extension import KubeQOS, QoSClass
from koordlet.statesinformer.inventory import WorkloadInventory
from koordlet.statesinformer.kube import (
    CollectPolicy,
    KubeStatesSource,
    parse_collect_policy,
    pod_info,
)
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from kubeclient.backoff import Backoff
from kubeclient.client import KubeClient, Obj
from kubeclient.informer import Informer
from tests.fakehost import FakeHost
from tests.kube.conftest import eventually
from tests.kube.conftest import running_source as _running
from tests.kubefake import FakeApiServer, Fault

NODE = "node-1"
UID_BE = "11111111-2222-3333-4444-555555555555"
UID_LS = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
UID_OTHER = "00000000-0000-0000-0000-000000000000"
UID_DONE = "10000000-0000-0000-0000-000000000000"
CID = "ab" * 32


def _fast_informer(*args: object, **kw: object) -> Informer:
    kw["backoff"] = Backoff(base=0.01, cap=0.05, rng=random.Random(1))
    return Informer(*args, **kw)  # type: ignore[arg-type]


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "host", CgroupVersion.V1, CgroupDriver.CGROUPFS)


def _source(client: KubeClient, host: FakeHost, state_dir: Path) -> KubeStatesSource:
    return KubeStatesSource(
        client, NODE, lambda: host.layout, str(state_dir), informer_factory=_fast_informer
    )


def _pods() -> list[Obj]:
    be = {
        "metadata": {
            "name": "batch",
            "namespace": "jobs",
            "uid": UID_BE,
            "labels": {"koordinator.sh/qosClass": "BE"},
            "annotations": {"a": "b"},
            "creationTimestamp": "2026-01-02T03:04:05Z",
        },
        "spec": {
            "nodeName": NODE,
            "priority": 5500,
            "containers": [
                {"name": "c", "resources": {"requests": {"kubernetes.io/batch-cpu": "1k"}}}
            ],
        },
        "status": {
            "phase": "Running",
            "qosClass": "BestEffort",
            "containerStatuses": [{"name": "c", "containerID": f"containerd://{CID}"}],
        },
    }
    ls = {
        "metadata": {"name": "web", "namespace": "prod", "uid": UID_LS},
        "spec": {
            "nodeName": NODE,
            "containers": [
                {
                    "name": "a",
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "1Gi"},
                        "limits": {"cpu": "1", "memory": "2Gi"},
                    },
                },
                {
                    "name": "b",
                    "resources": {
                        "requests": {"cpu": "250m", "memory": "512Mi"},
                        "limits": {"cpu": "1500m", "memory": "1Gi"},
                    },
                },
            ],
        },
        "status": {"phase": "Running"},  # no qosClass yet: computed (Burstable)
    }
    other = {
        "metadata": {
            "name": "elsewhere",
            "namespace": "x",
            "uid": "0" * 8 + "-0000-0000-0000-" + "0" * 12,
        },
        "spec": {"nodeName": "node-2", "containers": []},
    }
    done = {
        "metadata": {
            "name": "done",
            "namespace": "x",
            "uid": "1" * 8 + "-0000-0000-0000-" + "0" * 12,
        },
        "spec": {"nodeName": NODE, "containers": []},
        "status": {"phase": "Succeeded"},
    }
    return [be, ls, other, done]


async def test_pods_bound_to_the_node_map_to_pod_infos(
    kube_api: FakeApiServer, kube_client: KubeClient, host: FakeHost, tmp_path: Path
) -> None:
    for pod in _pods():
        kube_api.put("pods", pod)
    source = _source(kube_client, host, tmp_path / "state")
    async with _running(source):
        assert await source.wait_synced(5.0)
        pods = source.list_pods()
    assert sorted(pods) == [UID_BE, UID_LS]
    be, ls = pods[UID_BE], pods[UID_LS]
    assert (be.qos, be.kube_qos, be.priority_class, be.priority) == (
        QoSClass.BE,
        KubeQOS.BESTEFFORT,
        "koord-batch",
        5500,
    )
    assert be.cgroup_dir == f"kubepods/besteffort/pod{UID_BE}"
    assert [(c.id, c.name, c.runtime, c.cgroup_dir) for c in be.containers] == [
        (CID, "c", "containerd", f"kubepods/besteffort/pod{UID_BE}/{CID}")
    ]
    assert be.annotations == {"a": "b"}
    assert be.created_at == 1767323045.0
    assert be.source == "kubernetes"
    assert (ls.qos, ls.kube_qos, ls.priority_class) == (
        QoSClass.LS,
        KubeQOS.BURSTABLE,
        "koord-prod",
    )
    assert (ls.cpu_request_milli, ls.memory_request_bytes) == (750, 1536 * 2**20)
    assert (ls.cpu_limit_milli, ls.memory_limit_bytes) == (2500, 3 * 2**30)
    assert ls.cgroup_dir == f"kubepods/burstable/pod{UID_LS}"


async def test_the_inventory_takes_the_kubernetes_source_and_sees_deletions(
    kube_api: FakeApiServer, kube_client: KubeClient, host: FakeHost, tmp_path: Path
) -> None:
    for pod in _pods():
        kube_api.put("pods", pod)
    source = _source(kube_client, host, tmp_path / "state")
    inventory = WorkloadInventory([source], [source])
    async with _running(source):
        assert await source.wait_synced(5.0)
        first = inventory.refresh()
        kube_api.remove("pods", "batch", "jobs")
        await eventually(lambda: UID_BE not in source.list_pods())
        second = inventory.refresh()
    assert first.added == tuple(sorted([UID_BE, UID_LS]))
    assert second.removed == (UID_BE,)


def _nodeslo(threshold: int) -> Obj:
    return {
        "metadata": {"name": NODE},
        "spec": {
            "resourceUsedThresholdWithBE": {
                "enable": True,
                "cpuSuppressThresholdPercent": threshold,
            },
            "hostApplications": [{"name": "nginx", "qos": "LS", "priority": "koord-prod"}],
        },
    }


async def test_the_nodeslo_merges_over_defaults_notifies_and_is_persisted(
    kube_api: FakeApiServer, kube_client: KubeClient, host: FakeHost, tmp_path: Path
) -> None:
    kube_api.put("nodeslos", _nodeslo(50))
    source = _source(kube_client, host, tmp_path / "state")
    seen: list[int] = []
    source.add_node_slo_listener(
        lambda s: seen.append(s.resource_used_threshold_with_be.cpu_suppress_threshold_percent)
    )
    async with _running(source):
        assert await source.wait_synced(5.0)
        kube_api.put("nodeslos", _nodeslo(40))
        await eventually(lambda: seen == [50, 40])
        await source.flush()
    threshold = source.node_slo.resource_used_threshold_with_be
    assert threshold.enable is True
    assert threshold.cpu_suppress_threshold_percent == 40
    assert threshold.memory_evict_threshold_percent == 70  # Koordinator's default, kept
    assert [a.name for a in source.list_host_apps()] == ["nginx"]
    saved = json.loads((tmp_path / "state" / "nodeslo.json").read_text())
    assert saved["spec"]["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] == 40


async def test_a_restart_without_the_api_server_runs_on_the_persisted_nodeslo(
    kube_api: FakeApiServer, kube_client: KubeClient, host: FakeHost, tmp_path: Path
) -> None:
    kube_api.put("nodeslos", _nodeslo(45))
    first = _source(kube_client, host, tmp_path / "state")
    async with _running(first):
        assert await first.wait_synced(5.0)
        await first.flush()
    # The API server goes away; a new koordlet starts.
    kube_api.faults.append(Fault(status=503, times=10_000))
    second = _source(kube_client, host, tmp_path / "state")
    assert second.load_persisted()
    async with _running(second):
        assert not await second.wait_synced(0.3)
        assert not second.connected
    threshold = second.node_slo.resource_used_threshold_with_be
    assert threshold.cpu_suppress_threshold_percent == 45
    assert [a.name for a in second.list_host_apps()] == ["nginx"]


def test_without_a_persisted_nodeslo_the_defaults_are_used(tmp_path: Path, host: FakeHost) -> None:
    source = KubeStatesSource(None, NODE, lambda: host.layout, str(tmp_path))  # type: ignore[arg-type]
    assert not source.load_persisted()
    assert source.node_slo.resource_used_threshold_with_be.cpu_suppress_threshold_percent == 65


async def test_the_nodemetric_spec_sets_the_collect_policy(
    kube_api: FakeApiServer, kube_client: KubeClient, host: FakeHost, tmp_path: Path
) -> None:
    kube_api.put(
        "nodemetrics",
        {
            "metadata": {"name": NODE},
            "spec": {
                "metricCollectPolicy": {
                    "aggregateDurationSeconds": 120,
                    "reportIntervalSeconds": 10,
                    "nodeAggregatePolicy": {"durations": ["5m0s", "1h0m0s"]},
                }
            },
        },
    )
    source = _source(kube_client, host, tmp_path / "state")
    async with _running(source):
        assert await source.wait_synced(5.0)
    assert source.node_metric() is not None
    assert source.collect_policy == CollectPolicy(
        aggregate_duration_seconds=120,
        report_interval_seconds=30,  # raised to Koordinator's minimum
        node_aggregate_durations=(300, 3600),
    )


def test_a_missing_collect_policy_is_koordinators_default() -> None:
    assert parse_collect_policy({}) == CollectPolicy(300, 60, (300, 600, 1800))


def test_each_container_carries_its_own_requests_and_limits(host: FakeHost) -> None:
    pod = {
        "metadata": {"name": "web", "namespace": "prod", "uid": UID_LS},
        "spec": {
            "nodeName": NODE,
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "1"}}},
                {"name": "b", "resources": {"requests": {"memory": "1Gi"}}},
            ],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "a", "containerID": f"containerd://{CID}"},
                {"name": "b", "containerID": f"containerd://{'cd' * 32}"},
            ],
        },
    }

    info = pod_info(pod, host.layout)

    by_name = {c.name: c for c in info.containers}
    assert (by_name["a"].cpu_request_milli, by_name["a"].cpu_limit_milli) == (500, 1000)
    assert by_name["a"].memory_limit_bytes is None
    assert (by_name["b"].memory_request_bytes, by_name["b"].cpu_limit_milli) == (1 << 30, None)
    assert info.cpu_limit_milli is None  # container b is unlimited, so the pod is
    # nothing to carry: one shared read-only empty mapping for all pods
    other = pod_info({**pod, "metadata": {**pod["metadata"], "uid": UID_LS}}, host.layout)
    for empty in ("labels", "annotations", "extended_requests", "extended_resources"):
        assert getattr(info, empty) == {}
        assert getattr(info, empty) is getattr(other, empty)
    with pytest.raises(TypeError):
        info.annotations["x"] = "y"  # type: ignore[index]


def test_extended_requests_and_the_raw_qos_label_are_read(host: FakeHost) -> None:
    # upstream's GetContainerBatchMilliCPURequest and friends: the integer value of each
    # extended resource, summed over the containers and the sidecar (restartable init)
    # containers; GetPodQoSClassRaw: the label alone
    def container(name: str, requests: dict[str, str]) -> Obj:
        return {"name": name, "resources": {"requests": requests, "limits": requests}}

    pod: Obj = {
        "metadata": {"name": "b", "namespace": "ns", "uid": UID_LS, "labels": {}},
        "spec": {
            "priority": 5500,
            "containers": [
                container(
                    "a", {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "1Gi"}
                ),
                container("b", {"kubernetes.io/batch-cpu": "500"}),
            ],
            "initContainers": [
                {
                    **container("side", {"kubernetes.io/batch-cpu": "250"}),
                    "restartPolicy": "Always",
                },
                container("init", {"kubernetes.io/batch-cpu": "9000"}),  # not a sidecar
            ],
        },
        "status": {"phase": "Running", "containerStatuses": []},
    }
    info = pod_info(pod, host.layout)
    assert info.extended_requests == {
        "kubernetes.io/batch-cpu": 2250,
        "kubernetes.io/batch-memory": 1 << 30,
    }
    assert info.qos is QoSClass.LS  # derived from the Kubernetes QoS (Burstable)
    assert info.qos_label is QoSClass.NONE  # no koordinator.sh/qosClass label
    labelled = {**pod, "metadata": {**pod["metadata"], "labels": {"koordinator.sh/qosClass": "BE"}}}
    assert pod_info(labelled, host.layout).qos_label is QoSClass.BE


async def test_a_nodeslo_with_one_bad_section_keeps_the_others_and_posts_a_warning_event(
    kube_api: FakeApiServer, kube_client: KubeClient, host: FakeHost, tmp_path: Path
) -> None:
    bad = _nodeslo(45)
    bad["spec"]["cpuBurstStrategy"] = {"policy": "sometimes"}
    kube_api.put("nodeslos", bad)
    source = _source(kube_client, host, tmp_path / "state")
    async with _running(source):
        assert await source.wait_synced(5.0)
        await source.flush()

    in_force = source.node_slo
    assert in_force.resource_used_threshold_with_be.cpu_suppress_threshold_percent == 45
    assert in_force.cpu_burst_strategy.policy.value == "none"  # the section's default
    (rejection,) = in_force.rejected.values()
    assert rejection.error.field == "spec.cpuBurstStrategy.policy"
    (post,) = kube_api.writes("POST", "/events")
    event = post.body
    assert event["type"] == "Warning"
    assert event["reason"] == "InvalidNodeSLO"
    assert event["involvedObject"]["kind"] == "NodeSLO"
    assert event["involvedObject"]["name"] == NODE
    assert event["metadata"]["namespace"] == "default"  # a cluster-scoped object's Events
    assert "spec.cpuBurstStrategy.policy" in event["message"]
    assert "sometimes" in event["message"]
