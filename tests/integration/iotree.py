"""Real host pieces for the I/O QoS tests, each undone even on failure: a kubepods-shaped tree
under a unique prefix in the v1 controllers a test names, a loop device over a file of the test's
own, a private ``net_cls`` mount, and two network namespaces joined by a veth pair.

:class:`Undo` records what was made and undoes it in reverse order; every helper registers its
own cleanup before it can fail half-way. Nothing here touches a device, mount or interface the
test did not create.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from apis.extension import KubeQOS
from koordlet.system.cgroups import CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths

T = TypeVar("T")
CLONE_NEWNET = 0x40000000


@dataclass
class Undo:
    """Cleanups in creation order; :meth:`run` calls them newest first and never stops early."""

    steps: list[tuple[str, Callable[[], object]]] = field(default_factory=list)

    def add(self, what: str, fn: Callable[[], object]) -> None:
        self.steps.append((what, fn))

    def run(self) -> list[str]:
        failed = []
        while self.steps:
            what, fn = self.steps.pop()
            try:
                fn()
            except Exception as err:  # keep undoing the rest
                failed.append(f"{what}: {err}")
        return failed


def run(*cmd: str) -> str:
    """Run a command of ours, failing loudly with its output."""
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def rmdir_retry(path: str) -> None:
    for _ in range(50):  # a killed task leaves its cgroup asynchronously
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
        else:
            return
    os.rmdir(path)


@dataclass
class PodTree:
    """``kpytest-<hex>/kubepods/{burstable,besteffort}/pod<uid>/<container>`` under each of
    ``controllers`` of ``paths.cgroup_root`` (v1)."""

    host: Host
    prefix: str
    controllers: Sequence[str]
    undo: Undo
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    @classmethod
    def create(cls, paths: HostPaths, controllers: Sequence[str], undo: Undo) -> PodTree:
        prefix = f"kpytest-{secrets.token_hex(6)}"
        layout = detect_layout(
            paths, version=CgroupVersion.V1, driver=CgroupDriver.CGROUPFS,
            kube_path=f"{prefix}/kubepods/",
        )  # fmt: skip
        tree = cls(Host(paths, layout), prefix, controllers, undo)
        for rel in (
            prefix,
            layout.kube_root,
            layout.qos_dir(KubeQOS.BURSTABLE),
            layout.qos_dir(KubeQOS.BESTEFFORT),
        ):
            tree.mkdir(rel)
        return tree

    def mkdir(self, rel: str) -> None:
        for controller in self.controllers:
            path = self.host.layout.abs_dir(controller, rel)
            os.mkdir(path)
            self.undo.add(f"rmdir {path}", lambda p=path: rmdir_retry(p))
            if controller == "cpuset":  # a new v1 cpuset is empty until told; copy the parent's
                for name in ("cpuset.cpus", "cpuset.mems"):
                    parent = Path(path).parent / name
                    (Path(path) / name).write_text(parent.read_text().strip())

    def add_pod(self, kube_qos: KubeQOS) -> tuple[str, str, str]:
        """A pod with one container: ``(uid, pod_rel, container_rel)``."""
        uid = str(uuid.uuid4())
        pod = self.host.layout.pod_dir(kube_qos, uid)
        container = self.host.layout.container_dir(pod, "containerd", secrets.token_hex(32))
        self.mkdir(pod)
        self.mkdir(container)
        return uid, pod, container

    def read(self, controller: str, rel: str, name: str) -> str:
        return Path(self.host.layout.file(controller, rel, name)).read_text()

    def start(
        self, rel: str, code: str, *argv: str, prefix: Sequence[str] = ()
    ) -> subprocess.Popen[str]:
        """A Python process of ours moved into cgroup ``rel`` before it goes on (it must read
        one line from stdin first): :func:`go` lets it run. ``prefix`` runs it through a command
        that execs it in place (``nsenter --net=...``), so the pid is the process's own."""
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-c", code, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        self.undo.add(f"kill {proc.pid}", lambda: kill(proc))
        for controller in self.controllers:
            Path(self.host.layout.file(controller, rel, "cgroup.procs")).write_text(str(proc.pid))
        return proc


def go(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


def kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def loop_device(backing: Path, size: int, undo: Undo) -> str:
    """A loop device over a new file ``backing`` of ``size`` bytes: ``/dev/loopN``."""
    with open(backing, "wb") as f:
        f.truncate(size)
    device = run("losetup", "--find", "--show", str(backing)).strip()
    undo.add(f"losetup -d {device}", lambda: run("losetup", "-d", device))
    return device


def cgroup_root_with_net_cls(base: Path, undo: Undo, real: HostPaths) -> HostPaths:
    """A cgroup root of the test's own: symlinks to this host's v1 hierarchies, plus a private
    mount of the ``net_cls`` controller (the same hierarchy when the host has one mounted)."""
    root = base / "cgroup"
    root.mkdir()
    for name in sorted(os.listdir(real.cgroup_root)):
        src = Path(real.cgroup(name))
        if src.is_dir() and not src.is_symlink() and name not in ("net_cls", "unified", "systemd"):
            (root / name).symlink_to(src)
    mnt = root / "net_cls"
    mnt.mkdir()
    run(
        "mount",
        "-t",
        "cgroup",
        "-o",
        "net_cls",
        f"kpytest-net_cls-{secrets.token_hex(3)}",
        str(mnt),
    )
    undo.add(f"umount {mnt}", lambda: run("umount", str(mnt)))
    return HostPaths(str(root), real.proc_root, real.sys_root)


@dataclass(frozen=True)
class VethPair:
    """Namespaces ``a`` (the node: a default route over its end) and ``b`` (the peer)."""

    a: str
    b: str
    a_if: str
    b_if: str
    a_ip: str
    b_ip: str


def veth_namespaces(undo: Undo) -> VethPair:
    tag = secrets.token_hex(3)
    pair = VethPair(
        f"kpt-a-{tag}", f"kpt-b-{tag}", f"kpa{tag}", f"kpb{tag}", "10.231.7.1", "10.231.7.2"
    )
    for ns in (pair.a, pair.b):
        run("ip", "netns", "add", ns)
        undo.add(f"ip netns del {ns}", lambda ns=ns: run("ip", "netns", "del", ns))
    run("ip", "link", "add", pair.a_if, "netns", pair.a, "type", "veth", "peer", "name", pair.b_if,
        "netns", pair.b)  # fmt: skip
    for ns, ifname, ip in ((pair.a, pair.a_if, pair.a_ip), (pair.b, pair.b_if, pair.b_ip)):
        run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", ifname)
        run("ip", "-n", ns, "link", "set", ifname, "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
    run("ip", "-n", pair.a, "route", "add", "default", "via", pair.b_ip, "dev", pair.a_if)
    return pair


def in_netns(ns: str, fn: Callable[[], T]) -> T:
    """``fn()`` on a thread of its own that first joins network namespace ``ns`` (setns(2)
    changes the calling thread only), so this process's other threads stay where they are."""
    box: dict[str, object] = {}

    def body() -> None:
        try:
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as err:  # handed to the caller
            box["error"] = err

    thread = threading.Thread(target=body, name=f"netns-{ns}")
    thread.start()
    thread.join(timeout=60)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def tools_missing(*names: str) -> str:
    """Why the tools are not all on PATH, or empty."""
    missing = [n for n in names if shutil.which(n) is None]
    return f"needs {', '.join(missing)}" if missing else ""
