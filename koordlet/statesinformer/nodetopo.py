"""What the node's topology report derives from the Node's annotations: reserved CPUs, the
SYSTEM QoS CPUs and the CPU basic info (Koordinator's ``statesinformer/impl`` node topology
informer, ``calcNodeTopo``).

The topology reporter publishes these on the NodeResourceTopology (``koordlet.reporter.topology``)
and CPU suppress keeps BE off the same CPUs (``koordlet.qos.cpusuppress``); both call the
functions here, so the CPUs the report names are the CPUs BE leaves alone.

- :func:`reserved_cpus`: the Node's ``node.koordinator.sh/reservation``: its ``reservedCPUs``, or
  ``ceil(resources.cpu)`` CPUs picked by :func:`take_by_topology` (upstream's ``getNodeReserved``
  with ``kubelet.TakeByTopology``);
- :func:`system_qos_exclusive_cpus`: the CPUs of ``node.koordinator.sh/system-qos-resource`` when
  exclusive (the default);
- :func:`cpu_basic_info`: the CPU model, hyper-threading, turbo, vendor and L3 CAT mask from the
  nodeinfo collector's ``node_info``.

A malformed annotation reserves nothing and is logged once per distinct value (upstream logs and
ignores it as well).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from apis.nodetopo import (
    ANNOTATION_NODE_RESERVATION,
    ANNOTATION_NODE_SYSTEM_QOS_RESOURCE,
    CPUBasicInfo,
    SystemQOSResource,
    parse_node_reservation,
    parse_system_qos_resource,
)

logger = logging.getLogger(__name__)

_reported: set[tuple[str, str]] = set()


class TopoCPU(NamedTuple):
    """One logical CPU of the ``node_info`` value."""

    cpu_id: int
    core_id: int
    """Unique on the node (the nodeinfo collector numbers cores per socket and siblings)."""
    socket_id: int
    numa_node: int


def cpus_of_node_info(info: object) -> tuple[TopoCPU, ...]:
    """The CPUs of the nodeinfo collector's ``node_info`` value; () when absent or malformed."""
    if info is None or not isinstance(info, Mapping):  # None first: no ABC check every round
        return ()
    out = []
    for cpu in info.get("cpus") or ():
        try:
            out.append(
                TopoCPU(
                    int(cpu["cpu_id"]),
                    int(cpu["core_id"]),
                    int(cpu["socket_id"]),
                    int(cpu["numa_node"]),
                )
            )
        except (KeyError, TypeError, ValueError):
            return ()
    return tuple(sorted(out))


def _warn_once(key: str, raw: str, err: ValueError) -> None:
    if (key, raw) not in _reported:
        _reported.add((key, raw))
        logger.warning("node annotation %s ignored: %s", key, err)


# Picking CPUs by topology -------------------------------------------------------------------------


class _Accumulator:
    """Kubelet's ``cpuAccumulator`` with the sockets-first order Koordinator uses
    (``pkg/koordlet/util/kubelet/cpu_assignment.go``, ``takeByTopologyNUMAPacked``)."""

    def __init__(self, topo: Sequence[TopoCPU], available: Iterable[int], need: int) -> None:
        self.topo = {c.cpu_id: c for c in topo}
        self.free = {c for c in available if c in self.topo}
        self.need = need
        self.result: set[int] = set()
        sockets = {c.socket_id for c in topo}
        cores = {c.core_id for c in topo}
        self.per_socket = len(topo) // max(len(sockets), 1)
        self.per_core = len(topo) // max(len(cores), 1)

    def _all(self, attr: str, value: int) -> set[int]:
        return {c.cpu_id for c in self.topo.values() if getattr(c, attr) == value}

    def _avail(self, attr: str, value: int) -> set[int]:
        return {c for c in self.free if getattr(self.topo[c], attr) == value}

    def _sorted(self, attr: str, ids: Iterable[int]) -> list[int]:
        """By available CPUs ascending, then id (``cpuAccumulator.sort``)."""
        return sorted(ids, key=lambda i: (len(self._avail(attr, i)), i))

    def sockets(self) -> list[int]:
        return self._sorted("socket_id", {self.topo[c].socket_id for c in self.free})

    def numas(self) -> list[int]:
        out: list[int] = []
        for socket in self.sockets():
            numas = {self.topo[c].numa_node for c in self._avail("socket_id", socket)}
            out.extend(n for n in self._sorted("numa_node", numas) if n not in out)
        return out

    def cores(self) -> list[int]:
        out: list[int] = []
        for numa in self.numas():
            cores = {self.topo[c].core_id for c in self._avail("numa_node", numa)}
            out.extend(c for c in self._sorted("core_id", cores) if c not in out)
        return out

    def take(self, cpus: set[int]) -> None:
        self.result |= cpus
        self.free -= cpus
        self.need -= len(cpus)

    def take_full(self, attr: str, ids: list[int], is_free: Any) -> None:
        for i in ids:
            if not is_free(i):
                continue
            cpus = self._all(attr, i)
            if self.need >= len(cpus):
                self.take(cpus)

    def run(self) -> frozenset[int]:
        if self.need < 1:
            return frozenset()
        if self.need > len(self.free):
            return frozenset()  # "not enough cpus available to satisfy request"
        self.take_full(
            "socket_id",
            self.sockets(),
            lambda s: len(self._avail("socket_id", s)) == self.per_socket,
        )
        if self.need > 0:
            self.take_full(
                "numa_node",
                self.numas(),
                lambda n: len(self._avail("numa_node", n)) == len(self._all("numa_node", n)),
            )
        if self.need > 0:
            self.take_full(
                "core_id",
                self.cores(),
                lambda c: len(self._avail("core_id", c)) == self.per_core,
            )
        if self.need > 0:
            for core in self.cores():
                for cpu in sorted(self._avail("core_id", core)):
                    self.take({cpu})
                    if self.need < 1:
                        return frozenset(self.result)
        return frozenset(self.result) if self.need < 1 else frozenset()


def take_by_topology(
    topo: Sequence[TopoCPU], available: Iterable[int], count: int
) -> frozenset[int]:
    """``count`` CPUs out of ``available`` the way Koordinator's ``kubelet.TakeByTopology`` takes
    them: whole sockets, then whole NUMA nodes, then whole cores while that many are still needed,
    then single CPUs; each level visited from the one with the fewest available CPUs (ties by id).
    Empty when fewer than ``count`` are available."""
    return _Accumulator(topo, available, count).run()


# The annotations ---------------------------------------------------------------------------------


def reserved_cpus(annotations: Mapping[str, str] | None, topo: Sequence[TopoCPU]) -> frozenset[int]:
    """The CPUs the Node's ``node.koordinator.sh/reservation`` reserves (``getNodeReserved``):
    its ``reservedCPUs``, else ``ceil(resources.cpu)`` CPUs by :func:`take_by_topology`; empty
    when absent, malformed or without CPUs."""
    raw = (annotations or {}).get(ANNOTATION_NODE_RESERVATION)
    if not raw:  # absent or empty: no reservation (the common case, every round)
        return frozenset()
    try:
        listed, count = parse_node_reservation(raw).reserved_cpus_and_count()
    except ValueError as err:
        _warn_once(ANNOTATION_NODE_RESERVATION, raw or "", err)
        return frozenset()
    if listed:
        return listed
    if count and topo:
        return take_by_topology(topo, (c.cpu_id for c in topo), count)
    return frozenset()


_NO_SYSTEM_QOS = SystemQOSResource()


def system_qos_resource(annotations: Mapping[str, str] | None) -> SystemQOSResource:
    """The Node's ``node.koordinator.sh/system-qos-resource``; empty when absent or malformed."""
    raw = (annotations or {}).get(ANNOTATION_NODE_SYSTEM_QOS_RESOURCE)
    if not raw:  # absent or empty: none (the common case, every round)
        return _NO_SYSTEM_QOS
    try:
        return parse_system_qos_resource(raw)
    except ValueError as err:
        _warn_once(ANNOTATION_NODE_SYSTEM_QOS_RESOURCE, raw or "", err)
        return SystemQOSResource()


def system_qos_exclusive_cpus(annotations: Mapping[str, str] | None) -> frozenset[int]:
    """The SYSTEM QoS CPUs no other pod may use (``getSystemQOSExclusiveCPU``)."""
    return system_qos_resource(annotations).exclusive_cpus


def node_annotations(node: Mapping[str, Any] | None) -> Mapping[str, str]:
    """``metadata.annotations`` of a Node object; empty without one."""
    if node is None:  # standalone, or not fetched yet: every round, no ABC check
        return {}
    meta = node.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def cpu_basic_info(info: Mapping[str, Any]) -> CPUBasicInfo:
    """The node's ``CPUBasicInfo`` from the ``node_info`` value: ``model_name``,
    ``hyperthreading``, ``turbo`` (unknown counts as off, as upstream reads a missing
    ``no_turbo``), ``vendor_id`` and ``cat_l3_cbm_mask``."""
    return CPUBasicInfo(
        cpu_model=str(info.get("model_name") or ""),
        hyper_thread_enabled=bool(info.get("hyperthreading")),
        turbo_enabled=info.get("turbo") is True,
        cat_l3_cbm_mask=str(info.get("cat_l3_cbm_mask") or ""),
        vendor_id=str(info.get("vendor_id") or ""),
    )
