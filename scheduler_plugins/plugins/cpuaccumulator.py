"""Choosing logical CPUs on one node: Koordinator's CPU accumulator, re-implemented from its
semantics (``pkg/scheduler/plugins/nodenumaresource/cpu_accumulator.go``, ``takeCPUs``).

Pure functions over the node's CPU topology (``node.koordinator.sh/cpu-topology``) and the CPUs
free for this pod. *Strategy* is the NUMA allocate strategy: ``MostAllocated`` (default) tries
the NUMA nodes and sockets with the fewest free CPUs first (packing), ``LeastAllocated`` the
most; ties go to the emptier (or fuller) socket, then the lower id.

- **FullPCPUs** (or one thread per core): whole free cores of one NUMA node that can hold the
  pod (cores with the most free threads first, then by id); else of one socket; else whole
  free cores socket by socket, the socket with the most free cores first, and what is still
  missing core by core from the sockets with the fewest free cores.
- **SpreadByPCPUs**: first one NUMA node that can give one CPU per distinct core (so no two of
  the pod's CPUs share a core), then any NUMA node with enough free CPUs, spread (one thread of
  every core before a second thread of any); the same per socket; then across the node.
- **Last resort** for both: every free CPU, spread, ordered by the socket already holding the
  most of the pod's CPUs, the fullest (or emptiest) socket and NUMA node, the core with the
  fewest free threads, then ids.
- **Exclusivity** is a preference: a PCPULevel-exclusive pod first avoids cores holding CPUs of
  other PCPULevel-exclusive pods, a NUMANodeLevel one the NUMA nodes of other NUMANodeLevel pods;
  when that cannot be met, it shares (each step is tried without the exclusive CPUs first, then
  with them). The CPUs it takes become exclusive for the rest of its own choice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from apis.records import frozen
from scheduler_plugins.nodeviews import CPUInfo

FULL_PCPUS = "FullPCPUs"
SPREAD_BY_PCPUS = "SpreadByPCPUs"
PCPU_LEVEL = "PCPULevel"
NUMA_NODE_LEVEL = "NUMANodeLevel"
MOST_ALLOCATED = "MostAllocated"
LEAST_ALLOCATED = "LeastAllocated"

Core = tuple[int, int]
"""``(socket, core)``: a physical core."""


@frozen
class Topology:
    """A node's CPUs indexed for allocation."""

    cpus: dict[int, CPUInfo]
    """By logical CPU id."""
    cores: dict[Core, tuple[int, ...]]
    """``(socket, core)`` → sibling CPU ids, sorted."""
    numa_of_core: dict[Core, int]
    """``(socket, core)`` → NUMA node."""
    numa_cpus: dict[int, frozenset[int]]
    """NUMA node → its CPU ids."""
    cpus_per_core: int
    """Threads per physical core (CPUs / cores)."""
    cpus_per_node: int
    """CPUs per NUMA node."""
    cpus_per_socket: int
    """CPUs per socket."""

    @classmethod
    def build(cls, cpus: Iterable[CPUInfo]) -> Topology:
        by_id = {c.id: c for c in cpus}
        cores: dict[Core, list[int]] = {}
        numa_of_core: dict[Core, int] = {}
        numa: dict[int, set[int]] = {}
        sockets: set[int] = set()
        for c in by_id.values():
            key = (c.socket, c.core)
            cores.setdefault(key, []).append(c.id)
            numa_of_core[key] = c.node
            numa.setdefault(c.node, set()).add(c.id)
            sockets.add(c.socket)
        n = len(by_id)
        return cls(
            cpus=by_id,
            cores={k: tuple(sorted(v)) for k, v in sorted(cores.items())},
            numa_of_core=numa_of_core,
            numa_cpus={k: frozenset(v) for k, v in sorted(numa.items())},
            cpus_per_core=max(n // len(cores), 1) if cores else 1,
            cpus_per_node=n // len(numa) if numa else 0,
            cpus_per_socket=n // len(sockets) if sockets else 0,
        )

    @property
    def valid(self) -> bool:
        """Every CPU has a core and NUMA node; at least one CPU."""
        return bool(self.cpus)

    def core_of(self, cpu: int) -> Core:
        """The physical core of a logical CPU."""
        info = self.cpus[cpu]
        return (info.socket, info.core)


class _Accumulator:
    """The state of one choice (``cpuAccumulator``)."""

    def __init__(
        self,
        topo: Topology,
        available: Iterable[int],
        needed: int,
        exclusive_policy: str,
        exclusive_cores: Iterable[Core],
        exclusive_numa: Iterable[int],
        strategy: str,
    ) -> None:
        self.topo = topo
        self.free = {c for c in available if c in topo.cpus}
        self.needed = needed
        self.policy = exclusive_policy
        self.exclusive_cores = set(exclusive_cores)
        self.exclusive_numa = set(exclusive_numa)
        self.most = strategy != LEAST_ALLOCATED
        self.result: list[int] = []

    # -- bookkeeping ------------------------------------------------------------------------

    def take(self, cpus: Sequence[int]) -> None:
        for cpu in cpus:
            self.free.discard(cpu)
            self.result.append(cpu)
            if self.policy == PCPU_LEVEL:
                self.exclusive_cores.add(self.topo.core_of(cpu))
            elif self.policy == NUMA_NODE_LEVEL:
                self.exclusive_numa.add(self.topo.cpus[cpu].node)
        self.needed -= len(cpus)

    def needs(self, n: int) -> bool:
        return self.needed >= n

    def satisfied(self) -> bool:
        return self.needed < 1

    def _pcpu_taken(self, cpu: int) -> bool:
        return self.policy == PCPU_LEVEL and self.topo.core_of(cpu) in self.exclusive_cores

    def _numa_taken(self, cpu: int) -> bool:
        return self.policy == NUMA_NODE_LEVEL and self.topo.cpus[cpu].node in self.exclusive_numa

    def _order(self, count: int) -> int:
        """Sort key of a free count: fewest first when packing (MostAllocated)."""
        return count if self.most else -count

    # -- candidate lists --------------------------------------------------------------------

    def _cores(self, cpus: Iterable[int]) -> dict[Core, list[int]]:
        out: dict[Core, list[int]] = {}
        for cpu in cpus:
            out.setdefault(self.topo.core_of(cpu), []).append(cpu)
        for v in out.values():
            v.sort()
        return out

    def _by_core(self, cores: dict[Core, list[int]], keys: list[Core]) -> list[int]:
        """CPUs of ``keys``, the cores with the most free threads first, then by id."""
        keys.sort(key=lambda k: (-len(cores[k]), k))
        return [cpu for k in keys for cpu in cores[k]]

    def free_cores_in_node(self, filter_exclusive: bool) -> list[list[int]]:
        """CPUs of the wholly free cores per NUMA node, nodes in strategy order."""
        cpus = [c for c in self.free if not (filter_exclusive and self._numa_taken(c))]
        socket_free: dict[int, int] = {}
        for c in cpus:
            s = self.topo.cpus[c].socket
            socket_free[s] = socket_free.get(s, 0) + 1
        cores = self._cores(cpus)
        per_node: dict[int, list[Core]] = {}
        for key, sib in cores.items():
            if len(sib) == self.topo.cpus_per_core:
                per_node.setdefault(self.topo.numa_of_core[key], []).append(key)
        lists = {n: self._by_core(cores, keys) for n, keys in per_node.items()}

        def rank(n: int) -> tuple[int, int, int]:
            socket = self.topo.cpus[lists[n][0]].socket
            return (self._order(len(lists[n])), self._order(socket_free[socket]), n)

        return [lists[n] for n in sorted(lists, key=rank)]

    def free_cores_in_socket(self) -> list[list[int]]:
        """CPUs of the wholly free cores per socket, sockets in strategy order."""
        cores = self._cores(self.free)
        per_socket: dict[int, list[Core]] = {}
        for key, sib in cores.items():
            if len(sib) == self.topo.cpus_per_core:
                per_socket.setdefault(key[0], []).append(key)
        lists = {s: self._by_core(cores, keys) for s, keys in per_socket.items()}
        return [lists[s] for s in sorted(lists, key=lambda s: (self._order(len(lists[s])), s))]

    def _one_per_core(self, cpus: list[int]) -> list[int]:
        seen: set[Core] = set()
        out = []
        for c in cpus:
            core = self.topo.core_of(c)
            if core not in seen:
                seen.add(core)
                out.append(c)
        return out

    def free_cpus_in_node(self, filter_exclusive: bool) -> list[list[int]]:
        """Free CPUs per NUMA node (with ``filter_exclusive``: not exclusive-taken, one per
        core), nodes in strategy order by their free CPUs, then their socket's."""
        per_node: dict[int, list[int]] = {}
        socket_free: dict[int, int] = {}
        for c in self.free:
            if filter_exclusive and (self._pcpu_taken(c) or self._numa_taken(c)):
                continue
            info = self.topo.cpus[c]
            per_node.setdefault(info.node, []).append(c)
            socket_free[info.socket] = socket_free.get(info.socket, 0) + 1
        node_free = {n: len(v) for n, v in per_node.items()}
        lists = {}
        for n, v in per_node.items():
            v.sort()
            lists[n] = self._one_per_core(v) if filter_exclusive else v

        def rank(n: int) -> tuple[int, int, int]:
            socket = self.topo.cpus[lists[n][0]].socket
            return (self._order(node_free[n]), self._order(socket_free[socket]), n)

        return [lists[n] for n in sorted(lists, key=rank)]

    def free_cpus_in_socket(self, filter_exclusive: bool) -> list[list[int]]:
        """Free CPUs per socket (with ``filter_exclusive``: not on PCPU-exclusive cores, one
        per core), sockets in strategy order."""
        per_socket: dict[int, list[int]] = {}
        for c in self.free:
            if filter_exclusive and self._pcpu_taken(c):
                continue
            per_socket.setdefault(self.topo.cpus[c].socket, []).append(c)
        lists = {}
        for s, v in per_socket.items():
            v.sort()
            lists[s] = self._one_per_core(v) if filter_exclusive else v
        return [lists[s] for s in sorted(lists, key=lambda s: (self._order(len(lists[s])), s))]

    def free_cpus(self, filter_exclusive: bool) -> list[int]:
        """Every free CPU, core by core: the socket holding most of the result first, then
        the fullest (or emptiest) socket and NUMA node, the core with the fewest free threads,
        then socket and core id."""
        topo = self.topo
        cpus = [
            c
            for c in self.free
            if not (filter_exclusive and (self._pcpu_taken(c) or self._numa_taken(c)))
        ]
        cores = self._cores(cpus)
        node_free: dict[int, int] = {}
        socket_free: dict[int, int] = {}
        for c in cpus:
            info = topo.cpus[c]
            node_free[info.node] = node_free.get(info.node, 0) + 1
            socket_free[info.socket] = socket_free.get(info.socket, 0) + 1
        colocated: dict[int, int] = {}
        for c in self.result:
            s = topo.cpus[c].socket
            colocated[s] = colocated.get(s, 0) + 1

        def rank(k: Core) -> tuple[int, int, int, int, int, Core]:
            socket = k[0]
            return (
                -colocated.get(socket, 0),
                self._order(socket_free[socket]),
                self._order(node_free[topo.numa_of_core[k]]),
                len(cores[k]),
                socket,
                k,
            )

        return [cpu for k in sorted(cores, key=rank) for cpu in cores[k]]

    def spread(self, cpus: list[int]) -> list[int]:
        """One thread of every core (in order) before a second of any (``spreadCPUs``)."""
        if len(cpus) <= self.topo.cpus_per_core:
            return cpus
        out: list[int] = []
        left = cpus
        while left:
            seen: set[Core] = set()
            later = []
            for c in left:
                core = self.topo.core_of(c)
                if core in seen:
                    later.append(c)
                else:
                    seen.add(core)
                    out.append(c)
            left = later
        return out

    # -- the choice -------------------------------------------------------------------------

    def _first_fit(self, lists: Iterable[list[int]], spread: bool = False) -> bool:
        for cpus in lists:
            if len(cpus) >= self.needed:
                chosen = self.spread(cpus) if spread else cpus
                self.take(chosen[: self.needed])
                return True
        return False

    def _full_pcpus(self) -> bool:
        topo = self.topo
        if self.needed <= topo.cpus_per_node:
            for filter_exclusive in (True, False):
                if self._first_fit(self.free_cores_in_node(filter_exclusive)):
                    return True
        if self.needed <= topo.cpus_per_socket and self._first_fit(self.free_cores_in_socket()):
            return True
        # across sockets: whole free cores from the sockets with the most of them
        unsatisfied = []
        for cpus in sorted(self.free_cores_in_socket(), key=len, reverse=True):
            if not self.needs(len(cpus)):
                unsatisfied.append(cpus)
                continue
            self.take(cpus)
            if self.satisfied():
                return True
        cpc = topo.cpus_per_core
        if self.needs(cpc):
            for cpus in sorted(unsatisfied, key=len):
                for i in range(0, len(cpus), cpc):
                    self.take(cpus[i : i + cpc])
                    if self.satisfied():
                        return True
                    if not self.needs(cpc):
                        break
        return False

    def _spread_by_pcpus(self) -> bool:
        topo = self.topo
        if self.needed <= topo.cpus_per_node:
            for filter_exclusive in (True, False):
                if self._first_fit(self.free_cpus_in_node(filter_exclusive), spread=True):
                    return True
        if self.needed <= topo.cpus_per_socket:
            for filter_exclusive in (True, False):
                if self._first_fit(self.free_cpus_in_socket(filter_exclusive), spread=True):
                    return True
        return False

    def run(self, policy: str) -> list[int] | None:
        if self.satisfied():
            return self.result
        if self.needed > len(self.free):
            return None
        full = policy == FULL_PCPUS
        if (full or self.topo.cpus_per_core == 1) and self._full_pcpus():
            return self.result
        if not full and self._spread_by_pcpus():
            return self.result
        for filter_exclusive in (True, False):
            for cpu in self.spread(self.free_cpus(filter_exclusive)):
                if self.needs(1):
                    self.take([cpu])
                if self.satisfied():
                    return self.result
        return None


def take_cpus(
    topo: Topology,
    available: Iterable[int],
    count: int,
    policy: str,
    *,
    exclusive_policy: str = "",
    exclusive_cores: Iterable[Core] = (),
    exclusive_numa: Iterable[int] = (),
    strategy: str = MOST_ALLOCATED,
) -> list[int] | None:
    """``count`` CPUs of ``available`` by ``policy`` (FullPCPUs or SpreadByPCPUs), or ``None``
    when they do not suffice. ``exclusive_policy`` is the pod's
    ``preferredCPUExclusivePolicy``; ``exclusive_cores`` and ``exclusive_numa`` are the cores and
    NUMA nodes other exclusive pods hold; ``strategy`` the NUMA allocate strategy."""
    acc = _Accumulator(
        topo, available, count, exclusive_policy, exclusive_cores, exclusive_numa, strategy
    )
    return acc.run(policy)
