"""Pressure for real on this machine: PSI triggers that fire under CPU contention, a memcg v1
threshold crossed by a process allocating 100 MiB, and the PSI collector on real cgroup2 pod and
container cgroups, on asyncio and on uvloop.

Contention is four busy loops on this machine's CPUs (two here). Every cgroup is
``kpytest-<hex>``; every process is killed and every cgroup removed, children first, in a
``finally``. Bounds are generous and no test asserts on latency (``bench/pressure_event.py``
measures it).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvloop

from apis.extension import KubeQOS
from koordlet.collectors.psi import PSICollector
from koordlet.collectors.runner import TickState
from koordlet.events.source import EventKind, PressureEvent, PressureEventSource
from koordlet.metriccache import series as s
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.cgroups import CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths
from koordlet.system.psi import has_cap_sys_resource

PATHS = HostPaths()
UNIFIED = HostPaths(cgroup_root=PATHS.cgroup("unified"))
"""This hybrid host's cgroup2 mount: no controllers, but every cgroup has pressure files."""
MiB = 1 << 20
WAIT = 30.0
BUSY = "while True: pass"
ALLOCATE = (
    "import mmap, sys\n"
    "sys.stdin.readline()\n"  # wait until moved into the cgroup: pages are charged on touch
    "block = mmap.mmap(-1, 100 << 20)\n"
    "for offset in range(0, len(block), 4096):\n"
    "    block[offset] = 1\n"
    "print('done', flush=True)\n"
    "sys.stdin.readline()\n"
)

pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create cgroups"),
    pytest.mark.skipif(not os.path.isdir(PATHS.proc("pressure")), reason="needs PSI"),
]
needs_cgroup2 = pytest.mark.skipif(
    not os.path.isfile(UNIFIED.cgroup("cgroup.procs")), reason="needs cgroup2 at .../unified"
)
needs_memcg_v1 = pytest.mark.skipif(
    not os.path.isfile(PATHS.cgroup("memory", "cgroup.event_control")),
    reason="needs the cgroup v1 memory hierarchy",
)

LoopFactory = Callable[[], asyncio.AbstractEventLoop]
LOOPS = [
    pytest.param(asyncio.new_event_loop, id="asyncio"),
    pytest.param(uvloop.new_event_loop, id="uvloop"),
]


def run_on(factory: LoopFactory, coro: Coroutine[Any, Any, PressureEvent]) -> PressureEvent:
    loop = factory()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


@dataclass
class Made:
    """Cgroups and processes a test made, for the ``finally``."""

    dirs: list[str] = field(default_factory=list)
    """Absolute folders, parents first."""
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def mkdir(self, path: str) -> str:
        os.mkdir(path)
        self.dirs.append(path)
        return path

    def spawn(self, code: str, cgroup_dir: str | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.procs.append(proc)
        if cgroup_dir is not None:
            with open(os.path.join(cgroup_dir, "cgroup.procs"), "w") as f:
                f.write(str(proc.pid))
        return proc

    def contention(self, cgroup_dir: str | None = None) -> None:
        """Four busy loops, the first in ``cgroup_dir``: every CPU has a queue."""
        for i in range(max(4, 2 * (os.cpu_count() or 1))):
            self.spawn(BUSY, cgroup_dir if i == 0 else None)

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
        for path in reversed(self.dirs):
            for _ in range(50):  # a killed task leaves its cgroup asynchronously
                try:
                    os.rmdir(path)
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
                else:
                    break


@pytest.fixture
def made() -> Iterator[Made]:
    things = Made()
    try:
        yield things
    finally:
        things.cleanup()
        assert not any(os.path.exists(d) for d in things.dirs), "test cgroups left behind"


def window_us() -> int:
    """The shortest window this process may use: 1 s with CAP_SYS_RESOURCE, else 2 s."""
    return 1_000_000 if has_cap_sys_resource(PATHS) else 2_000_000


async def first_event(source: PressureEventSource, arm: Coroutine[Any, Any, bool]) -> PressureEvent:
    queue: asyncio.Queue[PressureEvent] = asyncio.Queue()
    source.subscribe(queue)
    try:
        assert await arm, source.unsupported
        return await asyncio.wait_for(queue.get(), WAIT)
    finally:
        source.close()


@pytest.mark.parametrize("new_loop", LOOPS)
def test_a_node_cpu_trigger_fires_under_contention(made: Made, new_loop: LoopFactory) -> None:
    source = PressureEventSource(privileged=has_cap_sys_resource(PATHS))
    arm = source.watch_psi(PATHS.proc("pressure", "cpu"), "some", 10_000, window_us(), "node-cpu")
    made.contention()

    event = run_on(new_loop, first_event(source, arm))

    assert (event.name, event.kind) == ("node-cpu", EventKind.PSI)


@needs_cgroup2
@pytest.mark.parametrize("new_loop", LOOPS)
def test_a_pod_cgroup_cpu_trigger_fires_when_its_task_waits_for_a_cpu(
    made: Made, new_loop: LoopFactory
) -> None:
    pod = made.mkdir(UNIFIED.cgroup(f"kpytest-{secrets.token_hex(6)}"))
    source = PressureEventSource(privileged=has_cap_sys_resource(PATHS))
    path = os.path.join(pod, "cpu.pressure")
    arm = source.watch_psi(path, "some", 10_000, window_us(), "pod-cpu")
    made.contention(pod)

    event = run_on(new_loop, first_event(source, arm))

    assert (event.name, event.kind) == ("pod-cpu", EventKind.PSI)


@needs_memcg_v1
@pytest.mark.parametrize("new_loop", LOOPS)
def test_a_process_allocating_100_mib_crosses_a_64_mib_memcg_threshold(
    made: Made, new_loop: LoopFactory
) -> None:
    cgroup = made.mkdir(PATHS.cgroup("memory", f"kpytest-{secrets.token_hex(6)}"))
    source = PressureEventSource()
    child = made.spawn(ALLOCATE, cgroup)

    async def scenario() -> PressureEvent:
        queue: asyncio.Queue[PressureEvent] = asyncio.Queue()
        source.subscribe(queue)
        try:
            assert await source.watch_memcg_threshold(cgroup, 64 * MiB, "pod-mem")
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            return await asyncio.wait_for(queue.get(), WAIT)
        finally:
            source.close()

    event = run_on(new_loop, scenario())

    assert (event.name, event.kind) == ("pod-mem", EventKind.MEMCG_THRESHOLD)
    with open(os.path.join(cgroup, "memory.usage_in_bytes")) as f:
        assert int(f.read()) >= 64 * MiB  # the kernel fires at usage >= threshold


@needs_cgroup2
def test_the_psi_collector_reads_real_cgroup2_pods_and_containers(made: Made) -> None:
    prefix = f"kpytest-{secrets.token_hex(6)}"
    layout = detect_layout(
        UNIFIED,
        version=CgroupVersion.V2,
        driver=CgroupDriver.CGROUPFS,
        kube_path=f"{prefix}/kubepods/",
    )
    host = Host(UNIFIED, layout)
    uid = str(uuid.uuid4())
    busy_id, quiet_id = secrets.token_hex(32), secrets.token_hex(32)
    pod_rel = layout.pod_dir(KubeQOS.BESTEFFORT, uid)
    busy_rel = layout.container_dir(pod_rel, "containerd", busy_id)
    quiet_rel = layout.container_dir(pod_rel, "containerd", quiet_id)
    for rel in (
        prefix,
        layout.kube_root,
        layout.qos_dir(KubeQOS.BESTEFFORT),
        pod_rel,
        busy_rel,
        quiet_rel,
    ):
        made.mkdir(layout.abs_dir("cpu", rel))
    with open(layout.file("cpu", quiet_rel, "cgroup.pressure"), "w") as f:
        f.write("0")  # hides the quiet container's pressure files
    made.contention(layout.abs_dir("cpu", busy_rel))
    snapshot = WorkloadSnapshot(pods=KubepodsSource(host).list_pods(), generation=1)
    collector = PSICollector(host)
    some_avg10 = s.psi_series("cpu", "some", "avg10")
    busy = s.container_entity(uid, busy_id)

    deadline = time.monotonic() + WAIT
    while True:  # avg10 is recomputed every 2 s
        result = collector.collect(TickState(time.time(), snapshot))
        got = {(x.key.metric, x.key.entity): x.value for x in result.samples}
        if got.get((some_avg10, busy), 0.0) > 0.0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)

    assert got[(some_avg10, busy)] > 0.0
    assert got[(some_avg10, s.pod_entity(uid))] > 0.0
    assert got[(s.psi_full_supported_series("cpu"), busy)] == 1.0
    assert (some_avg10, s.container_entity(uid, quiet_id)) not in got
    assert layout.abs_dir("cpu", quiet_rel) in result.unsupported["cgroup"]
    assert (some_avg10, s.NODE) in got
