"""The writer and the probe against this machine's real cgroup v1 hierarchy.

Every test makes its own ``kpytest-<random>`` cgroups, puts no task in them and removes them in
a ``finally``; nothing else on the host is touched.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from koordlet.errors import CgroupGoneError, HostError, InvalidValueError
from koordlet.executor import CgroupWriter
from koordlet.system import tc
from koordlet.system.cgroups import CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.host import Host
from koordlet.system.knobs import (
    CPU_CFS_PERIOD,
    CPU_CFS_QUOTA,
    CPU_SHARES,
    CPUSET_CPUS,
    MEMORY_LIMIT,
)
from koordlet.system.paths import HostPaths
from koordlet.system.probe import probe_capabilities

PATHS = HostPaths()

pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create cgroups"),
    pytest.mark.skipif(
        not all(os.path.isfile(PATHS.cgroup(c, "tasks")) for c in ("cpu", "cpuset", "memory")),
        reason="needs the cgroup v1 cpu, cpuset and memory hierarchies",
    ),
]


@pytest.fixture(scope="module")
def host() -> Host:
    layout = detect_layout(PATHS, version=CgroupVersion.V1, driver=CgroupDriver.CGROUPFS)
    return Host(PATHS, layout)


@pytest.fixture
def cgroup(host: Host) -> Iterator[str]:
    """A fresh empty cgroup in the cpu, cpuset and memory hierarchies; its relative dir."""
    rel = f"kpytest-{secrets.token_hex(6)}"
    made: list[str] = []
    try:
        for controller in ("cpu", "cpuset", "memory"):
            path = host.layout.abs_dir(controller, rel)
            os.mkdir(path)
            made.append(path)
        yield rel
    finally:
        for path in reversed(made):
            if os.path.isdir(path):
                os.rmdir(path)


def read(host: Host, controller: str, rel: str, filename: str) -> str:
    with open(host.layout.file(controller, rel, filename)) as f:
        return f.read().strip()


def test_cpu_shares_are_written_and_read_back_by_the_kernel(host: Host, cgroup: str) -> None:
    result = CgroupWriter(host).write(CPU_SHARES, cgroup, 512)
    assert result.changed
    assert read(host, "cpu", cgroup, "cpu.shares") == "512"


def test_cfs_quota_and_period_are_written_and_unlimited_is_restored(
    host: Host, cgroup: str
) -> None:
    writer = CgroupWriter(host)
    writer.write(CPU_CFS_PERIOD, cgroup, 200000)
    writer.write(CPU_CFS_QUOTA, cgroup, 50000)
    assert read(host, "cpu", cgroup, "cpu.cfs_period_us") == "200000"
    assert read(host, "cpu", cgroup, "cpu.cfs_quota_us") == "50000"
    writer.write(CPU_CFS_QUOTA, cgroup, None)
    assert read(host, "cpu", cgroup, "cpu.cfs_quota_us") == "-1"


def test_an_unchanged_value_is_not_written_again(host: Host, cgroup: str) -> None:
    writes: list[str] = []
    writer = CgroupWriter(host, on_change=lambda r: writes.append(r.new))
    assert writer.write(CPU_SHARES, cgroup, 1024).changed is False  # the kernel default
    writer.write(CPU_SHARES, cgroup, 4096)
    assert writer.write(CPU_SHARES, cgroup, 4096).changed is False
    assert CgroupWriter(host).write(CPU_SHARES, cgroup, 4096).changed is False  # from the file
    assert writes == ["4096"]


def test_an_out_of_range_value_never_reaches_the_kernel(host: Host, cgroup: str) -> None:
    before = read(host, "cpu", cgroup, "cpu.shares")
    with pytest.raises(InvalidValueError, match="cpu_shares"):
        CgroupWriter(host).write(CPU_SHARES, cgroup, 1)
    with pytest.raises(InvalidValueError, match="cpu_cfs_quota"):
        CgroupWriter(host).write(CPU_CFS_QUOTA, cgroup, 10)
    assert read(host, "cpu", cgroup, "cpu.shares") == before
    assert read(host, "cpu", cgroup, "cpu.cfs_quota_us") == "-1"


def test_a_removed_cgroup_gives_cgroup_gone(host: Host, cgroup: str) -> None:
    writer = CgroupWriter(host)
    writer.write(CPU_SHARES, cgroup, 512)
    os.rmdir(host.layout.abs_dir("cpu", cgroup))
    with pytest.raises(CgroupGoneError):
        writer.write(CPU_SHARES, cgroup, 256)


def test_unlimited_memory_matches_the_kernel_page_counter_maximum(host: Host, cgroup: str) -> None:
    writer = CgroupWriter(host)
    assert writer.write(MEMORY_LIMIT, cgroup, None).changed is False
    writer.write(MEMORY_LIMIT, cgroup, 64 << 20)
    assert read(host, "memory", cgroup, "memory.limit_in_bytes") == str(64 << 20)
    assert writer.write(MEMORY_LIMIT, cgroup, None).changed
    assert int(read(host, "memory", cgroup, "memory.limit_in_bytes")) >= (1 << 63) - (1 << 20)


def test_cpuset_cpus_are_written_in_canonical_form(host: Host, cgroup: str) -> None:
    online = read(host, "cpuset", "", "cpuset.cpus")
    writer = CgroupWriter(host)
    writer.write(CPUSET_CPUS, cgroup, online)
    assert read(host, "cpuset", cgroup, "cpuset.cpus") == online


def test_a_value_the_kernel_refuses_is_a_host_error(host: Host, cgroup: str) -> None:
    with pytest.raises(HostError, match=r"cpuset\.cpus") as info:
        CgroupWriter(host).write(CPUSET_CPUS, cgroup, {65000})  # no such CPU
    assert not isinstance(info.value, CgroupGoneError)


def test_the_probe_claims_exactly_the_files_this_kernel_has(host: Host) -> None:
    caps = probe_capabilities(host)
    assert caps.supported("cpu_shares")
    assert caps.supported("memory_limit")
    for cap in caps.values():
        if cap.name == "tc_classifier":  # a bpf(2) load: the kernel's answer, no file
            assert cap.supported == tc.probe_classifier()[0], cap
        elif cap.supported:
            assert os.path.exists(cap.path), cap
        elif cap.path and not cap.reason.startswith(("permission", "cannot read")):
            assert not os.path.exists(cap.path) or "has no" in cap.reason, cap
