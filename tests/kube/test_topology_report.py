"""NodeResourceTopology reporting against the fake API server: content, and writes only on
change."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from apis.configuration import CPUNormalizationConfig, CPUNormalizationStrategy, ModelRatio
from apis.crdschema import validate
from apis.extension import KubeQOS, QoSClass
from apis.nodetopo import parse_cpu_basic_info
from koordlet.collectors.nodeinfo import INFO_KEY, node_info_dict
from koordlet.metriccache import MetricCache
from koordlet.reporter.topology import (
    ANNOTATION_CPU_SHARED_POOLS,
    ANNOTATION_CPU_TOPOLOGY,
    KubeletTopology,
    TopologyReporter,
    build_nrt,
    merge_zones,
    topology_policy,
)
from koordlet.statesinformer.model import PodInfo
from koordlet.system.topology import CpuInfo, NodeCpuTopology
from kubeclient.client import KubeClient, Obj
from manager.cpunormalization import normalization_ratio
from tests.freshinterp import run_json
from tests.kubefake import FakeApiServer

GiB = 2**30
NRT = "noderesourcetopologies"
NODE: Obj = {"metadata": {"name": "node-1", "uid": "node-uid-1"}}


def _info(cpus_per_node: int = 4, nodes: int = 2) -> dict[str, Any]:
    """Two sockets, one NUMA node each, two threads a core."""
    cpus = tuple(
        CpuInfo(
            cpu_id=n * cpus_per_node + i,
            core_id=(n * cpus_per_node + i) // 2,
            socket_id=n,
            numa_node=n,
        )
        for n in range(nodes)
        for i in range(cpus_per_node)
    )
    topo = NodeCpuTopology(
        cpus=cpus,
        hyperthreading=True,
        model_name="fake",
        turbo=None,
        numa_nodes={n: tuple(c.cpu_id for c in cpus if c.numa_node == n) for n in range(nodes)},
        numa_memory_total=dict.fromkeys(range(nodes), 8 * GiB),
    )
    return node_info_dict(topo)


def _lsr(uid: str, cpuset: str) -> PodInfo:
    return PodInfo(
        uid=uid,
        name=uid,
        namespace="ns",
        qos=QoSClass.LSR,
        kube_qos=KubeQOS.GUARANTEED,
        cgroup_dir=f"kubepods/pod{uid}",
        annotations={"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": cpuset})},
    )


@dataclass
class Rig:
    client: KubeClient
    cache: MetricCache = field(default_factory=MetricCache)
    pods: list[PodInfo] = field(default_factory=list)
    now: float = 0.0
    kubelet: KubeletTopology = field(default_factory=KubeletTopology)

    def reporter(self) -> TopologyReporter:
        return TopologyReporter(
            self.client,
            self.cache,
            lambda: NODE,
            lambda: list(self.pods),
            self.kubelet,
            clock=lambda: self.now,
        )


def _nrt_writes(api: FakeApiServer) -> list[str]:
    return [r.method for r in api.writes(path_contains=NRT)]


# Content ---------------------------------------------------------------------------------------
def test_zones_policies_and_annotations_follow_the_topology() -> None:
    kubelet = KubeletTopology(
        policy="single-numa-node", reserved_cpus=frozenset({0}), reserved_memory={1: GiB}
    )
    obj = build_nrt(NODE, _info(), kubelet, [_lsr("a", "2-3")])
    assert validate(obj) == []
    assert obj["metadata"]["name"] == "node-1"
    assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "Koordinator"}
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "node-uid-1"
    assert obj["topologyPolicies"] == ["SingleNUMANodeContainerLevel"]
    zones = {z["name"]: z for z in obj["zones"]}
    assert list(zones) == ["node-0", "node-1"]
    res0 = {r["name"]: r for r in zones["node-0"]["resources"]}
    assert res0["cpu"] == {"name": "cpu", "capacity": "4", "allocatable": "3", "available": "3"}
    assert res0["memory"]["capacity"] == res0["memory"]["allocatable"] == "8Gi"
    res1 = {r["name"]: r for r in zones["node-1"]["resources"]}
    assert res1["memory"]["allocatable"] == "7Gi"
    assert zones["node-0"]["type"] == "Node"

    ann = obj["metadata"]["annotations"]
    detail = json.loads(ann[ANNOTATION_CPU_TOPOLOGY])["detail"]
    assert detail[5] == {"id": 5, "core": 2, "socket": 1, "node": 1}
    assert len(detail) == 8
    # CPU 0 is reserved and 2-3 belong to the LSR pod
    assert json.loads(ann[ANNOTATION_CPU_SHARED_POOLS]) == [
        {"socket": 0, "node": 0, "cpuset": "1"},
        {"socket": 1, "node": 1, "cpuset": "4-7"},
    ]


@pytest.mark.parametrize(
    ("policy", "scope", "expected"),
    [
        ("", "", "None"),
        ("none", "pod", "None"),
        ("best-effort", "container", "BestEffortContainerLevel"),
        ("restricted", "pod", "RestrictedPodLevel"),
        ("single-numa-node", "pod", "SingleNUMANodePodLevel"),
        ("bogus", "container", "None"),
    ],
)
def test_the_kubelet_policy_maps_to_the_nrt_policy(policy: str, scope: str, expected: str) -> None:
    assert topology_policy(policy, scope) == expected


def test_the_kubelet_config_file_is_read_and_flags_win(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "kind: KubeletConfiguration\n"
        "topologyManagerPolicy: restricted\n"
        "topologyManagerScope: pod\n"
        'reservedSystemCPUs: "0,4"\n'
        "reservedMemory:\n- numaNode: 0\n  limits: {memory: 1Gi}\n"
    )
    from_file = KubeletTopology.load(str(path))
    assert from_file.nrt_policy == "RestrictedPodLevel"
    assert from_file.reserved_cpus == frozenset({0, 4})
    assert from_file.reserved_memory == {0: GiB}
    assert KubeletTopology.load(str(path), policy="best-effort", scope="container").nrt_policy == (
        "BestEffortContainerLevel"
    )
    assert KubeletTopology.load(str(tmp_path / "missing.yaml")).nrt_policy == "None"


@pytest.mark.parametrize(
    ("content", "why"),
    [(b"topologyManagerPolicy: [unclosed\n", "not YAML"), (b"\xff\xfe\x00", "unreadable")],
)
def test_a_bad_kubelet_config_file_gives_the_defaults(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, why: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING):
        topo = KubeletTopology.load(str(path))
    assert topo == KubeletTopology.load(None)
    assert topo.cpu_manager_policy is None
    assert f"kubelet config {path} {why}" in caplog.text


# Writing ---------------------------------------------------------------------------------------
async def test_created_once_and_not_rewritten_over_many_rounds(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    rig = Rig(kube_client)
    rig.cache.set_info(INFO_KEY, _info())
    reporter = rig.reporter()
    assert await reporter.sync_once()
    for _ in range(50):
        rig.now += 10
        assert not await reporter.sync_once()
    assert _nrt_writes(kube_api) == ["POST"]
    stored = kube_api.get(NRT, "node-1")
    assert stored is not None
    assert validate(stored) == []
    assert reporter.stats.unchanged == 50


async def test_rewritten_when_the_topology_changes(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    rig = Rig(kube_client)
    rig.cache.set_info(INFO_KEY, _info())
    reporter = rig.reporter()
    await reporter.sync_once()
    rig.pods = [_lsr("a", "4-5")]  # an LSR pod takes CPUs out of the shared pool
    assert await reporter.sync_once()
    assert not await reporter.sync_once()
    rig.cache.set_info(INFO_KEY, _info(cpus_per_node=6))  # CPUs came online
    assert await reporter.sync_once()
    assert _nrt_writes(kube_api) == ["POST", "PUT", "PUT"]
    stored = kube_api.get(NRT, "node-1")
    assert stored is not None
    pools = json.loads(stored["metadata"]["annotations"][ANNOTATION_CPU_SHARED_POOLS])
    assert pools[1] == {"socket": 1, "node": 1, "cpuset": "6-11"}
    assert stored["zones"][0]["resources"][0]["capacity"] == "6"
    assert validate(stored) == []


async def test_a_restart_with_an_equal_object_writes_nothing(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    rig = Rig(kube_client)
    rig.cache.set_info(INFO_KEY, _info())
    await rig.reporter().sync_once()
    again = rig.reporter()  # a new koordlet process
    assert not await again.sync_once()
    assert _nrt_writes(kube_api) == ["POST"]


async def test_an_update_keeps_what_others_wrote_and_repairs_their_edits_on_resync(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    rig = Rig(kube_client)
    rig.cache.set_info(INFO_KEY, _info())
    reporter = rig.reporter()
    await reporter.sync_once()
    stored = kube_api.get(NRT, "node-1")
    assert stored is not None
    stored["metadata"]["annotations"]["example.com/note"] = "kept"
    stored["topologyPolicies"] = ["BestEffortPodLevel"]  # someone else's edit
    kube_api.put(NRT, stored)
    assert not await reporter.sync_once()  # within the resync period: trusted
    rig.now += reporter.resync
    assert await reporter.sync_once()
    repaired = kube_api.get(NRT, "node-1")
    assert repaired is not None
    assert repaired["topologyPolicies"] == ["None"]
    assert repaired["metadata"]["annotations"]["example.com/note"] == "kept"


async def test_nothing_is_written_before_the_node_info_is_known(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    rig = Rig(kube_client)
    reporter = rig.reporter()
    assert not await reporter.sync_once()
    assert reporter.stats.waiting == 1
    assert kube_api.requests == []


# The annotations derived from the Node (upstream's calcNodeTopo) --------------------------------
RESERVED_NODE: Obj = {
    "metadata": {
        "name": "node-1",
        "uid": "node-uid-1",
        "annotations": {
            "node.koordinator.sh/reservation": '{"resources": {"cpu": "2"}}',
            "node.koordinator.sh/system-qos-resource": '{"cpuset": "7"}',
        },
    }
}


def _identified_info() -> dict[str, Any]:
    info = _info()
    info.update(
        model_name="Intel(R) Xeon(R) Platinum 8369B CPU @ 2.90GHz",
        vendor_id="GenuineIntel",
        turbo=True,
    )
    return info


def test_cpu_basic_info_reservation_and_system_qos_are_published() -> None:
    obj = build_nrt(RESERVED_NODE, _identified_info(), KubeletTopology(), [_lse("e", "5")])
    assert validate(obj) == []
    ann = obj["metadata"]["annotations"]
    # the exact bytes Go's json.Marshal writes for CPUBasicInfo (omitempty, declaration order)
    assert ann["node.koordinator.sh/cpu-basic-info"] == (
        '{"cpuModel":"Intel(R) Xeon(R) Platinum 8369B CPU @ 2.90GHz",'
        '"hyperThreadEnabled":true,"turboEnabled":true,"vendorID":"GenuineIntel"}'
    )
    # two CPUs reserved by count: the first whole core by topology (core 0 = CPUs 0 and 1)
    assert ann["node.koordinator.sh/reservation"] == '{"reservedCPUs":"0-1"}'
    assert ann["node.koordinator.sh/system-qos-resource"] == '{"cpuset":"7"}'
    # reserved CPUs and the exclusive SYSTEM QoS CPU are out of both pools; the LSE pod's CPU is
    # out of the BE pool too
    assert json.loads(ann[ANNOTATION_CPU_SHARED_POOLS]) == [
        {"socket": 0, "node": 0, "cpuset": "2-3"},
        {"socket": 1, "node": 1, "cpuset": "4,6"},
    ]
    assert json.loads(ann["node.koordinator.sh/be-cpu-shared-pools"]) == [
        {"socket": 0, "node": 0, "cpuset": "2-3"},
        {"socket": 1, "node": 1, "cpuset": "4,6"},
    ]
    plain = build_nrt(NODE, _info(), KubeletTopology())["metadata"]["annotations"]
    assert plain["node.koordinator.sh/reservation"] == "{}"
    assert plain["node.koordinator.sh/system-qos-resource"] == "{}"
    assert plain["node.koordinator.sh/cpu-basic-info"] == (
        '{"cpuModel":"fake","hyperThreadEnabled":true}'
    )


def _lse(uid: str, cpuset: str) -> PodInfo:
    return replace(_lsr(uid, cpuset), qos=QoSClass.LSE)


async def test_the_manager_normalizes_from_the_published_basic_info(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    rig = Rig(kube_client)
    rig.cache.set_info(INFO_KEY, _identified_info())
    assert await rig.reporter().sync_once()
    stored = kube_api.get(NRT, "node-1")
    assert stored is not None
    raw = stored["metadata"]["annotations"]["node.koordinator.sh/cpu-basic-info"]
    config = CPUNormalizationConfig(
        cluster=CPUNormalizationStrategy(
            enable=True,
            ratio_model={
                "Intel(R) Xeon(R) Platinum 8369B CPU @ 2.90GHz": ModelRatio(
                    base_ratio=1.5, hyper_thread_turbo_enabled_ratio=1.8
                )
            },
        )
    )
    result = normalization_ratio(config, {}, parse_cpu_basic_info(raw))
    assert result.annotation == "1.80"


def test_zones_merge_as_upstreams_merge_zone_list() -> None:
    """``MergeZoneList(TrimDifferentZone(current, desired), desired)``: the koordlet's zones, its
    resources replacing the same-named ones, others' resources kept, resources in name order."""

    def res(name: str, value: str) -> Obj:
        return {"name": name, "capacity": value, "allocatable": value, "available": value}

    batch = "kubernetes.io/batch-cpu"
    current = [
        {"name": "node-0", "type": "Node",
         "resources": [res(batch, "3k"), res("cpu", "4"), res("memory", "8Gi")]},
        {"name": "node-9", "type": "Node", "resources": [res(batch, "1k")]},
    ]  # fmt: skip
    desired = [
        {"name": "node-0", "type": "Node", "resources": [res("cpu", "3"), res("memory", "7Gi")]},
        {"name": "node-1", "type": "Node", "resources": [res("cpu", "4"), res("memory", "8Gi")]},
    ]
    out = merge_zones(current, desired)
    assert [z["name"] for z in out] == ["node-0", "node-1"]  # node-9 trimmed
    assert out[0]["resources"] == [
        res("cpu", "3"), res(batch, "3k"), res("memory", "7Gi")
    ]  # fmt: skip
    assert out[1]["resources"] == desired[1]["resources"]
    assert current[0]["resources"][1] == res("cpu", "4")  # the input is left alone


def test_the_kubelet_config_file_is_parsed_without_keeping_pyyaml(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text('cpuManagerPolicy: static\nreservedSystemCPUs: "0"\n')
    result = run_json(
        f"""
        import json, sys
        from koordlet.reporter.topology import KubeletTopology
        topo = KubeletTopology.load({str(path)!r})
        print(json.dumps([topo.cpu_manager_policy, sorted(topo.reserved_cpus),
                          "yaml" in sys.modules]))
        """
    )
    assert result == ["static", [0], False]
