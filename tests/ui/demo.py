"""A fake node whose pods use CPU and memory that change over time, and the real ``koordlet``
process started on it: what the UI tests (and the screenshot in docs/) look at.

:class:`DemoNode` keeps each pod's cumulative counters and :meth:`DemoNode.advance` adds what
``dt`` seconds of its current rate use, so the daemon's collectors see moving, consistent
numbers: the node's /proc/stat busy time is the pods' sum plus the system's.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from apis.extension import KubeQOS
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from tests.daemon import free_port
from tests.fakehost import FakeHost, container_id

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "koordlet"
USER_HZ = 100
MiB = 1 << 20


@dataclass
class _Pod:
    uid: str
    name: str
    qos: KubeQOS
    rel: str
    ctr: str
    cores: float
    """Average cores the pod uses; the rate swings around it."""
    phase: float
    ns: int = 0


class DemoNode:
    """A :class:`FakeHost` (cgroup v1, cgroupfs, ``ncpus`` CPUs) with ``pods`` pods: a quarter
    BestEffort, a quarter Guaranteed, the rest Burstable."""

    def __init__(self, root: Path, pods: int = 12, ncpus: int = 8) -> None:
        self.fake = FakeHost(root, CgroupVersion.V1, CgroupDriver.CGROUPFS, ncpus=ncpus)
        self.ncpus = ncpus
        self.pods: list[_Pod] = []
        kinds = (KubeQOS.BESTEFFORT, KubeQOS.GUARANTEED, KubeQOS.BURSTABLE, KubeQOS.BURSTABLE)
        for i in range(pods):
            qos = kinds[i % 4]
            uid = f"de30de30-0000-4000-8000-{i:012x}"
            rel, (ctr,) = self.fake.add_pod(uid, qos, [("containerd", container_id(("demo", i)))])
            cores = {KubeQOS.BESTEFFORT: 0.7, KubeQOS.GUARANTEED: 0.5}.get(qos, 0.3)
            self.pods.append(_Pod(uid, f"pod-{i}", qos, rel, ctr, cores, phase=i * 0.9))
        self.t = 0.0
        self._ticks = 0.0  # busy and idle ticks owed to /proc/stat (it counts whole ticks)
        self._idle = 0.0
        self.advance(0.0)

    def rate(self, pod: _Pod) -> float:
        """Cores the pod uses at the demo's time ``t``."""
        return pod.cores * (1.0 + 0.6 * math.sin(self.t / 20.0 + pod.phase))

    def advance(self, dt: float) -> None:
        """``dt`` more seconds of CPU time at the current rates, and memory that follows them."""
        self.t += dt
        busy = 0.0
        anon_total = 0
        for pod in self.pods:
            used = self.rate(pod)
            busy += used
            pod.ns += int(used * dt * 1e9)
            self.fake.set_cpu_usage(pod.rel, pod.ns)
            self.fake.set_cpu_usage(pod.ctr, pod.ns)
            anon = int((200 + 150 * used) * MiB)
            anon_total += anon
            self.fake.set_memory(pod.rel, anon=anon, file=64 * MiB)
            self.fake.set_memory(pod.ctr, anon=anon, file=64 * MiB)
        # Node memory: the pods' plus the system's 800 MiB in use, 2 GiB of page cache.
        total_kb = self.fake.meminfo["MemTotal"]
        available_kb = total_kb - (anon_total + 800 * MiB) // 1024
        self.fake.set_meminfo(MemAvailable=available_kb, MemFree=available_kb - 2 * 1024 * 1024)
        # The kernel's parents count their children: the QoS folders and kubepods itself.
        layout = self.fake.layout
        totals: dict[str, int] = {layout.kube_root: 0}
        for pod in self.pods:
            totals[layout.kube_root] += pod.ns
            if pod.qos is not KubeQOS.GUARANTEED:
                qos_dir = layout.qos_dir(pod.qos)
                totals[qos_dir] = totals.get(qos_dir, 0) + pod.ns
        for rel, ns in totals.items():
            self.fake.set_cpu_usage(rel, ns)
        busy += 0.4 + 0.2 * math.sin(self.t / 7.0)  # the system's own
        busy = min(busy, self.ncpus)
        self._ticks += busy * dt * USER_HZ
        ticks = int(self._ticks)
        self._ticks -= ticks
        self._idle += (self.ncpus - busy) * dt * USER_HZ
        idle = int(self._idle)
        self._idle -= idle
        self.fake.advance_proc_stat(user=ticks, idle=idle)

    def args(self, *extra: str) -> list[str]:
        """``koordlet`` flags that point a standalone daemon at this node."""
        paths = self.fake.paths
        return [
            "--standalone",
            *("--cgroup-root-dir", paths.cgroup_root),
            *("--proc-root-dir", paths.proc_root),
            *("--sys-root-dir", paths.sys_root),
            *("--cgroup-version", "v1", "--cgroup-driver", "cgroupfs"),
            *("--node-name", "demo-node"),
            *extra,
        ]


def write_nodeslo(path: Path, threshold: dict[str, Any]) -> Path:
    """A local NodeSLO file with ``resourceUsedThresholdWithBE`` set to ``threshold``."""
    path.write_text(yaml.safe_dump({"spec": {"resourceUsedThresholdWithBE": threshold}}))
    return path


@dataclass
class Daemon:
    """A running ``koordlet`` and its address."""

    popen: subprocess.Popen[bytes]
    addr: str
    log: Path

    @property
    def base(self) -> str:
        return f"http://{self.addr}"

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def json(self, path: str) -> Any:
        status, body = self.get(path)
        assert status == 200, body
        return json.loads(body)

    def until(self, what: str, check: Any, timeout: float = 20.0) -> Any:
        """Poll ``check()`` until it returns something truthy; fail naming ``what``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.popen.poll() is None, f"koordlet exited:\n{self.log.read_text()}"
            with contextlib.suppress(OSError):
                got = check()
                if got:
                    return got
            time.sleep(0.05)
        raise AssertionError(f"no {what} within {timeout:g}s; log:\n{self.log.read_text()}")


@contextlib.contextmanager
def koordlet(args: Sequence[str], tmp_path: Path) -> Iterator[Daemon]:
    """The ``koordlet`` console script on a free loopback port, its state in ``tmp_path``; waits
    for ``/readyz`` and always stops it (SIGTERM, then SIGKILL)."""
    addr = f"127.0.0.1:{free_port()}"
    log = tmp_path / "koordlet.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            [str(SCRIPT), "--addr", addr, "--state-dir", str(tmp_path / "state"), *args],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    daemon = Daemon(popen, addr, log)
    try:
        daemon.until("ready", lambda: daemon.get("/readyz")[0] == 200)
        yield daemon
    finally:
        if popen.poll() is None:
            popen.terminate()
            try:
                popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(timeout=10)
