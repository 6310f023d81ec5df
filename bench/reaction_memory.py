"""Memory eviction reaction on real cgroups: threshold crossing to the BE pod's processes killed.

Each run builds a kubepods-shaped cgroup v1 tree ``kpybench-<hex>/kubepods/{besteffort,
burstable}/pod<uid>/<container>`` in the memory and freezer hierarchies, with one LS pod and one
BE pod, each a child process holding some memory. The node, for the strategy, is the test's
kubepods cgroup: capacity :data:`CAPACITY`, usage its ``memory.usage_in_bytes``, NodeSLO
``memoryEvictThresholdPercent`` 70. The memory eviction strategy (``koordlet.qos.memoryevict``)
runs one tick below the threshold, which arms its memcg threshold on the kubepods cgroup through
a real :class:`~koordlet.events.source.PressureEventSource`; then the BE child is told to touch
:data:`GROW` more bytes. Nothing calls the strategy again: the kernel's threshold event wakes it,
its event round reads the usage, picks the BE pod and the cgroup-kill evictor freezes, kills and
thaws its cgroup.

**Crossing.** The BE child reads the kubepods ``memory.usage_in_bytes`` while it touches pages
(every 64 pages, every page once within 1 MiB) and writes ``time.monotonic()`` to its stdout the
moment the usage reaches the threshold (a pipe write of a few microseconds; it is killed soon
after, so it cannot wait). **Eviction** = ``time.monotonic()`` when the backend's kill returned
with the cgroup empty. ``memory_evict_p50_ms``/``memory_evict_p99_ms`` are over the runs; the
kernel checks thresholds every 128 page charges per CPU, so that lag is included.

    python -m bench.reaction_memory [--json] [--runs N]

Needs root and the cgroup v1 memory and freezer hierarchies. :class:`EvictTree` is shared with
``tests/integration/test_qos_evict_realcgroup.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from apis.extension import KubeQOS, QoSClass
from bench._stats import latency_figures, print_result
from koordlet.events.source import PressureEventSource
from koordlet.executor.audit import AuditLog
from koordlet.executor.kill import subtree_pids
from koordlet.features import FeatureGates
from koordlet.metriccache import series
from koordlet.metriccache.store import MetricCache
from koordlet.qos.evictor import CgroupKillEvictor, Evictor, Victim
from koordlet.qos.framework import QoSBook, StrategyContext
from koordlet.qos.memoryevict import MemoryEvict
from koordlet.statesinformer.model import ContainerInfo, PodInfo, WorkloadSnapshot
from koordlet.system.cgroups import CgroupDriver, CgroupLayout, CgroupVersion
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths
from tests.strategyrig import config, in_force

MiB = 1 << 20
CAPACITY = 256 * MiB
"""The test node's memory capacity (its kubepods cgroup)."""
THRESHOLD_PERCENT = 70
GROW = 200 * MiB
"""Bytes the BE child touches after the go: from ~17 MiB of pods well past 70% of 256 MiB."""
CONTROLLERS = ("memory", "freezer")
PATHS = HostPaths()
WAIT = 10.0

CHILD = """
import mmap, os, sys, time
for path in sys.argv[4:]:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
usage_fd = os.open(sys.argv[1], os.O_RDONLY)
threshold, size = int(sys.argv[2]), int(sys.argv[3])
near = threshold - (1 << 20)
held = bytearray(b"\\x01") * (8 << 20)
print("ready", flush=True)
while True:
    line = sys.stdin.readline()
    if not line:
        break
    grow = int(line)
    block = mmap.mmap(-1, grow)
    usage, crossed = 0, None
    for offset in range(0, grow, 4096):
        block[offset] = 1
        if crossed is None and threshold and (usage >= near or offset % (64 * 4096) == 0):
            usage = int(os.pread(usage_fd, 32, 0))
            if usage >= threshold:
                crossed = time.monotonic()
                os.write(1, (repr(crossed) + "\\n").encode())
    print("grown", flush=True)
"""


def available() -> str | None:
    """None when this host can run the scenario, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    missing = [c for c in CONTROLLERS if not os.path.isfile(PATHS.cgroup(c, "tasks"))]
    return f"needs the cgroup v1 {', '.join(missing)} hierarchy" if missing else None


class Child:
    """A process in a pod's container cgroup holding memory; ``grow(n)`` touches n more bytes."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def grow(self, nbytes: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{nbytes}\n".encode())
        self.proc.stdin.flush()

    def readline(self) -> bytes:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


class EvictTree:
    """A kubepods-shaped test tree in the v1 memory and freezer hierarchies, its pods and their
    child processes; :meth:`close` kills what is left in it (only our children can be there)
    and removes every folder."""

    def __init__(self, prefix: str = "kpybench") -> None:
        self.top = f"{prefix}-{secrets.token_hex(4)}"
        self.layout = CgroupLayout(
            PATHS, CgroupVersion.V1, CgroupDriver.CGROUPFS, f"{self.top}/kubepods"
        )
        self.host = Host(PATHS, self.layout)
        self.pods: dict[str, PodInfo] = {}
        self.children: list[Child] = []
        for rel in (
            self.layout.kube_root,
            self.layout.qos_dir(KubeQOS.BESTEFFORT),
            self.layout.qos_dir(KubeQOS.BURSTABLE),
        ):
            self._mkdir(rel)

    def _mkdir(self, rel: str) -> None:
        for c in CONTROLLERS:
            os.makedirs(self.layout.abs_dir(c, rel), exist_ok=True)

    @property
    def kube_memory_dir(self) -> str:
        return self.layout.abs_dir("memory", self.layout.kube_root)

    def usage(self, rel: str | None = None) -> int:
        """``memory.usage_in_bytes`` of ``rel`` (default: the kubepods root)."""
        rel = self.layout.kube_root if rel is None else rel
        with open(self.layout.file("memory", rel, "memory.usage_in_bytes"), "rb") as f:
            return int(f.read())

    def add_pod(self, name: str, qos: QoSClass, *, priority: int | None = None) -> PodInfo:
        uid = f"{secrets.token_hex(4)}-0000-4000-8000-{secrets.token_hex(6)}"
        kube = KubeQOS.BESTEFFORT if qos is QoSClass.BE else KubeQOS.BURSTABLE
        rel = self.layout.pod_dir(kube, uid)
        cid = secrets.token_hex(32)
        crel = self.layout.container_dir(rel, "containerd", cid)
        self._mkdir(crel)
        container = ContainerInfo(cid, "main", "containerd", crel)
        pod = PodInfo(uid, name, "bench", qos, kube, rel, (container,), priority=priority)
        self.pods[uid] = pod
        return pod

    def start(self, pod: PodInfo, *, threshold: int = 0) -> Child:
        """Start a child in the pod's container; it holds 8 MiB and waits for ``grow`` orders.
        With ``threshold`` it reports when the kubepods usage reaches it while growing."""
        crel = pod.containers[0].cgroup_dir
        procs = [self.layout.file(c, crel, "cgroup.procs") for c in CONTROLLERS]
        usage = self.layout.file("memory", self.layout.kube_root, "memory.usage_in_bytes")
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, usage, str(threshold), "0", *procs],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        child = Child(proc)
        self.children.append(child)
        if child.readline().strip() != b"ready":
            raise RuntimeError("a test child did not start")
        return child

    def sample(self, cache: MetricCache, now: float) -> None:
        """Act as the collector: node usage = kubepods usage; each pod's usage."""
        samples = [
            series.Sample(series.SeriesKey(series.NODE_MEMORY_USAGE, series.NODE), self.usage())
        ]
        for pod in self.pods.values():
            try:
                used = self.usage(pod.cgroup_dir)
            except FileNotFoundError:
                continue
            entity = series.pod_entity(pod.uid)
            samples.append(series.Sample(series.SeriesKey(series.POD_MEMORY_USAGE, entity), used))
            samples.append(
                series.Sample(series.SeriesKey(series.POD_MEMORY_WITH_PAGE_CACHE, entity), used)
            )
        cache.append(now, samples)

    def close(self) -> None:
        for child in self.children:
            with contextlib.suppress(Exception):
                child.stop()
        freezer = PATHS.cgroup("freezer", self.top)
        for folder, _dirs, files in os.walk(freezer):
            if "freezer.state" in files:
                with contextlib.suppress(OSError), open(f"{folder}/freezer.state", "w") as f:
                    f.write("THAWED")
        for c in CONTROLLERS:
            for pid in subtree_pids(PATHS.cgroup(c, self.top)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for c in CONTROLLERS:
            base = PATHS.cgroup(c, self.top)
            for folder in sorted((f for f, _, _ in os.walk(base)), key=len, reverse=True):
                for _ in range(100):
                    try:
                        os.rmdir(folder)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.02)

    def __enter__(self) -> EvictTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TimedKill(CgroupKillEvictor):
    """The cgroup-kill backend, stamping ``time.monotonic()`` when each kill returns."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.done: dict[str, float] = {}

    async def evict(self, victim: Victim, *, reason: str, message: str) -> str:
        out = await super().evict(victim, reason=reason, message=message)
        self.done[victim.key] = time.monotonic()
        return out


def build_strategy(
    tree: EvictTree,
    *,
    events: PressureEventSource | None,
    dry_run: bool = False,
    audit: AuditLog | None = None,
) -> tuple[MemoryEvict, MetricCache, TimedKill, StrategyContext]:
    """The memory eviction strategy on ``tree``'s kubepods cgroup as the node."""
    cache = MetricCache()
    backend = TimedKill(lambda: tree.host)
    audit = audit or AuditLog(None)
    evictor = Evictor(backend, audit=audit)
    slo = {"enable": True, "memoryEvictThresholdPercent": THRESHOLD_PERCENT}
    ctx = StrategyContext(
        host=lambda: tree.host,
        # the table gate of the BE task (off by default, as Koordinator's)
        config=config(FeatureGates().merged({"BEMemoryEvict": True})),
        cache=cache,
        executor=None,  # type: ignore[arg-type]  # eviction writes no cgroup knob
        workloads=lambda: WorkloadSnapshot(pods=dict(tree.pods)),
        node_slo=lambda: in_force(resourceUsedThresholdWithBE=slo),
        evictor=evictor,
        events=events,
        audit=audit,
        dry_run_all=dry_run,
        book=QoSBook(),
    )
    strategy = MemoryEvict(
        ctx,
        capacity=lambda: CAPACITY,
        fresh_usage=lambda: (tree.usage(), CAPACITY),
        watch_dir=tree.kube_memory_dir,
    )
    return strategy, cache, backend, ctx


THRESHOLD_BYTES = CAPACITY * THRESHOLD_PERCENT // 100


async def one_run() -> float:
    """Milliseconds from the BE child's threshold crossing to its cgroup emptied."""
    loop = asyncio.get_running_loop()
    with EvictTree() as tree:
        source = PressureEventSource()
        try:
            ls = tree.start(tree.add_pod("ls", QoSClass.LS))
            be_pod = tree.add_pod("be", QoSClass.BE)
            be = tree.start(be_pod, threshold=THRESHOLD_BYTES)
            strategy, cache, backend, ctx = build_strategy(tree, events=source)
            tree.sample(cache, time.time())
            await strategy.reconcile()  # below the threshold: arms the memcg threshold
            if strategy.describe()["armed"] is None:
                raise RuntimeError(f"memcg threshold not armed: {source.unsupported}")
            be.grow(GROW)
            line = await asyncio.wait_for(loop.run_in_executor(None, be.readline), WAIT)
            crossed = float(line)
            deadline = time.monotonic() + WAIT
            while f"pod/{be_pod.uid}" not in backend.done:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        "the BE pod was not evicted within the wait: "
                        f"{strategy.describe()} {source.describe()} "
                        f"{ctx.book.describe(strategy.name)} usage {tree.usage()}"
                    )
                await asyncio.sleep(0.005)
            if ls.proc.poll() is not None:
                raise RuntimeError("the LS pod died")
            await strategy.close()
            return (backend.done[f"pod/{be_pod.uid}"] - crossed) * 1000
        finally:
            source.close()


def memory_evict_scenario(runs: int = 20) -> dict[str, Any]:
    """``memory_evict_p50_ms``/``memory_evict_p99_ms`` over ``runs`` runs (see the module)."""
    why = available()
    if why is not None:
        return {"memory_evict_skipped": why}
    latencies = [asyncio.run(one_run()) for _ in range(runs)]
    return {
        "memory_evict_runs": runs,
        **latency_figures("memory_evict", latencies),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    result = memory_evict_scenario(args.runs)
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
