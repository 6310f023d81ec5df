"""The CPU accumulator against the cases of Koordinator's own tests, re-implemented as data
(``pkg/scheduler/plugins/nodenumaresource/cpu_accumulator_test.go``: TestTakeFullPCPUs,
TestTakeFullPCPUsWithNUMALeastAllocated, TestCPUSpreadByPCPUs, TestTakeSpreadByPCPUs,
TestTakeSpreadByPCPUsWithNUMALeastAllocated, TestTakeCPUsWithExclusivePolicy).

Upstream's test topology numbers CPUs core by core (a core's threads are consecutive ids) and
cores across the whole machine; ``topology(sockets, numa_per_socket, cores_per_numa, threads)``
builds the same."""

from __future__ import annotations

import pytest

from apis.cpulist import parse_cpulist
from scheduler_plugins.nodeviews import CPUInfo
from scheduler_plugins.plugins.cpuaccumulator import (
    FULL_PCPUS,
    LEAST_ALLOCATED,
    MOST_ALLOCATED,
    NUMA_NODE_LEVEL,
    PCPU_LEVEL,
    SPREAD_BY_PCPUS,
    Topology,
    _Accumulator,
    take_cpus,
)


def topology(sockets: int, numa_per_socket: int, cores_per_numa: int, threads: int) -> Topology:
    cpus = []
    node = core = cpu = 0
    for s in range(sockets):
        for _ in range(numa_per_socket):
            for _ in range(cores_per_numa):
                for _ in range(threads):
                    cpus.append(CPUInfo(cpu, core, s, node))
                    cpu += 1
                core += 1
            node += 1
    return Topology.build(cpus)


def choose(
    topo: Topology,
    allocated: str,
    count: int,
    policy: str,
    strategy: str = MOST_ALLOCATED,
    **kw,
) -> frozenset[int] | None:
    taken = parse_cpulist(allocated)
    got = take_cpus(
        topo, [c for c in topo.cpus if c not in taken], count, policy, strategy=strategy, **kw
    )
    return None if got is None else frozenset(got)


FULL_PCPUS_CASES = [
    # name, topology, allocated, needed, MostAllocated result, LeastAllocated result
    ("allocate on non-NUMA node", (1, 1, 4, 2), "", 2, "0-1", "0-1"),
    ("with allocated cpus", (1, 1, 4, 2), "0-1", 2, "2-3", "2-3"),
    ("allocate whole socket", (2, 1, 4, 2), "", 8, "0-7", "0-7"),
    ("allocate across socket", (2, 1, 4, 2), "", 12, "0-11", "0-11"),
    ("whole socket with partially-allocated socket", (2, 1, 4, 2), "0-1", 8, "8-15", "8-15"),
    ("smallest or most idle socket", (2, 2, 4, 2), "0-5,16-23", 6, "24-29", "8-13"),
    (
        "most of the CPUs on the same socket",
        (2, 2, 4, 2),
        "0-5,16-23",
        12,
        "6-15,24-25",
        "6-15,24-25",
    ),
    ("from the first or second socket", (2, 2, 4, 2), "0-3,8-11", 4, "4-7", "16-19"),
    ("with less spread cpus", (2, 2, 2, 2), "0,2,4,8,12", 4, "10-11,14-15", "10-11,14-15"),
]


@pytest.mark.parametrize(
    ("shape", "allocated", "needed", "most", "least"),
    [c[1:] for c in FULL_PCPUS_CASES],
    ids=[c[0] for c in FULL_PCPUS_CASES],
)
def test_take_full_pcpus(shape, allocated, needed, most, least):
    topo = topology(*shape)
    assert choose(topo, allocated, needed, FULL_PCPUS) == parse_cpulist(most)
    assert choose(topo, allocated, needed, FULL_PCPUS, LEAST_ALLOCATED) == parse_cpulist(least)


@pytest.mark.parametrize(
    ("shape", "allocated", "needed", "strategy", "want"),
    [
        ((2, 2, 2, 2), "0,2,4,8,10,12", 6, MOST_ALLOCATED, "5-7,13-15"),
        ((2, 2, 2, 2), "0,2,4,8,9,10,12", 6, MOST_ALLOCATED, "6-7,11,13-15"),
        ((2, 2, 2, 2), "0,2,4,8,10,12", 6, LEAST_ALLOCATED, "1,3,6-7,14-15"),
        ((2, 2, 4, 2), "0,2,4,8,9,10,12", 6, LEAST_ALLOCATED, "16-21"),
    ],
    ids=[
        "the most spread cpus",
        "the most spread cpus on the smallest idle socket",
        "the less spread cpus, least allocated",
        "the most idle socket, least allocated",
    ],
)
def test_take_full_pcpus_from_scattered_free_cpus(shape, allocated, needed, strategy, want):
    assert choose(topology(*shape), allocated, needed, FULL_PCPUS, strategy) == parse_cpulist(want)


@pytest.mark.parametrize("strategy", [MOST_ALLOCATED, LEAST_ALLOCATED])
def test_spreading_takes_one_thread_of_every_core_first(strategy):
    topo = topology(2, 2, 4, 2)
    acc = _Accumulator(topo, topo.cpus, 8, "", (), (), strategy)
    assert acc.spread(acc.free_cpus(False)) == [*range(0, 32, 2), *range(1, 32, 2)]


SPREAD_CASES = [
    # name, topology, allocated, needed, MostAllocated result, LeastAllocated result
    ("allocate on non-NUMA node", (1, 1, 4, 2), "", 4, "0,2,4,6", "0,2,4,6"),
    ("the partially-allocated socket", (2, 1, 4, 2), "0,2", 4, "1,3,4,6", "8,10,12,14"),
    ("a full-free socket", (2, 1, 4, 2), "0-3", 4, "8,10,12,14", "8,10,12,14"),
    ("most of the CPUs in one socket", (2, 1, 4, 2), "0,2", 6, "1,3-7", "8-12,14"),
]


@pytest.mark.parametrize(
    ("shape", "allocated", "needed", "most", "least"),
    [c[1:] for c in SPREAD_CASES],
    ids=[c[0] for c in SPREAD_CASES],
)
def test_take_spread_by_pcpus(shape, allocated, needed, most, least):
    topo = topology(*shape)
    assert choose(topo, allocated, needed, SPREAD_BY_PCPUS) == parse_cpulist(most)
    assert choose(topo, allocated, needed, SPREAD_BY_PCPUS, LEAST_ALLOCATED) == parse_cpulist(least)


EXCLUSIVE_CASES = [
    # name, topology, exclusive CPUs held, their policy, bind policy, own policy, needed, result
    (
        "full-free socket with PCPULevel",
        (2, 1, 4, 2),
        "0,2",
        PCPU_LEVEL,
        SPREAD_BY_PCPUS,
        PCPU_LEVEL,
        4,
        "8,10,12,14",
    ),
    (
        "overlapped cpus with PCPULevel",
        (2, 1, 4, 2),
        "",
        PCPU_LEVEL,
        SPREAD_BY_PCPUS,
        PCPU_LEVEL,
        10,
        "0-4,6,8,10,12,14",
    ),
    (
        "large partially-allocated socket with PCPULevel",
        (2, 1, 8, 2),
        "0,2",
        PCPU_LEVEL,
        SPREAD_BY_PCPUS,
        PCPU_LEVEL,
        4,
        "4,6,8,10",
    ),
    ("none exclusive policy", (2, 1, 8, 2), "0,2", PCPU_LEVEL, SPREAD_BY_PCPUS, "", 4, "1,3,4,6"),
    (
        "full-free socket with NUMANodeLevel",
        (2, 1, 4, 2),
        "0,2",
        NUMA_NODE_LEVEL,
        SPREAD_BY_PCPUS,
        NUMA_NODE_LEVEL,
        4,
        "8,10,12,14",
    ),
    (
        "partially-allocated socket without NUMANodeLevel",
        (2, 1, 4, 2),
        "0,2",
        NUMA_NODE_LEVEL,
        SPREAD_BY_PCPUS,
        "",
        4,
        "1,3,4,6",
    ),
    (
        "full-free socket with NUMANodeLevel, FullPCPUs",
        (2, 1, 4, 2),
        "0,2",
        NUMA_NODE_LEVEL,
        FULL_PCPUS,
        NUMA_NODE_LEVEL,
        4,
        "8-11",
    ),
    (
        "partially-allocated socket without NUMANodeLevel, FullPCPUs",
        (2, 1, 4, 2),
        "0,2",
        NUMA_NODE_LEVEL,
        FULL_PCPUS,
        "",
        4,
        "4-7",
    ),
]


@pytest.mark.parametrize(
    ("shape", "held", "held_policy", "bind", "own", "needed", "want"),
    [c[1:] for c in EXCLUSIVE_CASES],
    ids=[c[0] for c in EXCLUSIVE_CASES],
)
def test_take_cpus_with_exclusive_policy(shape, held, held_policy, bind, own, needed, want):
    topo = topology(*shape)
    taken = parse_cpulist(held)
    cores = {topo.core_of(c) for c in taken} if held_policy == PCPU_LEVEL else set()
    numa = {topo.cpus[c].node for c in taken} if held_policy == NUMA_NODE_LEVEL else set()
    got = take_cpus(
        topo,
        [c for c in topo.cpus if c not in taken],
        needed,
        bind,
        exclusive_policy=own,
        exclusive_cores=cores,
        exclusive_numa=numa,
    )
    assert got is not None
    assert frozenset(got) == parse_cpulist(want)


def test_too_few_free_cpus_is_a_failure():
    topo = topology(1, 1, 2, 2)
    assert choose(topo, "0-2", 2, FULL_PCPUS) is None
    assert choose(topo, "", 0, SPREAD_BY_PCPUS) == frozenset()
