"""The CPU picker of the ``cpuset`` suppress policy: which CPUs best-effort pods may run on.

Koordinator's ``calculateBESuppressCPUSetPolicy`` (``qosmanager/plugins/cpusuppress``), re-done
from its documented behaviour:

1. CPUs are put in buckets, one per (NUMA node, socket); inside a bucket they are ordered by
   core id, then CPU id, so hyper-thread siblings sit next to each other.
2. Buckets are ordered biggest first; equal sizes by their first CPU id.
3. While at least two CPUs are still wanted, the buckets are visited round robin and each visit
   takes the first free *pair* of siblings (two neighbours of one core); a full round that takes
   nothing ends this phase. BE work is so spread over the NUMA nodes and packed on whole cores.
4. Single CPUs are then taken round robin, starting at the bucket where phase 3 stopped, until
   enough are taken or a full round takes nothing.
5. Upstream quirk, kept: when fewer CPUs are available than wanted, nothing is picked (the
   caller then leaves the cpusets alone).

:func:`be_cpuset_count` is the size rule around it (at least 2 CPUs, growth per round limited
to 10 % of the node's CPUs), and :func:`split_lsr_ls` the proportional split between the CPUs of
LSR pods and the shared pool.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from apis.records import frozen
from koordlet.statesinformer.nodetopo import cpus_of_node_info

BE_MIN_CPUSET_CPUS = 2
"""Koordinator's ``beMinCPUSetCores``: the cpuset policy never leaves BE fewer CPUs."""
BE_MAX_INCREASE_RATIO = 0.1
"""Koordinator's ``beMaxIncreaseCPUPercent``: a round grows the BE cpuset (or quota) by at most
this fraction of the node's CPUs (scale up slowly)."""


@frozen
class Processor:
    """One logical CPU as the picker sees it."""

    cpu_id: int
    """Logical CPU number."""
    core_id: int
    """Core id; hyper-thread siblings share it."""
    socket_id: int
    """Physical package."""
    numa_node: int
    """NUMA node (-1 when unknown)."""


def processors_from_node_info(info: object) -> tuple[Processor, ...]:
    """The processors of the ``node_info`` value the nodeinfo collector stores, by CPU id; ()
    when absent or malformed (read by the states informer's :func:`cpus_of_node_info`)."""
    return tuple(Processor(*cpu) for cpu in cpus_of_node_info(info))


def be_cpuset_count(suppress_milli: int, old_count: int, total_cpus: int) -> int:
    """How many CPUs the BE cpuset gets this round.

    ``ceil(suppress_milli / 1000)``, at least :data:`BE_MIN_CPUSET_CPUS`, and at most
    ``old_count + ceil(total_cpus * 0.1)`` (growth per round is limited; shrinking is not).
    """
    cpus = max(math.ceil(suppress_milli / 1000), BE_MIN_CPUSET_CPUS)
    max_increase = math.ceil(total_cpus * BE_MAX_INCREASE_RATIO)
    if cpus - old_count > max_increase:
        cpus = old_count + max_increase
    return cpus


def split_lsr_ls(count: int, lsr_cpus: int, ls_cpus: int) -> tuple[int, int]:
    """``(from LSR CPUs, from the shared pool)``: LSR CPUs contribute in proportion to their
    number, rounded down (integer arithmetic, as upstream)."""
    if lsr_cpus + ls_cpus <= 0:
        return 0, count
    from_lsr = count * lsr_cpus // (lsr_cpus + ls_cpus)
    return from_lsr, count - from_lsr


def pick_cpus(count: int, processors: Sequence[Processor]) -> list[int]:
    """``count`` CPU ids out of ``processors`` by the rule in the module docstring, in pick
    order; [] when fewer than ``count`` are available."""
    if count <= 0 or len(processors) < count:
        return []
    buckets_of: dict[tuple[int, int], list[Processor]] = {}
    for p in processors:
        buckets_of.setdefault((p.numa_node, p.socket_id), []).append(p)
    buckets = [sorted(b, key=lambda p: (p.core_id, p.cpu_id)) for b in buckets_of.values()]
    buckets.sort(key=lambda b: (-len(b), b[0].cpu_id))

    picked: list[int] = []
    used: set[int] = set()
    need = count
    n = len(buckets)

    # Phase 1: whole cores (pairs of siblings), one per bucket per visit.
    i = 0
    before_round = -1
    while need > 1:
        if i == 0:
            if before_round == need:
                break
            before_round = need
        bucket = buckets[i]
        for j in range(len(bucket) - 1):
            if bucket[j].cpu_id in used:
                continue
            if bucket[j].core_id == bucket[j + 1].core_id:
                pair = (bucket[j].cpu_id, bucket[j + 1].cpu_id)
                picked.extend(pair)
                used.update(pair)
                need -= 2
                break
        i = (i + 1) % n

    # Phase 2: single CPUs, from where phase 1 stopped.
    start = i
    before_round = -1
    while need > 0:
        if i == start:
            if before_round == need:
                break
            before_round = need
        for p in buckets[i]:
            if p.cpu_id not in used:
                picked.append(p.cpu_id)
                used.add(p.cpu_id)
                need -= 1
                break
        i = (i + 1) % n
    return picked


def pick_be_cpus(
    count: int,
    processors: Iterable[Processor],
    *,
    lsr_cpus: frozenset[int] = frozenset(),
    excluded: frozenset[int] = frozenset(),
) -> list[int]:
    """The BE cpuset of ``count`` CPUs, sorted: ``excluded`` CPUs (LSE pods', reserved) are
    never picked, LSR pods' CPUs contribute their proportional share, the rest comes from the
    shared pool."""
    lsr: list[Processor] = []
    ls: list[Processor] = []
    for p in processors:
        if p.cpu_id in excluded:
            continue
        (lsr if p.cpu_id in lsr_cpus else ls).append(p)
    from_lsr, from_ls = split_lsr_ls(count, len(lsr), len(ls))
    cpus: list[int] = []
    if from_lsr > 0:
        cpus.extend(pick_cpus(from_lsr, lsr))
    if from_ls > 0:
        cpus.extend(pick_cpus(from_ls, ls))
    return sorted(cpus)
