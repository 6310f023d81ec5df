"""The node's block devices from sysfs, and the device under a pod volume: what blkio QoS needs
to turn a NodeSLO block name into the ``MAJ:MIN`` of a whole disk.

Everything comes from ``<sys>/class/block/<name>`` (``Documentation/ABI/stable/sysfs-block``):
``dev`` is ``MAJ:MIN``; a partition has a ``partition`` file and its disk is the directory
above it; a device-mapper device has ``dm/name`` and ``dm/uuid`` (``LVM-...`` for an LVM
logical volume) and its underlying devices under ``slaves/``; a disk's ``queue/scheduler``
lists the schedulers with the active one in brackets (``[none] mq-deadline kyber bfq``).

Block I/O policies apply to whole disks only: the kernel refuses a partition (``ENODEV`` from
``blkg_conf_open_bdev``), so a partition resolves to its disk, and an LVM volume (or volume
group) to the disks under it, as Koordinator's ``NodeLocalStorageInfo`` maps them
(``PartitionDiskMap``, ``VGDiskMap``, ``LVMapperVGMap``).

A pod volume is found under ``<kubelet root>/pods/<uid>/volumes/<plugin>/<name>`` (a CSI
volume's filesystem is mounted at ``.../<name>/mount``); its device is the ``st_dev`` of that
path: the block device of the filesystem holding it, or ``0:N`` for a filesystem without one
(tmpfs, overlay), which has no disk to limit.
"""

from __future__ import annotations

import contextlib
import logging
import os

from apis.records import frozen
from koordlet.system.paths import HostPaths

logger = logging.getLogger(__name__)


@frozen
class BlockDevice:
    """One entry of ``/sys/class/block``."""

    name: str
    """Kernel name (``vdb``, ``vdb1``, ``dm-0``, ``loop3``)."""
    dev: str
    """``MAJ:MIN``."""
    parent: str = ""
    """The disk of a partition; empty for a whole device."""
    scheduler: str = ""
    """The active I/O scheduler of a disk (``bfq``, ``mq-deadline``, ``none``); empty when the
    device has no request queue (partitions, bio-based devices)."""
    dm_name: str = ""
    """A device-mapper device's name (``vg0-data``); empty otherwise."""
    lvm: tuple[str, str] | None = None
    """``(volume group, logical volume)`` of an LVM logical volume."""
    slaves: tuple[str, ...] = ()
    """Devices under a stacked device (device-mapper, md)."""


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read().strip()


def active_scheduler(text: str) -> str:
    """The bracketed scheduler of a ``queue/scheduler`` file; the only one when none is
    bracketed (``none`` on a device with a single choice)."""
    names = text.split()
    for name in names:
        if name.startswith("[") and name.endswith("]"):
            return name[1:-1]
    return names[0] if len(names) == 1 else ""


def split_lvm_name(dm_name: str) -> tuple[str, str] | None:
    """``vg-lv`` → ``("vg", "lv")``, undoing LVM's escape of ``-`` in either name as ``--``;
    None when the name has no single ``-`` (not an LVM volume's dm name)."""
    i = 0
    while i < len(dm_name):
        if dm_name[i] == "-":
            if dm_name[i + 1 : i + 2] == "-":
                i += 2
                continue
            vg, lv = dm_name[:i], dm_name[i + 1 :]
            if vg and lv:
                return vg.replace("--", "-"), lv.replace("--", "-")
            return None
        i += 1
    return None


def scan_block_devices(paths: HostPaths) -> dict[str, BlockDevice]:
    """Every device of ``<sys>/class/block`` by name; one that vanishes mid-scan is left out.

    Raises ``OSError`` only when ``class/block`` itself cannot be listed.
    """
    root = paths.sys("class", "block")
    out: dict[str, BlockDevice] = {}
    for name in sorted(os.listdir(root)):
        entry = os.path.join(root, name)
        try:
            dev = _read(os.path.join(entry, "dev"))
        except OSError as err:
            logger.debug("block device %s: no dev file (%s); skipped", name, err.strerror)
            continue
        parent = ""
        if os.path.exists(os.path.join(entry, "partition")):
            parent = os.path.basename(os.path.dirname(os.path.realpath(entry)))
        scheduler = ""
        with contextlib.suppress(OSError):  # partitions and bio-based devices have no queue
            scheduler = active_scheduler(_read(os.path.join(entry, "queue", "scheduler")))
        dm_name, lvm = "", None
        try:
            dm_name = _read(os.path.join(entry, "dm", "name"))
            if _read(os.path.join(entry, "dm", "uuid")).startswith("LVM-"):
                lvm = split_lvm_name(dm_name)
        except OSError:
            pass
        try:
            slaves = tuple(sorted(os.listdir(os.path.join(entry, "slaves"))))
        except OSError:
            slaves = ()
        out[name] = BlockDevice(name, dev, parent, scheduler, dm_name, lvm, slaves)
    return out


def device_number(path: str) -> str:
    """``MAJ:MIN`` of the filesystem holding ``path`` (its ``st_dev``); ``OSError`` when the
    path does not exist."""
    st = os.stat(path)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
