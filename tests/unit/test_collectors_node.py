"""Node collectors on a fake host: CPU from /proc/stat deltas, memory, NUMA, node info."""

from __future__ import annotations

from pathlib import Path

import pytest

from koordlet.collectors.nodeinfo import INFO_KEY, NodeInfoCollector
from koordlet.collectors.noderesource import NodeResourceCollector
from koordlet.collectors.runner import TickState
from koordlet.errors import HostError, ParseError
from koordlet.metriccache import series as s
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from tests.fakehost import USER_HZ, CpuTimes, FakeHost

EMPTY = WorkloadSnapshot()
KiB = 1024


def collect(collector: NodeResourceCollector, now: float) -> dict[tuple[str, str], float]:
    result = collector.collect(TickState(now, EMPTY))
    return {(sample.key.metric, sample.key.entity): sample.value for sample in result.samples}


@pytest.fixture
def numa_host(host_root: Path) -> FakeHost:
    return FakeHost(host_root, CgroupVersion.V1, CgroupDriver.SYSTEMD, ncpus=8, numa_nodes=2)


def test_node_cpu_is_busy_jiffies_over_user_hz_and_elapsed_seconds(fake_host: FakeHost) -> None:
    collector = NodeResourceCollector(fake_host.host, user_hz=USER_HZ)
    assert (s.NODE_CPU_USAGE, s.NODE) not in collect(collector, 100.0)  # first reading seeds

    # 2 s later: 150 user + 30 nice + 20 system + 10 irq + 20 softirq = 230 busy jiffies,
    # idle, iowait and steal do not count: 2.3 s of CPU over 2 s is 1.15 cores.
    fake_host.advance_proc_stat(
        user=150, nice=30, system=20, irq=10, softirq=20, idle=500, iowait=40, steal=7
    )
    got = collect(collector, 102.0)

    assert got[(s.NODE_CPU_USAGE, s.NODE)] == pytest.approx(1.15)


def test_node_memory_is_total_minus_available_and_with_page_cache_total_minus_free(
    fake_host: FakeHost,
) -> None:
    fake_host.set_meminfo(MemTotal=16_000_000, MemAvailable=12_000_000, MemFree=9_000_000)

    got = collect(NodeResourceCollector(fake_host.host), 100.0)

    assert got[(s.NODE_MEMORY_USAGE, s.NODE)] == 4_000_000 * KiB
    assert got[(s.NODE_MEMORY_WITH_PAGE_CACHE, s.NODE)] == 7_000_000 * KiB


def test_memory_is_reported_per_numa_node_without_page_cache(numa_host: FakeHost) -> None:
    numa_host.set_numa_meminfo(
        0, MemTotal=8_000_000, MemFree=5_000_000, Active_file=500_000, Inactive_file=300_000
    )
    numa_host.set_numa_meminfo(
        1, MemTotal=8_000_000, MemFree=7_000_000, Active_file=100_000, Inactive_file=100_000
    )

    got = collect(NodeResourceCollector(numa_host.host), 100.0)

    assert got[(s.NUMA_MEMORY_TOTAL, s.numa_entity(0))] == 8_000_000 * KiB
    assert got[(s.NUMA_MEMORY_USAGE, s.numa_entity(0))] == 2_200_000 * KiB
    assert got[(s.NUMA_MEMORY_USAGE, s.numa_entity(1))] == 800_000 * KiB


def test_a_kernel_without_numa_is_reported_as_unsupported_not_faked(fake_host: FakeHost) -> None:
    for node in Path(fake_host.paths.sys("devices", "system", "node")).glob("node*"):
        for f in node.iterdir():
            f.unlink()
        node.rmdir()

    result = NodeResourceCollector(fake_host.host).collect(TickState(100.0, EMPTY))

    assert "numa" in result.unsupported
    assert not [x for x in result.samples if x.key.entity.startswith("numa/")]
    assert any(x.key.metric == s.NODE_MEMORY_USAGE for x in result.samples)


def test_a_missing_proc_stat_is_a_host_error_not_a_cgroup_race(fake_host: FakeHost) -> None:
    Path(fake_host.paths.proc("stat")).unlink()

    with pytest.raises(HostError, match="stat: missing"):
        NodeResourceCollector(fake_host.host).collect(TickState(100.0, EMPTY))


def test_a_malformed_meminfo_raises_a_parse_error_naming_it(fake_host: FakeHost) -> None:
    Path(fake_host.paths.proc("meminfo")).write_text("MemTotal: lots\n")

    with pytest.raises(ParseError, match="meminfo"):
        NodeResourceCollector(fake_host.host).collect(TickState(100.0, EMPTY))


def test_node_info_describes_topology_numa_and_processor(numa_host: FakeHost) -> None:
    result = NodeInfoCollector(numa_host.host).collect(TickState(100.0, EMPTY))

    info = result.info[INFO_KEY]
    assert result.samples == ()
    assert info["total"] == {"cpus": 8, "cores": 8, "sockets": 2, "numa_nodes": 2}
    assert info["numa"]["0"]["cpus"] == "0-3"
    assert info["numa"]["1"]["memory_total_bytes"] == numa_host.meminfo["MemTotal"] // 2 * KiB
    assert info["hyperthreading"] is False
    assert [c["numa_node"] for c in info["cpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_node_info_sees_hyperthread_siblings_share_a_core(host_root: Path) -> None:
    fake = FakeHost(host_root, CgroupVersion.V2, CgroupDriver.SYSTEMD, ncpus=4, threads_per_core=2)

    info = NodeInfoCollector(fake.host).collect(TickState(100.0, EMPTY)).info[INFO_KEY]

    assert info["hyperthreading"] is True
    assert info["total"]["cores"] == 2


def test_cpu_is_reported_per_numa_node_from_its_cpus_lines(numa_host: FakeHost) -> None:
    # 8 CPUs, NUMA node 0 holds CPUs 0-3, node 1 CPUs 4-7 (the kernel's node<N>/cpulist)
    def times(busy: int) -> CpuTimes:
        return CpuTimes(busy, 0, 0, 1000, 0, 0, 0, 0)

    numa_host.set_proc_stat(per_cpu=[times(100)] * 8)
    collector = NodeResourceCollector(numa_host.host, user_hz=USER_HZ)
    first = collect(collector, 100.0)
    numa_host.set_proc_stat(per_cpu=[times(300)] * 4 + [times(150)] * 4)
    got = collect(collector, 102.0)

    assert (s.NUMA_CPU_USAGE, "numa/0") not in first  # the first reading seeds
    # node 0: 4 CPUs x 200 jiffies over 2 s = 4 cores busy; node 1: 4 x 50 = 1 core
    assert got[(s.NUMA_CPU_USAGE, "numa/0")] == pytest.approx(4 * 200 / USER_HZ / 2)
    assert got[(s.NUMA_CPU_USAGE, "numa/1")] == pytest.approx(4 * 50 / USER_HZ / 2)
    assert got[(s.NODE_CPU_USAGE, s.NODE)] == pytest.approx(
        got[(s.NUMA_CPU_USAGE, "numa/0")] + got[(s.NUMA_CPU_USAGE, "numa/1")]
    )


def test_node_memory_total_is_memtotal(fake_host: FakeHost) -> None:
    fake_host.set_meminfo(MemTotal=24 * 1024 * 1024)  # 24 GiB in kB
    got = collect(NodeResourceCollector(fake_host.host), 100.0)
    assert got[(s.NODE_MEMORY_TOTAL, s.NODE)] == 24 * 1024**3
