"""Choosing logical CPUs on one node: FullPCPUs and SpreadByPCPUs, with exclusivity.

Pure functions over the node's CPU topology (``node.koordinator.sh/cpu-topology``) and the set
of CPUs that are free for this pod. Re-implements the intent of Koordinator's
``cpuAccumulator``:

- **FullPCPUs** packs the pod into whole physical cores: free cores (every sibling free) first,
  in the order of the NUMA nodes given, then the cores by id; a remainder smaller than a core
  takes the free CPUs of the most used cores first (so whole cores stay whole).
- **SpreadByPCPUs** spreads the pod across physical cores: on each NUMA node in turn, one CPU
  per core, the emptiest cores first, before taking a second sibling of any core.
- **PCPULevel** exclusivity: cores that hold CPUs of another PCPULevel-exclusive pod are not
  used, and with SpreadByPCPUs no core gives this pod more than one CPU.

The NUMA nodes come in preference order; the caller (NodeNUMAResource) has already applied the
NUMA topology policy and NUMANodeLevel exclusivity.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduler_plugins.snapshot import CPUInfo

FULL_PCPUS = "FullPCPUs"
SPREAD_BY_PCPUS = "SpreadByPCPUs"


@dataclass(frozen=True, slots=True)
class Topology:
    """A node's CPUs indexed for allocation."""

    cpus: dict[int, CPUInfo]
    """By logical CPU id."""
    cores: dict[tuple[int, int], tuple[int, ...]]
    """``(socket, core)`` → sibling CPU ids, sorted."""
    numa_of_core: dict[tuple[int, int], int]
    """``(socket, core)`` → NUMA node."""
    numa_cpus: dict[int, frozenset[int]]
    """NUMA node → its CPU ids."""
    cpus_per_core: int
    """Threads per physical core (the largest sibling group)."""

    @classmethod
    def build(cls, cpus: Iterable[CPUInfo]) -> Topology:
        by_id = {c.id: c for c in cpus}
        cores: dict[tuple[int, int], list[int]] = {}
        numa_of_core: dict[tuple[int, int], int] = {}
        numa: dict[int, set[int]] = {}
        for c in by_id.values():
            key = (c.socket, c.core)
            cores.setdefault(key, []).append(c.id)
            numa_of_core[key] = c.node
            numa.setdefault(c.node, set()).add(c.id)
        return cls(
            cpus=by_id,
            cores={k: tuple(sorted(v)) for k, v in sorted(cores.items())},
            numa_of_core=numa_of_core,
            numa_cpus={k: frozenset(v) for k, v in sorted(numa.items())},
            cpus_per_core=max((len(v) for v in cores.values()), default=1),
        )

    @property
    def valid(self) -> bool:
        """Every CPU has a core and NUMA node; at least one CPU."""
        return bool(self.cpus)


def take_cpus(
    topo: Topology,
    free: frozenset[int],
    numa_order: Sequence[int],
    count: int,
    policy: str,
    *,
    exclusive_cores: frozenset[tuple[int, int]] = frozenset(),
    pcpu_exclusive: bool = False,
) -> list[int] | None:
    """``count`` CPUs from ``free`` on the NUMA nodes of ``numa_order``, or ``None`` when they do
    not suffice. ``exclusive_cores`` are cores a PCPULevel-exclusive pod holds."""
    rank = {n: i for i, n in enumerate(numa_order)}
    cores: list[tuple[tuple[int, int], list[int], int]] = []
    for key, siblings in topo.cores.items():
        numa = topo.numa_of_core[key]
        if numa not in rank:
            continue
        if pcpu_exclusive and key in exclusive_cores:
            continue
        avail = [c for c in siblings if c in free]
        if avail:
            cores.append((key, avail, len(siblings)))
    chosen: list[int] = []
    if policy == SPREAD_BY_PCPUS:
        # NUMA node by NUMA node in preference order; within one, the emptiest cores first and
        # one thread of every core before a second thread of any
        cores.sort(key=lambda t: (rank[topo.numa_of_core[t[0]]], t[2] - len(t[1]), t[0]))
        rounds = 1 if pcpu_exclusive else topo.cpus_per_core
        for numa in numa_order:
            group = [avail for key, avail, _ in cores if topo.numa_of_core[key] == numa]
            for r in range(rounds):
                for avail in group:
                    if len(chosen) == count:
                        return chosen
                    if r < len(avail):
                        chosen.append(avail[r])
        return chosen if len(chosen) == count else None
    # FullPCPUs: whole free cores first, in NUMA preference order
    cores.sort(key=lambda t: (rank[topo.numa_of_core[t[0]]], t[0]))
    whole = [avail for _, avail, size in cores if len(avail) == size]
    partial = [avail for _, avail, size in cores if len(avail) < size]
    for avail in whole:
        if count - len(chosen) < len(avail):
            break
        chosen.extend(avail)
    if len(chosen) == count:
        return chosen
    taken = set(chosen)
    # the remainder: from the most used cores first, then what is left of whole cores
    rest = sorted(partial, key=len) + [a for a in whole if a[0] not in taken]
    for avail in rest:
        for cpu in avail:
            if len(chosen) == count:
                return chosen
            chosen.append(cpu)
    return chosen if len(chosen) == count else None
