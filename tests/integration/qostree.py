"""A kubepods-shaped tree on this machine's real cgroup v1, with busy loops in it, for QoS tests.

``QoSTree`` makes ``kpytest-<hex>/kubepods/{burstable,besteffort}/pod<uid>/<container id>``
under the cpu, cpuacct, cpuset and memory hierarchies (v1 cpusets copied from the parent, the
besteffort cgroup at ``cpu.shares`` 2 as the kubelet sets it), starts processes in containers,
and in :meth:`QoSTree.cleanup` kills exactly the processes it started and removes its cgroups,
children first. :class:`SuppressRig` wires the real collectors, a metric cache, a writer and the
``cpusuppress`` strategy over such a tree, so that a test or a benchmark runs rounds as the
daemon would, without a daemon.

Used by ``tests/integration/test_qos_suppress_realcgroup.py`` and ``bench/reaction.py``; other
QoS tests may import it (``from tests.integration.qostree import QoSTree``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from apis.extension import KubeQOS
from koordlet.collectors.framework import CollectorContext
from koordlet.collectors.nodeinfo import node_info_dict
from koordlet.collectors.runner import CollectorRunner
from koordlet.collectors.table import build_collectors
from koordlet.config import KoordletConfig
from koordlet.executor import CgroupWriter, WriteResult
from koordlet.executor.audit import AuditLog
from koordlet.metriccache import MetricCache
from koordlet.qos.cpusuppress import CPUSuppress
from koordlet.qos.framework import QoSBook, StrategyContext
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import PodInfo, WorkloadSnapshot
from koordlet.system.cgroups import CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths
from koordlet.system.topology import read_cpu_topology
from tests.strategyrig import config, in_force

PATHS = HostPaths()
CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")
BUSY = "while True: pass"


def real_cgroup_v1_available() -> bool:
    """Root, and the v1 cpu, cpuacct, cpuset and memory hierarchies mounted."""
    return os.geteuid() == 0 and all(os.path.isfile(PATHS.cgroup(c, "tasks")) for c in CONTROLLERS)


@dataclass
class QoSTree:
    """The cgroups and processes made, for :meth:`cleanup`."""

    host: Host
    prefix: str
    made: list[str] = field(default_factory=list)
    """Absolute directories in creation order (parents first)."""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def create(cls) -> QoSTree:
        prefix = f"kpytest-{secrets.token_hex(6)}"
        layout = detect_layout(
            PATHS, version=CgroupVersion.V1, driver=CgroupDriver.CGROUPFS,
            kube_path=f"{prefix}/kubepods/",
        )  # fmt: skip
        tree = cls(Host(PATHS, layout), prefix)
        try:
            tree.mkdir(prefix)
            tree.mkdir(layout.kube_root)
            tree.mkdir(layout.qos_dir(KubeQOS.BURSTABLE))
            tree.mkdir(layout.qos_dir(KubeQOS.BESTEFFORT))
            tree.write("cpu", layout.qos_dir(KubeQOS.BESTEFFORT), "cpu.shares", "2")
        except BaseException:
            tree.cleanup()
            raise
        return tree

    @property
    def be_dir(self) -> str:
        return self.host.layout.qos_dir(KubeQOS.BESTEFFORT)

    def mkdir(self, rel: str) -> None:
        for controller in CONTROLLERS:
            path = self.host.layout.abs_dir(controller, rel)
            os.mkdir(path)
            self.made.append(path)
            if controller == "cpuset":  # a new v1 cpuset is empty until told: copy the parent
                parent = os.path.dirname(path)
                for name in ("cpuset.mems", "cpuset.cpus"):
                    with open(os.path.join(parent, name)) as src:
                        value = src.read().strip()
                    with open(os.path.join(path, name), "w") as dst:
                        dst.write(value)

    def write(self, controller: str, rel: str, name: str, value: str) -> None:
        with open(self.host.layout.file(controller, rel, name), "w") as f:
            f.write(value)

    def read(self, controller: str, rel: str, name: str) -> str:
        with open(self.host.layout.file(controller, rel, name)) as f:
            return f.read()

    def add_pod(self, kube_qos: KubeQOS) -> tuple[str, str, str]:
        """A pod with one container: ``(uid, pod_rel, container_rel)``."""
        layout = self.host.layout
        uid = str(uuid.uuid4())
        pod = layout.pod_dir(kube_qos, uid)
        container = layout.container_dir(pod, "containerd", secrets.token_hex(32))
        self.mkdir(pod)
        self.mkdir(container)
        if kube_qos is KubeQOS.BESTEFFORT:
            self.write("cpu", pod, "cpu.shares", "2")
            self.write("cpu", container, "cpu.shares", "2")
        return uid, pod, container

    def start_busy(self, rel: str, count: int) -> list[subprocess.Popen[bytes]]:
        """``count`` busy loops, each moved into cgroup ``rel`` before it spins."""
        started = []
        for _ in range(count):
            proc = subprocess.Popen(
                [sys.executable, "-c", f"import sys; sys.stdin.readline()\n{BUSY}"],
                stdin=subprocess.PIPE,
            )
            self.procs.append(proc)
            for controller in CONTROLLERS:
                self.write(controller, rel, "cgroup.procs", str(proc.pid))
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            started.append(proc)
        return started

    def stop(self, procs: list[subprocess.Popen[bytes]]) -> None:
        """Kill these processes (ours) and reap them."""
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            if proc.stdin is not None:
                proc.stdin.close()

    def cpu_stat(self, rel: str) -> dict[str, int]:
        return {
            k: int(v)
            for k, v in (ln.split() for ln in self.read("cpu", rel, "cpu.stat").splitlines())
        }

    def cpuacct_ns(self, rel: str) -> int:
        return int(self.read("cpuacct", rel, "cpuacct.usage"))

    def cleanup(self) -> None:
        self.stop(self.procs)
        for path in reversed(self.made):
            for _ in range(50):  # a killed task leaves its cgroup asynchronously
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


@contextlib.contextmanager
def qos_tree(*, check_removed: bool = True) -> Iterator[QoSTree]:
    """A :class:`QoSTree` for one test, removed afterwards even on failure; with
    ``check_removed``, a cgroup left behind fails the test."""
    made = QoSTree.create()
    try:
        yield made
    finally:
        made.cleanup()
        if check_removed:
            assert not any(os.path.exists(p) for p in made.made), "test cgroups left behind"


class SuppressRig:
    """Real collectors + metric cache + writer + ``cpusuppress`` over a :class:`QoSTree`."""

    def __init__(self, tree: QoSTree, slo: dict[str, Any]) -> None:
        self.tree = tree
        self.slo = slo
        """``resourceUsedThresholdWithBE``, read afresh every round (tests change it)."""
        self.cache = MetricCache()
        self.cache.set_info("node_info", node_info_dict(read_cpu_topology(PATHS)))
        self.writes: list[tuple[float, WriteResult]] = []
        """``(time.monotonic(), result)`` of every write that changed a file."""
        self.audit = AuditLog(None)
        """The audit ring (no file): every change the writer made, as the daemon records it."""
        self.writer = CgroupWriter(tree.host, on_change=self._changed)
        self.snapshot = WorkloadSnapshot()
        self.extra_pods: dict[str, PodInfo] = {}
        """Pods added to the kubepods walk's (an LSE pod with a cpuset annotation...)."""
        self.node: dict[str, Any] | None = None
        """The Node object the strategy sees (reservation); None: standalone."""
        self.book = QoSBook()
        """The strategy's reports (what ``/debug/qos`` serves)."""
        self.runner = CollectorRunner(
            build_collectors(
                CollectorContext(host=tree.host, config=KoordletConfig(node_name="test"))
            ),
            self.cache,
            lambda: self.snapshot,
        )
        ctx = StrategyContext(
            host=lambda: tree.host,
            config=config(),
            cache=self.cache,
            executor=self.writer,
            workloads=lambda: self.snapshot,
            node_slo=lambda: in_force(resourceUsedThresholdWithBE=dict(self.slo)),
            audit=self.audit,
            book=self.book,
        )
        self.strategy = CPUSuppress(ctx, node=lambda: self.node)

    def _changed(self, result: WriteResult) -> None:
        self.writes.append((time.monotonic(), result))
        self.audit.on_write(result)

    def refresh_pods(self) -> None:
        pods = {**KubepodsSource(self.tree.host).list_pods(), **self.extra_pods}
        self.snapshot = WorkloadSnapshot(pods=pods, generation=1, taken_at=time.time())

    def collect(self) -> None:
        """One collector tick, stored in the cache (synchronous, as the daemon's worker)."""
        self.runner.apply(self.runner.run_tick(time.time()))

    async def round(self) -> None:
        """One collector tick, then one strategy round."""
        self.collect()
        await self.strategy.reconcile()
