"""CPU topology and NUMA layout from sysfs (no ``lscpu``): what the koordlet reports as node
CPU info and uses for CPU-set decisions.

Sources, all under :class:`~koordlet.system.paths.HostPaths` roots:

- ``/sys/devices/system/cpu/online``: the online CPUs (a cpulist such as ``0-3,8-11``);
- ``cpu<N>/topology/physical_package_id`` and ``thread_siblings_list``: socket and core;
- ``/sys/devices/system/node/node<N>/cpulist`` and ``meminfo``: NUMA nodes, their CPUs and RAM;
- ``/proc/cpuinfo``: the model name and the vendor;
- ``cpu/intel_pstate/no_turbo`` or ``cpu/cpufreq/boost``: whether turbo is on;
- ``/sys/fs/resctrl/info/L3/cbm_mask``: the L3 CAT capacity bit mask, where resctrl is mounted.

Core ids are logical, like ``lscpu``'s ``CORE`` column that Koordinator reads: CPUs that share
a ``thread_siblings_list`` share a core id, numbered 0.. in order of their lowest CPU. Socket ids
are the kernel's ``physical_package_id``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from apis.cpulist import parse_cpulist
from apis.records import frozen
from koordlet.errors import CgroupGoneError, HostError, ParseError
from koordlet.system.cgroupstats import read_file_bytes
from koordlet.system.paths import HostPaths
from koordlet.system.procfs import numa_node_ids, read_host_file, read_meminfo, read_numa_meminfo

logger = logging.getLogger(__name__)


def read_cpulist(text: str | bytes, path: str) -> tuple[int, ...]:
    """CPU ids of the kernel cpulist file ``path`` holding ``text``, ascending
    (:func:`apis.cpulist.parse_cpulist`); :class:`ParseError` naming the file when malformed."""
    try:
        return tuple(sorted(parse_cpulist(text)))
    except ValueError as err:
        raise ParseError(f"{path}: {err}") from None


@frozen
class CpuInfo:
    """Where one logical CPU sits."""

    cpu_id: int
    """Logical CPU number (``cpu<N>``)."""
    core_id: int
    """Logical core id, unique on the node; hyperthread siblings share it."""
    socket_id: int
    """Physical package (``physical_package_id``)."""
    numa_node: int
    """NUMA node holding the CPU; -1 when no node lists it."""


@frozen
class NodeCpuTopology:
    """The host's online CPUs, their cores, sockets and NUMA nodes."""

    cpus: tuple[CpuInfo, ...]
    """Online CPUs by ascending id."""
    hyperthreading: bool
    """True when some core runs more than one online thread."""
    model_name: str | None
    """``model name`` of ``/proc/cpuinfo``; None where the architecture prints none."""
    turbo: bool | None
    """Turbo/boost enabled; None when neither ``intel_pstate/no_turbo`` nor ``cpufreq/boost``
    exists (unknown, not false)."""
    numa_nodes: Mapping[int, tuple[int, ...]]
    """Online CPUs of each NUMA node; one node 0 with every CPU on a kernel without NUMA."""
    numa_memory_total: Mapping[int, int]
    """RAM of each NUMA node in bytes (``MemTotal`` of ``/proc/meminfo`` for node 0 on a kernel
    without NUMA)."""
    vendor_id: str | None = None
    """``vendor_id`` of ``/proc/cpuinfo`` (``GenuineIntel``, ``AuthenticAMD``); None where the
    architecture prints none."""
    cat_l3_cbm_mask: str | None = None
    """``/sys/fs/resctrl/info/L3/cbm_mask`` (hex, ``fff``); None without resctrl L3 CAT."""

    @property
    def cpu_ids(self) -> tuple[int, ...]:
        """Online CPU ids, ascending."""
        return tuple(cpu.cpu_id for cpu in self.cpus)

    @property
    def core_count(self) -> int:
        """Physical cores with at least one online CPU."""
        return len({cpu.core_id for cpu in self.cpus})

    @property
    def socket_count(self) -> int:
        """Sockets with at least one online CPU."""
        return len({cpu.socket_id for cpu in self.cpus})


def _read_int(path: str) -> int:
    data = read_host_file(path)
    try:
        return int(data)
    except ValueError:
        raise ParseError(f"{path}: not an integer: {data[:64]!r}") from None


def _read_optional_flag(path: str) -> bool | None:
    """A ``0``/``1`` sysfs flag; None when the file does not exist."""
    try:
        data = read_file_bytes(path)
    except CgroupGoneError:  # read_file_bytes' word for ENOENT
        return None
    value = data.strip()
    if value not in (b"0", b"1"):
        raise ParseError(f"{path}: expected 0 or 1, got {data[:64]!r}")
    return value == b"1"


def read_turbo(paths: HostPaths) -> bool | None:
    """Whether turbo is on: ``intel_pstate/no_turbo`` (inverted) first, then ``cpufreq/boost``;
    None when the host exposes neither."""
    cpu_root = paths.sys("devices", "system", "cpu")
    no_turbo = _read_optional_flag(f"{cpu_root}/intel_pstate/no_turbo")
    if no_turbo is not None:
        return not no_turbo
    return _read_optional_flag(f"{cpu_root}/cpufreq/boost")


def read_model_name(paths: HostPaths) -> str | None:
    """The first ``model name`` of ``/proc/cpuinfo``; None when the architecture prints none."""
    return read_cpuinfo_field(paths, b"model name")


def read_vendor_id(paths: HostPaths) -> str | None:
    """The first ``vendor_id`` of ``/proc/cpuinfo``; None when the architecture prints none."""
    return read_cpuinfo_field(paths, b"vendor_id")


def read_cat_l3_cbm_mask(paths: HostPaths) -> str | None:
    """The L3 CAT capacity bit mask of a mounted resctrl (``info/L3/cbm_mask``); None without."""
    path = paths.sys("fs", "resctrl", "info", "L3", "cbm_mask")
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read().strip() or None
    except OSError:
        return None


def read_cpuinfo_field(paths: HostPaths, name: bytes) -> str | None:
    """The first value of field ``name`` in ``/proc/cpuinfo``; None when no record has it."""
    path = paths.proc("cpuinfo")
    try:
        # cpuinfo is a multi-record seq file: a short read is not its end, so read to EOF.
        with open(path, "rb") as file:
            data = file.read()
    except OSError as err:
        raise HostError(f"{path}: {err.strerror}") from err
    for line in data.splitlines():
        key, sep, value = line.partition(b":")
        if sep and key.strip() == name:
            return value.strip().decode(errors="replace")
    return None


def _numa_layout(
    paths: HostPaths, online: tuple[int, ...]
) -> tuple[dict[int, tuple[int, ...]], dict[int, int]]:
    nodes = numa_node_ids(paths)
    if not nodes:
        logger.info("no NUMA nodes in sysfs: treating the host as one node 0")
        return {0: online}, {0: read_meminfo(paths).mem_total}
    online_set = set(online)
    cpus_of: dict[int, tuple[int, ...]] = {}
    for node in nodes:
        path = paths.sys("devices", "system", "node", f"node{node}", "cpulist")
        listed = read_cpulist(read_host_file(path), path)
        cpus_of[node] = tuple(cpu for cpu in listed if cpu in online_set)
    memory = {node: info.mem_total for node, info in read_numa_meminfo(paths).items()}
    return cpus_of, memory


def read_cpu_topology(paths: HostPaths) -> NodeCpuTopology:
    """The host's CPU topology from sysfs; see the module docstring for the sources."""
    cpu_root = paths.sys("devices", "system", "cpu")
    online_path = f"{cpu_root}/online"
    online = read_cpulist(read_host_file(online_path), online_path)
    if not online:
        raise ParseError(f"{online_path}: no online CPU")

    numa_nodes, numa_memory = _numa_layout(paths, online)
    node_of = {cpu: node for node, cpus in numa_nodes.items() for cpu in cpus}

    core_ids: dict[tuple[int, tuple[int, ...]], int] = {}
    cpus: list[CpuInfo] = []
    hyperthreading = False
    for cpu in online:
        topo = f"{cpu_root}/cpu{cpu}/topology"
        socket = _read_int(f"{topo}/physical_package_id")
        siblings_path = f"{topo}/thread_siblings_list"
        siblings = read_cpulist(read_host_file(siblings_path), siblings_path)
        if cpu not in siblings:
            raise ParseError(f"{siblings_path}: cpu {cpu} not among its siblings {siblings}")
        hyperthreading = hyperthreading or len(siblings) > 1
        core = core_ids.setdefault((socket, siblings), len(core_ids))
        cpus.append(CpuInfo(cpu, core, socket, node_of.get(cpu, -1)))

    return NodeCpuTopology(
        cpus=tuple(cpus),
        hyperthreading=hyperthreading,
        model_name=read_model_name(paths),
        turbo=read_turbo(paths),
        numa_nodes=numa_nodes,
        numa_memory_total=numa_memory,
        vendor_id=read_vendor_id(paths),
        cat_l3_cbm_mask=read_cat_l3_cbm_mask(paths),
    )
