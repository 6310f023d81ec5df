"""The real collectors on this machine's cgroup v1 hierarchy, with real processes in a pod.

The test builds a kubepods-shaped tree of its own, ``kpytest-<hex>/kubepods/besteffort/pod<uid>/
<container id>``, under each v1 controller the collectors read (cpu, cpuacct, cpuset, memory),
puts a busy loop in one container and a process holding ~100 MiB in another, runs two ticks of
the whole collector table through the runner, and always kills the processes and removes the
tree, children first, in a ``finally``.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from apis.extension import KubeQOS
from koordlet.collectors.framework import CollectorContext
from koordlet.collectors.pagecache import PageCacheCollector
from koordlet.collectors.podresource import PodResourceCollector
from koordlet.collectors.podthrottled import PodThrottledCollector
from koordlet.collectors.runner import CollectorRunner, TickState
from koordlet.collectors.table import build_collectors
from koordlet.config import KoordletConfig
from koordlet.errors import HostError
from koordlet.metriccache import MetricCache
from koordlet.metriccache import series as s
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.cgroups import CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.cgroupstats import (
    MemoryLru,
    lru_of_memory_stat,
    parse_memory_lru_v1,
    parse_memory_stat_v1,
)
from koordlet.system.host import Host
from koordlet.system.nativeread import load as load_native
from koordlet.system.openfiles import OpenFiles
from koordlet.system.paths import HostPaths
from koordlet.system.stats import MEMORY_LRU
from tests.inotifywatches import kernel_watches

PATHS = HostPaths()
CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")
MiB = 1 << 20

pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create cgroups"),
    pytest.mark.skipif(
        not all(os.path.isfile(PATHS.cgroup(c, "tasks")) for c in CONTROLLERS),
        reason="needs the cgroup v1 cpu, cpuacct, cpuset and memory hierarchies",
    ),
]

BUSY = "while True: pass"
HOLD = (
    "import sys, time\n"
    "sys.stdin.readline()\n"  # wait until moved into its cgroup: pages are charged on touch
    "block = bytearray(b'\\x01') * (100 << 20)\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)
LRU_HOLD = (  # something on each of the anon, unevictable and file LRU lists, then idle
    "import ctypes, os, sys, time\n"
    "sys.stdin.readline()\n"
    "anon = bytearray(b'\\x01') * (48 << 20)\n"
    "locked = bytearray(b'\\x01') * (8 << 20)\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "buf = (ctypes.c_char * len(locked)).from_buffer(locked)\n"
    "if libc.mlock(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(len(locked))):\n"
    "    sys.exit(f'mlock: {os.strerror(ctypes.get_errno())}')\n"
    "with open(sys.argv[1], 'wb') as f:\n"
    "    f.write(os.urandom(1 << 20) * 24)\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


@dataclass
class Tree:
    """The cgroups and processes the test made, for the ``finally``."""

    host: Host
    made: list[str] = field(default_factory=list)
    """Absolute directories, in creation order (parents first)."""
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def mkdir(self, rel: str) -> None:
        for controller in CONTROLLERS:
            path = self.host.layout.abs_dir(controller, rel)
            os.mkdir(path)
            self.made.append(path)
            if controller == "cpuset":  # a new v1 cpuset is empty until told; copy the parent's
                parent = os.path.dirname(path)
                for name in ("cpuset.cpus", "cpuset.mems"):
                    with open(os.path.join(parent, name)) as src:
                        value = src.read().strip()
                    with open(os.path.join(path, name), "w") as dst:
                        dst.write(value)

    def attach(self, rel: str, pid: int) -> None:
        for controller in CONTROLLERS:
            with open(self.host.layout.file(controller, rel, "cgroup.procs"), "w") as f:
                f.write(str(pid))

    def hold(self, rel: str, script: str, *args: str) -> subprocess.Popen[str]:
        """Start ``script`` (which waits for a line on stdin, takes its memory and says
        "ready"), put it in cgroup ``rel`` and let it go: its pages are charged there."""
        proc = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        self.attach(rel, proc.pid)
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "ready"
        return proc

    def runner(self, snap: WorkloadSnapshot, cache: MetricCache) -> CollectorRunner:
        """The whole collector table over this tree, storing into ``cache``."""
        ctx = CollectorContext(host=self.host, config=KoordletConfig(node_name="test"))
        return CollectorRunner(build_collectors(ctx), cache, lambda: snap)

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
        for path in reversed(self.made):
            for _ in range(50):  # a killed task leaves its cgroup asynchronously
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


@pytest.fixture
def tree() -> Iterator[Tree]:
    prefix = f"kpytest-{secrets.token_hex(6)}"
    layout = detect_layout(
        PATHS,
        version=CgroupVersion.V1,
        driver=CgroupDriver.CGROUPFS,
        kube_path=f"{prefix}/kubepods/",
    )
    made = Tree(Host(PATHS, layout))
    try:
        made.mkdir(prefix)
        yield made
    finally:
        made.cleanup()
        assert not any(os.path.exists(p) for p in made.made), "test cgroups left behind"


def test_real_pod_cpu_and_memory_are_collected(tree: Tree) -> None:
    layout = tree.host.layout
    uid = str(uuid.uuid4())
    busy_id, hold_id = secrets.token_hex(32), secrets.token_hex(32)
    pod_rel = layout.pod_dir(KubeQOS.BESTEFFORT, uid)
    busy_rel = layout.container_dir(pod_rel, "containerd", busy_id)
    hold_rel = layout.container_dir(pod_rel, "containerd", hold_id)
    for rel in (layout.kube_root, layout.qos_dir(KubeQOS.BESTEFFORT), pod_rel, busy_rel, hold_rel):
        tree.mkdir(rel)

    busy = subprocess.Popen([sys.executable, "-c", BUSY], text=True)
    tree.procs.append(busy)
    tree.attach(busy_rel, busy.pid)
    tree.hold(hold_rel, HOLD)

    pods = KubepodsSource(tree.host).list_pods()
    assert set(pods) == {uid}
    snap = WorkloadSnapshot(pods=pods, generation=1)
    cache = MetricCache()
    runner = tree.runner(snap, cache)
    busy_proc = psutil.Process(busy.pid)
    cpu0, t0 = sum(busy_proc.cpu_times()[:2]), time.time()
    first = runner.run_tick(t0)
    runner.apply(first)
    time.sleep(1.5)
    cpu1, t1 = sum(busy_proc.cpu_times()[:2]), time.time()
    second = runner.run_tick(t1)
    runner.apply(second)
    # What the kernel says the busy loop got: under contention from other work on this host
    # it may be less than one core, and the collectors must agree with it, not with hope.
    measured = (cpu1 - cpu0) / (t1 - t0)

    assert first.errors == {}
    assert second.errors == {}
    pod_cpu = cache.last(s.POD_CPU_USAGE, s.pod_entity(uid))
    busy_cpu = cache.last(s.CONTAINER_CPU_USAGE, s.container_entity(uid, busy_id))
    hold_memory = cache.last(s.CONTAINER_MEMORY_USAGE, s.container_entity(uid, hold_id))
    pod_memory = cache.last(s.POD_MEMORY_USAGE, s.pod_entity(uid))
    assert pod_cpu is not None
    assert busy_cpu is not None
    assert busy_cpu == pytest.approx(measured, abs=0.15)
    assert pod_cpu == pytest.approx(busy_cpu, abs=0.1)  # the holder sleeps
    if measured >= 0.8:  # the loop had a core to itself
        assert 0.7 <= pod_cpu <= 1.3
    assert hold_memory is not None
    assert hold_memory >= 90 * MiB
    assert pod_memory is not None
    be_usage = cache.last(s.BE_CPU_USAGE, s.BE)
    assert be_usage is not None
    assert be_usage == pytest.approx(pod_cpu, abs=0.1)  # the BE QoS cgroup holds the pod
    node_cpu = cache.last(s.NODE_CPU_USAGE, s.NODE)
    assert node_cpu is not None
    assert node_cpu >= pod_cpu - 0.1
    # memory.stat is the kernel's rstat view, flushed on read unless another flush is under way
    # (then the reader gets the last flush, at most ~2 s old: the kernel's periodic flush). A
    # pod read in that moment can miss its child's newest pages; a later tick catches up.
    deadline = time.time() + 5
    while pod_memory < hold_memory and time.time() < deadline:
        time.sleep(0.5)
        runner.apply(runner.run_tick(time.time()))
        pod_memory = cache.last(s.POD_MEMORY_USAGE, s.pod_entity(uid))
        hold_memory = cache.last(s.CONTAINER_MEMORY_USAGE, s.container_entity(uid, hold_id))
        assert pod_memory is not None
        assert hold_memory is not None
    assert pod_memory >= hold_memory


def test_memory_numa_stat_lru_sums_equal_memory_stats_on_a_real_pod(
    tree: Tree, tmp_path: Path
) -> None:
    """The v1 memory_lru source (hierarchical_* of memory.numa_stat) reads the kernel counters
    that memory.stat's total_* LRU keys print, for a container holding anonymous, mlocked and
    page-cache memory and for its pod, and the collectors report exactly those sums."""
    layout = tree.host.layout
    uid, cid = str(uuid.uuid4()), secrets.token_hex(32)
    pod_rel = layout.pod_dir(KubeQOS.BESTEFFORT, uid)
    hold_rel = layout.container_dir(pod_rel, "containerd", cid)
    for rel in (layout.kube_root, layout.qos_dir(KubeQOS.BESTEFFORT), pod_rel, hold_rel):
        tree.mkdir(rel)
    tree.hold(hold_rel, LRU_HOLD, str(tmp_path / "cache.bin"))

    bound = MEMORY_LRU.bind(layout)
    assert bound.file == "memory.numa_stat"  # this kernel has it (CONFIG_NUMA)

    def both(rel: str) -> tuple[MemoryLru, MemoryLru]:
        numa = layout.file("memory", rel, "memory.numa_stat")
        stat = layout.file("memory", rel, "memory.stat")
        with open(numa, "rb") as f:
            from_numa = parse_memory_lru_v1(f.read(), numa)
        with open(stat, "rb") as f:
            from_stat = lru_of_memory_stat(parse_memory_stat_v1(f.read(), stat), stat)
        return from_numa, from_stat

    # Both files print the flushed statistics; the kernel's periodic flush (about every 2 s) may
    # land between the two reads, so a pair is read again until one agrees.
    for rel in (hold_rel, pod_rel):
        for _ in range(20):
            from_numa, from_stat = both(rel)
            if from_numa == from_stat:
                break
            time.sleep(0.25)
        assert from_numa == from_stat, rel
    anon, unevictable, file = both(hold_rel)[0]
    assert anon >= 40 * MiB
    assert unevictable >= 8 * MiB
    assert file >= 16 * MiB

    pods = KubepodsSource(tree.host).list_pods()
    snap = WorkloadSnapshot(pods=pods, generation=1)
    cache = MetricCache()
    runner = tree.runner(snap, cache)
    entity = s.container_entity(uid, cid)
    for _ in range(20):
        report = runner.run_tick(time.time())
        runner.apply(report)
        assert report.errors == {}
        expected = both(hold_rel)[1]
        usage = cache.last(s.CONTAINER_MEMORY_USAGE, entity)
        with_cache = cache.last(s.CONTAINER_MEMORY_WITH_PAGE_CACHE, entity)
        if (usage, with_cache) == (expected[0] + expected[1], sum(expected)):
            break
        time.sleep(0.25)
    assert usage == expected[0] + expected[1]
    assert with_cache == sum(expected)


def wait_memcg_still(path: str, *, deadline: float = 20.0) -> None:
    """Until ``path`` (a ``memory.numa_stat``) reads the same over a span that holds one of the
    kernel's periodic flushes of memcg statistics (every 2 s): the counters of an idle cgroup
    then stand still, with no update pending that a flush could publish mid-test."""
    span = 2.2
    end = time.monotonic() + deadline
    with open(path, "rb") as f:
        before = f.read()
    while time.monotonic() < end:
        time.sleep(span)
        with open(path, "rb") as f:
            now = f.read()
        if now == before:
            return
        before = now
    raise AssertionError(f"{path} still changing after {deadline} s")


def burstable_pod(tree: Tree, containers: int) -> tuple[list[str], list[str]]:
    """A Burstable pod's cgroups with ``containers`` containers: their ids and folders."""
    layout = tree.host.layout
    ids = [secrets.token_hex(32) for _ in range(containers)]
    pod_rel = layout.pod_dir(KubeQOS.BURSTABLE, str(uuid.uuid4()))
    rels = [layout.container_dir(pod_rel, "containerd", cid) for cid in ids]
    for rel in (layout.kube_root, layout.qos_dir(KubeQOS.BURSTABLE), pod_rel, *rels):
        tree.mkdir(rel)
    return ids, rels


def test_the_column_path_on_kept_kernel_files_gives_what_file_by_file_gives(
    tree: Tree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At steady state the pod collectors read each column of kernel files at once through
    the kept descriptors (``OpenFiles.column``) and parse it in C loops; a second set of the
    same collectors, fed file by file with the very bytes of each tick, reports the same
    samples, through a busy loop, memory held and a container removed under them."""
    layout = tree.host.layout
    ids, rels = burstable_pod(tree, 3)
    busy = subprocess.Popen([sys.executable, "-c", BUSY], text=True)
    tree.procs.append(busy)
    tree.attach(rels[0], busy.pid)
    tree.hold(rels[1], LRU_HOLD, str(tmp_path / "cache.bin"))
    snap = WorkloadSnapshot(pods=KubepodsSource(tree.host).list_pods(), generation=1)
    kinds = (PodResourceCollector, PodThrottledCollector, PageCacheCollector)
    columns: list[Any] = [kind(tree.host) for kind in kinds]
    each = [kind(tree.host) for kind in kinds]
    by_file: list[int] = []
    for collector in columns[:2]:  # count the file-by-file path's ticks

        def counted(tick: TickState, each: Any = collector._collect_each) -> Any:
            by_file.append(1)
            return each(tick)

        monkeypatch.setattr(collector, "_collect_each", counted)
    open_files = OpenFiles(limit=100)
    paths, busy_cpu = 0, 0.0
    try:
        for n in range(5):
            if n == 3:  # no task in it: the kernel lets it go at once
                for controller in CONTROLLERS:
                    gone = layout.abs_dir(controller, rels[2])
                    os.rmdir(gone)
                    tree.made.remove(gone)
            now = time.time()
            by_file.clear()
            kept = TickState(now, snap, open_files=open_files)
            fast = [c.collect(kept) for c in columns]
            seen = dict(kept._files)  # the bytes this tick read, for the twin

            def replay(path: str, seen: dict[str, bytes | HostError] = seen) -> bytes:
                got = seen[path]
                if isinstance(got, BaseException):
                    raise got
                return got

            slow = [c.collect(TickState(now, snap, read=replay)) for c in each]
            assert [sorted(r.all_samples()) for r in fast] == [
                sorted(r.all_samples()) for r in slow
            ], n
            # Columns from the second tick on, until a file of the plan is gone.
            assert len(by_file) == (0 if n in (1, 2) else 2), n
            if n == 2:
                busy_cpu = next(
                    value
                    for (metric, entity), value in fast[0].all_samples()
                    if metric == s.CONTAINER_CPU_USAGE and entity.endswith(ids[0])
                )
            paths = max(paths, len(seen))
            open_files.end_tick()
            time.sleep(0.2)
        assert len(open_files) == 3 * (1 + len(rels) - 1)  # the removed container's closed
        assert busy_cpu > 0.1  # real counters moved under the column path
    finally:
        open_files.close()
    assert paths == 3 * (1 + len(rels))


def test_the_native_columns_give_what_the_python_columns_give(tree: Tree, tmp_path: Path) -> None:
    """The pod collectors over kept files read natively (``koordlet.system.nativeread``) and,
    at the same tick timestamps, over kept files read in Python: the same samples, tick after
    tick, for a pod whose counters stand still (memory held on each LRU list, no CPU used), and
    a removed container takes both back to file by file alike."""
    native, why = load_native()
    if native is None:
        pytest.skip(f"native column reader {why}")
    layout = tree.host.layout
    _, rels = burstable_pod(tree, 3)
    tree.hold(rels[1], LRU_HOLD, str(tmp_path / "cache.bin"))
    wait_memcg_still(layout.file("memory", rels[1], "memory.numa_stat"))
    snap = WorkloadSnapshot(pods=KubepodsSource(tree.host).list_pods(), generation=1)
    kinds = (PodResourceCollector, PodThrottledCollector, PageCacheCollector)
    natively: list[Any] = [kind(tree.host) for kind in kinds]
    in_python: list[Any] = [kind(tree.host) for kind in kinds]
    native_files = OpenFiles(limit=100, native=native)
    python_files = OpenFiles(limit=100)
    native_columns = 0
    try:
        for n in range(5):
            if n == 3:
                for controller in CONTROLLERS:
                    gone = layout.abs_dir(controller, rels[2])
                    os.rmdir(gone)
                    tree.made.remove(gone)
            now = time.time()
            fast = TickState(now, snap, open_files=native_files)
            fast_results = [c.collect(fast) for c in natively]
            native_columns += len(native_files._read_columns)
            slow = TickState(now, snap, open_files=python_files)
            slow_results = [c.collect(slow) for c in in_python]
            assert [sorted(r.all_samples()) for r in fast_results] == [
                sorted(r.all_samples()) for r in slow_results
            ], n
            # bytes only where files were read one by one: the first tick, and from the removal
            # on (the snapshot still names the removed container, whose file is gone)
            assert any(isinstance(v, bytes) for v in fast._files.values()) == (n in (0, 3, 4)), n
            native_files.end_tick()
            python_files.end_tick()
        # Columns were read natively on the ticks whose files were all kept (1 and 2):
        # cpuacct.usage, cpu.stat, memory.numa_stat (the page cache shares the memory parse).
        assert native_columns == 2 * 3
        assert len(native_files) == len(python_files) == 3 * len(rels)
    finally:
        native_files.close()
        python_files.close()


def test_the_walker_sees_real_cgroups_made_and_removed_through_its_watches(tree: Tree) -> None:
    """cgroupfs reports mkdir and rmdir of cgroups to inotify: between full walks the walker
    lists nothing until a pod or container cgroup is made or removed, then sees it at once."""
    layout = tree.host.layout
    uid, first, second = str(uuid.uuid4()), secrets.token_hex(32), secrets.token_hex(32)
    pod_rel = layout.pod_dir(KubeQOS.BESTEFFORT, uid)
    for rel in (layout.kube_root, layout.qos_dir(KubeQOS.BESTEFFORT)):
        tree.mkdir(rel)
    source = KubepodsSource(tree.host)
    try:
        assert source.list_pods() == {}
        assert source._watcher is not None  # watching, not listing

        tree.mkdir(pod_rel)
        tree.mkdir(layout.container_dir(pod_rel, "containerd", first))
        found = source.list_pods()
        assert [c.id for c in found[uid].containers] == [first]
        assert source.list_pods()[uid] is found[uid]  # no event: the same object

        tree.mkdir(layout.container_dir(pod_rel, "containerd", second))
        assert [c.id for c in source.list_pods()[uid].containers] == sorted([first, second])

        first_rel, second_rel = (
            layout.container_dir(pod_rel, "containerd", cid) for cid in (first, second)
        )
        for controller in CONTROLLERS:
            os.rmdir(layout.abs_dir(controller, first_rel))
        assert [c.id for c in source.list_pods()[uid].containers] == [second]
        for controller in CONTROLLERS:
            os.rmdir(layout.abs_dir(controller, second_rel))
            os.rmdir(layout.abs_dir(controller, pod_rel))
        assert source.list_pods() == {}
    finally:
        source.close()


def test_the_walker_follows_a_real_pod_cgroup_renamed_away_and_made_again(tree: Tree) -> None:
    """cgroup v1 lets a cgroup be renamed: the watch on the moved folder is dropped (the kernel's
    own list of the instance's watches says so) and the folder made under the old name is
    described afresh."""
    layout = tree.host.layout
    uid, first, second = str(uuid.uuid4()), secrets.token_hex(32), secrets.token_hex(32)
    pod_rel = layout.pod_dir(KubeQOS.BESTEFFORT, uid)
    for rel in (layout.kube_root, layout.qos_dir(KubeQOS.BESTEFFORT), pod_rel):
        tree.mkdir(rel)
    tree.mkdir(layout.container_dir(pod_rel, "containerd", first))
    source = KubepodsSource(tree.host)

    try:
        assert [c.id for c in source.list_pods()[uid].containers] == [first]
        moved_rel = f"{layout.qos_dir(KubeQOS.BESTEFFORT)}/moved-{secrets.token_hex(4)}"
        for controller in CONTROLLERS:
            os.rename(layout.abs_dir(controller, pod_rel), layout.abs_dir(controller, moved_rel))
            tree.made.append(layout.abs_dir(controller, moved_rel))  # removed before its parent
            tree.made.append(
                layout.abs_dir(controller, layout.container_dir(moved_rel, "containerd", first))
            )
        tree.mkdir(pod_rel)
        tree.mkdir(layout.container_dir(pod_rel, "containerd", second))

        assert [c.id for c in source.list_pods()[uid].containers] == [second]
        assert source._watcher is not None
        assert kernel_watches(source._watcher.fd) == set(source._paths_of_wd)
        assert not any("moved-" in p for p in source._wd_of)
    finally:
        source.close()
