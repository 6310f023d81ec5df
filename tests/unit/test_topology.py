"""CPU topology from sysfs: cpulists, a golden 2-socket hyperthreaded 2-NUMA-node tree, and this
machine's real (read-only) /sys."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from koordlet.errors import HostError, ParseError
from koordlet.system.paths import HostPaths
from koordlet.system.procfs import read_meminfo, read_numa_meminfo
from koordlet.system.topology import (
    read_cpu_topology,
    read_cpulist,
    read_model_name,
    read_turbo,
)

TREE = Path(__file__).resolve().parents[1] / "golden" / "parsers" / "sys-2s-ht"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A writable copy of the golden 2-socket tree (sysfs at the root, procfs under proc/)."""
    shutil.copytree(TREE, tmp_path / "host")
    return tmp_path / "host"


def host_paths(root: Path) -> HostPaths:
    return HostPaths(sys_root=str(root), proc_root=str(root / "proc"))


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# cpulists ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["0-", "3-1", "a", "0-3,x", "-1"])
def test_a_bad_cpulist_names_its_file(text: str) -> None:
    with pytest.raises(ParseError, match="node0/cpulist"):
        read_cpulist(text, "node0/cpulist")


def test_a_cpulist_file_reads_as_sorted_cpu_ids() -> None:
    assert read_cpulist(b"4,0-1,1\n", "cpu/online") == (0, 1, 4)


# the golden 2-socket, hyperthreaded, 2-NUMA-node tree --------------------------------------


def test_the_golden_tree_has_two_sockets_of_two_hyperthreaded_cores() -> None:
    topo = read_cpu_topology(host_paths(TREE))
    assert topo.cpu_ids == tuple(range(8))
    assert topo.hyperthreading
    assert (topo.socket_count, topo.core_count) == (2, 4)
    by_id = {cpu.cpu_id: cpu for cpu in topo.cpus}
    for first in range(4):  # Intel numbering: cpu N and N+4 are siblings of one core
        assert by_id[first].core_id == by_id[first + 4].core_id
        assert by_id[first].socket_id == by_id[first + 4].socket_id
    assert len({by_id[n].core_id for n in range(4)}) == 4


def test_cores_with_equal_kernel_core_ids_on_two_sockets_stay_distinct() -> None:
    topo = read_cpu_topology(host_paths(TREE))
    socket0 = {cpu.core_id for cpu in topo.cpus if cpu.socket_id == 0}
    socket1 = {cpu.core_id for cpu in topo.cpus if cpu.socket_id == 1}
    assert socket0.isdisjoint(socket1)


def test_numa_nodes_come_from_the_node_cpulists() -> None:
    topo = read_cpu_topology(host_paths(TREE))
    for node in (0, 1):
        listed = (TREE / f"devices/system/node/node{node}/cpulist").read_text()
        assert topo.numa_nodes[node] == read_cpulist(listed, "listed")
    assert all(cpu.cpu_id in topo.numa_nodes[cpu.numa_node] for cpu in topo.cpus)


def test_numa_memory_totals_come_from_the_node_meminfo() -> None:
    paths = host_paths(TREE)
    expected = {node: info.mem_total for node, info in read_numa_meminfo(paths).items()}
    assert read_cpu_topology(paths).numa_memory_total == expected
    assert len(expected) == 2


def test_model_name_and_turbo_are_reported() -> None:
    topo = read_cpu_topology(host_paths(TREE))
    assert topo.model_name == "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz"
    assert topo.turbo is True  # intel_pstate/no_turbo is 0


def test_offline_cpus_are_left_out_everywhere(tree: Path) -> None:
    write(tree, "devices/system/cpu/online", "0-6\n")
    topo = read_cpu_topology(host_paths(tree))
    assert topo.cpu_ids == tuple(range(7))
    assert 7 not in topo.numa_nodes[1]


def test_a_host_without_numa_support_is_one_node_with_all_ram(tree: Path) -> None:
    shutil.rmtree(tree / "devices/system/node")
    shutil.copy(TREE.parent / "proc" / "meminfo", tree / "proc" / "meminfo")
    paths = host_paths(tree)
    topo = read_cpu_topology(paths)
    assert topo.numa_nodes == {0: tuple(range(8))}
    assert topo.numa_memory_total == {0: read_meminfo(paths).mem_total}
    assert {cpu.numa_node for cpu in topo.cpus} == {0}


def test_a_missing_topology_file_is_a_host_error_naming_it(tree: Path) -> None:
    (tree / "devices/system/cpu/cpu3/topology/physical_package_id").unlink()
    with pytest.raises(HostError, match="cpu3/topology/physical_package_id"):
        read_cpu_topology(host_paths(tree))


def test_a_cpu_missing_from_its_own_sibling_list_is_a_parse_error(tree: Path) -> None:
    write(tree, "devices/system/cpu/cpu2/topology/thread_siblings_list", "3,7\n")
    with pytest.raises(ParseError, match="cpu2/topology/thread_siblings_list"):
        read_cpu_topology(host_paths(tree))


# turbo and model name ----------------------------------------------------------------------


def test_no_turbo_set_means_turbo_off(tree: Path) -> None:
    write(tree, "devices/system/cpu/intel_pstate/no_turbo", "1\n")
    assert read_turbo(host_paths(tree)) is False


def test_cpufreq_boost_is_used_without_intel_pstate(tree: Path) -> None:
    shutil.rmtree(tree / "devices/system/cpu/intel_pstate")
    write(tree, "devices/system/cpu/cpufreq/boost", "1\n")
    assert read_turbo(host_paths(tree)) is True
    write(tree, "devices/system/cpu/cpufreq/boost", "0\n")
    assert read_turbo(host_paths(tree)) is False


def test_turbo_is_unknown_when_no_knob_exists(tree: Path) -> None:
    shutil.rmtree(tree / "devices/system/cpu/intel_pstate")
    assert read_turbo(host_paths(tree)) is None


def test_a_garbled_turbo_flag_is_a_parse_error(tree: Path) -> None:
    write(tree, "devices/system/cpu/intel_pstate/no_turbo", "maybe\n")
    with pytest.raises(ParseError, match="no_turbo"):
        read_turbo(host_paths(tree))


def test_an_architecture_without_model_name_reports_none(tree: Path) -> None:
    write(tree, "proc/cpuinfo", "processor\t: 0\nBogoMIPS\t: 50.00\nCPU part\t: 0xd0c\n")
    assert read_model_name(host_paths(tree)) is None


# this machine ------------------------------------------------------------------------------


def test_the_real_host_topology_matches_sysfs_and_cpuinfo() -> None:
    paths = HostPaths()
    topo = read_cpu_topology(paths)
    online = Path(paths.sys("devices/system/cpu/online")).read_text()
    assert topo.cpu_ids == read_cpulist(online, "online")
    assert sorted(cpu for cpus in topo.numa_nodes.values() for cpu in cpus) == list(topo.cpu_ids)
    models = [
        line.split(":", 1)[1].strip()
        for line in Path(paths.proc("cpuinfo")).read_text().splitlines()
        if line.startswith("model name")
    ]
    assert topo.model_name == (models[0] if models else None)
    assert topo.socket_count >= 1
    assert set(topo.numa_memory_total) == set(topo.numa_nodes)
