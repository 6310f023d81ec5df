"""What this host can do, probed once at start: every knob and every collector source.

A knob is supported when its file exists and is readable (and writable, for writable knobs) in
a probed cgroup directory. The directories are tried in order: the caller's ``sample_rel``, the
kubepods root, the root cgroup and, on cgroup v2, the first child cgroup with the controller
enabled, because the v2 root has none of the controllers' interface files (no ``cpu.max``,
``memory.max``…). The answer names the file that was found or, when none was, the first file
probed and why it is missing ("file cpu.bvt_warp_ns absent (Anolis kernels only)").
Koordinator probes the same way (``SupportedIfFileExistsInKubepods``); it never claims support
for a file it did not see.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from apis.records import frozen
from apis.terway import BPF_PIN_PARTS
from koordlet.system.cgroups import CgroupVersion
from koordlet.system.damon import probe_damon
from koordlet.system.inotify import probe_inotify
from koordlet.system.kidled import probe_kidled
from koordlet.system.knobs import KNOBS, Knob
from koordlet.system.nativeread import load as load_native
from koordlet.system.oserrors import refused_errno
from koordlet.system.perf import CYCLES, INSTRUCTIONS, probe_events
from koordlet.system.psi import probe_memcg_threshold, probe_psi_trigger
from koordlet.system.resctrl import probe_resctrl
from koordlet.system.tc import probe_classifier

if TYPE_CHECKING:
    from koordlet.system.host import Host

logger = logging.getLogger(__name__)


V2_CONTROLLER_NAMES = {"blkio": "io"}
"""v1 controllers that cgroup v2 names otherwise (``Documentation/admin-guide/cgroup-v2.rst``)."""
TERWAY_ABSENT = (
    "no terway-qos seen (its BPF maps are not pinned at {path}): netQOSPolicy terway-qos needs "
    "the Terway CNI's terway-qos daemon, which enforces the files the TerwayQoS runtime hook "
    "writes; without it nothing does"
)


@frozen
class Capability:
    """Whether one knob or source works on this host."""

    name: str
    """Knob name (``cpu_shares``) or source name (``psi_node``)."""
    supported: bool
    """True only when the file was seen and could be read (and written, for writable knobs)."""
    reason: str
    """Why it is unsupported; for a supported one, where it was found."""
    path: str
    """The file found, or the first file probed when none was; empty when nothing was probed."""


class Capabilities(Mapping[str, Capability]):
    """Probe results by name; immutable."""

    __slots__ = ("_items", "version")

    def __init__(self, items: Iterable[Capability], version: CgroupVersion) -> None:
        self._items: Mapping[str, Capability] = MappingProxyType({c.name: c for c in items})
        self.version = version
        """The cgroup version that was probed."""

    def __getitem__(self, name: str) -> Capability:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def supported(self, name: str) -> bool:
        """Whether ``name`` was probed and found usable; KeyError for a name never probed."""
        return self._items[name].supported

    def unsupported(self) -> list[Capability]:
        """Every unsupported knob and source, by name."""
        return sorted((c for c in self._items.values() if not c.supported), key=lambda c: c.name)

    def as_dict(self) -> dict[str, dict[str, object]]:
        """Plain data for ``/debug``: name → ``{name, supported, reason, path}``."""
        return {name: asdict(c) for name, c in sorted(self._items.items())}


def probe_capabilities(host: Host, *, sample_rel: str = "") -> Capabilities:
    """Probe every knob of :data:`~koordlet.system.knobs.KNOBS` and every collector source.

    ``sample_rel`` is a cgroup directory (relative to a controller root) to try first, for
    example a pod's, when the kubepods root lacks files that its children have.
    """
    prober = _Prober(host, sample_rel)
    caps = [prober.knob(k) for k in KNOBS.values()]
    caps += prober.sources()
    result = Capabilities(caps, host.layout.version)
    missing = result.unsupported()
    logger.info(
        "probed %d knobs and %d sources on cgroup %s: %d unsupported (%s)",
        len(KNOBS),
        len(result) - len(KNOBS),
        host.layout.version,
        len(missing),
        ", ".join(c.name for c in missing) or "none",
    )
    return result


def _check_file(path: str, *, writable: bool, must_contain: str = "") -> str:
    """Empty when ``path`` is readable (and writable when asked); else why not."""
    try:
        with open(path, "rb") as f:
            content = f.read(65536)
    except PermissionError:
        return f"permission denied reading {path}"
    except OSError as err:
        if refused_errno(err) is not None:
            return f"{path} exists but the kernel refuses reads (feature disabled at boot)"
        return f"cannot read {path}: {err.strerror}"
    if must_contain and must_contain.encode() not in content:
        return f"{path} has no {must_contain!r} field"
    if writable and not os.access(path, os.W_OK):
        return f"permission denied writing {path} (read-only cgroupfs?)"
    return ""


@dataclass
class _Prober:
    host: Host
    sample_rel: str

    @property
    def version(self) -> CgroupVersion:
        return self.host.layout.version

    def cgroup_dirs(self, controller: str) -> list[str]:
        """Existing directories to look in for ``controller``'s files, most specific first."""
        layout = self.host.layout
        rels = [r for r in (self.sample_rel, layout.kube_root) if r] + [""]
        dirs: list[str] = []
        for rel in dict.fromkeys(rels):
            path = layout.abs_dir(controller, rel)
            if os.path.isdir(path):
                dirs.append(path)
        if self.version is CgroupVersion.V2 and len(dirs) <= 1:
            child = self._v2_child_with(controller)
            if child:
                dirs.append(child)
        return dirs

    def _v2_child_with(self, controller: str) -> str:
        root = self.host.layout.abs_dir(controller, "")
        try:
            names = sorted(e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False))
        except OSError:
            return ""
        wanted = V2_CONTROLLER_NAMES.get(controller, controller)
        for name in names:
            path = os.path.join(root, name)
            try:
                with open(os.path.join(path, "cgroup.controllers")) as f:
                    if wanted in f.read().split():
                        return path
            except OSError:
                continue
        return ""

    def controller_missing(self, controller: str) -> str:
        """Why ``controller`` is unusable on this host, or empty."""
        layout = self.host.layout
        root = layout.abs_dir(controller, "")
        if not os.path.isdir(root):
            return f"cgroup {self.version} controller {controller} not mounted at {root}"
        if self.version is CgroupVersion.V2:
            try:
                with open(os.path.join(root, "cgroup.controllers")) as f:
                    available = f.read().split()
            except OSError as err:
                return f"cannot read {root}/cgroup.controllers: {err.strerror}"
            name = V2_CONTROLLER_NAMES.get(controller, controller)
            if name not in available:
                return f"controller {name} not enabled in cgroup v2 ({root})"
        return ""

    def cgroup_file(
        self,
        name: str,
        controller: str,
        filename: str,
        *,
        writable: bool = False,
        must_contain: str = "",
        absent_note: str = "",
    ) -> Capability:
        why = self.controller_missing(controller)
        if why:
            return Capability(name, False, why, "")
        dirs = self.cgroup_dirs(controller)
        refused: tuple[str, str] | None = None
        for d in dirs:
            path = os.path.join(d, filename)
            if not os.path.exists(path):
                continue
            why = _check_file(path, writable=writable, must_contain=must_contain)
            if not why:
                return Capability(name, True, f"found in {d}", path)
            refused = refused or (why, path)
        if refused is not None:
            return Capability(name, False, *refused)
        first = os.path.join(dirs[0], filename) if dirs else ""
        note = f" ({absent_note})" if absent_note else ""
        return Capability(
            name, False, f"file {filename} absent{note}; probed {', '.join(dirs)}", first
        )

    def knob(self, k: Knob[Any]) -> Capability:
        filename = k.file_for(self.version)
        if filename is None:
            return Capability(k.name, False, f"cgroup {self.version} has no file for it", "")
        if k.v1_anolis_only and self.version is CgroupVersion.V1:
            note = f"cgroup v1 has no {filename} on this kernel; Anolis kernels only"
        elif k.anolis_only:
            note = "Anolis kernels only"
        else:
            note = k.requires
        return self.cgroup_file(
            k.name, k.controller, filename, writable=k.writable, absent_note=note
        )

    def host_file(self, name: str, path: str, absent: str, *, must_contain: str = "") -> Capability:
        if not os.path.exists(path):
            return Capability(name, False, f"{path} absent ({absent})", path)
        why = _check_file(path, writable=False, must_contain=must_contain)
        return Capability(name, not why, why or "readable", path)

    def _native_column_reads(self) -> Capability:
        """The native column reader (``koordlet.system.nativeread``): built and loadable, and a
        layout it reads (the v1 files)."""
        reader, why = load_native()
        if reader is None:
            return Capability("native_column_reads", False, why, "")
        if self.version is CgroupVersion.V2:
            return Capability(
                "native_column_reads",
                False,
                "cgroup v2: the library reads the v1 layouts; columns are read in Python",
                reader.path,
            )
        return Capability("native_column_reads", True, why, reader.path)

    def sources(self) -> list[Capability]:
        paths = self.host.paths
        v2 = self.version is CgroupVersion.V2
        caps = [
            self.host_file("proc_stat", paths.proc("stat"), "procfs not mounted?"),
            self.host_file("meminfo", paths.proc("meminfo"), "procfs not mounted?"),
            self._numa_meminfo(),
            self.host_file(
                "cpu_topology",
                paths.sys("devices", "system", "cpu", "cpu0", "topology", "core_id"),
                "sysfs without CPU topology",
            ),
            self._psi_node(),
            self.host_file(
                "vmstat_reclaim",
                paths.proc("vmstat"),
                "procfs not mounted?",
                must_contain="pgscan_",
            ),
            Capability("psi_trigger", *probe_psi_trigger(self.host.paths)),
            Capability(
                "memcg_threshold",
                *probe_memcg_threshold(self.host.layout.abs_dir("memory", "")),
            ),
            Capability("inotify_cgroup", *probe_inotify(self.host.layout.abs_dir("cpu", ""))),
            self._native_column_reads(),
            self.cgroup_file("memory_stat", "memory", "memory.stat"),
            self.cgroup_file(
                "memory_numa_stat", "memory", "memory.numa_stat", absent_note="needs CONFIG_NUMA"
            ),
            self.cgroup_file("cpu_stat_throttling", "cpu", "cpu.stat", must_contain="nr_throttled"),
            self._idle_page_stats(),
            Capability("damon_cold_pages", *probe_damon(paths.sys_root, paths.proc_root)),
            self.cgroup_file(
                "psi_cgroup",
                "cpuacct" if not v2 else "cpu",
                "cpu.pressure",
                absent_note="needs PSI for cgroups (psi=1; on v1 Anolis psi_v1=1)",
            ),
            self._resctrl(),
            *self._perf_event_and_cpi(),
            self._block_devices(),
            self._oom_score_adj(),
            Capability("tc_classifier", *probe_classifier(), ""),  # bpf(2): no file to name
            self._terway_qos(),
        ]
        if v2:
            caps.append(Capability("cpuacct_usage", False, "cgroup v2 has no cpuacct", ""))
            caps.append(
                self.cgroup_file("cpu_stat_usage", "cpu", "cpu.stat", must_contain="usage_usec")
            )
        else:
            caps.append(self.cgroup_file("cpuacct_usage", "cpuacct", "cpuacct.usage"))
            caps.append(
                Capability("cpu_stat_usage", False, "cgroup v1 cpu.stat has no usage_usec", "")
            )
        return caps

    def _block_devices(self) -> Capability:
        """``class/block``, where blkio QoS resolves device names (``system.blockdev``)."""
        root = self.host.paths.sys("class", "block")
        try:
            count = len(os.listdir(root))
        except OSError as err:
            return Capability("block_devices", False, f"cannot list {root}: {err.strerror}", root)
        return Capability("block_devices", True, f"{count} block devices", root)

    def _oom_score_adj(self) -> Capability:
        """``/proc/<pid>/oom_score_adj`` (the ``koordinator.sh/oom-score-adj`` hot update): this
        process's own file, readable and writable (not written: a probe changes nothing)."""
        path = self.host.paths.proc("self", "oom_score_adj")
        if not os.path.isfile(path):
            return Capability("oom_score_adj", False, f"{path} absent (procfs not mounted?)", path)
        if not os.access(path, os.R_OK | os.W_OK):
            return Capability("oom_score_adj", False, f"permission denied on {path}", path)
        return Capability("oom_score_adj", True, "writable", path)

    def _terway_qos(self) -> Capability:
        """Whether Terway's terway-qos daemon is visibly there (``netQOSPolicy terway-qos``): its
        BPF maps pinned under ``<sys>/fs/bpf/terway`` (``apis.terway.BPF_PIN_PARTS``), which it
        does at start. At the koordlet's start only: a terway-qos started later is not seen."""
        path = self.host.paths.sys(*BPF_PIN_PARTS)
        try:
            pinned = sorted(os.listdir(path))
        except OSError:
            pinned = []
        if not pinned:
            return Capability("netqos_terway", False, TERWAY_ABSENT.format(path=path), path)
        return Capability("netqos_terway", True, f"terway-qos's BPF maps at {path}", path)

    def _numa_meminfo(self) -> Capability:
        node_root = self.host.paths.sys("devices", "system", "node")
        try:
            nodes = sorted(n for n in os.listdir(node_root) if n.removeprefix("node").isdigit())
        except OSError:
            nodes = []
        if not nodes:
            return Capability(
                "numa_meminfo", False, f"no node* under {node_root} (no CONFIG_NUMA?)", node_root
            )
        return self.host_file(
            "numa_meminfo", os.path.join(node_root, nodes[0], "meminfo"), "sysfs without meminfo"
        )

    def _psi_node(self) -> Capability:
        for resource in ("cpu", "memory", "io"):
            cap = self.host_file(
                "psi_node",
                self.host.paths.proc("pressure", resource),
                "kernel without CONFIG_PSI",
            )
            if not cap.supported:
                return cap
        return Capability("psi_node", True, "readable", self.host.paths.proc("pressure"))

    def _idle_page_stats(self) -> Capability:
        """The memcg file, with whether kidled is there and scanning (``system.kidled``)."""
        cap = self.cgroup_file(
            "idle_page_stats",
            "memory",
            "memory.idle_page_stats",
            absent_note="Anolis kernels with kidled only",
        )
        kidled = probe_kidled(self.host.paths)[1]
        return Capability(cap.name, cap.supported, f"{cap.reason}; kidled: {kidled}", cap.path)

    def _resctrl(self) -> Capability:
        """Mounted or not, and the monitoring events, flags and files (``system.resctrl``)."""
        return Capability("resctrl", *probe_resctrl(self.host.paths))

    def _perf_event_and_cpi(self) -> list[Capability]:
        """The perf_event controller, and ``perf_cpi``: whether the CPI collector's cycles and
        instructions open CPU-wide. That is a real ``perf_event_open``, the kernel's and the PMU's
        answer (errno in the reason), whatever tree the paths point at."""
        controller = self._perf_event()
        hw = probe_events((CYCLES, INSTRUCTIONS))
        if not controller.supported:
            # Both reasons: mounting the controller alone would not help a PMU-less VM.
            reason = f"{controller.reason}; hardware events: {hw.reason}"
            return [controller, Capability("perf_cpi", False, reason, controller.path)]
        return [controller, Capability("perf_cpi", hw.supported, hw.reason, controller.path)]

    def _perf_event(self) -> Capability:
        if self.version is CgroupVersion.V2:
            # perf_event is implicitly enabled on the v2 hierarchy (Linux >= 4.11) and never
            # listed in cgroup.controllers; the kernel knob says whether perf exists at all.
            return self.host_file(
                "perf_event",
                self.host.paths.proc("sys", "kernel", "perf_event_paranoid"),
                "kernel without perf events",
            )
        root = self.host.layout.abs_dir("perf_event", "")
        if os.path.isdir(root):
            return Capability("perf_event", True, "controller mounted", root)
        return Capability("perf_event", False, f"controller perf_event not mounted at {root}", root)
