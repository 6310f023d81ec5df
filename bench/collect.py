"""Benchmark of one collection sweep against the floor of reading the same files.

For each tree (fake, real cgroup v1, or both) and each pod count (default 50, 200 and 500, three
containers a pod), the bench builds the tree (``bench._trees``), lists its pods with the real
``KubepodsSource``, and builds the collectors of the table that run at the base tick
(``collect.res_used_interval``; ``nodeinfo``, at 60 s, does not) exactly as the daemon does.

1. Recording: a separate runner whose file reader records every path it is asked for runs a
   seeding tick and then one steady tick; the paths of that tick are the files a sweep reads
   (the tick memoizes, so each file once).
2. Timing: the timed runner, with the production reader, runs a seeding tick and ``--warmup``
   untimed ticks, then ``--repeat`` times, interleaved: one ``CollectorRunner.run_tick`` (the
   sweep; its samples are then stored with ``apply``, untimed) and one bare loop of
   ``os.open``/``os.read``/``os.close`` over exactly the recorded files (the floor). Both are
   measured in CPU time of this thread (``time.thread_time``: user and system), so that other
   processes on a shared machine do not inflate them; the median and p90 are reported, with the
   median wall time of the sweep. A third loop, one ``os.pread`` from offset 0 of each of the
   same files kept open (``pread_floor_cpu_ms``, ``pread_ratio``), is the least the daemon's
   reads cost: it keeps a tick's kernel files open. The inventory walk
   (``KubepodsSource.list_pods``) and ``apply``, which the daemon also does every tick, are
   timed separately and are not part of the sweep.

Tick timestamps advance one base interval per sweep (the metric cache runs on the same fake
clock), so every sweep is a steady-state tick. ``--profile N`` runs extra sweeps under cProfile
and prints the N most expensive functions (by own time) to stderr.

    python -m bench.collect [--json] [--pods N ...] [--tree fake|real|auto|both]
                            [--version v1|v2] [--driver cgroupfs|systemd] [--repeat N]

With ``--json`` the last line is one JSON object: the figures of the headline run (the 200-pod
run of the first tree when there is one, else the largest) at the top level (``sweep_cpu_ms``,
``floor_cpu_ms``, ``ratio``, ``files``, ``pods``, ``tree``, ...) and every run under ``runs``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

from bench._stats import machine_figures, percentile
from bench._trees import BenchTree, exit_on_sigterm, fake_tree, real_cgroups_available, real_tree
from koordlet.collectors.framework import CollectorContext
from koordlet.collectors.runner import CollectorRunner
from koordlet.collectors.table import build_collectors
from koordlet.config import KoordletConfig
from koordlet.metriccache.store import MetricCache
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from koordlet.system.cgroupstats import READ_BUFFER, read_file_bytes
from koordlet.system.probe import probe_capabilities

DEFAULT_PODS = (50, 200, 500)
CONTAINERS = 3
TARGET_RATIO = 2.0
"""The issue's target: a 200-pod sweep costs at most twice the floor."""
START = 1_700_000_000.0


class TickTimes(NamedTuple):
    """What one timed sweep cost."""

    cpu: float
    """Thread CPU seconds of ``run_tick``."""
    wall: float
    """Wall seconds of ``run_tick``."""
    apply_cpu: float
    """Thread CPU seconds of ``apply`` (storing the samples), not part of the sweep."""
    steps: dict[str, float]
    """Collector → thread CPU seconds of its step, as the runner measured it."""
    reads: int
    """Distinct files the tick read."""
    errors: list[str]
    """Collectors whose step raised."""


class RecordingReader:
    """The production reader, remembering every path it was asked for."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def __call__(self, path: str) -> bytes:
        self.paths.append(path)
        return read_file_bytes(path)


def floor_read(files: Sequence[str]) -> int:
    """Open, read once and close each file: the least any collector can do. Returns how many
    could be opened."""
    open_, read, close = os.open, os.read, os.close
    flags = os.O_RDONLY | os.O_CLOEXEC
    opened = 0
    for path in files:
        try:
            fd = open_(path, flags)
        except OSError:
            continue
        try:
            read(fd, READ_BUFFER)
        finally:
            close(fd)
        opened += 1
    return opened


def open_all(files: Sequence[str]) -> list[int]:
    """A descriptor for each file that opens (closed by the caller)."""
    fds = []
    for path in files:
        try:
            fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            continue
    return fds


def pread_floor(fds: Sequence[int]) -> None:
    """One ``pread`` from offset 0 of each kept descriptor: what the daemon's reads cost at the
    least, since it keeps the kernel files of a tick open (``koordlet.system.openfiles``);
    the floor issue 26 measures the daemon's tick against."""
    pread = os.pread
    for fd in fds:
        with contextlib.suppress(OSError):
            pread(fd, READ_BUFFER, 0)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


class Sweep:
    """The collectors of one tree, ready to tick; see the module docstring."""

    def __init__(self, tree: BenchTree) -> None:
        self.tree = tree
        host = tree.host
        self.source = KubepodsSource(host)
        pods = self.source.list_pods()
        if len(pods) != tree.pods:
            raise SystemExit(f"bench bug: the walker found {len(pods)} of {tree.pods} pods")
        self.snapshot = WorkloadSnapshot(pods=pods, generation=1, taken_at=START)
        self.config = KoordletConfig(paths=host.paths)
        self.base = self.config.collect.res_used_interval
        self.ctx = CollectorContext(
            host=host, config=self.config, capabilities=probe_capabilities(host)
        )
        every = CollectorRunner(build_collectors(self.ctx), MetricCache(), self._workloads)
        self.skipped = [n for n in every.names if every.every(n) > 1]
        """Collectors of the table that do not run at the base tick."""
        self.now = START

    def _workloads(self) -> WorkloadSnapshot:
        return self.snapshot

    def runner(self, read: Callable[[str], bytes] = read_file_bytes) -> CollectorRunner:
        cache = MetricCache(clock=lambda: self.now)
        return CollectorRunner(
            build_collectors(self.ctx, disabled=self.skipped),
            cache,
            self._workloads,
            base_interval=self.base,
            read=read,
        )

    def tick(self, runner: CollectorRunner) -> TickTimes:
        """One sweep at the next timestamp, then ``apply``."""
        self.now += self.base
        c0, w0 = time.thread_time(), time.perf_counter()
        report = runner.run_tick(self.now)
        cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
        c0 = time.thread_time()
        runner.apply(report)
        return TickTimes(
            cpu,
            wall,
            time.thread_time() - c0,
            {s.name: s.cpu_seconds for s in report.steps},
            report.reads,
            sorted(report.errors),
        )

    def record_files(self) -> list[str]:
        reader = RecordingReader()
        runner = self.runner(reader)
        self.tick(runner)  # seeding
        reader.paths.clear()
        self.tick(runner)
        return list(reader.paths)


def measure(tree: BenchTree, repeat: int, warmup: int, profile: int) -> dict[str, Any]:
    sweep = Sweep(tree)
    files = sweep.record_files()
    runner = sweep.runner()
    failing = sweep.tick(runner).errors  # seeding
    fds = open_all(files)
    for _ in range(warmup):
        sweep.tick(runner)
        floor_read(files)
        pread_floor(fds)
    sweep_cpu: list[float] = []
    sweep_wall: list[float] = []
    apply_cpu: list[float] = []
    floor_cpu: list[float] = []
    pread_cpu: list[float] = []
    walk_cpu: list[float] = []
    steps: dict[str, list[float]] = {}
    reads: set[int] = set()
    opened = 0
    for _ in range(repeat):
        got = sweep.tick(runner)
        sweep_cpu.append(got.cpu)
        sweep_wall.append(got.wall)
        apply_cpu.append(got.apply_cpu)
        for name, seconds in got.steps.items():
            steps.setdefault(name, []).append(seconds)
        reads.add(got.reads)
        failing = sorted(set(failing) | set(got.errors))
        c0 = time.thread_time()
        opened = floor_read(files)
        floor_cpu.append(time.thread_time() - c0)
        c0 = time.thread_time()
        pread_floor(fds)
        pread_cpu.append(time.thread_time() - c0)
        c0 = time.thread_time()
        sweep.source.list_pods()
        walk_cpu.append(time.thread_time() - c0)
    for fd in fds:
        os.close(fd)
    if profile:
        profile_sweeps(sweep, runner, profile)
    by_name = Counter(os.path.basename(f) for f in files)
    return {
        "tree": tree.kind,
        "driver": str(tree.host.layout.driver),
        "kube_path": tree.kube_path,
        "pods": tree.pods,
        "containers_per_pod": tree.containers,
        "cgroups": tree.cgroups,
        "repeat": repeat,
        "collectors": list(runner.names),
        "files": len(files),
        "files_missing": len(files) - opened,
        "files_by_name": dict(sorted(by_name.items())),
        "reads_per_sweep": sorted(reads),
        "sweep_cpu_ms": ms(median(sweep_cpu)),
        "sweep_cpu_p90_ms": ms(percentile(sweep_cpu, 90)),
        "sweep_cpu_min_ms": ms(min(sweep_cpu)),
        "sweep_wall_ms": ms(median(sweep_wall)),
        "floor_cpu_ms": ms(median(floor_cpu)),
        "floor_cpu_p90_ms": ms(percentile(floor_cpu, 90)),
        "floor_cpu_min_ms": ms(min(floor_cpu)),
        "ratio": round(median(sweep_cpu) / median(floor_cpu), 2),
        "pread_floor_cpu_ms": ms(median(pread_cpu)),
        "pread_floor_cpu_p90_ms": ms(percentile(pread_cpu, 90)),
        "pread_ratio": round(median(sweep_cpu) / max(median(pread_cpu), 1e-9), 2),
        "target_ratio": TARGET_RATIO,
        "collector_cpu_ms": {name: ms(median(v)) for name, v in steps.items()},
        "apply_cpu_ms": ms(median(apply_cpu)),
        "inventory_cpu_ms": ms(median(walk_cpu)),
        "failing_collectors": failing,
        "unsupported_sources": sorted(runner.unsupported),
    }


def profile_sweeps(sweep: Sweep, runner: CollectorRunner, top: int, sweeps: int = 10) -> None:
    """Print the ``top`` functions by own time over ``sweeps`` extra sweeps to stderr."""
    prof = cProfile.Profile()
    for _ in range(sweeps):
        sweep.now += sweep.base
        prof.enable()
        report = runner.run_tick(sweep.now)
        prof.disable()
        runner.apply(report)
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    title = f"--- cProfile of {sweeps} sweeps, {sweep.tree.kind}, {sweep.tree.pods} pods ---"
    print(f"{title}\n{out.getvalue()}", file=sys.stderr)


def trees_for(kind: str) -> list[str]:
    if kind == "auto":
        return ["real" if real_cgroups_available() is None else "fake"]
    if kind == "both":
        return ["fake", "real"]
    return [kind]


def build(
    kind: str, pods: int, version: CgroupVersion, driver: CgroupDriver
) -> AbstractContextManager[BenchTree]:
    if kind == "real":
        return real_tree(pods, CONTAINERS, driver=driver)
    return fake_tree(pods, CONTAINERS, version=version, driver=driver)


def summary(f: dict[str, Any]) -> str:
    """One human-readable line of a run."""
    return (
        f"{f['tree']:>15} {f['pods']:>4} pods {f['files']:>5} files: "
        f"sweep {f['sweep_cpu_ms']:8.2f} ms (p90 {f['sweep_cpu_p90_ms']:.2f})  "
        f"floor {f['floor_cpu_ms']:7.2f} ms (p90 {f['floor_cpu_p90_ms']:.2f})  "
        f"ratio {f['ratio']:.2f}  walk {f['inventory_cpu_ms']:.2f} ms  "
        f"apply {f['apply_cpu_ms']:.2f} ms"
    )


def headline(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The 200-pod run of the first tree when there is one, else the first tree's largest."""
    first = [r for r in runs if r["tree"] == runs[0]["tree"]]
    at_200 = [r for r in first if r["pods"] == 200]
    return at_200[0] if at_200 else max(first, key=lambda r: r["pods"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.collect", description=__doc__)
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument(
        "--pods", type=int, nargs="+", default=list(DEFAULT_PODS), help="pod counts to run"
    )
    parser.add_argument(
        "--tree",
        choices=("fake", "real", "auto", "both"),
        default="auto",
        help="auto: real cgroups when root with cgroup v1, else fake",
    )
    parser.add_argument("--version", choices=("v1", "v2"), default="v1", help="fake tree only")
    parser.add_argument("--driver", choices=("cgroupfs", "systemd"), default="cgroupfs")
    parser.add_argument("--repeat", type=int, default=15, help="timed sweeps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed sweeps after seeding")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile top N")
    args = parser.parse_args(argv)
    if args.repeat < 1 or min(args.pods) < 1:
        parser.error("--repeat and --pods must be positive")
    kinds = trees_for(args.tree)
    version = CgroupVersion(args.version)
    if "real" in kinds and version is not CgroupVersion.V1:
        parser.error("real trees are cgroup v1 on this machine; --version v2 is for fake trees")
    runs: list[dict[str, Any]] = []
    with exit_on_sigterm():
        for kind in kinds:
            for pods in args.pods:
                with build(kind, pods, version, CgroupDriver(args.driver)) as tree:
                    figures = measure(tree, args.repeat, args.warmup, args.profile)
                runs.append(figures)
                print(summary(figures), flush=True)
    result = dict(headline(runs))
    result["meets_target"] = result["ratio"] <= TARGET_RATIO
    result.update(machine_figures())
    result["runs"] = runs
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
