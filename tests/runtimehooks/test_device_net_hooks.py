"""GPUEnvInject (upstream ``hooks/gpu/gpu_test.go``: ``Test_InjectContainerGPUEnv``),
TCNetworkQoS (``hooks/tc``: ``SetPodNetCls``, the class ids of :mod:`apis.netqos`) and the
Resctrl hook's group choice."""

from __future__ import annotations

from typing import Any

import pytest

from apis.extension import ANNOTATION_POD_RESCTRL, LABEL_POD_QOS, KubeQOS, QoSClass
from apis.netqos import POD_CLASS_MINORS, NetQoSClass, class_id_of
from apis.pod_overrides import ANNOTATION_POD_NETWORK_QOS
from apis.scheduling_keys import ANNOTATION_DEVICE_ALLOCATED, LABEL_GPU_ISOLATION_PROVIDER
from koordlet.qos.netqos import own_class_ids, pod_classes, pod_limits, tree_classes
from koordlet.runtimehooks.errors import BadPodInput
from koordlet.runtimehooks.gpu import GPUEnvInject
from koordlet.runtimehooks.model import ContainerRequest, HookPoint, Mount, PodMeta, PodRequest
from koordlet.runtimehooks.resctrl import Resctrl
from koordlet.runtimehooks.tc import TCNetworkQoS
from koordlet.statesinformer.model import PodInfo
from tests.strategyrig import in_force

POD = PodMeta("p", "default", "11111111-2222-3333-4444-555555555555")


def creq(
    labels: dict[str, str], annotations: dict[str, str], parent: str = "/kubepods/pod1"
) -> ContainerRequest:
    return ContainerRequest(
        HookPoint.PRE_CREATE_CONTAINER,
        POD,
        "main",
        container_id="c" * 64,
        pod_labels=labels,
        pod_annotations=annotations,
        pod_cgroup_parent=parent,
    )


# GPU ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "labels", "allocated", "env", "mounts"),
    [
        ("normal gpu alloc", {}, '{"gpu": [{"minor": 0},{"minor": 1}]}',
         {"NVIDIA_VISIBLE_DEVICES": "0,1"}, ()),
        ("empty gpu alloc", {}, '{"fpga": [{"minor": 0},{"minor": 1}]}', None, ()),
        ("gpu share with HAMi", {LABEL_GPU_ISOLATION_PROVIDER: "HAMi-core"},
         '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"50",'
         '"koordinator.sh/gpu-memory":"16Gi","koordinator.sh/gpu-memory-ratio":"50"}}]}',
         {"NVIDIA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_MEMORY_LIMIT": "17179869184",
          "CUDA_DEVICE_SM_LIMIT": "50", "LD_PRELOAD": "/usr/local/vgpu/libvgpu.so"},
         (Mount("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so"),
          Mount("/tmp/vgpulock", "/tmp/vgpulock"))),
        ("HAMi with a whole GPU: no limits", {LABEL_GPU_ISOLATION_PROVIDER: "HAMi-core"},
         '{"gpu":[{"minor":2,"resources":{"koordinator.sh/gpu-memory-ratio":"100"}}]}',
         {"NVIDIA_VISIBLE_DEVICES": "2"}, ()),
    ],
)  # fmt: skip
def test_gpu_env_as_upstreams_table(
    case: str,
    labels: dict[str, str],
    allocated: str,
    env: dict[str, str] | None,
    mounts: tuple[Mount, ...],
) -> None:
    change = GPUEnvInject().container(creq(labels, {ANNOTATION_DEVICE_ALLOCATED: allocated}))
    if env is None:
        assert change is None, case
        return
    assert change is not None
    assert dict(change.env) == env, case
    assert change.mounts == mounts, case
    assert all(m.type == "bind" and m.options == ("rbind",) for m in change.mounts)


@pytest.mark.parametrize(
    ("allocated", "labels", "field"),
    [
        ("{not json", {}, ANNOTATION_DEVICE_ALLOCATED),
        ('{"gpu": [{"minor": "zero"}]}', {}, f"{ANNOTATION_DEVICE_ALLOCATED}: gpu[0].minor"),
        ('{"gpu":[{"minor":1,"resources":{}}]}', {LABEL_GPU_ISOLATION_PROVIDER: "HAMi-core"},
         f"{ANNOTATION_DEVICE_ALLOCATED}: gpu[0].resources.koordinator.sh/gpu-memory-ratio"),
    ],
)  # fmt: skip
def test_a_malformed_allocation_is_refused_naming_the_field(
    allocated: str, labels: dict[str, str], field: str
) -> None:
    with pytest.raises(BadPodInput) as err:
        GPUEnvInject().container(creq(labels, {ANNOTATION_DEVICE_ALLOCATED: allocated}))
    assert err.value.field == field


# tc class ids --------------------------------------------------------------------------------


TC_ON: dict[str, Any] = {
    "policies": {"netQOSPolicy": "tc"},
    "lsClass": {"networkQOS": {"enable": True}},
    "beClass": {"networkQOS": {"enable": True}},
}


def test_the_class_ids_are_upstreams() -> None:
    # tc_linux.go: MAJOR_ID 1, SYSTEM 2, LS 3, BE 4 (apis/netqos.py, the strategy's too)
    assert class_id_of(NetQoSClass.SYSTEM) == 0x10002
    assert class_id_of(NetQoSClass.LS) == 0x10003 == 65539
    assert class_id_of(NetQoSClass.BE) == 0x10004


@pytest.mark.parametrize(
    ("raw", "supported", "labels", "want"),
    [
        (TC_ON, True, {LABEL_POD_QOS: "BE"}, 0x10004),
        (TC_ON, True, {LABEL_POD_QOS: "LSR"}, 0x10003),
        (TC_ON, True, {LABEL_POD_QOS: "SYSTEM"}, 0x10002),
        (TC_ON, True, {}, None),  # no class: the qdisc's default class
        (TC_ON, False, {LABEL_POD_QOS: "BE"}, None),  # no net_cls controller
        ({**TC_ON, "policies": {"netQOSPolicy": "terway-qos"}}, True, {LABEL_POD_QOS: "BE"},
         None),
        ({"policies": {"netQOSPolicy": "tc"}}, True, {LABEL_POD_QOS: "BE"}, None),  # QoS off
    ],
)  # fmt: skip
def test_a_new_pod_gets_its_classes_net_cls_classid_while_tc_network_qos_is_on(
    raw: dict[str, Any], supported: bool, labels: dict[str, str], want: int | None
) -> None:
    slo = in_force(resourceQOSStrategy=raw)
    hook = TCNetworkQoS(lambda: slo, lambda knob: supported and knob == "net_cls_classid")
    change = hook.pod(PodRequest(HookPoint.PRE_RUN_POD_SANDBOX, POD, labels, {}, "/kubepods/p"))
    assert (None if change is None else change.resources.net_cls_classid) == want
    # its containers inherit it from the pod's cgroup; running ones are the strategy's
    assert hook.container(creq(labels, {})) is None


def test_a_pod_with_its_own_htb_class_gets_that_classes_id_at_creation() -> None:
    """koordinator.sh/networkQOS: the id the network QoS strategy allots the pod (its rule over
    the inventory, through HookContext.pod_net_class_ids), written once; a pod the inventory
    does not list yet gets its QoS class's, which the strategy's next round moves."""
    pods = [
        PodInfo(uid, name, "ns", QoSClass.BE, KubeQOS.BESTEFFORT, f"kubepods/pod{uid}",
                labels={LABEL_POD_QOS: "BE"},
                annotations={ANNOTATION_POD_NETWORK_QOS: '{"egressLimit": "20M"}'})
        for uid, name in ((POD.uid, POD.name), ("99999999-2222-3333-4444-555555555555", "q"))
    ]  # fmt: skip
    ids = own_class_ids(pods)
    # the strategy's own allotment, for the same pods
    slo = in_force(resourceQOSStrategy=TC_ON)
    classes, _notes = tree_classes(slo.resource_qos_strategy, 1_000_000_000)
    _plans, strategy_ids, _notes = pod_classes(pod_limits(pods), classes)
    assert ids == strategy_ids
    assert all((i & 0xFFFF) in POD_CLASS_MINORS for i in ids.values())
    hook = TCNetworkQoS(lambda: slo, lambda knob: True, lambda: ids)
    req = PodRequest(HookPoint.PRE_RUN_POD_SANDBOX, POD, {LABEL_POD_QOS: "BE"}, {}, "/kubepods/p")
    change = hook.pod(req)
    assert change is not None
    assert change.resources.net_cls_classid == ids[POD.uid] != class_id_of(NetQoSClass.BE)
    # not in the inventory yet: its QoS class
    change = TCNetworkQoS(lambda: slo, lambda knob: True, dict).pod(req)
    assert change is not None
    assert change.resources.net_cls_classid == class_id_of(NetQoSClass.BE)
    # network QoS off, or no class label: nothing, own class or not
    off = in_force()
    assert TCNetworkQoS(lambda: off, lambda knob: True, lambda: ids).pod(req) is None
    bare = PodRequest(HookPoint.PRE_RUN_POD_SANDBOX, POD, {}, {}, "/kubepods/p")
    assert hook.pod(bare) is None


# resctrl ---------------------------------------------------------------------------------------


def test_a_started_container_goes_to_its_classes_group_while_its_resctrl_qos_is_on() -> None:
    raw = {
        "lsrClass": {"resctrlQOS": {"enable": True}},
        "lsClass": {"resctrlQOS": {"enable": False}},
        "beClass": {"resctrlQOS": {"enable": True}},
    }
    slo = in_force(resourceQOSStrategy=raw)
    hook = Resctrl(lambda: slo)

    def group(labels: dict[str, str], parent: str, ann: dict[str, str] | None = None) -> str | None:
        change = hook.container(creq(labels, ann or {}, parent))
        return None if change is None else change.resctrl_group

    assert group({LABEL_POD_QOS: "LSE"}, "/kubepods/p") == "LSR"
    assert group({LABEL_POD_QOS: "BE"}, "/kubepods/besteffort/p") == "BE"
    assert group({}, "/kubepods/besteffort/p") == "BE"  # BestEffort: BE's group
    assert group({LABEL_POD_QOS: "LS"}, "/kubepods/burstable/p") is None  # LS's is off
    assert group({LABEL_POD_QOS: "SYSTEM"}, "/kubepods/p") is None
    # no resourceQOSStrategy in the NodeSLO: nothing (the strategy does nothing either)
    assert Resctrl(lambda: in_force()).container(creq({LABEL_POD_QOS: "BE"}, {})) is None


def test_a_pod_with_its_own_resctrl_group_has_its_new_containers_go_there() -> None:
    """node.koordinator.sh/resctrl: upstream's SetContainerResctrlResources gives the container
    the closid koordlet-<uid>, whatever its class and whether the NodeSLO has a
    resourceQOSStrategy (the pod-level groups are the strategy's with or without one)."""
    own = {ANNOTATION_POD_RESCTRL: '{"llc": {"schemata": {"range": [0, 30]}}}'}
    for slo in (in_force(), in_force(resourceQOSStrategy={"lsClass": {"resctrlQOS": {}}})):
        for labels in ({LABEL_POD_QOS: "LS"}, {LABEL_POD_QOS: "SYSTEM"}, {}):
            change = Resctrl(lambda slo=slo: slo).container(creq(labels, own))
            assert change is not None
            assert change.resctrl_group == f"koordlet-{POD.uid}"
    # a value that does not parse: the class's group (the strategy reports the value once)
    slo = in_force(resourceQOSStrategy={"beClass": {"resctrlQOS": {"enable": True}}})
    bad = {ANNOTATION_POD_RESCTRL: '{"llc": {"schemata": {"range": [30, 0]}}}'}
    change = Resctrl(lambda: slo).container(creq({LABEL_POD_QOS: "BE"}, bad))
    assert change is not None
    assert change.resctrl_group == "BE"
