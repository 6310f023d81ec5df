"""The real ``koordlet`` process with ``--feature-gates=Accelerators=true``: on this host (no
NVML) the GPU collector is unsupported with the reason and the daemon runs on; with the fake
library on ``LD_LIBRARY_PATH`` the GPUs are exported, an Xid shows, and SIGTERM stops cleanly."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from koordlet.system.nvml import LIBRARY
from tests.daemon import one_value
from tests.daemon.test_daemon_process import fake_args, koordlet, launcher
from tests.fakehost import FakeHost
from tests.gpu.conftest import add_numa_node, add_pci_device
from tests.nvmlfake import ENV, FakeNvml, gpu

pytestmark = pytest.mark.daemon

GATE = "--feature-gates=Accelerators=true"


def _real_nvml_present() -> bool:
    try:
        ctypes.CDLL(LIBRARY)
    except OSError:
        return False
    return True


@pytest.fixture
def fake(host_root: Path) -> FakeHost:
    return FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)


@pytest.mark.skipif(_real_nvml_present(), reason="this host has an NVML library")
def test_without_nvml_the_collector_is_unsupported_with_the_reason(
    fake: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    with koordlet(launcher(script=False), fake_args(fake, GATE), tmp_path) as proc:
        caps = proc.until(
            "the GPU collector's verdict",
            lambda: proc.json("/debug/capabilities").get("collector/gpu/nvml"),
        )
        assert caps["supported"] is False
        assert caps["reason"].startswith("NVML library libnvidia-ml.so.1 not found")
        assert proc.get("/readyz") == (200, "ok")
        assert not any(name.startswith("koordlet_gpu_") for name in proc.samples())
        assert proc.stop() == 0


def test_with_the_library_the_gpus_are_exported_and_an_xid_shows(
    fake: FakeHost,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_nvml_library: Path,
) -> None:
    nvml = FakeNvml(fake_nvml_library, tmp_path / "nvml.json")
    nvml.set(gpu(0), gpu(1))
    add_numa_node(fake.paths, 0, "0-3", 0)
    add_pci_device(fake.paths, "0000:3b:00.0", 0)
    add_pci_device(fake.paths, "0000:86:00.0", 0, "pci0000:85")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake_nvml_library.parent))
    monkeypatch.setenv(ENV, str(nvml.config))
    uuid1 = gpu(1)["uuid"]
    with koordlet(launcher(script=False), fake_args(fake, GATE), tmp_path) as proc:
        used = proc.until(
            "GPU samples",
            lambda: one_value(proc.samples(), "koordlet_gpu_memory_used_bytes", gpu_minor="1"),
        )
        assert used == 1 << 30
        samples = proc.samples()
        assert one_value(samples, "koordlet_gpu_healthy", gpu_device_uuid=uuid1) == 1.0
        assert one_value(samples, "koordlet_gpu_core_used_percent", gpu_minor="0") == 5.0
        assert not [k for k in proc.json("/debug/capabilities") if k.startswith("collector/gpu")]

        nvml.set(gpu(0), gpu(1, xid_events=[79]))
        proc.until(
            "GPU 1 unhealthy",
            lambda: one_value(proc.samples(), "koordlet_gpu_healthy", gpu_minor="1") == 0.0,
        )
        assert one_value(proc.samples(), "koordlet_gpu_healthy", gpu_minor="0") == 1.0
        assert proc.stop() == 0
    assert "NVML opened: driver 535.104.05, 2 GPUs" in proc.log.read_text()
