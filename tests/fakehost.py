"""A fake host tree for tests: procfs, sysfs and a cgroup hierarchy in a temporary folder.

``FakeHost(root, version, driver)`` writes, under ``root``::

    proc/{stat,meminfo,cpuinfo}  proc/pressure/{cpu,memory,io}
    sys/devices/system/cpu/{online,possible,present,cpuN/topology/*}
    sys/devices/system/node/{online,possible,nodeN/{meminfo,cpulist}}
    sys/fs/cgroup/...            v1: one folder per controller; v2: the unified tree

with the kubepods root and its Burstable and BestEffort folders already made, as the kubelet
makes them. Every file has the kernel's real format: key sets, order and line layout come from the
captured samples in ``tests/golden`` (see its README), numbers are substituted.

Counters are set per cgroup and never aggregated up the tree: a test sets exactly what the code
under test reads. Setters rewrite only their keys and keep the rest of a file, so a test may also
write a file directly (``write``) and still use the setters. Cgroups are named by their path
relative to a controller root, as ``CgroupLayout`` and ``PodInfo.cgroup_dir`` name them::

    pod, [c] = fake.add_pod(uid, KubeQOS.BURSTABLE, [("containerd", container_id(1))])
    fake.set_cpu_usage(c, 2 * 10**9)
    fake.set_memory(pod, anon=300 << 20, file=100 << 20)
    fake.advance_proc_stat(user=100, idle=300)
    fake.set_meminfo(MemAvailable=8 << 20)

Use the ``fake_host`` fixture (every layout) or build one on the ``host_root`` fixture, which
puts the tree on tmpfs: 200 pods of 3 containers build there in well under a second, against
several seconds on a busy disk.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from apis.extension import KubeQOS
from koordlet.system.cgroups import RUNTIME_CRIO, CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths

GOLDEN = Path(__file__).parent / "golden"
PAGE = 4096
USER_HZ = 100
"""Clock ticks per second of /proc/stat and cpuacct.stat (``getconf CLK_TCK``)."""
V1_UNLIMITED = 9223372036854771712
"""What v1 ``memory.limit_in_bytes`` reads when unlimited (LONG_MAX rounded down to a page)."""
_NS_PER_TICK = 10**9 // USER_HZ
_V2_ROOT_CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc"
_V2_ENABLED = "cpuset cpu io memory pids"
_V2_NON_ROOT = (
    "cpu.max cpu.max.burst cpu.weight cpu.idle cpuset.cpus cpuset.mems io.max memory.current "
    "memory.min memory.low memory.high memory.max pids.max pids.current"
)
"""cgroup v2 files that exist on non-root cgroups only (cgroup-v2.rst)."""
_PROC_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
"""The /proc/stat fields a test sets (guest and guest_nice stay 0)."""
_MEMINFO_PERCENT = (
    "MemTotal=100 MemFree=60 MemAvailable=75 Buffers=1 Cached=12 Active=15 Inactive=10 "
    "Active(anon)=10 Inactive(anon)=2 Active(file)=5 Inactive(file)=8 AnonPages=12"
)
"""Default /proc/meminfo in percent of MemTotal (16 GiB a NUMA node); the rest is golden."""


@functools.cache
def golden(name: str) -> str:
    """Text of a golden sample, e.g. ``golden("v1/memory.stat")``."""
    return (GOLDEN / name).read_text()


def _keys(text: str, sep: str | None = None) -> tuple[str, ...]:
    return tuple(line.split(sep, 1)[0] for line in text.splitlines() if line)


def parse_flat(text: str) -> dict[str, int]:
    """A flat-keyed cgroup file (``key value`` lines) as a dict."""
    return {k: int(v) for k, v in (line.split() for line in text.splitlines() if line)}


def render_flat(keys: Iterable[str], values: Mapping[str, int]) -> str:
    """``key value`` lines in ``keys`` order; keys without a value read 0."""
    return "".join(f"{k} {values.get(k, 0)}\n" for k in keys)


def cpulist(cpus: Iterable[int]) -> str:
    """The kernel's list format (``%*pbl``): ``0-3,8-11``."""
    runs: list[list[int]] = []
    for c in sorted(set(cpus)):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def container_id(seed: object) -> str:
    """A deterministic 64-hex runtime container id, as containerd, cri-o and docker make."""
    return hashlib.sha256(repr(seed).encode()).hexdigest()


def _split(value: int, parts: int) -> list[int]:
    """``value`` split into ``parts`` page-granular shares; what is left goes to the first."""
    pages = value // PAGE
    shares = [pages // parts * PAGE] * parts
    shares[0] += value - sum(shares)
    return shares


def _weight_of_shares(shares: int) -> int:
    """cgroup v2 cpu.weight the kubelet writes for v1 cpu.shares (``CpuSharesToCpuWeight``)."""
    return 1 + ((shares - 2) * 9999) // 262142


def _write(path: str, data: str | bytes) -> None:
    """Replace the file whole: as with the kernel's own files, a reader sees the old value or the
    new one, never an empty or half-written file (a daemon may collect while a test writes)."""
    tmp = f"{path}.fakehost-tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data.encode() if isinstance(data, str) else data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class CpuTimes(NamedTuple):
    """One ``cpu`` line of /proc/stat, in USER_HZ ticks."""

    user: int = 0
    nice: int = 0
    system: int = 0
    idle: int = 0
    iowait: int = 0
    irq: int = 0
    softirq: int = 0
    steal: int = 0
    guest: int = 0
    guest_nice: int = 0

    def line(self, label: str) -> str:
        return f"{label} {' '.join(str(v) for v in self)}\n"


def _sum_times(times: Iterable[CpuTimes]) -> CpuTimes:
    return CpuTimes(*(sum(col) for col in zip(*times, strict=True)))


class FakeHost:
    """A fake node on ``root``; see the module docstring."""

    def __init__(
        self,
        root: Path,
        version: CgroupVersion,
        driver: CgroupDriver,
        ncpus: int = 4,
        numa_nodes: int = 1,
        *,
        threads_per_core: int = 1,
        kube_path: str = "kubepods/",
    ) -> None:
        if ncpus % numa_nodes or (ncpus // numa_nodes) % threads_per_core:
            raise ValueError("ncpus must split evenly into NUMA nodes and cores")
        self.root = Path(root)
        self.version = version
        self.ncpus = ncpus
        self.numa_nodes = numa_nodes
        self.threads_per_core = threads_per_core
        self.paths = HostPaths(
            str(self.root / "sys/fs/cgroup"), str(self.root / "proc"), str(self.root / "sys")
        )
        self.layout = detect_layout(self.paths, version=version, driver=driver, kube_path=kube_path)
        self.host = Host(paths=self.paths, layout=self.layout)
        self.all_cpus = cpulist(range(ncpus))
        self.all_mems = cpulist(range(numa_nodes))
        self._cgroups: set[str] = set()
        self._per_cpu = [CpuTimes(1000, 0, 300, 10000, 20, 0, 10, 0)] * ncpus
        total_kb = numa_nodes * 16 * 1024 * 1024
        meminfo = (ln.split(":", 1) for ln in golden("proc/meminfo").splitlines())
        self._meminfo = {k: int(v.split()[0]) for k, v in meminfo}
        shares = (pair.split("=") for pair in _MEMINFO_PERCENT.split())
        self._meminfo.update({k: total_kb * int(pct) // 100 for k, pct in shares})
        self._node_meminfo: list[dict[str, int]] = [
            self._default_node_meminfo() for _ in range(numa_nodes)
        ]
        self._write_proc()
        self._write_sys()
        self._write_cgroup_roots()

    def _topology(self, cpu: int) -> tuple[int, int, list[int]]:
        """(core id within its socket, socket = NUMA node, thread siblings) of ``cpu``."""
        cores = self.ncpus // self.threads_per_core
        per_node = cores // self.numa_nodes
        core = cpu % cores
        threads = [core + t * cores for t in range(self.threads_per_core)]
        return core % per_node, core // per_node, threads

    def node_cpus(self, node: int) -> list[int]:
        """CPUs of NUMA node (= socket) ``node``. CPUs are numbered as Linux numbers x86
        threads: the first thread of every core, then the second threads."""
        return [cpu for cpu in range(self.ncpus) if self._topology(cpu)[1] == node]

    # Generic file access -----------------------------------------------------------------------

    def path(self, controller: str, rel: str, filename: str) -> str:
        """Absolute path of a cgroup file (the layout decides v1 or v2)."""
        return self.layout.file(controller, rel, filename)

    def read(self, controller: str, rel: str, filename: str) -> str:
        return Path(self.path(controller, rel, filename)).read_text()

    def write(self, controller: str, rel: str, filename: str, content: str | int) -> None:
        text = str(content)
        _write(self.path(controller, rel, filename), text if text.endswith("\n") else text + "\n")

    def _update_flat(self, controller: str, rel: str, filename: str, **values: int) -> None:
        path = self.path(controller, rel, filename)
        text = Path(path).read_text()
        current = parse_flat(text)
        unknown = set(values) - set(current)
        if unknown:
            raise KeyError(f"{path} has no keys {sorted(unknown)}")
        current.update(values)
        _write(path, render_flat(_keys(text), current))

    # procfs and sysfs --------------------------------------------------------------------------

    def _default_node_meminfo(self) -> dict[str, int]:
        n, mem = self.numa_nodes, self._meminfo
        out: dict[str, int] = {}
        for line in golden("sys/node0_meminfo").splitlines():
            key = line.split()[2].rstrip(":")
            if key == "MemUsed":
                out[key] = out["MemTotal"] - out["MemFree"]
            elif key == "FilePages":
                out[key] = (mem["Buffers"] + mem["Cached"]) // n
            else:
                out[key] = mem[key] // n if key in mem else int(line.split()[3])
        return out

    def _write_proc(self) -> None:
        os.makedirs(self.paths.proc("pressure"), exist_ok=True)
        self._write_proc_stat()
        self._write_meminfo()
        for res in ("cpu", "memory", "io"):
            _write(self.paths.proc("pressure", res), golden(f"proc/pressure_{res}"))
        self.set_vmstat()
        block = [ln.partition(":") for ln in golden("proc/cpuinfo").split("\n\n")[0].splitlines()]
        blocks = []
        for cpu in range(self.ncpus):
            core_id, socket, _ = self._topology(cpu)
            per_socket = self.ncpus // self.numa_nodes
            subst = {"processor": cpu, "physical id": socket, "siblings": per_socket}
            subst |= {"core id": core_id, "cpu cores": per_socket // self.threads_per_core}
            subst |= {"apicid": cpu, "initial apicid": cpu}
            lines = [
                f"{k}: {subst[k.strip()]}" if k.strip() in subst else k + s + v for k, s, v in block
            ]
            blocks.append("\n".join(lines) + "\n")
        _write(self.paths.proc("cpuinfo"), "\n".join(blocks) + "\n")

    def _write_proc_stat(self) -> None:
        head = _sum_times(self._per_cpu).line("cpu ")
        head += "".join(t.line(f"cpu{i}") for i, t in enumerate(self._per_cpu))
        rest = "".join(f"{ln}\n" for ln in golden("proc/stat").splitlines() if ln[:3] != "cpu")
        _write(self.paths.proc("stat"), head + rest)

    def _write_meminfo(self) -> None:
        # fs/proc/meminfo.c: the label padded to 16 columns, the number in at least 8.
        lines = []
        for key, value in self._meminfo.items():
            unit = "" if key.startswith("HugePages_") else " kB"
            lines.append(f"{key + ':':<16}{value:>8}{unit}\n")
        _write(self.paths.proc("meminfo"), "".join(lines))

    def _write_node_meminfo(self, node: int) -> None:
        # drivers/base/node.c: "Node %d " then the label in 16 columns; kB values in %8lu,
        # HugePages_* counts in " %5u".
        lines = []
        for key, value in self._node_meminfo[node].items():
            if key.startswith("HugePages_"):
                lines.append(f"Node {node} {key + ':':<16} {value:>5}\n")
            else:
                lines.append(f"Node {node} {key + ':':<16}{value:>8} kB\n")
        _write(self.paths.sys("devices/system/node", f"node{node}", "meminfo"), "".join(lines))

    def _write_sys(self) -> None:
        cpu_root = self.paths.sys("devices/system/cpu")
        os.makedirs(cpu_root, exist_ok=True)
        for name in ("online", "possible", "present"):
            _write(os.path.join(cpu_root, name), self.all_cpus + "\n")
        for cpu in range(self.ncpus):
            core_id, socket, threads = self._topology(cpu)
            siblings, package = cpulist(threads), cpulist(self.node_cpus(socket))
            topo = os.path.join(cpu_root, f"cpu{cpu}", "topology")
            os.makedirs(topo)
            files: dict[str, int | str] = {"core_id": core_id, "physical_package_id": socket}
            files |= {"thread_siblings_list": siblings, "core_cpus_list": siblings}
            files |= {"core_siblings_list": package, "package_cpus_list": package, "die_id": 0}
            for name, value in files.items():
                _write(os.path.join(topo, name), f"{value}\n")
        node_root = self.paths.sys("devices/system/node")
        os.makedirs(node_root, exist_ok=True)
        for name in ("online", "possible", "has_cpu", "has_memory"):
            _write(os.path.join(node_root, name), self.all_mems + "\n")
        for node in range(self.numa_nodes):
            os.makedirs(os.path.join(node_root, f"node{node}"), exist_ok=True)
            node_cpus = cpulist(self.node_cpus(node))
            _write(os.path.join(node_root, f"node{node}", "cpulist"), node_cpus + "\n")
            self._write_node_meminfo(node)

    @property
    def proc_stat(self) -> CpuTimes:
        """The aggregate ``cpu`` line now in /proc/stat."""
        return _sum_times(self._per_cpu)

    def set_proc_stat(
        self,
        user: int = 0,
        nice: int = 0,
        system: int = 0,
        idle: int = 0,
        iowait: int = 0,
        irq: int = 0,
        softirq: int = 0,
        steal: int = 0,
        *,
        per_cpu: Sequence[CpuTimes] | None = None,
    ) -> None:
        """Set /proc/stat in ticks: the aggregate split evenly over the CPUs (remainders on
        cpu0), or ``per_cpu`` lines whose sum becomes the aggregate."""
        if per_cpu is not None:
            aggregate = (user, nice, system, idle, iowait, irq, softirq, steal)
            if len(per_cpu) != self.ncpus or any(aggregate):
                raise ValueError("per_cpu needs one CpuTimes per CPU and no aggregate values")
            self._per_cpu = [CpuTimes(*t) for t in per_cpu]
        else:
            total = CpuTimes(user, nice, system, idle, iowait, irq, softirq, steal)
            n = self.ncpus
            share = CpuTimes(*(v // n for v in total))
            first = CpuTimes(*(v - s * (n - 1) for v, s in zip(total, share, strict=True)))
            self._per_cpu = [first] + [share] * (n - 1)
        self._write_proc_stat()

    def advance_proc_stat(self, **ticks: int) -> None:
        """Add ticks to the aggregate (``user=150, idle=250``), spread evenly over the CPUs."""
        unknown = set(ticks) - set(_PROC_STAT_FIELDS)
        if unknown:
            raise KeyError(f"/proc/stat has no fields {sorted(unknown)}")
        now = self.proc_stat._asdict()
        self.set_proc_stat(**{k: now[k] + ticks.get(k, 0) for k in _PROC_STAT_FIELDS})

    @property
    def meminfo(self) -> dict[str, int]:
        """/proc/meminfo values in kB (counts for HugePages_*)."""
        return dict(self._meminfo)

    @staticmethod
    def _merge_kb(target: dict[str, int], values: Mapping[str, int], where: str) -> None:
        updates = {re.sub(r"_(anon|file)$", r"(\1)", k): v for k, v in values.items()}
        unknown = set(updates) - set(target)
        if unknown:
            raise KeyError(f"{where} has no keys {sorted(unknown)}")
        target.update(updates)

    def set_meminfo(self, **kb: int) -> None:
        """Set /proc/meminfo values in kB; ``Active_file`` stands for ``Active(file)``.

        Only /proc/meminfo changes; the NUMA files keep their values (``set_numa_meminfo``)."""
        self._merge_kb(self._meminfo, kb, "/proc/meminfo")
        self._write_meminfo()

    def set_numa_meminfo(self, node: int, **kb: int) -> None:
        """Set values of nodeN/meminfo in kB; MemUsed follows MemTotal - MemFree."""
        values = self._node_meminfo[node]
        self._merge_kb(values, kb, f"node{node}/meminfo")
        if "MemUsed" not in kb:
            values["MemUsed"] = values["MemTotal"] - values["MemFree"]
        self._write_node_meminfo(node)

    def set_pressure(
        self,
        resource: str,
        some_total_us: int,
        full_total_us: int = 0,
        *,
        some_avg10: float = 0.0,
        full_avg10: float = 0.0,
        rel: str | None = None,
    ) -> None:
        """Write PSI for ``cpu``, ``memory`` or ``io``: the node's /proc/pressure file, or the
        ``<resource>.pressure`` file of cgroup ``rel`` (v2 only; v1 cgroups have none)."""
        if rel is None:
            path = self.paths.proc("pressure", resource)
        elif self.version is CgroupVersion.V2:
            path = self.path("cpu", rel, f"{resource}.pressure")
        else:
            raise ValueError("cgroup v1 has no per-cgroup pressure files")
        _write(
            path,
            f"some avg10={some_avg10:.2f} avg60=0.00 avg300=0.00 total={some_total_us}\n"
            f"full avg10={full_avg10:.2f} avg60=0.00 avg300=0.00 total={full_total_us}\n",
        )

    def set_vmstat(
        self,
        pgscan_kswapd: int = 0,
        pgscan_direct: int = 0,
        pgsteal_kswapd: int = 0,
        pgsteal_direct: int = 0,
        refault_file: int = 0,
    ) -> None:
        """Write /proc/vmstat: the golden file's keys in its order, these reclaim counters."""
        subst = {
            "pgscan_kswapd": pgscan_kswapd,
            "pgscan_direct": pgscan_direct,
            "pgsteal_kswapd": pgsteal_kswapd,
            "pgsteal_direct": pgsteal_direct,
            "workingset_refault_file": refault_file,
        }
        lines = []
        for line in golden("proc/vmstat").splitlines():
            key, _, value = line.partition(" ")
            lines.append(f"{key} {subst.get(key, value)}\n")
        _write(self.paths.proc("vmstat"), "".join(lines))

    # cgroups: creation -------------------------------------------------------------------------

    def _numa(self, values: Mapping[str, Sequence[int]]) -> str:
        """memory.numa_stat: v1 ``key=total N0=pages …``; v2 ``key N0=bytes …``."""
        v1 = self.version is CgroupVersion.V1
        lines = []
        for key in _keys(golden(f"{self.version}/memory.numa_stat"), "=" if v1 else None):
            per_node = values.get(key, [0] * self.numa_nodes)
            nodes = " ".join(f"N{i}={v}" for i, v in enumerate(per_node))
            lines.append(f"{key}={sum(per_node)} {nodes}\n" if v1 else f"{key} {nodes}\n")
        return "".join(lines)

    @functools.cached_property
    def _templates(self) -> dict[str, dict[str, bytes]]:
        """Files of a new cgroup, controller → name → content (v2: the one controller ""), from
        ``golden/<version>/cgroup``, with this node's CPUs and NUMA nodes filled in."""
        base = GOLDEN / self.version / "cgroup"
        dirs = sorted(base.iterdir()) if self.version is CgroupVersion.V1 else [base]
        files = {
            ("" if d == base else d.name): {f.name: f.read_text() for f in sorted(d.iterdir())}
            for d in dirs
        }
        cpus, mems = self.all_cpus + "\n", self.all_mems + "\n"
        if self.version is CgroupVersion.V1:
            # runc copies the parent's cpuset into a new container cgroup; kubelet's are full.
            files["cpuset"].update({"cpuset.cpus": cpus, "cpuset.mems": mems})
            files["memory"]["memory.numa_stat"] = self._numa({})
        else:
            files[""].update({"cpuset.cpus.effective": cpus, "cpuset.mems.effective": mems})
            files[""]["memory.numa_stat"] = self._numa({})
        return {c: {n: d.encode() for n, d in f.items()} for c, f in files.items()}

    def _root_files(self) -> dict[str, dict[str, bytes]]:
        """The root cgroup has no limits of its own (kernel: these files are non-root only)."""
        files = {c: dict(f) for c, f in self._templates.items()}
        if self.version is CgroupVersion.V1:
            del files["pids"]["pids.max"], files["pids"]["pids.current"]
            return files
        v2 = files[""]
        for name in _V2_NON_ROOT.split():
            del v2[name]
        v2["cgroup.controllers"] = (_V2_ROOT_CONTROLLERS + "\n").encode()
        v2["cpu.stat"] = render_flat(_keys(golden("v2/cpu.stat.root")), {}).encode()
        return files

    def _make_dir(self, controller: str, rel: str, files: Mapping[str, bytes]) -> str:
        d = self.layout.abs_dir(controller or "cpu", rel)
        with contextlib.suppress(FileExistsError):
            os.mkdir(d)
        for name, data in files.items():
            _write(os.path.join(d, name), data)
        return d

    def _write_cgroup_roots(self) -> None:
        os.makedirs(self.paths.cgroup_root, exist_ok=True)
        for controller, files in self._root_files().items():
            self._make_dir(controller, "", files)
        self._cgroups.add("")
        self._create(self.layout.kube_root, leaf=False, shares=1024 * self.ncpus)
        self._create(self.layout.qos_dir(KubeQOS.BURSTABLE), leaf=False)
        self._create(self.layout.qos_dir(KubeQOS.BESTEFFORT), leaf=False, shares=2)

    def _create(self, rel: str, *, leaf: bool, shares: int | None = None) -> None:
        if rel in self._cgroups:
            return
        parent = rel.rpartition("/")[0]
        if parent not in self._cgroups:
            self._create(parent, leaf=False)
        for controller, files in self._templates.items():
            d = self._make_dir(controller, rel, files)
            if controller == "":
                if leaf:
                    _write(os.path.join(d, "cgroup.subtree_control"), "\n")
                if shares is not None:
                    _write(os.path.join(d, "cpu.weight"), f"{_weight_of_shares(shares)}\n")
            elif controller == "cpu" and shares is not None:
                _write(os.path.join(d, "cpu.shares"), f"{shares}\n")
        self._cgroups.add(rel)

    def add_pod(
        self, uid: str, kube_qos: KubeQOS, containers: Sequence[tuple[str, str]] = ()
    ) -> tuple[str, list[str]]:
        """Make a pod cgroup and its containers' (``(runtime, id)`` pairs, runtime one of
        ``containerd``, ``cri-o``, ``docker``), named as the kubelet and the runtime name them.

        BestEffort pods get ``cpu.shares`` 2 (v2: ``cpu.weight`` 1) as the kubelet sets. On
        systemd, a cri-o container also gets its ``crio-conmon-<id>.scope`` sibling, as cri-o
        makes it. Returns ``(pod_rel, [container_rel, ...])``.
        """
        shares = 2 if kube_qos is KubeQOS.BESTEFFORT else None
        pod_rel = self.layout.pod_dir(kube_qos, uid)
        self._create(pod_rel, leaf=False, shares=shares)
        rels = []
        for runtime, cid in containers:
            rel = self.layout.container_dir(pod_rel, runtime, cid)
            self._create(rel, leaf=True, shares=shares)
            if runtime == RUNTIME_CRIO and self.layout.driver is CgroupDriver.SYSTEMD:
                self._create(f"{pod_rel}/crio-conmon-{cid}.scope", leaf=True)
            rels.append(rel)
        return pod_rel, rels

    def add_host_app_cgroup(self, rel: str) -> str:
        """Make a cgroup for a host application (any relative path; parents are made)."""
        rel = rel.strip("/")
        self._create(rel, leaf=True)
        return rel

    def remove_cgroup(self, rel: str) -> None:
        """Remove a cgroup and everything below it, in every controller."""
        rel = rel.strip("/")
        for controller in self._templates:
            shutil.rmtree(self.layout.abs_dir(controller or "cpu", rel), ignore_errors=True)
        self._cgroups = {c for c in self._cgroups if c != rel and not c.startswith(rel + "/")}

    # cgroups: counters -------------------------------------------------------------------------

    def set_cpu_usage(self, rel: str, ns: int, *, system_ns: int | None = None) -> None:
        """Set a cgroup's cumulative CPU time: v1 ``cpuacct.usage`` (ns) and ``cpuacct.stat``
        (ticks), v2 ``usage_usec``/``user_usec``/``system_usec`` in ``cpu.stat``. The system
        part defaults to a quarter."""
        sys_ns = ns // 4 if system_ns is None else system_ns
        if self.version is CgroupVersion.V1:
            self.write("cpuacct", rel, "cpuacct.usage", ns)
            user, system = (ns - sys_ns) // _NS_PER_TICK, sys_ns // _NS_PER_TICK
            self._update_flat("cpuacct", rel, "cpuacct.stat", user=user, system=system)
        else:
            usec = {"usage_usec": ns, "user_usec": ns - sys_ns, "system_usec": sys_ns}
            self._update_flat("cpu", rel, "cpu.stat", **{k: v // 1000 for k, v in usec.items()})

    def set_throttle(
        self, rel: str, periods: int, throttled: int, *, throttled_ns: int | None = None
    ) -> None:
        """Set CFS bandwidth counters in ``cpu.stat``; ``throttled_ns`` None keeps the time."""
        values = {"nr_periods": periods, "nr_throttled": throttled}
        if throttled_ns is not None:
            if self.version is CgroupVersion.V1:
                values["throttled_time"] = throttled_ns
            else:
                values["throttled_usec"] = throttled_ns // 1000
        self._update_flat("cpu", rel, "cpu.stat", **values)

    def set_memory(
        self,
        rel: str,
        *,
        anon: int = 0,
        file: int | None = None,
        unevictable: int = 0,
        active_file: int | None = None,
        inactive_file: int | None = None,
        active_anon: int | None = None,
        usage: int | None = None,
    ) -> None:
        """Set a cgroup's memory in bytes, consistently across ``memory.stat``, the usage file
        (v1 ``memory.usage_in_bytes``, v2 ``memory.current``) and ``memory.numa_stat``.

        ``anon`` and ``file`` are what sits on the anon and file LRU lists; ``unevictable`` is
        the unevictable list, counted (as the kernel counts mlocked anon memory) inside v1
        ``rss`` and v2 ``anon``. So Koordinator's usage, ``active_anon + inactive_anon +
        unevictable``, reads ``anon + unevictable``. Splits default to halves; ``file`` defaults
        to ``active_file + inactive_file``; ``usage`` to ``anon + file + unevictable``. NUMA
        memory is spread evenly over the nodes.
        """
        if file is None:
            file = (active_file or 0) + (inactive_file or 0)
        if active_file is None:
            active_file = file // 2 if inactive_file is None else file - inactive_file
        if inactive_file is None:
            inactive_file = file - active_file
        if active_file + inactive_file != file or min(active_file, inactive_file) < 0:
            raise ValueError("active_file + inactive_file must equal file")
        if active_anon is None:
            active_anon = anon // 2
        if not 0 <= active_anon <= anon:
            raise ValueError("active_anon must lie within anon")
        lru = {"inactive_anon": anon - active_anon, "active_anon": active_anon}
        lru |= {"inactive_file": inactive_file, "active_file": active_file}
        lru["unevictable"] = unevictable
        usage = anon + file + unevictable if usage is None else usage
        n = self.numa_nodes
        if self.version is CgroupVersion.V1:
            stat = {"cache": file, "rss": anon + unevictable, **lru}
            stat.update({f"total_{k}": v for k, v in list(stat.items())})
            self._update_flat("memory", rel, "memory.stat", **stat)
            self.write("memory", rel, "memory.usage_in_bytes", usage)
            # The kernel's numa_stat groups (memcg_numa_stat_show): "anon" is the two anon LRU
            # lists only, the unevictable list has its own line, "total" is all four.
            sums = {"total": anon + file + unevictable, "file": file, "anon": anon}
            sums["unevictable"] = unevictable
            pages = {k: [b // PAGE for b in _split(v, n)] for k, v in sums.items()}
            pages.update({f"hierarchical_{k}": v for k, v in list(pages.items())})
            self.write("memory", rel, "memory.numa_stat", self._numa(pages))
        else:
            stat = {"anon": anon + unevictable, "file": file, **lru}
            self._update_flat("memory", rel, "memory.stat", **stat)
            self.write("memory", rel, "memory.current", usage)
            numa = self._numa({k: _split(v, n) for k, v in stat.items()})
            self.write("memory", rel, "memory.numa_stat", numa)
