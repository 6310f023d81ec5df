"""The Device reporter against the fake API server: the object fits the CRD, is written only on
change, keeps condition transition times and what others wrote, repairs edits on resync."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from apis.crdschema import validate
from apis.device import LABEL_GPU_DRIVER_VERSION, LABEL_GPU_MODEL, LABEL_GPU_VENDOR
from koordlet.collectors.gpu import INFO_KEY, GPUDevices, GPUState
from koordlet.metriccache import MetricCache
from koordlet.reporter.device import DeviceReporter
from koordlet.system.pcidevice import PCIPlace
from kubeclient.client import KubeClient, Obj
from tests.kubefake import FakeApiServer
from tests.kubefake.server import Fault, Kind

GiB = 1 << 30
DEVICES = "devices"
NODE: Obj = {"metadata": {"name": "node-1", "uid": "node-uid-1"}}
DEVICE_KIND = Kind("scheduling.koordinator.sh", "v1alpha1", "devices", "Device", False)
T0 = 1_714_557_600.0  # 2024-05-01T10:00:00Z


def gpu(minor: int, **changes: object) -> GPUState:
    bus_id = f"0000:{0x3B + minor:02x}:00.0"
    state = GPUState(
        uuid=f"GPU-{minor:08x}-1111-2222-3333-444444444444",
        minor=minor,
        model="NVIDIA A100-SXM4-80GB",
        memory_total=80 * GiB,
        bus_id=bus_id,
        place=PCIPlace(bus_id, minor, minor, f"pci0000:{0x3A + minor:02x}"),
    )
    return replace(state, **changes)  # type: ignore[arg-type]


@dataclass
class Rig:
    client: KubeClient
    cache: MetricCache = field(default_factory=MetricCache)
    now: float = 0.0
    wall: float = T0

    def reporter(self) -> DeviceReporter:
        return DeviceReporter(
            self.client, self.cache, lambda: NODE, clock=lambda: self.now, wall=lambda: self.wall
        )

    def gpus(self, *gpus: GPUState, driver: str = "535.104.05") -> None:
        self.cache.set_info(INFO_KEY, GPUDevices(driver, gpus))


def writes(api: FakeApiServer) -> list[str]:
    return [r.method for r in api.writes(path_contains=DEVICES)]


def stored(api: FakeApiServer) -> Obj:
    obj = api.get(DEVICES, "node-1")
    assert obj is not None
    assert validate(obj) == [], validate(obj)
    return obj


async def test_the_device_is_created_with_every_gpu_and_fits_the_crd(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.register(DEVICE_KIND)
    rig = Rig(kube_client)
    rig.gpus(gpu(0), gpu(1, place=None))
    assert await rig.reporter().sync_once()
    obj = stored(kube_api)
    assert obj["metadata"]["labels"] == {
        LABEL_GPU_VENDOR: "nvidia",
        LABEL_GPU_MODEL: "A100-SXM4-80GB",
        LABEL_GPU_DRIVER_VERSION: "535.104.05",
    }
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "node-uid-1"
    first, second = obj["spec"]["devices"]
    assert first == {
        "type": "gpu",
        "id": "GPU-00000000-1111-2222-3333-444444444444",
        "minor": 0,
        "health": True,
        "resources": {
            "koordinator.sh/gpu-core": "100",
            "koordinator.sh/gpu-memory": "80Gi",
            "koordinator.sh/gpu-memory-ratio": "100",
        },
        "topology": {"socketID": 0, "nodeID": 0, "pcieID": "pci0000:3a", "busID": "0000:3b:00.0"},
        "conditions": [
            {
                "type": "Healthy",
                "status": "True",
                "reason": "DeviceHealthy",
                "message": "device is healthy",
                "lastTransitionTime": "2024-05-01T10:00:00Z",
            }
        ],
    }
    assert "topology" not in second
    assert second["minor"] == 1


async def test_written_once_over_many_rounds_and_not_again_after_a_restart(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.register(DEVICE_KIND)
    rig = Rig(kube_client)
    rig.gpus(gpu(0), gpu(1))
    reporter = rig.reporter()
    assert await reporter.sync_once()
    for _ in range(50):
        rig.now += 10
        rig.wall += 10
        assert not await reporter.sync_once()
    assert reporter.stats.unchanged == 50
    rig.wall += 3600
    assert not await rig.reporter().sync_once()  # a new koordlet: the times on the server stay
    assert writes(kube_api) == ["POST"]
    assert stored(kube_api)["spec"]["devices"][0]["conditions"][0]["lastTransitionTime"] == (
        "2024-05-01T10:00:00Z"
    )


async def test_an_unhealthy_gpu_is_rewritten_with_its_reason_and_transition_time(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.register(DEVICE_KIND)
    rig = Rig(kube_client)
    rig.gpus(gpu(0), gpu(1))
    reporter = rig.reporter()
    await reporter.sync_once()
    rig.now += 10
    rig.wall += 90
    message = "Xid error detected on device, error code: 79"
    rig.gpus(gpu(0), gpu(1, healthy=False, reason="Xid79", message=message))
    assert await reporter.sync_once()
    assert not await reporter.sync_once()
    assert writes(kube_api) == ["POST", "PUT"]
    first, second = stored(kube_api)["spec"]["devices"]
    assert first["health"] is True
    assert first["conditions"][0]["lastTransitionTime"] == "2024-05-01T10:00:00Z"
    assert second["health"] is False
    assert second["conditions"] == [
        {
            "type": "Healthy",
            "status": "False",
            "reason": "Xid79",
            "message": message,
            "lastTransitionTime": "2024-05-01T10:01:30Z",
        }
    ]


async def test_others_labels_and_devices_are_kept_and_edits_repaired_on_resync(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.register(DEVICE_KIND)
    rig = Rig(kube_client)
    rig.gpus(gpu(0))
    reporter = rig.reporter()
    await reporter.sync_once()
    obj = stored(kube_api)
    obj["metadata"]["labels"]["example.com/rack"] = "r1"
    obj["metadata"]["labels"][LABEL_GPU_MODEL] = "edited"
    rdma = {"type": "rdma", "id": "0000:1f:00.0", "minor": 0, "health": True}
    obj["spec"]["devices"].append(rdma)
    kube_api.put(DEVICES, obj)
    assert not await reporter.sync_once()  # within the resync period: trusted
    rig.now += reporter.resync
    assert await reporter.sync_once()
    repaired = stored(kube_api)
    assert repaired["metadata"]["labels"]["example.com/rack"] == "r1"
    assert repaired["metadata"]["labels"][LABEL_GPU_MODEL] == "A100-SXM4-80GB"
    assert [d["type"] for d in repaired["spec"]["devices"]] == ["gpu", "rdma"]


async def test_a_label_no_longer_true_is_removed(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.register(DEVICE_KIND)
    rig = Rig(kube_client)
    rig.gpus(gpu(0), gpu(1))
    reporter = rig.reporter()
    await reporter.sync_once()
    rig.gpus(gpu(0), gpu(1, model="NVIDIA H100 80GB HBM3"))  # a mix: no model label, as upstream
    assert await reporter.sync_once()
    labels = stored(kube_api)["metadata"]["labels"]
    assert LABEL_GPU_MODEL not in labels
    assert labels[LABEL_GPU_VENDOR] == "nvidia"


async def test_a_conflict_is_retried_at_the_next_round(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.register(DEVICE_KIND)
    rig = Rig(kube_client)
    rig.gpus(gpu(0))
    reporter = rig.reporter()
    await reporter.sync_once()
    rig.gpus(gpu(0, healthy=False, reason="Xid48", message="double bit ECC error"))
    kube_api.faults.append(Fault(status=409, method="PUT", path_contains=DEVICES))
    assert not await reporter.sync_once()
    assert await reporter.sync_once()
    assert stored(kube_api)["spec"]["devices"][0]["conditions"][0]["reason"] == "Xid48"


async def test_nothing_is_written_before_the_gpus_are_listed(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.register(DEVICE_KIND)
    rig = Rig(kube_client)
    reporter = rig.reporter()
    assert not await reporter.sync_once()
    assert reporter.stats.waiting == 1
    assert kube_api.requests == []


async def test_an_api_error_is_counted_and_the_next_round_writes(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.register(DEVICE_KIND)
    rig = Rig(kube_client)
    rig.gpus(gpu(0))
    reporter = rig.reporter()
    kube_api.faults.append(Fault(status=500, method="POST", path_contains=DEVICES, times=9))
    assert not await reporter.sync_once()
    assert reporter.stats.failed == 1
    kube_api.faults.clear()
    assert await reporter.sync_once()
    assert writes(kube_api)[-1] == "POST"
