"""``koordlet.system.nvml`` through the real pynvml against the fake NVML library: the listing,
samples, Xid events, and every way NVML can be unusable, each with its reason."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import pytest

from koordlet.errors import ParseError
from koordlet.system import nvml as n
from koordlet.system.paths import HostPaths
from koordlet.system.pcidevice import normalize_bus_id, read_pci_place
from tests.nvmlfake import FakeNvml, GiB, gpu


def test_open_lists_every_gpu_with_its_uuid_minor_model_memory_and_bus(nvml: FakeNvml) -> None:
    nvml.driver_version = "550.54.15"
    nvml.set(gpu(0), gpu(1, minor=3, name="NVIDIA H100 80GB HBM3", memory_total=81559 << 20))
    session = n.open_nvml()
    try:
        assert session.driver_version == "550.54.15"
        assert [(g.index, g.minor, g.name) for g in session.gpus] == [
            (0, 0, "NVIDIA A100-SXM4-80GB"),
            (1, 3, "NVIDIA H100 80GB HBM3"),
        ]
        assert session.gpus[0].uuid == "GPU-00000000-1111-2222-3333-444444444444"
        assert session.gpus[0].memory_total == 80 * GiB
        assert session.gpus[1].memory_total == 81559 << 20
        assert [g.bus_id for g in session.gpus] == ["0000:3B:00.0", "0000:86:00.0"]
        assert session.events_unsupported == {}
    finally:
        session.close()
        session.close()  # idempotent


def test_a_sample_reads_memory_in_use_and_utilization_each_time(nvml: FakeNvml) -> None:
    session = n.open_nvml()
    try:
        first = session.sample(session.gpus[1])
        assert first == n.GPUSample(memory_used=GiB, memory_total=80 * GiB, core_used_percent=15)
        nvml.set(gpu(0), gpu(1, memory_used=7 * GiB, utilization_gpu=99))
        again = session.sample(session.gpus[1])
        assert (again.memory_used, again.core_used_percent) == (7 * GiB, 99.0)
    finally:
        session.close()


def test_a_gpu_without_a_utilization_counter_samples_memory_only(nvml: FakeNvml) -> None:
    nvml.set(gpu(0, errors={"nvmlDeviceGetUtilizationRates": n.ERROR_NOT_SUPPORTED}))
    session = n.open_nvml()
    try:
        sample = session.sample(session.gpus[0])
        assert sample.core_used_percent is None
        assert sample.memory_used == GiB
    finally:
        session.close()


def test_a_lost_gpu_raises_an_error_that_says_it_is_gone(nvml: FakeNvml) -> None:
    session = n.open_nvml()
    try:
        nvml.set(gpu(0), gpu(1, errors={"nvmlDeviceGetMemoryInfo": n.ERROR_GPU_IS_LOST}))
        with pytest.raises(n.NvmlError) as caught:
            session.sample(session.gpus[1])
        assert caught.value.gone
        assert caught.value.code == n.ERROR_GPU_IS_LOST
        assert "GPU is lost" in str(caught.value)
        assert session.sample(session.gpus[0]).memory_used == GiB
    finally:
        session.close()


def test_xid_events_are_drained_once_each_without_waiting(nvml: FakeNvml) -> None:
    session = n.open_nvml()
    try:
        assert session.poll_xids() == []
        nvml.set(gpu(0), gpu(1, xid_events=[79, 13]))
        events = session.poll_xids()
        uuid = session.gpus[1].uuid
        assert events == [n.XidEvent(uuid, 79), n.XidEvent(uuid, 13)]
        assert [e.critical for e in events] == [True, False]  # 13: an application's fault
        assert session.poll_xids() == []
        nvml.set(gpu(0), gpu(1, xid_events=[79, 13, 48]))
        assert session.poll_xids() == [n.XidEvent(uuid, 48)]
    finally:
        session.close()


def test_a_gpu_too_old_for_xid_events_is_named(nvml: FakeNvml) -> None:
    nvml.set(gpu(0), gpu(1, events_supported=False))
    session = n.open_nvml()
    try:
        assert session.events_unsupported == {session.gpus[1].uuid: "too old for Xid events"}
    finally:
        session.close()


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (n.ERROR_DRIVER_NOT_LOADED, "the NVIDIA kernel driver is not loaded"),
        (n.ERROR_LIB_RM_VERSION_MISMATCH, "NVML library and NVIDIA kernel driver versions"),
        (n.ERROR_NO_PERMISSION, "no permission to open /dev/nvidiactl"),
        (999, "NVML initialization failed: "),
    ],
)
def test_an_init_failure_is_unsupported_with_the_reason(
    nvml: FakeNvml, code: int, reason: str
) -> None:
    nvml.set(gpu(0), nvmlInitWithFlags=code)
    with pytest.raises(n.NvmlUnsupported) as caught:
        n.open_nvml()
    assert caught.value.code == code
    assert caught.value.reason.startswith(reason)
    assert caught.value.what == "nvml"


def test_no_gpu_is_unsupported_and_nvml_is_shut_down_again(nvml: FakeNvml) -> None:
    nvml.set()
    with pytest.raises(n.NvmlUnsupported, match="NVML found no NVIDIA GPU"):
        n.open_nvml()  # the fixture checks that NVML was shut down


def test_a_gpu_that_cannot_be_described_is_left_out_and_the_others_listed(nvml: FakeNvml) -> None:
    nvml.set(gpu(0, errors={"nvmlDeviceGetUUID": n.ERROR_GPU_IS_LOST}), gpu(1))
    session = n.open_nvml()
    try:
        assert [g.index for g in session.gpus] == [1]
        assert "GPU is lost" in session.skipped[0]
        assert session.sample(session.gpus[0]).memory_used == GiB
    finally:
        session.close()


def test_a_driver_level_failure_while_listing_is_unsupported(nvml: FakeNvml) -> None:
    nvml.set(gpu(0), nvmlDeviceGetHandleByIndex_v2=n.ERROR_NO_PERMISSION)
    with pytest.raises(n.NvmlUnsupported, match=r"no permission .*nvmlDeviceGetHandleByIndex"):
        n.open_nvml()


def test_the_library_is_found_by_ld_library_path_in_a_fresh_process(nvml: FakeNvml) -> None:
    """The deployment path: nothing preloaded, the dynamic loader finds the library."""
    code = (
        "import json; from koordlet.system.nvml import open_nvml\n"
        "s = open_nvml()\n"
        "print(json.dumps([s.driver_version, [g.uuid for g in s.gpus]]))\n"
        "s.close()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=nvml.env(), capture_output=True, text=True, check=True
    )
    driver, uuids = json.loads(out.stdout)
    assert driver == "535.104.05"
    assert uuids == [gpu(0)["uuid"], gpu(1)["uuid"]]


def _real_nvml_present() -> bool:
    try:
        ctypes.CDLL(n.LIBRARY)
    except OSError:
        return False
    return True


@pytest.mark.skipif(_real_nvml_present(), reason="this host has an NVML library")
def test_without_the_library_nvml_is_unsupported_with_the_reason_never_a_crash() -> None:
    code = (
        "from koordlet.system.nvml import NvmlUnsupported, open_nvml\n"
        "try:\n    open_nvml()\nexcept NvmlUnsupported as err:\n    print(err.reason)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("NVML library libnvidia-ml.so.1 not found")


# sysfs ------------------------------------------------------------------------------------------


def test_nvml_bus_ids_normalize_to_sysfs_names() -> None:
    assert normalize_bus_id("0000:3B:00.0") == "0000:3b:00.0"
    assert normalize_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    with pytest.raises(ParseError, match=r"not domain:bus:device\.function"):
        normalize_bus_id("3b:00")


def test_the_pci_place_is_the_numa_node_socket_and_root_complex(sysfs: HostPaths) -> None:
    place = read_pci_place(sysfs, "0000:86:00.0")
    assert (place.numa_node, place.socket_id, place.pcie_root) == (1, 1, "pci0000:85")


def test_numa_node_minus_one_counts_as_node_zero(sysfs: HostPaths) -> None:
    Path(sysfs.sys("bus", "pci", "devices", "0000:3b:00.0", "numa_node")).write_text("-1\n")
    place = read_pci_place(sysfs, "0000:3b:00.0")
    assert (place.numa_node, place.socket_id) == (0, 0)


def test_a_device_sysfs_does_not_show_is_a_host_error(sysfs: HostPaths) -> None:
    with pytest.raises(n.HostError, match=r"0000:af:00\.0/numa_node"):
        read_pci_place(sysfs, "0000:af:00.0")


def test_this_hosts_real_pci_devices_read() -> None:
    devices = Path("/sys/bus/pci/devices")
    found = sorted(devices.iterdir()) if devices.is_dir() else []
    if not found:
        pytest.skip("no PCI devices in this host's sysfs")
    place = read_pci_place(HostPaths(), found[0].name)
    assert place.numa_node >= 0
    assert place.pcie_root.startswith("pci")
