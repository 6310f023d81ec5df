"""Cost of the DAMON cold-page source at 200 pods: our snapshot and the kdamond's CPU.

Builds ``--pods`` pods of two containers each in the real cgroup v1 memory hierarchy
(``kpybench-<hex>/pod<i>/c<j>``, removed afterwards), with ``--touchers`` processes that each
touch ``--touch-mib`` MiB in a container. Then:

- **snapshot**: what :class:`~koordlet.system.damoncold.DamonColdPageSource` does once per refresh
  interval, in the worst case where all of System RAM is cold (an idle node: free memory looks
  cold to DAMON): ``/proc/kpagecgroup`` tallied over every System RAM range, every pod's and
  container's subtree inodes, their sums. CPU (``time.process_time``) and wall time per snapshot,
  ns per page frame, the Python heap peak of one snapshot (``tracemalloc``), and the share of a
  core: at the least refresh interval, and at the gap the CPU budget stretches it to.
- **kdamond**: a kdamond's CPU time (utime + stime of the kernel thread from
  ``/proc/<pid>/stat``) over ``--window`` seconds, as a share of a core. Ours with the default
  settings when the DAMON interface is free (started and removed by the bench), else the
  kdamond(s) already running, reported as ``not ours`` (a reference, at their own settings).

    python -m bench.coldmemory_damon [--json] [--pods 200] [--window 10]

Needs root, the cgroup v1 memory hierarchy, DAMON sysfs and ``/proc/kpagecgroup``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from typing import Any

from koordlet.system.cgroups import CgroupVersion, detect_layout
from koordlet.system.damon import (
    DamonAttrs,
    Kdamond,
    RealSysfs,
    admin_dir,
    claim_path,
    kdamond_states,
    system_ram_ranges,
)
from koordlet.system.damoncold import DEFAULT_CPU_BUDGET, DEFAULT_REFRESH_INTERVAL
from koordlet.system.kpagecgroup import PAGE_SIZE, pages_of, subtree_inodes, tally
from koordlet.system.paths import HostPaths

PATHS = HostPaths()
MEMCG = PATHS.cgroup("memory")
CLK_TCK = os.sysconf("SC_CLK_TCK")
TOUCH = (
    "import sys; sys.stdin.readline(); b = bytearray({n}); b[::4096] = b'\\x01' * len(b[::4096]); "
    "print(1, flush=True); sys.stdin.readline()"
)
"""A toucher: waits for a line (sent once it is in its cgroup, so that every page it touches is
charged there, not to the cgroup it started in), touches ``n`` bytes, says so, and waits."""


def _kdamond_pids() -> list[int]:
    """Kernel threads named ``kdamond.*`` (from their ``comm``; nothing under DAMON is read)."""
    pids = []
    for name in os.listdir(PATHS.proc_root):
        if not name.isdigit():
            continue
        try:
            with open(PATHS.proc(name, "comm")) as f:
                if f.read().startswith("kdamond."):
                    pids.append(int(name))
        except OSError:
            continue
    return sorted(pids)


def _cpu_ticks(pid: int) -> int:
    with open(PATHS.proc(str(pid), "stat"), "rb") as f:
        data = f.read()
    fields = data[data.rfind(b")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def _kdamond_cpu(pids: Sequence[int], window: float) -> float:
    """Share of one core (percent) the threads used over ``window`` seconds."""
    before, t0 = sum(_cpu_ticks(p) for p in pids), time.monotonic()
    time.sleep(window)
    after, t1 = sum(_cpu_ticks(p) for p in pids), time.monotonic()
    return (after - before) / CLK_TCK / (t1 - t0) * 100


def _tree(pods: int) -> tuple[str, list[str]]:
    top = f"kpybench-{secrets.token_hex(4)}"
    rels = []
    for i in range(pods):
        pod = f"{top}/pod{i}"
        rels.append(pod)
        for j in range(2):
            os.makedirs(os.path.join(MEMCG, pod, f"c{j}"))
            rels.append(f"{pod}/c{j}")
    return top, rels


def _remove_tree(top: str) -> None:
    for dirpath, _, _ in sorted(os.walk(os.path.join(MEMCG, top)), key=lambda w: -len(w[0])):
        for _ in range(50):
            try:
                os.rmdir(dirpath)
                break
            except OSError:
                time.sleep(0.05)


def _touchers(rels: Sequence[str], count: int, mib: int) -> list[subprocess.Popen[str]]:
    procs = []
    for i in range(count):
        rel = rels[1 + 3 * i]  # a container of pod i
        p = subprocess.Popen(
            [sys.executable, "-c", TOUCH.format(n=mib << 20)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        with open(os.path.join(MEMCG, rel, "cgroup.procs"), "w") as f:
            f.write(str(p.pid))
        assert p.stdin is not None
        p.stdin.write("go\n")  # moved: now it may touch
        p.stdin.flush()
        procs.append(p)
    for p in procs:
        assert p.stdout is not None
        p.stdout.readline()
    return procs


def _snapshot(rels: Sequence[str]) -> tuple[int, dict[str, int]]:
    counts = tally(PATHS.proc_root, system_ram_ranges(PATHS.proc_root))
    per = {rel: pages_of(counts, subtree_inodes(os.path.join(MEMCG, rel))) for rel in rels}
    return sum(counts.values()), per


def run(pods: int, touchers: int, touch_mib: int, repeat: int, window: float) -> dict[str, Any]:
    top, rels = _tree(pods)
    procs: list[subprocess.Popen[str]] = []
    try:
        procs = _touchers(rels, touchers, touch_mib)
        cpu: list[float] = []
        wall: list[float] = []
        node_pages = 0
        per: dict[str, int] = {}
        for _ in range(repeat):
            c0, w0 = time.process_time(), time.perf_counter()
            node_pages, per = _snapshot(rels)
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
        tracemalloc.start()
        _snapshot(rels)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        frames = sum(e - s for s, e in system_ram_ranges(PATHS.proc_root)) // PAGE_SIZE
        found = min(per[rels[1 + 3 * i]] for i in range(touchers)) * PAGE_SIZE if touchers else 0
    finally:
        for p in procs:
            p.kill()
            p.communicate()
        _remove_tree(top)
    snapshot_cpu = statistics.median(cpu)
    gap = max(DEFAULT_REFRESH_INTERVAL, snapshot_cpu / DEFAULT_CPU_BUDGET)
    ours = snapshot_cpu / gap * 100
    kd = _measure_kdamond(window)
    return {
        "pods": pods,
        "cgroups": len(rels),
        "ram_frames": frames,
        "snapshot_cpu_ms_p50": round(snapshot_cpu * 1000, 1),
        "snapshot_wall_ms_p50": round(statistics.median(wall) * 1000, 1),
        "ns_per_frame": round(snapshot_cpu / frames * 1e9, 1),
        "snapshot_heap_peak_kib": round(peak / 1024, 1),
        "charged_frames": node_pages,
        "min_toucher_bytes_found": found,
        "touched_bytes_each": touch_mib << 20,
        "refresh_interval_s": DEFAULT_REFRESH_INTERVAL,
        "snapshot_gap_s": round(gap, 1),
        "ours_cpu_percent_at_refresh_interval": round(
            snapshot_cpu / DEFAULT_REFRESH_INTERVAL * 100, 3
        ),
        "ours_cpu_percent": round(ours, 3),
        "kdamond": kd,
        "total_cpu_percent": round(ours + kd["cpu_percent"], 3),
    }


def _measure_kdamond(window: float) -> dict[str, Any]:
    io = RealSysfs(admin_dir(PATHS.sys_root))
    if kdamond_states(io):
        pids = _kdamond_pids()
        return {"whose": "not ours", "pids": pids, "window_s": window,
                "cpu_percent": round(_kdamond_cpu(pids, window), 3)}  # fmt: skip
    state = tempfile.mkdtemp(prefix="kpybench-damon-")
    k = Kdamond(io, claim_path(state), PATHS.proc_root, DamonAttrs())
    try:
        k.start()
        a = k.attrs
        return {
            "whose": "ours",
            "pids": [k.pid],
            "window_s": window,
            "sample_us": a.sample_us,
            "aggr_us": a.aggr_us,
            "max_regions": a.max_regions,
            "cpu_percent": round(_kdamond_cpu([k.pid], window), 3),
        }
    finally:
        k.stop()
        shutil.rmtree(state, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.coldmemory_damon", description=__doc__)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--touchers", type=int, default=4)
    parser.add_argument("--touch-mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--json", action="store_true", help="one JSON line only")
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or not os.path.isfile(os.path.join(MEMCG, "tasks")):
        print("needs root and the cgroup v1 memory hierarchy", file=sys.stderr)
        return 2
    detect_layout(PATHS, version=CgroupVersion.V1)
    result = run(args.pods, args.touchers, args.touch_mib, args.repeat, args.window)
    if not args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
