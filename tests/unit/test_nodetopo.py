"""Reserved and SYSTEM QoS CPUs from the Node's annotations, and the CPUs a reservation count
picks (Koordinator's ``kubelet.TakeByTopology``: ``pkg/koordlet/util/kubelet/cpu_assignment.go``).

The topologies are the kubelet's CPU manager fixtures the upstream tests use
(``topoSingleSocketHT``, ``topoDualSocketHT``, ``topoDualSocketMultiNumaPerSocketHT``), rebuilt
from their layout; the cases are ``commonTakeByTopologyTestCases`` and
``TestTakeByTopologyNUMAPacked`` of ``cpu_assignment_test.go`` as data.
"""

from __future__ import annotations

import json

import pytest

from apis.cpulist import parse_cpulist
from koordlet.statesinformer.nodetopo import (
    TopoCPU,
    cpu_basic_info,
    cpus_of_node_info,
    node_annotations,
    reserved_cpus,
    system_qos_exclusive_cpus,
    take_by_topology,
)


def single_socket_ht() -> tuple[TopoCPU, ...]:
    """8 CPUs, 1 socket, 4 cores: CPU i and i+4 are siblings of core i."""
    return tuple(TopoCPU(i, i % 4, 0, 0) for i in range(8))


def dual_socket_ht() -> tuple[TopoCPU, ...]:
    """12 CPUs, 2 sockets (one NUMA node each), 6 cores: core c holds CPUs c and c+6; even
    cores on socket 0, odd on socket 1."""
    return tuple(TopoCPU(i, i % 6, i % 2, i % 2) for i in range(12))


def dual_socket_multi_numa_ht() -> tuple[TopoCPU, ...]:
    """80 CPUs, 2 sockets, 4 NUMA nodes, 40 cores: CPUs 0-39 are one thread of cores 0-39, CPUs
    40-79 the sibling; NUMA node n holds cores 10n..10n+9, sockets hold NUMA nodes 0-1 and 2-3."""
    out = []
    for i in range(80):
        core = i % 40
        numa = core // 10
        out.append(TopoCPU(i, core, numa // 2, numa))
    return tuple(out)


TOPOS = {
    "single": single_socket_ht,
    "dual": dual_socket_ht,
    "multi": dual_socket_multi_numa_ht,
}

TAKE_CASES = [
    ("more cpus than are available", "single", "0,2,4,6", 5, ""),
    ("zero cpus", "single", "0-7", 0, ""),
    ("one cpu", "single", "0-7", 1, "0"),
    ("one cpu, some taken", "single", "1,3,5,6,7", 1, "6"),
    ("two cpus", "single", "0-7", 2, "0,4"),
    ("all cpus", "single", "0-7", 8, "0-7"),
    ("two cpus, one core totally free", "single", "0,1,2,3,6", 2, "2,6"),
    ("a socket from dual socket", "dual", "0-11", 6, "0,2,4,6,8,10"),
    ("a socket from multi numa", "multi", "0-79", 40, "0-19,40-59"),
    ("a NUMA node from multi numa", "multi", "0-79", 20, "0-9,40-49"),
    ("a NUMA node, one already taken", "multi", "10-39,50-79", 20, "10-19,50-59"),
    ("a socket and a NUMA node", "multi", "0-79", 60, "0-29,40-69"),
    ("a socket and a NUMA node, a core taken", "multi", "1-39,41-79", 60, "10-39,50-79"),
    ("one cpu, core from socket 0", "dual", "1,2,3,4,5,7,8,9,10,11", 1, "2"),
    (
        "4 full cores: 3 from the first node and 1 from the second",
        "dual",
        "0-11",
        8,
        "0,6,2,8,4,10,1,7",
    ),
    (
        "32 full cores: 30 from 3 nodes, 2 from the fourth",
        "multi",
        "0-79",
        64,
        "0-29,40-69,30,31,70,71",
    ),
]


@pytest.mark.parametrize(("name", "topo", "available", "count", "expected"), TAKE_CASES)
def test_take_by_topology_as_upstream(
    name: str, topo: str, available: str, count: int, expected: str
) -> None:
    got = take_by_topology(TOPOS[topo](), parse_cpulist(available), count)
    assert got == frozenset(parse_cpulist(expected)), name


def _node(**annotations: object) -> dict[str, object]:
    return {"metadata": {"annotations": {k: json.dumps(v) for k, v in annotations.items()}}}


def test_reserved_cpus_from_the_node_annotation() -> None:
    topo = dual_socket_ht()
    key = "node.koordinator.sh/reservation"
    assert reserved_cpus(node_annotations(_node()), topo) == frozenset()
    assert reserved_cpus({key: '{"reservedCPUs": "3,5"}'}, topo) == frozenset({3, 5})
    # a count takes whole cores first: 2 CPUs are core 0 (CPUs 0 and 6)
    assert reserved_cpus({key: '{"resources": {"cpu": "2"}}'}, topo) == frozenset({0, 6})
    # 1.5 CPUs round up to 2
    assert reserved_cpus({key: '{"resources": {"cpu": "1500m"}}'}, topo) == frozenset({0, 6})
    # malformed: nothing reserved (logged)
    assert reserved_cpus({key: "{not json"}, topo) == frozenset()
    assert reserved_cpus(None, topo) == frozenset()


def test_system_qos_exclusive_cpus() -> None:
    key = "node.koordinator.sh/system-qos-resource"
    assert system_qos_exclusive_cpus({key: '{"cpuset": "0-1"}'}) == frozenset({0, 1})
    assert system_qos_exclusive_cpus({key: '{"cpuset": "0-1", "cpusetExclusive": false}'}) == (
        frozenset()
    )
    assert system_qos_exclusive_cpus({key: "[]"}) == frozenset()
    assert system_qos_exclusive_cpus({}) == frozenset()


def test_cpu_basic_info_from_node_info() -> None:
    info = {
        "cpus": [{"cpu_id": 0, "core_id": 0, "socket_id": 0, "numa_node": 0}],
        "model_name": "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz",
        "vendor_id": "GenuineIntel",
        "hyperthreading": True,
        "turbo": None,
        "cat_l3_cbm_mask": None,
    }
    basic = cpu_basic_info(info)
    assert basic.to_json() == (
        '{"cpuModel":"Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz","hyperThreadEnabled":true,'
        '"vendorID":"GenuineIntel"}'
    )
    assert cpus_of_node_info(info) == (TopoCPU(0, 0, 0, 0),)
    assert cpus_of_node_info({"cpus": [{"cpu_id": 0}]}) == ()
