"""The stat table: every stat resolves, on each cgroup layout, to a file the kernel has, and reads
the same value through its table entry as the version's own parser reads from the file.

The fake trees take their files from ``tests/golden`` (captured from a real kernel; see its
README); the real-cgroup test at the end reads this machine's v1 files.
"""

from __future__ import annotations

import os
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from apis.extension import KubeQOS
from koordlet.collectors.runner import TickState
from koordlet.errors import CgroupGoneError, HostError, ParseError, UnsupportedError
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system import stats
from koordlet.system.cgroups import CgroupVersion, detect_layout
from koordlet.system.cgroupstats import (
    MemoryLru,
    parse_cpu_stat,
    parse_memory_stat_v1,
    parse_memory_stat_v2,
)
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths
from koordlet.system.psi import parse_psi
from tests.fakehost import FakeHost

PSI_STATS = (stats.CPU_PRESSURE, stats.MEMORY_PRESSURE, stats.IO_PRESSURE)


def tick() -> TickState:
    return TickState(1.0, WorkloadSnapshot())


def test_the_tables_are_keyed_by_each_stats_own_name() -> None:
    assert all(name == stat.name for name, stat in stats.CGROUP_STATS.items())
    assert all(name == stat.name for name, stat in stats.HOST_STATS.items())
    assert stats.cgroup_stat("cpu_usage") is stats.CPU_USAGE
    assert stats.host_stat("meminfo") is stats.MEMINFO
    with pytest.raises(UnsupportedError, match="cpu_usag"):
        stats.cgroup_stat("cpu_usag")


@pytest.mark.parametrize("version", list(CgroupVersion))
def test_sources_that_share_a_file_and_parser_are_all_parsed_through_the_memo(
    version: CgroupVersion,
) -> None:
    by_file: dict[tuple[str, object], list[stats.Source[object]]] = defaultdict(list)
    for stat in stats.CGROUP_STATS.values():
        source = stat.source(version)
        by_file[(source.file, source.parse)].append(source)

    for (file, _), sources in by_file.items():
        if len(sources) > 1:
            assert all(s.shared for s in sources), file
    assert stats.MEMORY_STAT.source(version).shared  # four collectors parse every memory.stat


def test_v2_cpu_time_and_throttling_share_one_parse_of_cpu_stat() -> None:
    usage, throttling = (
        s.source(CgroupVersion.V2) for s in (stats.CPU_USAGE, stats.CPU_THROTTLING)
    )

    assert usage.file == throttling.file == "cpu.stat"
    assert usage.parse is throttling.parse is parse_cpu_stat
    assert usage.shared
    assert throttling.shared


def test_every_non_psi_stat_of_a_pod_cgroup_is_a_file_of_the_kernels_tree(
    fake_host: FakeHost,
) -> None:
    rel = fake_host.layout.qos_dir(KubeQOS.BURSTABLE)
    for stat in stats.CGROUP_STATS.values():
        bound = stat.bind(fake_host.layout)
        if stat in PSI_STATS and fake_host.version is CgroupVersion.V1:
            continue  # Anolis psi_v1 only; the golden v1 tree is mainline
        assert os.path.isfile(bound.path(rel)), (stat.name, bound.path(rel))
        assert bound.dir(rel) == os.path.dirname(bound.path(rel))


def test_cpu_time_and_memory_read_through_the_table_as_the_versions_parser_reads_them(
    fake_host: FakeHost,
) -> None:
    layout, rel = fake_host.layout, fake_host.layout.qos_dir(KubeQOS.BURSTABLE)
    t = tick()
    v2 = fake_host.version is CgroupVersion.V2
    cpu, memory, charge = (
        s.bind(layout) for s in (stats.CPU_USAGE, stats.MEMORY_STAT, stats.MEMORY_CHARGE)
    )

    usage = cpu.get(t, cpu.path(rel))
    mem = memory.get(t, memory.path(rel))

    raw_cpu = fake_host.read("cpu" if v2 else "cpuacct", rel, "cpu.stat" if v2 else "cpuacct.usage")
    expected_usage = int(raw_cpu) if not v2 else parse_cpu_stat(raw_cpu.encode(), "x").usage_ns
    assert usage == expected_usage
    parse = parse_memory_stat_v2 if v2 else parse_memory_stat_v1
    assert mem == parse(fake_host.read("memory", rel, "memory.stat").encode(), "x")
    charge_file = "memory.current" if v2 else "memory.usage_in_bytes"
    assert charge.get(t, charge.path(rel)) == int(fake_host.read("memory", rel, charge_file))


def test_the_lru_sums_read_numa_stat_on_v1_and_memory_stat_where_the_kernel_lacks_it(
    fake_host: FakeHost,
) -> None:
    layout, rel = fake_host.layout, fake_host.layout.qos_dir(KubeQOS.BURSTABLE)
    mib = 1 << 20
    fake_host.set_memory(rel, anon=96 * mib, unevictable=8 * mib, file=40 * mib)
    expected = MemoryLru(anon=96 * mib, unevictable=8 * mib, file=40 * mib)

    bound = stats.MEMORY_LRU.bind(layout)

    assert bound.get(tick(), bound.path(rel)) == expected
    if fake_host.version is CgroupVersion.V2:
        assert bound.file == "memory.stat"
        return
    assert bound.file == "memory.numa_stat"
    os.remove(layout.file("memory", "", "memory.numa_stat"))  # a kernel built without NUMA
    fallback = stats.MEMORY_LRU.bind(layout)
    assert fallback.file == "memory.stat"
    assert fallback.get(tick(), fallback.path(rel)) == expected


def test_throttling_counters_read_the_same_on_both_versions(fake_host: FakeHost) -> None:
    rel = fake_host.layout.qos_dir(KubeQOS.BURSTABLE)
    throttling = stats.CPU_THROTTLING.bind(fake_host.layout)
    expected = parse_cpu_stat(fake_host.read("cpu", rel, "cpu.stat").encode(), "x")

    assert throttling.get(tick(), throttling.path(rel)) == (
        expected.nr_periods,
        expected.nr_throttled,
    )


@pytest.mark.parametrize(("quota", "expected"), [(None, None), (250_000, 250_000)])
def test_cfs_quota_and_period_read_alike_from_two_v1_files_or_one_v2_cpu_max(
    fake_host: FakeHost, quota: int | None, expected: int | None
) -> None:
    rel = fake_host.layout.qos_dir(KubeQOS.BURSTABLE)
    if fake_host.version is CgroupVersion.V2:
        fake_host.write("cpu", rel, "cpu.max", f"{quota or 'max'} 50000")
    else:
        fake_host.write("cpu", rel, "cpu.cfs_quota_us", -1 if quota is None else quota)
        fake_host.write("cpu", rel, "cpu.cfs_period_us", 50000)
    q, p = (s.bind(fake_host.layout) for s in (stats.CPU_CFS_QUOTA, stats.CPU_CFS_PERIOD))
    t = tick()

    assert q.get(t, q.path(rel)) == expected
    assert p.get(t, p.path(rel)) == 50000
    assert t.reads == (1 if fake_host.version is CgroupVersion.V2 else 2)


def test_the_effective_cpuset_is_the_kernels_text(fake_host: FakeHost) -> None:
    rel = fake_host.layout.qos_dir(KubeQOS.BURSTABLE)
    cpuset = stats.CPUSET_EFFECTIVE_CPUS.bind(fake_host.layout)

    assert cpuset.get(tick(), cpuset.path(rel)).strip() == fake_host.all_cpus.encode()


def test_a_v2_cpu_stat_without_usage_is_a_parse_error_naming_the_file(
    fake_host: FakeHost,
) -> None:
    if fake_host.version is CgroupVersion.V1:
        pytest.skip("v1 keeps CPU time in cpuacct.usage")
    rel = fake_host.layout.qos_dir(KubeQOS.BURSTABLE)
    fake_host.write("cpu", rel, "cpu.stat", "nr_periods 1\nnr_throttled 0\nthrottled_usec 0\n")
    cpu = stats.CPU_USAGE.bind(fake_host.layout)

    with pytest.raises(ParseError, match=r"cpu\.stat"):
        cpu.get(tick(), cpu.path(rel))


def test_a_vanished_cgroup_is_gone_but_a_missing_required_host_file_is_a_host_error(
    fake_host: FakeHost,
) -> None:
    cpu = stats.CPU_USAGE.bind(fake_host.layout)
    paths = fake_host.host.paths
    os.remove(stats.MEMINFO.path(paths))

    with pytest.raises(CgroupGoneError):
        cpu.get(tick(), cpu.path("kubepods/podgone"))
    with pytest.raises(HostError, match="meminfo: missing") as info:
        stats.MEMINFO.get(tick(), stats.MEMINFO.path(paths))
    assert not isinstance(info.value, CgroupGoneError)


def test_host_stats_fill_their_path_fields_and_parse_the_kernels_files(
    fake_host: FakeHost,
) -> None:
    paths, t = fake_host.host.paths, tick()

    numa = stats.NUMA_MEMINFO.get(t, stats.NUMA_MEMINFO.path(paths, node=0))
    meminfo = stats.MEMINFO.get(t, stats.MEMINFO.path(paths))
    cpu_path = stats.PRESSURE.path(paths, resource="cpu")

    assert stats.NUMA_MEMINFO.path(paths, node=0) == paths.sys(
        "devices", "system", "node", "node0", "meminfo"
    )
    assert numa.mem_total > 0
    assert meminfo.mem_total > 0
    assert stats.PROC_STAT_CPU.get(t, stats.PROC_STAT_CPU.path(paths)).busy >= 0
    assert len(stats.CPU_ONLINE.get(t, stats.CPU_ONLINE.path(paths))) == fake_host.ncpus
    assert cpu_path == paths.proc("pressure", "cpu")
    assert stats.PRESSURE.get(t, cpu_path) == parse_psi(Path(cpu_path).read_bytes(), cpu_path)


def test_a_numa_meminfo_outside_a_node_folder_is_refused(tmp_path: Path) -> None:
    path = os.path.join(tmp_path, "meminfo")
    with open(path, "w") as f:
        f.write("Node 0 MemTotal: 1 kB\nNode 0 MemFree: 1 kB\n")

    with pytest.raises(ParseError, match="node<N>"):
        stats.NUMA_MEMINFO.get(tick(), path)


def test_v1_pressure_is_a_kernel_wide_switch_and_v2_a_per_cgroup_one() -> None:
    for stat in PSI_STATS:
        assert stat.source(CgroupVersion.V1).controller == "cpuacct"
        assert stat.source(CgroupVersion.V1).kernel_wide
        assert not stat.source(CgroupVersion.V2).kernel_wide


# This machine's cgroup v1 --------------------------------------------------------------------

_REAL = ("cpu", "cpuacct", "cpuset", "memory")


@pytest.fixture
def real_cgroup() -> Iterator[tuple[Host, str]]:
    """A fresh cgroup in each v1 controller the table names, removed afterwards."""
    paths = HostPaths()
    if os.geteuid() != 0 or not all(os.access(paths.cgroup(c), os.W_OK) for c in _REAL):
        pytest.skip("needs root and writable cgroup v1 cpu, cpuacct, cpuset, memory")
    layout = detect_layout(paths)
    if layout.version is not CgroupVersion.V1:
        pytest.skip("this machine is not on cgroup v1")
    rel = f"kpytest-stats-{uuid.uuid4().hex[:12]}"
    made: list[str] = []
    try:
        for controller in _REAL:
            path = layout.abs_dir(controller, rel)
            os.mkdir(path)
            made.append(path)
        yield Host(paths, layout), rel
    finally:
        for path in reversed(made):
            os.rmdir(path)


@pytest.mark.realcgroup
def test_every_v1_stat_reads_from_a_real_cgroup(real_cgroup: tuple[Host, str]) -> None:
    host, rel = real_cgroup
    t = tick()
    got = {}
    for stat in stats.CGROUP_STATS.values():
        if stat in PSI_STATS:
            continue  # mainline kernels put no pressure files in v1 cgroups
        bound = stat.bind(host.layout)
        got[stat.name] = bound.get(t, bound.path(rel))

    assert got["cpu_usage"] == 0  # nothing ever ran in it
    assert got["cpu_throttling"] == (0, 0)
    assert got["memory_stat"].usage == 0
    assert got["memory_lru"] == (0, 0, 0)
    assert got["memory_charge"] == 0
    assert got["cpu_cfs_quota"] is None  # a new cgroup has no quota
    assert got["cpu_cfs_period"] == 100_000  # the kernel's default period
    assert got["cpuset_effective_cpus"].strip() == b""  # a new v1 cpuset is empty until told
