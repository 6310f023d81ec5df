"""DeviceShare: GPU shares and whole GPUs from the Device CRD."""

from __future__ import annotations

import json

import pytest

from scheduler_plugins.framework import Framework
from scheduler_plugins.plugins.deviceshare import DeviceShare
from scheduler_plugins.snapshot import parse_pod
from tests.scheduler.builders import NOW, node, pod
from tests.scheduler.helpers import evaluate, snapshot_of

ALLOCATED = "scheduling.koordinator.sh/device-allocated"


def device(name, gpus=2, memory="16Gi"):
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": name},
        "spec": {
            "devices": [
                {
                    "type": "gpu",
                    "minor": i,
                    "health": True,
                    "resources": {
                        "koordinator.sh/gpu-core": "100",
                        "koordinator.sh/gpu-memory": memory,
                        "koordinator.sh/gpu-memory-ratio": "100",
                    },
                }
                for i in range(gpus)
            ]
        },
    }


def holder(name, node_name, minor, core, memory):
    allocated = {
        "gpu": [
            {
                "minor": minor,
                "resources": {
                    "koordinator.sh/gpu-core": str(core),
                    "koordinator.sh/gpu-memory": memory,
                },
            }
        ]
    }
    return pod(name, node_name=node_name, annotations={ALLOCATED: json.dumps(allocated)})


@pytest.mark.parametrize(
    ("requests", "feasible"),
    [
        (
            {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory": "8Gi"},
            True,
        ),  # GPU 1 half free
        (
            {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory": "17Gi"},
            False,
        ),  # more memory than any GPU has
        ({"nvidia.com/gpu": "1"}, True),  # GPU 0 untouched
        ({"nvidia.com/gpu": "2"}, False),
        ({"koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory-ratio": "200"}, False),
    ],
)
def test_requests_fit_what_the_gpus_have_left(requests, feasible):
    objects = [node("n1"), device("n1"), holder("h", "n1", 1, 50, "8Gi")]
    result = evaluate(objects, pod("p", requests=requests), plugins=[DeviceShare()])
    assert result.nodes["n1"].reasons == ([] if feasible else ["Insufficient gpu devices"])


def test_a_node_without_devices_rejects_gpu_pods_and_an_odd_whole_gpu_request_is_invalid():
    assert evaluate(
        [node("n1")], pod("p", requests={"nvidia.com/gpu": "1"}), plugins=[DeviceShare()]
    ).nodes["n1"].reasons == ["Insufficient gpu devices"]
    odd = pod(
        "p", requests={"koordinator.sh/gpu-core": "150", "koordinator.sh/gpu-memory-ratio": "150"}
    )
    assert evaluate([node("n1"), device("n1")], odd, plugins=[DeviceShare()]).nodes[
        "n1"
    ].reasons == ["invalid gpu request"]


def test_reserve_packs_shares_onto_the_fullest_gpu_and_records_them():
    fw = Framework([DeviceShare()])
    snap = snapshot_of(node("n1"), device("n1"), holder("h", "n1", 1, 50, "8Gi"))
    p = parse_pod(
        pod(
            "p", requests={"koordinator.sh/gpu-core": "25", "koordinator.sh/gpu-memory-ratio": "25"}
        ),
        "p",
    )
    cycle = fw.new_cycle(snap, NOW)
    assert fw.evaluate(snap, p, cycle=cycle).nodes["n1"].feasible
    ann = json.loads(fw.reserve(cycle, p, "n1")[ALLOCATED])
    assert ann == {
        "gpu": [
            {
                "minor": 1,
                "resources": {
                    "koordinator.sh/gpu-core": "25",
                    "koordinator.sh/gpu-memory": str(4 * 1024**3),
                    "koordinator.sh/gpu-memory-ratio": "25",
                },
            }
        ]
    }


def test_pods_without_gpu_requests_are_not_scored():
    result = evaluate(
        [node("n1"), device("n1")], pod("p", requests={"cpu": "1"}), plugins=[DeviceShare()]
    )
    assert result.nodes["n1"].feasible
    assert result.nodes["n1"].scores == {}
