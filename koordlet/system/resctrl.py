"""Intel RDT / AMD PQoS monitoring through the resctrl file system: what is there, and its counters.

The kernel (``Documentation/filesystems/resctrl.rst``) exposes, under ``<sys>/fs/resctrl``::

    info/L3_MON/mon_features         one monitoring event a line
    schemata                         allocation of the default group
    <group>/mon_data/mon_L3_<NN>/    one folder per L3 cache domain (NN: cache id, two digits)
        llc_occupancy                bytes of L3 held by the group's tasks now
        mbm_total_bytes              bytes read from and written to memory, a running counter
        mbm_local_bytes              the same, to the domain's local memory only

Each value file holds a decimal number, or the word ``Unavailable`` (the kernel cannot read the
counter for this group's RMID in this domain yet) or ``Error`` (the read failed). Koordinator's
QoS strategy keeps one control group per QoS class, named ``LSR``, ``LS`` and ``BE``
(``LSRResctrlGroup``…); the resctrl collector reads those (:data:`RESCTRL_GROUPS`).

Monitoring needs the CPU (``/proc/cpuinfo`` flags ``cqm_llc`` plus ``cqm_occup_llc``,
``cqm_mbm_total``, ``cqm_mbm_local`` for the three events) **and** the mount with
``info/L3_MON``; an event the CPU has but ``mon_features`` does not list (kernel ``rdt=``
options) is unsupported too. Every reason names the missing flag or file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import field

from apis.extension import QoSClass
from apis.records import frozen
from koordlet.errors import CgroupGoneError, HostError, ParseError, UnsupportedError
from koordlet.system.cgroupstats import read_file_bytes
from koordlet.system.oserrors import absent_error
from koordlet.system.paths import HostPaths
from koordlet.system.procfs import read_host_file

RESCTRL_GROUPS = ("LSR", "LS", "BE")
"""Koordinator's resctrl control groups, one per QoS class, in priority order."""
GROUP_OF_CLASS: Mapping[str, str] = {
    QoSClass.LSE: "LSR",
    QoSClass.LSR: "LSR",
    QoSClass.LS: "LS",
    QoSClass.BE: "BE",
}
"""Control group of each QoS class: Koordinator's ``LSRResctrlGroup``, ``LSResctrlGroup``,
``BEResctrlGroup``; SYSTEM pods stay in the default group."""
LLC_OCCUPANCY = "llc_occupancy"
MBM_TOTAL = "mbm_total_bytes"
MBM_LOCAL = "mbm_local_bytes"
MON_EVENTS = (LLC_OCCUPANCY, MBM_TOTAL, MBM_LOCAL)
"""The L3 monitoring events, in the order the kernel lists them."""
MBM_EVENTS = (MBM_TOTAL, MBM_LOCAL)
"""The events that are running byte counters (bandwidth is their rate)."""
MON_BASE_FLAG = "cqm_llc"
"""The cpuinfo flag of any L3 cache monitoring (CMT/MBM)."""
EVENT_FLAGS: Mapping[str, str] = {
    LLC_OCCUPANCY: "cqm_occup_llc",
    MBM_TOTAL: "cqm_mbm_total",
    MBM_LOCAL: "cqm_mbm_local",
}
"""The cpuinfo flag each event needs."""
ALLOC_FLAGS = ("rdt_a", "cat_l3", "mba")
"""cpuinfo flags of resctrl allocation (CAT, MBA)."""
UNAVAILABLE = "Unavailable"
"""What a value file says when the counter has no data for the group in that domain."""
ERROR = "Error"
"""What a value file says when reading the counter failed."""
_DOMAIN_RE = re.compile(r"mon_L3_(\d+)")

Reader = Callable[[str], bytes]
"""Reads a whole file: ``Tick.read`` or ``read_file_bytes`` (ENOENT → ``CgroupGoneError``)."""


def resctrl_root(paths: HostPaths) -> str:
    """The resctrl mount point, ``<sys>/fs/resctrl``."""
    return paths.sys("fs", "resctrl")


def parse_cpu_flags(data: bytes, path: str) -> frozenset[str]:
    """The feature flags of the first CPU in ``/proc/cpuinfo`` (x86 ``flags`` line); empty for an
    architecture that prints none (arm64 lists ``Features``)."""
    for line in data.splitlines():
        key, sep, value = line.partition(b":")
        if key.split()[:1] != [b"flags"]:
            continue
        if not sep or key.strip() != b"flags":
            raise ParseError(f"{path}: bad flags line {line[:60]!r}")
        return frozenset(value.decode("ascii", errors="replace").split())
    return frozenset()


def read_cpu_flags(paths: HostPaths) -> frozenset[str]:
    """The CPU flags of the host; :class:`HostError` when ``/proc/cpuinfo`` cannot be read."""
    path = paths.proc("cpuinfo")
    return parse_cpu_flags(read_host_file(path), path)


def is_mounted(root: str) -> bool:
    """Whether resctrl is mounted at ``root``: the mount always has ``info`` and ``schemata``;
    the bare mount point of an unmounted kernel is an empty folder."""
    return os.path.isdir(os.path.join(root, "info")) or os.path.isfile(
        os.path.join(root, "schemata")
    )


def parse_mon_features(data: bytes, path: str) -> frozenset[str]:
    """``info/L3_MON/mon_features``: one event name a line."""
    names = data.decode("ascii", errors="replace").split()
    if not all(re.fullmatch(r"[a-z_]+", n) for n in names):
        raise ParseError(f"{path}: not a list of event names: {data[:80]!r}")
    return frozenset(names)


@frozen
class MonitoringSupport:
    """Which L3 monitoring events this host can read."""

    root: str
    """The resctrl mount point."""
    events: tuple[str, ...]
    """Readable events, in :data:`MON_EVENTS` order; never empty."""
    missing: Mapping[str, str] = field(default_factory=dict)
    """Event → why it cannot be read (the flag or the ``mon_features`` entry it lacks)."""


def monitoring_support(paths: HostPaths, flags: frozenset[str], read: Reader) -> MonitoringSupport:
    """The readable monitoring events; :class:`UnsupportedError` naming the missing flag, mount
    or file when there is none."""
    root = resctrl_root(paths)
    cpuinfo = paths.proc("cpuinfo")
    if MON_BASE_FLAG not in flags:
        raise UnsupportedError(
            "resctrl monitoring", f"{cpuinfo} flags lack {MON_BASE_FLAG} (CPU without RDT/PQoS)"
        )
    if not is_mounted(root):
        raise UnsupportedError(
            "resctrl monitoring", f"resctrl not mounted at {root} (mount -t resctrl resctrl {root})"
        )
    features_path = os.path.join(root, "info", "L3_MON", "mon_features")
    try:
        features = parse_mon_features(read(features_path), features_path)
    except CgroupGoneError as err:
        raise UnsupportedError(
            "resctrl monitoring",
            f"{features_path} absent: resctrl mounted without L3 monitoring (kernel rdt= option?)",
        ) from err
    missing: dict[str, str] = {}
    for event in MON_EVENTS:
        flag = EVENT_FLAGS[event]
        if flag not in flags:
            missing[event] = f"{cpuinfo} flags lack {flag}"
        elif event not in features:
            missing[event] = f"{event} not listed in {features_path}"
    events = tuple(e for e in MON_EVENTS if e not in missing)
    if not events:
        why = "; ".join(f"{e}: {r}" for e, r in missing.items())
        raise UnsupportedError("resctrl monitoring", f"no L3 monitoring event readable ({why})")
    return MonitoringSupport(root, events, missing)


def mon_domains(root: str, group: str) -> list[tuple[int, str]]:
    """``(cache id, folder)`` of every L3 domain of control group ``group`` (``""``: the default
    group), by cache id. :class:`CgroupGoneError` when the group does not exist (or vanished)."""
    mon_data = os.path.join(root, group, "mon_data") if group else os.path.join(root, "mon_data")
    try:
        with os.scandir(mon_data) as it:
            names = [e.name for e in it if e.is_dir(follow_symlinks=False)]
    except OSError as err:
        raise absent_error(mon_data, err) from err
    domains = []
    for name in names:
        if not name.startswith("mon_L3_"):
            continue  # other resources' domains (mon_MB_* on some ARM MPAM kernels)
        match = _DOMAIN_RE.fullmatch(name)
        if match is None:
            raise ParseError(f"{mon_data}: bad L3 domain folder {name!r}")
        domains.append((int(match.group(1)), os.path.join(mon_data, name)))
    return sorted(domains)


def parse_mon_value(data: bytes, path: str) -> tuple[int | None, str]:
    """A monitoring value file: ``(bytes, "")``, or ``(None, reason)`` when the kernel printed
    ``Unavailable`` or ``Error`` instead of a number."""
    text = data.strip()
    if text == UNAVAILABLE.encode():
        return None, f"{path}: Unavailable (no data for this group's RMID in this domain)"
    if text == ERROR.encode():
        return None, f"{path}: Error (the kernel failed to read the counter)"
    try:
        value = int(text)
    except ValueError:
        raise ParseError(f"{path}: not a number: {data[:64]!r}") from None
    if value < 0:
        raise ParseError(f"{path}: negative value {value}")
    return value, ""


def probe_resctrl(paths: HostPaths) -> tuple[bool, str, str]:
    """``(supported, reason, path)`` for start-up probing of resctrl: supported when mounted; the
    reason says which monitoring events work, or which flag, mount or file is missing."""
    root = resctrl_root(paths)
    schemata = os.path.join(root, "schemata")
    cpuinfo = paths.proc("cpuinfo")
    try:
        flags = read_cpu_flags(paths)
    except (HostError, ParseError) as err:
        flags, flags_error = frozenset(), str(err)
    else:
        flags_error = ""
    if not is_mounted(root):
        have = [f for f in (*ALLOC_FLAGS, MON_BASE_FLAG) if f in flags]
        if have:
            why = f"resctrl not mounted at {root} ({cpuinfo} has {', '.join(have)})"
            return False, why, schemata
        why = flags_error or f"{cpuinfo} lists no RDT (rdt_a/cat_l3/mba/cqm_llc) flag"
        return False, f"resctrl not mounted and {why}", schemata
    try:
        support = monitoring_support(paths, flags, read_file_bytes)
    except UnsupportedError as err:
        monitoring = f"no monitoring: {err.reason}"
    except (HostError, ParseError) as err:
        monitoring = f"no monitoring: {err}"
    else:
        monitoring = "monitoring " + ", ".join(support.events)
        if support.missing:
            monitoring += " (" + "; ".join(f"{e}: {r}" for e, r in support.missing.items()) + ")"
    return True, f"mounted at {root}; {monitoring}", schemata
