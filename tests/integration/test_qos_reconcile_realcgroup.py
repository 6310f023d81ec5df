"""Cgroup QoS reconcile on this machine's real cgroup v1 hierarchy: an LSR pod's cpuset from its
annotation reaches the kernel (the CPUs a process in it may run on), a shift of that cpuset
passes the kernel's subset checks in the leveled order, and BE's CPU QoS lands on the besteffort
cgroup (``cpu.idle`` where the kernel has it, else the minimum shares).

Each test builds its own ``kpytest-<hex>/kubepods`` tree in the cpu, cpuset and memory
hierarchies, starts only ``sleep`` processes of its own, kills them and removes the tree in a
``finally``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pytest

from apis.extension import KubeQOS, QoSClass
from koordlet.collectors.nodeinfo import node_info_dict
from koordlet.executor import CgroupWriter
from koordlet.features import FeatureGates
from koordlet.metriccache.store import MetricCache
from koordlet.qos.cgplan import MECH_CPU_IDLE, MECH_SHARES
from koordlet.qos.cgreconcile import CgroupReconcile
from koordlet.qos.framework import QoSBook, StrategyContext
from koordlet.statesinformer.model import ContainerInfo, PodInfo, WorkloadSnapshot
from koordlet.system.cgroups import CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths
from koordlet.system.probe import probe_capabilities
from koordlet.system.topology import read_cpu_topology
from tests.strategyrig import config, in_force

PATHS = HostPaths()
CONTROLLERS = ("cpu", "cpuset", "memory")
STATUS = "scheduling.koordinator.sh/resource-status"

pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create cgroups"),
    pytest.mark.skipif(
        not all(os.path.isfile(PATHS.cgroup(c, "tasks")) for c in CONTROLLERS),
        reason="needs the cgroup v1 cpu, cpuset and memory hierarchies",
    ),
]

HOOKS_OFF = FeatureGates({"GroupIdentity": False, "CPUSetAllocator": False})
"""The runtime hooks that own pods' group identity and cpusets while their gates are on are off:
this strategy writes those too (docs/runtimehooks.md, "Who writes what")."""


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


@dataclass
class Tree:
    """A kubepods-shaped tree of real cgroups and the processes started in it."""

    host: Host
    made: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def mkdir(self, rel: str) -> str:
        """Make ``rel`` in every controller; cpuset gets its parent's CPUs and nodes, as the
        kubelet and runc give them (a v1 cpuset starts empty)."""
        for controller in CONTROLLERS:
            path = self.host.layout.abs_dir(controller, rel)
            os.mkdir(path)
            self.made.append(path)
            if controller == "cpuset":
                parent = os.path.dirname(path)
                for name in ("cpuset.mems", "cpuset.cpus"):
                    _write(os.path.join(path, name), _read(os.path.join(parent, name)))
        return rel

    def start_sleep(self, rel: str) -> int:
        """A ``sleep`` process moved into cgroup ``rel`` of every controller; its pid."""
        proc = subprocess.Popen(["sleep", "300"])
        self.procs.append(proc)
        for controller in CONTROLLERS:
            _write(self.host.layout.file(controller, rel, "cgroup.procs"), str(proc.pid))
        return proc.pid

    def cleanup(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(timeout=10)
        for path in reversed(self.made):
            deadline = time.monotonic() + 5
            while os.path.isdir(path):
                try:
                    os.rmdir(path)
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)


@pytest.fixture
def tree() -> Iterator[Tree]:
    prefix = f"kpytest-{secrets.token_hex(6)}"
    layout = detect_layout(
        PATHS,
        version=CgroupVersion.V1,
        driver=CgroupDriver.CGROUPFS,
        kube_path=f"{prefix}/kubepods/",
    )
    t = Tree(Host(PATHS, layout))
    try:
        t.mkdir(prefix)
        t.mkdir(layout.kube_root)
        t.mkdir(layout.qos_dir(KubeQOS.BURSTABLE))
        t.mkdir(layout.qos_dir(KubeQOS.BESTEFFORT))
        yield t
    finally:
        t.cleanup()


def _pod(t: Tree, name: str, qos: QoSClass, kube_qos: KubeQOS, cpus: str = "") -> PodInfo:
    uid = secrets.token_hex(16)
    rel = t.mkdir(t.host.layout.pod_dir(kube_qos, uid))
    cid = secrets.token_hex(32)
    crel = t.mkdir(t.host.layout.container_dir(rel, "containerd", cid))
    annotations = {STATUS: json.dumps({"cpuset": cpus})} if cpus else {}
    container = ContainerInfo(cid, "main", "containerd", crel)
    return PodInfo(uid, name, "default", qos, kube_qos, rel, (container,), annotations=annotations)


def _rig(t: Tree, pods: list[PodInfo], raw: dict[str, Any]) -> SimpleNamespace:
    cache = MetricCache()
    cache.set_info("node_info", node_info_dict(read_cpu_topology(PATHS)))
    box: dict[str, Any] = {"pods": pods, "raw": raw}
    book = QoSBook()
    writer = CgroupWriter(t.host)
    ctx = StrategyContext(
        host=lambda: t.host,
        config=config(HOOKS_OFF),
        cache=cache,
        executor=writer,
        workloads=lambda: WorkloadSnapshot(pods={p.uid: p for p in box["pods"]}),
        node_slo=lambda: in_force(resourceQOSStrategy=box["raw"]),
        capabilities=probe_capabilities(t.host),
        book=book,
    )
    return SimpleNamespace(box=box, book=book, writer=writer, strategy=CgroupReconcile(ctx))


def _allowed_cpus(pid: int) -> str:
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no Cpus_allowed_list")


def _online() -> list[int]:
    return list(read_cpu_topology(PATHS).cpu_ids)


@pytest.mark.skipif(len(_online()) < 2, reason="needs two online CPUs")
async def test_an_lsr_pods_cpuset_reaches_its_process_and_shifts_in_leveled_order(
    tree: Tree,
) -> None:
    first, second = _online()[0], _online()[1]
    lsr = _pod(tree, "lsr", QoSClass.LSR, KubeQOS.GUARANTEED, cpus=str(second))
    ls = _pod(tree, "ls", QoSClass.LS, KubeQOS.BURSTABLE)
    pid = tree.start_sleep(lsr.containers[0].cgroup_dir)
    rig = _rig(tree, [lsr, ls], {})
    rig.writer.start()
    try:
        await rig.strategy.reconcile()
        layout = tree.host.layout
        assert _read(layout.file("cpuset", lsr.cgroup_dir, "cpuset.cpus")) == str(second)
        assert _allowed_cpus(pid) == str(second)  # the kernel moved the process
        assert _read(layout.file("cpu", lsr.containers[0].cgroup_dir, "cpu.cfs_quota_us")) == "-1"
        # LS share pool: every online CPU but the LSR pod's
        pool = ",".join(str(c) for c in _online() if c != second)
        assert _read(layout.file("cpuset", ls.containers[0].cgroup_dir, "cpuset.cpus")) == pool
        # the scheduler moves the pod to another CPU: pod {second} -> {first} needs the pod to
        # grow before its container shrinks, or the kernel refuses (EBUSY/EINVAL)
        rig.box["pods"] = [
            replace(lsr, annotations={STATUS: json.dumps({"cpuset": str(first)})}),
            ls,
        ]
        await rig.strategy.reconcile()
        report = rig.book.last_report("cgreconcile")
        assert report is not None
        assert report.detail["errors"] == []
        assert _read(layout.file("cpuset", lsr.cgroup_dir, "cpuset.cpus")) == str(first)
        assert _allowed_cpus(pid) == str(first)
    finally:
        rig.writer.stop()


async def test_be_cpu_qos_lands_on_the_besteffort_cgroup(tree: Tree) -> None:
    be = _pod(tree, "be", QoSClass.BE, KubeQOS.BESTEFFORT)
    tree.start_sleep(be.containers[0].cgroup_dir)
    rig = _rig(tree, [be], {"beClass": {"cpuQOS": {"enable": True}}})
    rig.writer.start()
    try:
        await rig.strategy.reconcile()
        report = rig.book.last_report("cgreconcile")
        assert report is not None
        be_dir = tree.host.layout.qos_dir(KubeQOS.BESTEFFORT)
        idle_file = tree.host.layout.file("cpu", be_dir, "cpu.idle")
        if "cpu_idle" not in report.detail["unsupported"]:
            assert report.inputs["cpu_mechanism"] == MECH_CPU_IDLE
            assert _read(idle_file) == "1"
            rig.box["raw"] = {}  # BE CPU QoS off: SCHED_IDLE undone
            await rig.strategy.reconcile()
            assert _read(idle_file) == "0"
        else:
            assert report.inputs["cpu_mechanism"] == MECH_SHARES
            assert _read(tree.host.layout.file("cpu", be_dir, "cpu.shares")) == "2"
        assert "cpu_bvt_warp_ns" in report.detail["unsupported"]  # a mainline kernel
    finally:
        rig.writer.stop()
