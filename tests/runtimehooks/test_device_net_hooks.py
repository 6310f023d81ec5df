"""GPUEnvInject (upstream ``hooks/gpu/gpu_test.go``: ``Test_InjectContainerGPUEnv``),
TCNetworkQoS (``hooks/tc``: ``SetPodNetCls``, the class ids of :mod:`apis.netqos`) and the
Resctrl hook's group choice."""

from __future__ import annotations

from typing import Any

import pytest

from apis.extension import ANNOTATION_POD_RESCTRL, LABEL_POD_QOS
from apis.netqos import NetQoSClass, class_id_of
from apis.scheduling_keys import ANNOTATION_DEVICE_ALLOCATED, LABEL_GPU_ISOLATION_PROVIDER
from koordlet.runtimehooks.errors import BadPodInput
from koordlet.runtimehooks.gpu import GPUEnvInject
from koordlet.runtimehooks.model import ContainerRequest, HookPoint, Mount, PodMeta, PodRequest
from koordlet.runtimehooks.resctrl import Resctrl
from koordlet.runtimehooks.tc import TCNetworkQoS
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
    assert group({LABEL_POD_QOS: "BE"}, "/kubepods/p", {ANNOTATION_POD_RESCTRL: "{}"}) is None
    # no resourceQOSStrategy in the NodeSLO: nothing (the strategy does nothing either)
    assert Resctrl(lambda: in_force()).container(creq({LABEL_POD_QOS: "BE"}, {})) is None
