"""Fixtures of the GPU tests: the fake NVML library loaded in this process, its config, and a
sysfs tree with the GPUs' PCI devices."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.system.paths import HostPaths
from tests.nvmlfake import ENV, FakeNvml, build, gpu, preload


@pytest.fixture(scope="session")
def fake_nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake ``libnvidia-ml.so.1``, built once a session (skipped without gcc)."""
    try:
        return build(tmp_path_factory.mktemp("nvml"))
    except RuntimeError as err:
        pytest.skip(str(err))


@pytest.fixture
def nvml(
    fake_nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeNvml]:
    """The fake, loaded here, with two A100s; the test fails when it leaves NVML initialized
    (a session it did not close)."""
    preload(fake_nvml_library)
    fake = FakeNvml(fake_nvml_library, tmp_path / "nvml.json")
    fake.set(gpu(0), gpu(1))
    monkeypatch.setenv(ENV, str(fake.config))
    yield fake
    pynvml = importlib.import_module("pynvml")
    assert pynvml._nvmlLib_refcount == 0, "the test left NVML initialized"


def add_pci_device(paths: HostPaths, bus_id: str, numa_node: int, root: str = "pci0000:3a") -> None:
    """``bus/pci/devices/<bus_id>`` as the kernel lays it out: a link into
    ``devices/<root>/<bridge>/<bus_id>`` holding ``numa_node``."""
    real = Path(paths.sys("devices", root, f"{root[3:]}:00.0", bus_id))
    real.mkdir(parents=True, exist_ok=True)
    (real / "numa_node").write_text(f"{numa_node}\n")
    link = Path(paths.sys("bus", "pci", "devices", bus_id))
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(real, link.parent))


def add_numa_node(paths: HostPaths, node: int, cpus: str, socket: int) -> None:
    """``node<node>/cpulist`` and each CPU's ``physical_package_id``."""
    node_dir = Path(paths.sys("devices", "system", "node", f"node{node}"))
    node_dir.mkdir(parents=True, exist_ok=True)
    (node_dir / "cpulist").write_text(cpus + "\n")
    first, _, last = cpus.partition("-")
    for cpu in range(int(first), int(last or first) + 1):
        topo = Path(paths.sys("devices", "system", "cpu", f"cpu{cpu}", "topology"))
        topo.mkdir(parents=True, exist_ok=True)
        (topo / "physical_package_id").write_text(f"{socket}\n")


@pytest.fixture
def sysfs(tmp_path: Path) -> HostPaths:
    """Two sockets, one NUMA node each; the first fake GPU on node 0 (root complex
    ``pci0000:3a``), the second on node 1 (``pci0000:85``)."""
    paths = HostPaths(sys_root=str(tmp_path / "sys"), proc_root=str(tmp_path / "proc"))
    add_numa_node(paths, 0, "0-3", 0)
    add_numa_node(paths, 1, "4-7", 1)
    add_pci_device(paths, "0000:3b:00.0", 0, "pci0000:3a")
    add_pci_device(paths, "0000:86:00.0", 1, "pci0000:85")
    return paths
