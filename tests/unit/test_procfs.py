"""The procfs parsers, on golden files from this machine's kernel and on its live /proc."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from apis.cpulist import parse_cpulist
from koordlet.errors import CgroupGoneError, HostError, ParseError
from koordlet.system.paths import HostPaths
from koordlet.system.procfs import (
    USER_HZ,
    CpuTimes,
    parse_meminfo,
    parse_numa_meminfo,
    parse_pid_cgroups,
    parse_proc_stat_cpu,
    parse_proc_stat_per_cpu,
    read_meminfo,
    read_numa_meminfo,
    read_pid_cgroups,
    read_proc_stat_cpu,
    read_proc_stat_per_cpu,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "parsers"
TREE = GOLDEN / "sys-2s-ht"


def golden(name: str) -> tuple[bytes, str]:
    path = GOLDEN / name
    return path.read_bytes(), str(path)


def naive_meminfo(data: bytes, prefix: str = "") -> dict[str, int]:
    """``{key: value}`` with kB turned into bytes: the oracle of the meminfo parsers."""
    result = {}
    for line in data.decode().splitlines():
        key, value = line.removeprefix(prefix).split(":")
        number, *unit = value.split()
        result[key.strip()] = int(number) * (1024 if unit == ["kB"] else 1)
    return result


# /proc/stat --------------------------------------------------------------------------------


def test_the_aggregate_cpu_line_is_read_in_kernel_column_order() -> None:
    data, path = golden("proc/stat")
    columns = [int(v) for v in data.decode().splitlines()[0].split()[1:]]
    times = parse_proc_stat_cpu(data, path)
    assert list(times) == columns


def test_busy_jiffies_follow_koordinators_rule_and_total_excludes_guest() -> None:
    times = CpuTimes(10, 20, 30, 1000, 5, 6, 7, 8, 9, 11)
    assert times.busy == 10 + 20 + 30 + 6 + 7
    assert times.total == times.busy + 1000 + 5 + 8


def test_an_old_kernel_cpu_line_without_steal_and_guest_reads_them_as_zero() -> None:
    times = parse_proc_stat_cpu(b"cpu  1 2 3 4 5 6 7\nintr 0\n", "stat")
    assert (times.softirq, times.steal, times.guest, times.guest_nice) == (7, 0, 0, 0)


def test_per_cpu_lines_are_keyed_by_cpu_id() -> None:
    data, path = golden("proc/stat")
    expected = {
        int(fields[0][3:]): [int(v) for v in fields[1:]]
        for fields in (line.split() for line in data.decode().splitlines())
        if fields[0].startswith("cpu") and fields[0] != "cpu"
    }
    per_cpu = parse_proc_stat_per_cpu(data, path)
    assert {cpu: list(times) for cpu, times in per_cpu.items()} == expected


@pytest.mark.parametrize(
    "raw", [b"intr 1 2\ncpu 1 2 3 4 5 6 7\n", b"cpu  1 2 3\n", b"cpu  1 2 x 4 5 6 7\n", b""]
)
def test_a_malformed_proc_stat_names_the_file(raw: bytes) -> None:
    with pytest.raises(ParseError, match="fake/stat"):
        parse_proc_stat_cpu(raw, "fake/stat")


def test_the_live_proc_stat_has_one_line_per_online_cpu() -> None:
    paths = HostPaths()
    online = parse_cpulist(Path(paths.sys("devices/system/cpu/online")).read_text())
    assert sorted(read_proc_stat_per_cpu(paths)) == sorted(online)
    times = read_proc_stat_cpu(paths)
    assert 0 < times.busy < times.total
    assert os.sysconf("SC_CLK_TCK") == USER_HZ


def test_a_missing_proc_file_is_a_host_error_not_a_cgroup_race(tmp_path: Path) -> None:
    with pytest.raises(HostError, match="stat: missing") as info:
        read_proc_stat_cpu(HostPaths(proc_root=str(tmp_path)))
    assert not isinstance(info.value, CgroupGoneError)


# /proc/meminfo -----------------------------------------------------------------------------


def test_meminfo_is_read_in_bytes_from_the_golden_file() -> None:
    data, path = golden("proc/meminfo")
    raw = naive_meminfo(data)
    info = parse_meminfo(data, path)
    assert (info.mem_total, info.mem_free, info.mem_available) == (
        raw["MemTotal"],
        raw["MemFree"],
        raw["MemAvailable"],
    )
    assert (info.active_file, info.inactive_file, info.shmem) == (
        raw["Active(file)"],
        raw["Inactive(file)"],
        raw["Shmem"],
    )
    assert (info.hugepages_total, info.hugepage_size) == (
        raw["HugePages_Total"],
        raw["Hugepagesize"],
    )


def test_node_memory_usage_follows_koordinators_two_rules() -> None:
    data, path = golden("proc/meminfo")
    raw = naive_meminfo(data)
    info = parse_meminfo(data, path)
    assert info.used == raw["MemTotal"] - raw["MemAvailable"]
    assert info.used_with_page_cache == raw["MemTotal"] - raw["MemFree"]


def test_meminfo_without_memavailable_is_rejected_by_name() -> None:
    data, _ = golden("proc/meminfo")
    lines = [line for line in data.splitlines() if not line.startswith(b"MemAvailable")]
    old = b"\n".join(lines) + b"\n"
    with pytest.raises(ParseError, match=r"old/meminfo: missing MemAvailable"):
        parse_meminfo(old, "old/meminfo")


@pytest.mark.parametrize(
    "raw", [b"MemTotal: 12 MB\n", b"MemTotal: lots kB\n", b"MemTotal:\n", b"garbage line\n"]
)
def test_a_malformed_meminfo_names_the_file(raw: bytes) -> None:
    with pytest.raises(ParseError, match="bad/meminfo"):
        parse_meminfo(raw + b"MemFree: 1 kB\nMemAvailable: 1 kB\n", "bad/meminfo")


def test_the_live_meminfo_is_consistent() -> None:
    info = read_meminfo(HostPaths())
    assert 0 < info.mem_available <= info.mem_total
    assert 0 <= info.used <= info.used_with_page_cache <= info.mem_total


# NUMA meminfo ------------------------------------------------------------------------------


@pytest.mark.parametrize("node", [0, 1])
def test_numa_meminfo_strips_the_node_prefix(node: int) -> None:
    data, path = golden(f"proc/node{node}.meminfo")
    raw = naive_meminfo(data, prefix=f"Node {node} ")
    info = parse_numa_meminfo(data, path, node)
    assert (info.mem_total, info.mem_free, info.mem_used) == (
        raw["MemTotal"],
        raw["MemFree"],
        raw["MemUsed"],
    )
    assert (info.file_pages, info.hugepages_total) == (raw["FilePages"], raw["HugePages_Total"])


def test_numa_usage_excludes_the_file_lru_and_the_cache_rule_is_total_minus_free() -> None:
    data, path = golden("proc/node1.meminfo")
    raw = naive_meminfo(data, prefix="Node 1 ")
    info = parse_numa_meminfo(data, path, 1)
    assert info.used_with_page_cache == raw["MemTotal"] - raw["MemFree"]
    assert info.used == (
        raw["MemTotal"] - raw["MemFree"] - raw["Active(file)"] - raw["Inactive(file)"]
    )


def test_a_numa_meminfo_line_of_another_node_is_rejected() -> None:
    data, _ = golden("proc/node0.meminfo")
    with pytest.raises(ParseError, match=r"node1/meminfo: line not of node 1"):
        parse_numa_meminfo(data, "node1/meminfo", 1)


def test_every_numa_node_of_the_tree_is_read() -> None:
    infos = read_numa_meminfo(HostPaths(sys_root=str(TREE)))
    assert sorted(infos) == [0, 1]
    for node, info in infos.items():
        raw = naive_meminfo(
            (TREE / f"devices/system/node/node{node}/meminfo").read_bytes(), f"Node {node} "
        )
        assert info.mem_total == raw["MemTotal"]


def test_a_kernel_without_numa_has_no_numa_meminfo(tmp_path: Path) -> None:
    shutil.copytree(TREE, tmp_path / "sys")
    shutil.rmtree(tmp_path / "sys/devices/system/node")
    assert read_numa_meminfo(HostPaths(sys_root=str(tmp_path / "sys"))) == {}


# /proc/<pid>/cgroup ------------------------------------------------------------------------


def test_pid_cgroups_map_each_v1_controller_and_the_v2_entry() -> None:
    data, path = golden("proc/pid.cgroup")
    expected: dict[str, str] = {}
    for line in data.decode().splitlines():
        _, controllers, cgroup = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            expected[controller] = cgroup
    cgroups = parse_pid_cgroups(data, path)
    assert cgroups == expected
    assert "name=systemd" in cgroups
    assert "" in cgroups


def test_comounted_controllers_and_colons_in_paths_are_kept() -> None:
    data = b"3:cpu,cpuacct:/kubepods/pod1:odd\n0::/kubepods.slice\n"
    assert parse_pid_cgroups(data, "cgroup") == {
        "cpu": "/kubepods/pod1:odd",
        "cpuacct": "/kubepods/pod1:odd",
        "": "/kubepods.slice",
    }


@pytest.mark.parametrize("raw", [b"memory:/x\n", b"a:memory:/x\n", b"4::/x\n"])
def test_a_malformed_pid_cgroup_file_names_it(raw: bytes) -> None:
    with pytest.raises(ParseError, match="42/cgroup"):
        parse_pid_cgroups(raw, "42/cgroup")


def test_the_live_cgroups_of_this_process_are_read() -> None:
    expected = parse_pid_cgroups(Path("/proc/self/cgroup").read_bytes(), "self")
    assert read_pid_cgroups(HostPaths(), os.getpid()) == expected


def test_the_cgroups_of_an_exited_process_read_as_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with pytest.raises(CgroupGoneError, match=f"{child.pid}/cgroup"):
        read_pid_cgroups(HostPaths(), child.pid)
