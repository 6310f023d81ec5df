"""Where a PCI device sits, from sysfs: its NUMA node, CPU socket and PCIe root complex.

For a device at ``domain:bus:device.function`` (lower case, ``0000:3b:00.0``), under the
:class:`~koordlet.system.paths.HostPaths` sysfs root:

- ``bus/pci/devices/<bdf>/numa_node``: the NUMA node; the kernel writes ``-1`` when the platform
  does not say (single-node machines, many VMs), which counts as node 0, as upstream
  (``pkg/koordlet/metricsadvisor/devices/helper/topology.go``, ``getNUMANodeID``);
- the link ``bus/pci/devices/<bdf>`` resolves to ``devices/pci0000:3a/0000:3a:00.0/.../<bdf>``:
  its first ``pciDDDD:BB`` component is the root complex, the ``pcieID`` of the Device object
  (upstream's ``parsePCIEID``);
- ``devices/system/node/node<N>/cpulist`` and ``devices/system/cpu/cpu<K>/topology/
  physical_package_id`` of the node's first CPU: the socket. Upstream writes ``socketID: -1``;
  we say which socket when sysfs does, and -1 otherwise.
"""

from __future__ import annotations

import os
import re

from apis.cpulist import parse_cpulist
from apis.records import frozen
from koordlet.errors import HostError, ParseError
from koordlet.system.paths import HostPaths

_ROOT_COMPLEX = re.compile(r"pci[0-9a-fA-F]{4}:[0-9a-fA-F]{2}")
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@frozen
class PCIPlace:
    """The topology of one PCI device."""

    bus_id: str
    """``0000:3b:00.0``."""
    numa_node: int
    """NUMA node; 0 when sysfs says -1."""
    socket_id: int
    """CPU socket of that NUMA node; -1 when unknown."""
    pcie_root: str
    """The root complex (``pci0000:3a``)."""


def normalize_bus_id(bus_id: str) -> str:
    """NVML's bus id (``0000:3B:00.0`` legacy, or ``00000000:3B:00.0``) as sysfs names the
    device: a four-digit domain, lower case. :class:`ParseError` for anything else."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if sep and len(domain) == 8 and domain.startswith("0000"):
        text = f"{domain[4:]}:{rest}"
    if not _BDF.match(text):
        raise ParseError(f"PCI bus id {bus_id!r} is not domain:bus:device.function")
    return text


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError as err:
        raise HostError(f"cannot read {path}: {err.strerror}") from err


def _socket_of(paths: HostPaths, node: int) -> int:
    cpulist = paths.sys("devices", "system", "node", f"node{node}", "cpulist")
    try:
        cpus = sorted(parse_cpulist(_read_text(cpulist)))
    except (HostError, ValueError):
        return -1
    if not cpus:
        return -1
    package = paths.sys(
        "devices", "system", "cpu", f"cpu{cpus[0]}", "topology", "physical_package_id"
    )
    try:
        return int(_read_text(package))
    except (HostError, ValueError):
        return -1


def read_pci_place(paths: HostPaths, bus_id: str) -> PCIPlace:
    """The place of the device at ``bus_id`` (:func:`normalize_bus_id` form).

    :class:`HostError` when sysfs has no such device or no ``numa_node`` file; the root complex is
    empty when the link does not resolve to a ``pciDDDD:BB`` path.
    """
    device_dir = paths.sys("bus", "pci", "devices", bus_id)
    raw = _read_text(os.path.join(device_dir, "numa_node"))
    try:
        node = int(raw)
    except ValueError:
        raise ParseError(f"{device_dir}/numa_node: not a number: {raw!r}") from None
    node = max(node, 0)
    match = _ROOT_COMPLEX.search(os.path.realpath(device_dir))
    return PCIPlace(
        bus_id=bus_id,
        numa_node=node,
        socket_id=_socket_of(paths, node),
        pcie_root=match.group(0).lower() if match else "",
    )
