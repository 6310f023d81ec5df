"""Kubepods-shaped cgroup trees for the benchmarks: a fake one on tmpfs, or real cgroup v1.

Both shapes hold ``pods`` pods of ``containers`` containers each, in a fixed QoS mix (a quarter
BestEffort, a quarter Guaranteed, the rest Burstable), named as the kubelet and containerd name
them for the chosen driver, so the real ``KubepodsSource`` finds them and every collector of the
table has something to read (the BE collector needs BestEffort containers, the QoS collectors
their QoS folders).

- :func:`fake_tree`: ``tests.fakehost.FakeHost`` (kernel file formats from ``tests/golden``) on
  ``/dev/shm``, with non-zero CPU and memory counters in every pod and container (and, on
  cgroup v2, PSI files in each). Needs the
  repository checkout on ``sys.path`` (run the benches from its root, as ``python -m bench.X``).
- :func:`real_tree`: folders under this machine's cgroup v1 ``cpu``, ``cpuacct``, ``cpuset`` and
  ``memory`` hierarchies below a unique prefix ``kpytest-bench-<hex>/kubepods/``; no processes
  (the kernel's files are real, the counters zero). Always removed, children first, when the
  context exits, including on Ctrl-C or SIGTERM (see :func:`exit_on_sigterm`).

Each yields a :class:`BenchTree`: the ``Host`` to collect from and the koordlet flags that point a
daemon at the same tree.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from apis.extension import KubeQOS
from koordlet.system.cgroups import CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths

REAL_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")
"""The v1 controllers the collectors read; a real tree is made in each of them."""
PREFIX = "kpytest-bench-"
"""Start of the unique top folder of a real tree (and of a fake tree's temporary folder)."""
MiB = 1 << 20
_SHM = Path("/dev/shm")
_RMDIR_TRIES = 50
"""Attempts per folder (0.1 s apart): a memory cgroup may stay busy briefly after its last use."""


@dataclass
class BenchTree:
    """A tree of pods to collect from; see the module docstring."""

    kind: str
    """``fake-v1``, ``fake-v2`` or ``real-cgroup-v1``."""
    host: Host
    """Paths and cgroup layout of the tree."""
    pods: int
    """Pods in the tree."""
    containers: int
    """Containers per pod."""
    daemon_args: list[str] = field(default_factory=list)
    """``koordlet`` flags that make a daemon see exactly this tree (roots, version, driver,
    kubepods path)."""
    cgroups: int = 0
    """Pod and container cgroups made (per controller on v1)."""
    kube_path: str = "kubepods/"
    """The kubepods folder below each controller root (``--cgroup-kube-path``)."""

    @property
    def kernel_roots(self) -> tuple[str, ...]:
        """The tree's cgroup and procfs roots, each ending in ``/``: where the daemon's tick
        reads."""
        paths = self.host.paths
        return tuple(root.rstrip("/") + "/" for root in (paths.cgroup_root, paths.proc_root))


def qos_of(index: int) -> KubeQOS:
    """The Kubernetes QoS of pod number ``index``: BestEffort, Guaranteed, Burstable, Burstable."""
    return (KubeQOS.BESTEFFORT, KubeQOS.GUARANTEED, KubeQOS.BURSTABLE, KubeQOS.BURSTABLE)[index % 4]


def pod_uid(index: int) -> str:
    """A deterministic UUID for pod number ``index``."""
    return str(uuid.UUID(int=(0x5BE4C << 96) | index, version=4))


def container_id(pod: int, container: int) -> str:
    """A 64-hex runtime id, unique per (pod, container)."""
    return f"{pod:08x}{container:04x}".ljust(64, "c")


# Fake ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def fake_tree(
    pods: int,
    containers: int = 3,
    *,
    version: CgroupVersion = CgroupVersion.V1,
    driver: CgroupDriver = CgroupDriver.CGROUPFS,
) -> Iterator[BenchTree]:
    """A FakeHost with ``pods`` pods on tmpfs (``/dev/shm`` when writable); removed afterwards."""
    try:
        from tests.fakehost import FakeHost
    except ImportError as err:  # the fake host lives with the tests, not in the package
        raise SystemExit(
            f"the fake tree needs tests.fakehost from the repository checkout ({err}); "
            "run the bench from the repository root"
        ) from err
    base = str(_SHM) if _SHM.is_dir() and os.access(_SHM, os.W_OK) else None
    root = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base))
    try:
        fake = FakeHost(root, version, driver, ncpus=os.cpu_count() or 2)
        made = 0
        for p in range(pods):
            runtimes = [("containerd", container_id(p, c)) for c in range(containers)]
            pod_rel, ctr_rels = fake.add_pod(pod_uid(p), qos_of(p), runtimes)
            for c, rel in enumerate(ctr_rels):
                fake.set_cpu_usage(rel, (p * 7 + c + 1) * 10**9)
                fake.set_memory(rel, anon=(40 + c) * MiB, file=(10 + p % 7) * MiB)
            if version is CgroupVersion.V2:  # v2 cgroups have PSI files (v1 ones have none)
                for rel in (pod_rel, *ctr_rels):
                    for res in ("cpu", "memory", "io"):
                        fake.set_pressure(res, 1000 * (p + 1), 10 * p, some_avg10=0.5, rel=rel)
            fake.set_cpu_usage(pod_rel, sum((p * 7 + c + 1) * 10**9 for c in range(containers)))
            fake.set_memory(
                pod_rel,
                anon=sum((40 + c) * MiB for c in range(containers)),
                file=containers * (10 + p % 7) * MiB,
            )
            made += 1 + containers
        args = [
            *("--cgroup-root-dir", fake.paths.cgroup_root),
            *("--proc-root-dir", fake.paths.proc_root),
            *("--sys-root-dir", fake.paths.sys_root),
            *("--cgroup-version", str(version), "--cgroup-driver", str(driver)),
        ]
        yield BenchTree(f"fake-{version}", fake.host, pods, containers, args, made)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# Real ------------------------------------------------------------------------------------------


def real_cgroups_available(paths: HostPaths | None = None) -> str | None:
    """None when a real tree can be made here; else why not."""
    paths = paths or HostPaths()
    if os.geteuid() != 0:
        return "not root"
    missing = [c for c in REAL_CONTROLLERS if not os.path.isfile(paths.cgroup(c, "tasks"))]
    if missing:
        return f"no writable cgroup v1 hierarchy for {', '.join(missing)} under {paths.cgroup_root}"
    return None


class _RealBuilder:
    """Makes folders in every controller, parents first, and removes exactly its own tree."""

    def __init__(self, host: Host, top: str) -> None:
        self.host = host
        self.top = top
        self.started = False

    def mkdir(self, rel: str) -> None:
        layout = self.host.layout
        for controller in REAL_CONTROLLERS:
            path = layout.abs_dir(controller, rel)
            os.mkdir(path)
            self.started = True
            if controller == "cpuset":  # a new v1 cpuset is empty until told: copy the parent's
                parent = os.path.dirname(path)
                for name in ("cpuset.cpus", "cpuset.mems"):
                    with open(os.path.join(parent, name)) as src:
                        value = src.read().strip()
                    with open(os.path.join(path, name), "w") as dst:
                        dst.write(value)

    def remove(self) -> list[str]:
        """Remove every folder under the top folder, deepest first; returns what is left."""
        left: list[str] = []
        for controller in REAL_CONTROLLERS:
            top = self.host.layout.abs_dir(controller, self.top)
            if not os.path.isdir(top):
                continue
            deepest_first = sorted((d for d, _, _ in os.walk(top)), key=lambda d: -d.count("/"))
            left.extend(path for path in deepest_first if not _rmdir(path))
        return left


def _rmdir(path: str) -> bool:
    for _ in range(_RMDIR_TRIES):
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return True
        except OSError as err:
            if err.errno not in (errno.EBUSY, errno.EAGAIN):
                return False
            time.sleep(0.1)
        else:
            return True
    return False


@contextlib.contextmanager
def real_tree(
    pods: int,
    containers: int = 3,
    *,
    driver: CgroupDriver = CgroupDriver.CGROUPFS,
    uids: Sequence[str] = (),
) -> Iterator[BenchTree]:
    """Pods in this machine's cgroup v1 hierarchies under ``kpytest-bench-<hex>/kubepods/``;
    pod number ``i`` has the UID ``uids[i]`` when given (the API server's, for a cluster-mode
    run), else :func:`pod_uid`.

    Raises ``SystemExit`` with the reason when the host cannot have one. The tree is removed
    when the context exits, however it exits; what could not be removed is named on stderr.
    """
    if uids and len(uids) != pods:
        raise ValueError(f"{len(uids)} UIDs for {pods} pods")
    paths = HostPaths()
    why = real_cgroups_available(paths)
    if why is not None:
        raise SystemExit(f"cannot build a real cgroup tree: {why}")
    top = PREFIX + secrets.token_hex(6)
    kube_path = f"{top}/kubepods/"
    layout = detect_layout(paths, version=CgroupVersion.V1, driver=driver, kube_path=kube_path)
    host = Host(paths, layout)
    builder = _RealBuilder(host, top)
    try:
        builder.mkdir(top)
        builder.mkdir(layout.kube_root)
        for qos in (KubeQOS.BURSTABLE, KubeQOS.BESTEFFORT):
            builder.mkdir(layout.qos_dir(qos))
        made = 0
        for p in range(pods):
            pod_rel = layout.pod_dir(qos_of(p), uids[p] if uids else pod_uid(p))
            builder.mkdir(pod_rel)
            for c in range(containers):
                builder.mkdir(layout.container_dir(pod_rel, "containerd", container_id(p, c)))
            made += 1 + containers
        args = [
            *("--cgroup-root-dir", paths.cgroup_root),
            *("--proc-root-dir", paths.proc_root),
            *("--sys-root-dir", paths.sys_root),
            *("--cgroup-version", "v1", "--cgroup-driver", str(driver)),
            *("--cgroup-kube-path", kube_path),
        ]
        yield BenchTree("real-cgroup-v1", host, pods, containers, args, made, kube_path)
    finally:
        if builder.started:
            left = builder.remove()
            if left:
                print(f"bench: could not remove {len(left)} cgroups: {left[:5]}", flush=True)


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit`` for the duration, so that ``finally`` blocks (tree
    removal, killing the daemon) run when the bench is terminated."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
