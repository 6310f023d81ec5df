"""CPUSetAllocator: the container cpusets of upstream's table (``hooks/cpuset/rule_test.go``:
``Test_cpusetRule_getContainerCPUSet``) and the quota unset of koordinator#489
(``cpuset_test.go``), plus the share pools computed as the NRT reports them."""

from __future__ import annotations

import json

import pytest

from apis.extension import ANNOTATION_RESOURCE_STATUS, LABEL_POD_QOS, KubeQOS, QoSClass
from koordlet.runtimehooks.cpuset import POLICY_NONE, POLICY_STATIC, CPUSetAllocator
from koordlet.runtimehooks.errors import BadPodInput
from koordlet.runtimehooks.model import ContainerRequest, HookPoint, PodMeta, PodRequest
from koordlet.runtimehooks.sharepool import CPUSetRule, CPUSharedPool, share_pools_of
from koordlet.statesinformer.model import PodInfo

POD = PodMeta("p", "default", "11111111-2222-3333-4444-555555555555")
TWO_POOLS = (
    CPUSharedPool(0, 0, frozenset(range(8))),
    CPUSharedPool(1, 1, frozenset(range(8, 16))),
)
BURSTABLE = "/kubepods/burstable/pod1"
BESTEFFORT = "/kubepods/besteffort/pod1"


def creq(labels: dict[str, str], annotations: dict[str, str], parent: str) -> ContainerRequest:
    return ContainerRequest(
        HookPoint.PRE_CREATE_CONTAINER,
        POD,
        "main",
        pod_labels=labels,
        pod_annotations=annotations,
        pod_cgroup_parent=parent,
    )


def status(**doc: object) -> dict[str, str]:
    return {ANNOTATION_RESOURCE_STATUS: json.dumps(doc)}


LS = {LABEL_POD_QOS: "LS"}
LSR = {LABEL_POD_QOS: "LSR"}
BE = {LABEL_POD_QOS: "BE"}


@pytest.mark.parametrize(
    ("case", "policy", "labels", "annotations", "parent", "cpuset", "quota"),
    [
        # upstream's rows
        ("NUMA-bound pod: its nodes' pools", None, {}, status(numaNodeResources=[{"node": 0}]),
         BURSTABLE, "0-7", None),
        ("LS pod: every pool", None, LS, {}, BURSTABLE, "0-15", None),
        ("no class, kubelet policy none: every pool", POLICY_NONE, {}, {}, BURSTABLE, "0-15",
         None),
        ("no class, kubelet policy static: nothing", POLICY_STATIC, {}, {}, BURSTABLE, None, None),
        # upstream answers "" for a BestEffort pod (clear a kubelet static cpuset); the
        # besteffort cgroup's cpuset is CPU suppress's, and its containers inherit it: nothing
        ("no class, BestEffort: nothing", POLICY_NONE, {}, {}, BESTEFFORT, None, None),
        # ours: a policy nobody told us is treated as static
        ("no class, kubelet policy unknown: nothing", None, {}, {}, BURSTABLE, None, None),
        ("LSR pod: its cpuset, quota unset", None, LSR, status(cpuset="2-4"), BURSTABLE, "2-4",
         -1),
        ("BE pod: nothing", None, BE, {}, BESTEFFORT, None, None),
    ],
)  # fmt: skip
def test_container_cpusets_as_upstreams_table(
    case: str,
    policy: str | None,
    labels: dict[str, str],
    annotations: dict[str, str],
    parent: str,
    cpuset: str | None,
    quota: int | None,
) -> None:
    hook = CPUSetAllocator(lambda: CPUSetRule(TWO_POOLS, policy))
    change = hook.container(creq(labels, annotations, parent))
    got = (None, None) if change is None else (
        change.resources.cpuset_cpus, change.resources.cfs_quota
    )  # fmt: skip
    assert got == (cpuset, quota), case


def test_a_malformed_resource_status_leaves_the_pod_alone_naming_the_field() -> None:
    hook = CPUSetAllocator(lambda: CPUSetRule(TWO_POOLS))
    with pytest.raises(BadPodInput) as err:
        hook.container(creq({}, {ANNOTATION_RESOURCE_STATUS: "bad-alloc-fmt"}, BURSTABLE))
    assert err.value.field == ANNOTATION_RESOURCE_STATUS
    with pytest.raises(BadPodInput) as err:
        hook.container(creq(LSR, status(cpuset="4-x"), BURSTABLE))
    assert err.value.field.endswith("cpuset")


def test_without_known_share_pools_an_ls_pod_is_left_alone() -> None:
    assert CPUSetAllocator(CPUSetRule).container(creq(LS, {}, BURSTABLE)) is None


def test_a_cpuset_pod_has_its_pod_quota_unset_and_others_keep_theirs() -> None:
    hook = CPUSetAllocator(lambda: CPUSetRule(TWO_POOLS))
    bound = PodRequest(HookPoint.PRE_RUN_POD_SANDBOX, POD, LSR, status(cpuset="0-1"), BURSTABLE)
    change = hook.pod(bound)
    assert change is not None
    assert change.resources.cfs_quota == -1
    assert hook.pod(PodRequest(HookPoint.PRE_RUN_POD_SANDBOX, POD, LS, {}, BURSTABLE)) is None


def _info(cpus: list[tuple[int, int, int]]) -> dict[str, object]:
    keys = ("cpu_id", "socket_id", "numa_node")
    return {"cpus": [dict(zip(keys, c, strict=True)) | {"core_id": c[0]} for c in cpus]}


def test_share_pools_are_each_numa_nodes_cpus_less_reserved_and_lsr_lse_cpus() -> None:
    info = _info([(i, i // 4, i // 4) for i in range(8)])
    pods = [
        PodInfo("u1", "lsr", "d", QoSClass.LSR, KubeQOS.GUARANTEED, "g/1",
                annotations=status(cpuset="1-2")),
        PodInfo("u2", "lse", "d", QoSClass.LSE, KubeQOS.GUARANTEED, "g/2",
                annotations=status(cpuset="5")),
        PodInfo("u3", "ls", "d", QoSClass.LS, KubeQOS.BURSTABLE, "b/3",
                annotations=status(cpuset="6")),  # an LS pod holds no CPUs of its own
        PodInfo("u4", "bad", "d", QoSClass.LSR, KubeQOS.GUARANTEED, "g/4",
                annotations={ANNOTATION_RESOURCE_STATUS: "{"}),
    ]  # fmt: skip
    pools = share_pools_of(info, pods, reserved=frozenset({0}))
    assert pools == (
        CPUSharedPool(0, 0, frozenset({3})),
        CPUSharedPool(1, 1, frozenset({4, 6, 7})),
    )
    assert [p.as_json() for p in pools] == [
        {"socket": 0, "node": 0, "cpuset": "3"},
        {"socket": 1, "node": 1, "cpuset": "4,6-7"},
    ]
    assert share_pools_of(None, pods) is None
