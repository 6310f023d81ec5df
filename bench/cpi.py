"""Benchmark of the CPI collector: CPU cost per container per sample, real perf events.

Builds ``--containers`` container cgroups (default 20) in the perf_event v1 hierarchy, below a
unique ``kpytest-bench-<hex>/kubepods/besteffort/pod<uid>/<id>`` prefix, each running a small shell
loop that wakes every 50 ms, and drives the real :class:`~koordlet.collectors.cpi.CPICollector`
through ``--windows`` windows of ``--window-ms``: the step that opens and enables one group per
online CPU for every container, then the step that reads, scales and closes them. This machine has
no PMU, so the groups count the software events task-clock and cpu-clock in place of cycles and
instructions: the same system calls, descriptors and read layout per container and CPU.

Reported: the thread CPU time (``time.thread_time``: other processes do not inflate it) of both
steps, per container, median over the windows (``per_container_ms``; ``open_per_container_ms``
and ``read_per_container_ms`` split it), the descriptors one window holds, and the process's
descriptor count before and after (equal: nothing leaks).

    python -m bench.cpi [--json] [--containers N] [--windows N] [--window-ms MS]

Needs root. If the perf_event hierarchy is not mounted, it is mounted in a private temporary
folder and unmounted afterwards (:func:`perf_event_root`, which the real-host tests use too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from apis.extension import KubeQOS, QoSClass
from koordlet.collectors.cpi import CPICollector, online_cpus_reader
from koordlet.collectors.runner import TickState
from koordlet.statesinformer.model import ContainerInfo, PodInfo, WorkloadSnapshot
from koordlet.system import perf
from koordlet.system.cgroups import CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths

CONTROLLER = "perf_event"
_WAKER = "while :; do sleep 0.05; done"


def _mounted_hierarchy() -> str | None:
    """Mount point of the perf_event v1 hierarchy, if some mount has it."""
    with open("/proc/self/mounts") as f:
        for line in f:
            _, where, fstype, options, *_ = line.split()
            if fstype == "cgroup" and CONTROLLER in options.split(","):
                return where
    return None


def _hierarchy() -> tuple[int, int]:
    """``(hierarchy id, num_cgroups)`` of perf_event in ``/proc/cgroups``; id 0: none."""
    with open("/proc/cgroups") as f:
        for line in f:
            fields = line.split()
            if fields and fields[0] == CONTROLLER:
                return int(fields[1]), int(fields[2])
    return 0, 0


def _wait_until_only_root_is_left(timeout: float = 10.0) -> None:
    """Removed cgroups die asynchronously (and only once no perf event holds them)."""
    deadline = time.monotonic() + timeout
    while _hierarchy()[1] > 1 and time.monotonic() < deadline:
        time.sleep(0.05)


def _mount(mount_point: str) -> None:
    done = subprocess.run(
        ["mount", "-t", "cgroup", "-o", CONTROLLER, "none", mount_point],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise OSError(f"mount -t cgroup -o {CONTROLLER}: {done.stderr.strip()}")


def _hierarchy_gone(timeout: float) -> bool:
    """Whether the (unmounted) hierarchy is destroyed within ``timeout``; it goes async."""
    deadline = time.monotonic() + timeout
    while _hierarchy()[0] != 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _unmount(mount_point: str) -> None:
    """Unmount, leaving no hierarchy behind. One that still has (dying) cgroups when unmounted
    lives on, unmounted, until a later mount is unmounted clean: then do that once."""
    _wait_until_only_root_is_left()
    subprocess.run(["umount", mount_point], check=True)
    if _hierarchy_gone(2.0) or _mounted_hierarchy() is not None:
        return  # gone, or someone else mounted it meanwhile: theirs now
    _wait_until_only_root_is_left()
    _mount(mount_point)
    subprocess.run(["umount", mount_point], check=True)
    _hierarchy_gone(2.0)


@contextlib.contextmanager
def perf_event_root() -> Iterator[str]:
    """A cgroup root folder whose ``perf_event`` entry is the perf_event v1 hierarchy.

    An existing mount is used as it is (through a symbolic link when it is not named
    ``perf_event``); otherwise the hierarchy is mounted in a private temporary folder and, once
    the caller removed its cgroups, unmounted. Raises ``OSError`` when it cannot be mounted.
    """
    root = tempfile.mkdtemp(prefix="kpytest-perfroot-")
    mount_point = os.path.join(root, CONTROLLER)
    existing = _mounted_hierarchy()
    try:
        if existing is not None:
            os.symlink(existing, mount_point)
            yield root
            return
        os.mkdir(mount_point)
        _mount(mount_point)
        try:
            yield root
        finally:
            _unmount(mount_point)
    finally:
        with contextlib.suppress(FileNotFoundError):
            if os.path.islink(mount_point):
                os.unlink(mount_point)
            else:
                os.rmdir(mount_point)
        os.rmdir(root)


@dataclass
class Containers:
    """Container cgroups made under a perf_event root, their processes and the snapshot."""

    host: Host
    snapshot: WorkloadSnapshot
    dirs: list[str]
    """Absolute folders made, parents first."""
    procs: list[subprocess.Popen[bytes]]

    def attach(self, rel: str, pid: int) -> None:
        with open(self.host.layout.file(CONTROLLER, rel, "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def cleanup(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(timeout=10)
        for path in reversed(self.dirs):
            for _ in range(100):  # killed tasks leave their cgroup asynchronously
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)


@contextlib.contextmanager
def container_cgroups(root: str, count: int, command: str | None = _WAKER) -> Iterator[Containers]:
    """``count`` containers of one BestEffort pod each, under a unique ``kpytest-bench-<hex>``
    prefix of the perf_event hierarchy at ``root``; each runs ``command`` (a shell line) unless
    None. Always killed and removed, children first."""
    paths = HostPaths(cgroup_root=root)
    prefix = f"kpytest-bench-{secrets.token_hex(6)}"
    layout = detect_layout(
        paths,
        version=CgroupVersion.V1,
        driver=CgroupDriver.CGROUPFS,
        kube_path=f"{prefix}/kubepods/",
    )
    made = Containers(Host(paths, layout), WorkloadSnapshot(), [], [])
    try:
        pods: dict[str, PodInfo] = {}
        for rel in (prefix, layout.kube_root, layout.qos_dir(KubeQOS.BESTEFFORT)):
            os.mkdir(layout.abs_dir(CONTROLLER, rel))
            made.dirs.append(layout.abs_dir(CONTROLLER, rel))
        for index in range(count):
            uid, cid = str(uuid.uuid4()), secrets.token_hex(32)
            pod_rel = layout.pod_dir(KubeQOS.BESTEFFORT, uid)
            rel = layout.container_dir(pod_rel, "containerd", cid)
            for d in (pod_rel, rel):
                os.mkdir(layout.abs_dir(CONTROLLER, d))
                made.dirs.append(layout.abs_dir(CONTROLLER, d))
            if command is not None:
                proc = subprocess.Popen(["sh", "-c", command])
                made.procs.append(proc)
                made.attach(rel, proc.pid)
            container = ContainerInfo(cid, f"c{index}", "containerd", rel)
            pods[uid] = PodInfo(
                uid, f"p{index}", "bench", QoSClass.BE, KubeQOS.BESTEFFORT, pod_rel, (container,)
            )
        made.snapshot = WorkloadSnapshot(pods=pods, generation=1)
        yield made
    finally:
        made.cleanup()


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def measure(containers: int, windows: int, window_s: float) -> dict[str, object]:
    events = (perf.TASK_CLOCK, perf.CPU_CLOCK)
    with perf_event_root() as root, container_cgroups(root, containers) as made:
        collector = CPICollector(made.host, period=10.0, window=1.0, events=events)
        fds_before = _fd_count()
        opens: list[float] = []
        reads: list[float] = []
        held = sampled = 0
        for index in range(windows):
            now = 1000.0 + 10 * index
            c0 = time.thread_time()
            collector.collect(TickState(now, made.snapshot))
            opens.append(time.thread_time() - c0)
            held = max(held, collector.fd_count)
            time.sleep(window_s)
            c0 = time.thread_time()
            result = collector.collect(TickState(now + 1.0, made.snapshot))
            reads.append(time.thread_time() - c0)
            sampled = len(result.samples) // 2
        collector.close()
        fds_after = _fd_count()
        cpus = len(online_cpus_reader(made.host)())
    per = [(o + r) / containers * 1e3 for o, r in zip(opens, reads, strict=True)]
    return {
        "per_container_ms": round(statistics.median(per), 4),
        "open_per_container_ms": round(statistics.median(opens) / containers * 1e3, 4),
        "read_per_container_ms": round(statistics.median(reads) / containers * 1e3, 4),
        "per_container_cpu_ms": round(statistics.median(per) / cpus, 4),
        "containers": containers,
        "containers_sampled": sampled,
        "cpus": cpus,
        "descriptors_per_window": held,
        "fds_before": fds_before,
        "fds_after": fds_after,
        "windows": windows,
        "window_ms": window_s * 1e3,
        "events": [e.name for e in events],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpi", description=__doc__)
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--containers", type=int, default=20)
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--window-ms", type=float, default=200.0)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.cpi needs root (cgroups and CPU-wide perf events)", file=sys.stderr)
        return 2
    result = measure(args.containers, args.windows, args.window_ms / 1e3)
    if not args.json:
        for key, value in result.items():
            print(f"{key:>24}: {value}")
        return 0
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
