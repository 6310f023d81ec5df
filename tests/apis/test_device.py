"""The Device model: what it writes fits Koordinator's CRD, reads back equal, and a bad field is
named; the model label follows upstream's examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from apis.crdschema import load_crds, validate
from apis.device import (
    Device,
    DeviceCondition,
    DeviceInfo,
    DeviceTopology,
    device_json,
    gpu_model_label,
    gpu_resources,
    label_value,
    parse_device,
)
from apis.slo import SchemaError

GiB = 1 << 30
T0 = "2024-05-01T10:00:00Z"
SHARED_CRDS = Path(__file__).resolve().parents[3] / "shared" / "koordinator" / "crds"


def sample() -> Device:
    return Device(
        name="node-1",
        devices=(
            DeviceInfo(
                type="gpu",
                uuid="GPU-8a2c1f3e-5b4d-4c3a-9e8f-7a6b5c4d3e2f",
                minor=0,
                health=True,
                resources=gpu_resources(80 * GiB),
                topology=DeviceTopology(0, 0, "pci0000:3a", "0000:3b:00.0"),
                conditions=(
                    DeviceCondition("Healthy", "True", "DeviceHealthy", "device is healthy", T0),
                ),
            ),
            DeviceInfo(
                type="gpu",
                uuid="GPU-11111111-2222-3333-4444-555555555555",
                minor=1,
                health=False,
                resources=gpu_resources(15 * GiB + 12345),
                conditions=(
                    DeviceCondition(
                        "Healthy", "False", "Xid79", "fallen off the bus", "2024-05-01T11:00:00Z"
                    ),
                ),
            ),
        ),
        labels={"node.koordinator.sh/gpu-model": "A100-SXM4-80GB"},
        node_uid="4a1b2c3d-0000-0000-0000-000000000001",
    )


def test_the_written_object_fits_the_crd_and_reads_back_equal() -> None:
    obj = device_json(sample())
    assert validate(obj) == []
    assert parse_device(obj) == sample()
    entry = obj["spec"]["devices"][0]
    assert entry["resources"] == {
        "koordinator.sh/gpu-core": "100",
        "koordinator.sh/gpu-memory": "80Gi",
        "koordinator.sh/gpu-memory-ratio": "100",
    }
    assert entry["topology"] == {
        "socketID": 0,
        "nodeID": 0,
        "pcieID": "pci0000:3a",
        "busID": "0000:3b:00.0",
    }
    assert obj["spec"]["devices"][1]["resources"]["koordinator.sh/gpu-memory"] == str(
        15 * GiB + 12345
    )
    assert "topology" not in obj["spec"]["devices"][1]
    owner = obj["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Node", "node-1", True)


@pytest.mark.skipif(not SHARED_CRDS.is_dir(), reason="no ../shared/koordinator/crds here (CI)")
def test_the_written_object_fits_the_shared_crd_too() -> None:
    assert validate(device_json(sample()), crds=load_crds(SHARED_CRDS)) == []


def test_the_crd_rejects_what_the_model_must_never_write() -> None:
    obj = device_json(sample())
    del obj["spec"]["devices"][0]["health"]
    obj["spec"]["devices"][1]["conditions"][0]["reason"] = "Xid 79"
    problems = {str(v).split(":")[0] for v in validate(obj)}
    assert problems == {"spec.devices[0].health", "spec.devices[1].conditions[0].reason"}


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("minor",), "0", "spec.devices[0].minor"),
        (("health",), "true", "spec.devices[0].health"),
        (("resources", "koordinator.sh/gpu-memory"), "lots", "resources.koordinator.sh/gpu-memory"),
        (("topology", "nodeID"), None, "spec.devices[0].topology.nodeID"),
    ],
)
def test_a_bad_field_is_named(path: tuple[str, ...], value: object, field: str) -> None:
    obj = device_json(sample())
    target = obj["spec"]["devices"][0]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(SchemaError) as caught:
        parse_device(obj, "Device node-1")
    assert caught.value.field.endswith(field)
    assert str(caught.value).startswith("Device node-1: ")


@pytest.mark.parametrize(
    ("name", "label"),
    [
        # upstream's examples (states_device_linux.go, getGPUDriverAndModel)
        ("A100 SXM4 80GB", "A100-SXM4-80GB"),
        ("Tesla P100-PCIE-16GB", "Tesla-P100-PCIE-16GB"),
        ("Tesla T4", "Tesla-T4"),
        ("GeForce RTX 2080 Ti", "GeForce-RTX-2080-Ti"),
        # drivers from 470 on prefix "NVIDIA "
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB-HBM3"),
        # made a valid label value
        ("Quadro RTX 6000/8000", "Quadro-RTX-6000-8000"),
        ("NVIDIA (unknown)", "unknown"),
    ],
)
def test_the_model_label_follows_upstream(name: str, label: str) -> None:
    assert gpu_model_label(name) == label


def test_a_label_value_is_at_most_63_characters_and_ends_alphanumeric() -> None:
    assert label_value("x" * 70) == "x" * 63
    assert label_value("a" * 62 + "--b") == "a" * 62
    assert label_value("---") == ""
