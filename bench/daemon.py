"""Benchmark of the real koordlet process at steady state: CPU share and resident memory.

Builds a tree of ``--pods`` pods of three containers (``bench._trees``: fake on tmpfs by default,
or real cgroup v1 with ``--tree real``), starts the daemon as a user does (``python -m koordlet``,
or the ``koordlet`` console script with ``--command script``) in standalone mode on a free
127.0.0.1 port, pointed at that tree and collecting every ``--interval`` seconds, and waits for
``/readyz``. After ``--warmup`` seconds (excluded: imports, first ticks, series creation) it
scrapes ``/metrics`` once to check that the pods are exported (distinct ``pod_uid`` values), then
measures over ``--duration`` seconds:

- CPU: ``utime + stime`` of ``/proc/<pid>/stat`` at both ends of the window, over the window's
  wall time, in percent of one core (split into user and system too);
- memory: ``VmRSS`` of ``/proc/<pid>/status`` sampled every second; the last sample and the
  largest;
- where the time went, from the daemon's own ``koordlet_step_duration_seconds`` histogram,
  scraped just before and just after the window: the mean wall time of the whole collect step
  (``daemon/collect``: inventory walk, sweep, storing) and of each collector's step;
- how busy the whole machine was meanwhile (``/proc/stat``, all CPUs, steal separately), to
  judge whether the figures were taken on a quiet machine;
- the event loop's share: the main thread's ``utime + stime`` (``/proc/<pid>/task/<pid>/stat``),
  the rest being the collect step's worker threads and the cgroup writer; and every thread's
  share by its kernel name (``cpu_threads_percent``: ``main``, ``collect_0``,
  ``cgroup-writer_0``...).

Then it sends SIGTERM and records the exit code and how long the process took to exit. The
process is killed, and the tree removed, in a ``finally`` whatever happens (SIGTERM to the bench
included). Nothing scrapes during the window.

**The pread floor of the tick** (issue 26: "measure against the pread floor and say how close the
tick is"): at the window's end the bench lists the kernel files the daemon holds open
(``/proc/<pid>/fd``: the cgroup and proc files ``koordlet.system.openfiles`` keeps from one tick to
the next, which are the tick's reads), and once the daemon has exited it opens the same files and
reads each with one ``pread`` per round, :data:`FLOOR_ROUNDS` rounds one interval apart (cold
caches, like the daemon's ticks), timing its own thread's CPU. ``pread_floor_percent`` is the
median round over the interval, in percent of a core, and ``floor_ratio`` the daemon's CPU over
it: both taken minutes apart on the same machine, so a slow hour moves both. On a tree of regular
files (the fake trees) nothing is held open, and the floor is reported as not measured.

    python -m bench.daemon [--json] [--pods N] [--duration S] [--interval S] [--warmup S]
                           [--tree fake|fake-v2|real|auto] [--command module|script]
                           [--gates A,B]

With ``--gates`` (``CPICollector,PSICollector``) the daemon runs twice on the same tree, without
and then with those feature gates on; the first run's figures are at the top level, the second's
under ``gated``, and ``gates_cpu_millicores`` and ``gates_rss_mib`` are the differences.

With ``--json`` the last line is one JSON object (``cpu_percent``, ``rss_mib``, ``rss_max_mib``,
``duration_s``, ``pods``, ``exit_code``, ``stop_s``, ``step_wall_ms``, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from bench._stats import print_result
from bench._trees import BenchTree, exit_on_sigterm, fake_tree, real_cgroups_available, real_tree
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from koordlet.system.cgroupstats import READ_BUFFER
from koordlet.system.paths import HostPaths

REPO = Path(__file__).resolve().parents[1]
CONTAINERS = 3
TARGET_CPU_PERCENT = 2.0
"""Issue 26's target at 200 pods, standalone: at most 2 % of one core (it grows linearly with
pods; issue 17's was 3 %)."""
TARGET_RSS_MIB = 40.0
"""Issue 26's target at 200 pods, standalone: at most 40 MiB resident (issue 17's was 50)."""
TARGET_RSS_MIB_LARGE = 100.0
"""The issue's target above 200 pods (1,000): at most 100 MiB resident."""
TARGET_GATES_MILLICORES = 10.0
"""The issue's target for ``--gates CPICollector,PSICollector`` at 150 containers: at most 10m
of CPU more than without them."""
TARGET_GATES_RSS_MIB = 10.0
"""... and at most 10 MiB more resident memory."""
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
PROC = HostPaths()
"""This machine's procfs, where the daemon's own counters are."""
STANDALONE = ("--standalone", "--nodeslo-file", "", "--node-name", "bench-node")
"""The flags of a standalone run: no API server, Koordinator's default NodeSLO."""
FLOOR_ROUNDS = 10
"""Rounds of the pread floor, one interval apart."""


class CpuTicks(NamedTuple):
    """``utime`` and ``stime`` of a process, in clock ticks."""

    user: int
    system: int


def read_cpu_ticks(pid: int, thread: int | None = None) -> CpuTicks:
    """From ``/proc/<pid>/stat`` (the whole process), or ``/proc/<pid>/task/<thread>/stat`` (one
    thread; the main thread's id is ``pid``); ``comm`` may hold spaces and parentheses, so the
    fields are counted from the last ``)`` (proc(5): utime and stime are fields 14 and 15)."""
    parts = (str(pid), "stat") if thread is None else (str(pid), "task", str(thread), "stat")
    with open(PROC.proc(*parts), "rb") as f:
        text = f.read()
    fields = text[text.rindex(b")") + 2 :].split()
    return CpuTicks(int(fields[11]), int(fields[12]))


def read_thread_ticks(pid: int) -> dict[int, tuple[str, int]]:
    """Every thread of ``pid``: its ``comm`` (the koordlet names its threads in the kernel:
    ``collect_0``, ``cgroup-writer_0``, ``audit-log``; the main thread reads ``main``) and its
    ``utime + stime`` in clock ticks. A thread that ends meanwhile is left out."""
    out: dict[int, tuple[str, int]] = {}
    for name in os.listdir(PROC.proc(str(pid), "task")):
        tid = int(name)
        with contextlib.suppress(OSError):
            with open(PROC.proc(str(pid), "task", name, "comm")) as f:
                comm = "main" if tid == pid else f.read().rstrip("\n")
            out[tid] = (comm, sum(read_cpu_ticks(pid, tid)))
    return out


def thread_shares(
    before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]], window: float
) -> dict[str, float]:
    """Percent of a core per thread name over the window (threads of one name summed), for
    the threads alive at both ends; largest first."""
    shares: dict[str, float] = {}
    for tid, (comm, ticks) in after.items():
        if tid in before:
            used = (ticks - before[tid][1]) / CLK_TCK / window * 100
            shares[comm] = shares.get(comm, 0.0) + used
    return {k: round(v, 3) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])}


def held_kernel_files(pid: int, roots: Sequence[str]) -> list[str]:
    """The files under ``roots`` (the tree's cgroup and proc roots) that ``pid`` holds open, from
    its ``/proc/<pid>/fd`` links; its own ``/proc/<pid>`` files are left out."""
    fd_dir = PROC.proc(str(pid), "fd")
    own = PROC.proc(str(pid)) + "/"
    prefixes = tuple(roots)
    held = set()
    for name in os.listdir(fd_dir):
        with contextlib.suppress(OSError):  # closed meanwhile
            target = os.readlink(os.path.join(fd_dir, name))
            if target.startswith(prefixes) and not target.startswith(own):
                held.add(target)
    return sorted(held)


def pread_floor(paths: Sequence[str], interval: float, rounds: int) -> dict[str, Any]:
    """One ``pread`` of each of ``paths`` per round, ``rounds`` rounds ``interval`` apart; the
    median round's CPU (this thread's) in percent of a core at that interval."""
    fds = []
    try:
        for path in paths:
            with contextlib.suppress(OSError):  # a cgroup the tree no longer has
                fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        if not fds:
            return {"tick_files": 0, "pread_floor_percent": None, "floor_ratio": None}
        pread, cpu = os.pread, time.thread_time
        costs = []
        for _ in range(rounds):
            time.sleep(interval)
            c0 = cpu()
            for fd in fds:
                with contextlib.suppress(OSError):
                    pread(fd, READ_BUFFER, 0)
            costs.append(cpu() - c0)
    finally:
        for fd in fds:
            os.close(fd)
    percent = statistics.median(costs) / interval * 100
    return {"tick_files": len(fds), "pread_floor_percent": round(percent, 3)}


def read_host_cpu() -> tuple[int, int, int]:
    """(busy, steal, total) clock ticks of the whole machine, from the ``cpu`` line of
    ``/proc/stat`` (busy: everything but idle, iowait and steal; guest time is inside user)."""
    with open(PROC.proc("stat"), "rb") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    idle, iowait, steal = values[3], values[4], values[7]
    total = sum(values)
    return total - idle - iowait - steal, steal, total


def host_share(before: tuple[int, int, int], after: tuple[int, int, int]) -> dict[str, float]:
    """How busy the whole machine was between two :func:`read_host_cpu` readings, and how much
    of it was stolen by the hypervisor, in percent."""
    busy, steal, total = (b - a for a, b in zip(before, after, strict=True))
    return {
        "host_busy_percent": round(busy / max(total, 1) * 100, 1),
        "host_steal_percent": round(steal / max(total, 1) * 100, 1),
    }


def daemon_flags(
    tree: BenchTree,
    interval: float,
    log_level: str,
    mode: Sequence[str] = STANDALONE,
    extra: Sequence[str] = (),
) -> list[str]:
    """The koordlet's flags for a run on ``tree`` in ``mode``, collecting every ``interval``."""
    return [
        *mode,
        *("--collect-res-used-interval-seconds", f"{interval:g}"),
        *("--log-level", log_level),
        *tree.daemon_args,
        *extra,
    ]


def read_status(pid: int) -> dict[str, str]:
    """``/proc/<pid>/status`` as key → value text."""
    with open(PROC.proc(str(pid), "status")) as f:
        return {k: v.strip() for k, _, v in (line.partition(":") for line in f)}


def rss_mib(pid: int) -> float:
    """``VmRSS`` in MiB."""
    return int(read_status(pid)["VmRSS"].split()[0]) / 1024


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


class Scrape(NamedTuple):
    """What the bench reads from one ``/metrics`` exposition."""

    pods: int
    """Distinct ``pod_uid`` label values."""
    samples: int
    """Samples in the exposition."""
    steps: dict[str, tuple[float, float]]
    """``component/name`` → (sum of seconds, count) of ``koordlet_step_duration_seconds``."""


STEP_FAMILY = "koordlet_step_duration_seconds"


def read_scrape(text: str) -> Scrape:
    uids: set[str] = set()
    samples = 0
    steps: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples += 1
            uid = sample.labels.get("pod_uid")
            if uid:
                uids.add(uid)
            if family.name == STEP_FAMILY and sample.name in (
                STEP_FAMILY + "_sum",
                STEP_FAMILY + "_count",
            ):
                key = f"{sample.labels.get('component')}/{sample.labels.get('name')}"
                pair = steps.setdefault(key, [0.0, 0.0])
                pair[sample.name.endswith("_count")] = sample.value
    return Scrape(len(uids), samples, {k: (v[0], v[1]) for k, v in steps.items()})


def step_means_ms(before: Scrape, after: Scrape) -> dict[str, float]:
    """Mean wall milliseconds of each step between two scrapes (steps that ran in between)."""
    means = {}
    for key, (total, count) in sorted(after.steps.items()):
        total0, count0 = before.steps.get(key, (0.0, 0.0))
        if count > count0:
            means[key] = round((total - total0) / (count - count0) * 1e3, 3)
    return means


def launcher(kind: str) -> list[str]:
    if kind == "script":
        script = Path(sys.executable).parent / "koordlet"
        if not script.exists():
            raise SystemExit(f"no console script at {script}; pip install -e . installs it")
        return [str(script)]
    return [sys.executable, "-m", "koordlet"]


class Daemon:
    """A running koordlet; see :func:`running`."""

    def __init__(self, popen: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.popen = popen
        self.base = f"http://127.0.0.1:{port}"
        self.log = log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log.read_text(errors="replace")[-4000:]
            raise SystemExit(f"koordlet exited with {self.popen.returncode}; log tail:\n{tail}")

    def until(self, what: str, check: Callable[[], bool], timeout: float) -> float:
        """Poll ``check`` every 50 ms; returns the seconds it took."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            self.alive()
            with contextlib.suppress(OSError):
                if check():
                    return time.monotonic() - t0
            time.sleep(0.05)
        raise SystemExit(f"no {what} within {timeout:g}s; log: {self.log}")

    def get(self, path: str) -> tuple[int, str]:
        return http_get(self.base + path)


def is_ready(daemon: Daemon) -> bool:
    """``/readyz`` answers 200."""
    return daemon.get("/readyz")[0] == 200


@contextlib.contextmanager
def running(
    cmd: Sequence[str], args: Sequence[str], log: Path, cwd: Path = REPO
) -> Iterator[Daemon]:
    """Start the koordlet on a free loopback port (from the checkout ``cwd``: ``python -m``
    imports that checkout's code); always kill it afterwards."""
    port = free_port()
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            [*cmd, "--addr", f"127.0.0.1:{port}", *args],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield Daemon(popen, port, log)
    finally:
        if popen.poll() is None:
            popen.kill()
        popen.wait(timeout=STOP_TIMEOUT)


def measure(
    tree: BenchTree,
    cmd: Sequence[str],
    *,
    interval: float,
    warmup: float,
    duration: float,
    log_level: str,
    log: Path,
    extra: Sequence[str] = (),
    mode: Sequence[str] = STANDALONE,
    cwd: Path = REPO,
) -> dict[str, Any]:
    """One daemon run on ``tree``; ``mode`` holds the flags of its mode (:data:`STANDALONE`, or
    a kubeconfig and a node name for cluster mode)."""
    args = daemon_flags(tree, interval, log_level, mode, extra)
    with running(cmd, args, log, cwd) as daemon:
        ready_s = daemon.until("/readyz", functools.partial(is_ready, daemon), READY_TIMEOUT)
        time.sleep(warmup)
        scraped: list[Scrape] = []

        def all_pods_exported() -> bool:
            status, text = daemon.get("/metrics")
            if status != 200:
                return False
            scraped.append(read_scrape(text))
            return scraped[-1].pods >= tree.pods

        # One scrape is enough once the pods are there; a slow start gets a few more seconds.
        with contextlib.suppress(SystemExit):
            daemon.until("every pod in /metrics", all_pods_exported, timeout=10 * interval + 5)
        daemon.alive()
        before = scraped[-1] if scraped else Scrape(0, 0, {})

        pid = daemon.pid
        rss: list[float] = []
        host0 = read_host_cpu()
        ticks0, t0 = read_cpu_ticks(pid), time.monotonic()
        threads0 = read_thread_ticks(pid)  # inside the process's window: never more
        end = t0 + duration
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(1.0, left))
            daemon.alive()
            rss.append(rss_mib(pid))
        threads1 = read_thread_ticks(pid)
        ticks1, t1 = read_cpu_ticks(pid), time.monotonic()
        host1 = read_host_cpu()
        held = held_kernel_files(pid, tree.kernel_roots)
        threads = int(read_status(pid)["Threads"])
        status, text = daemon.get("/metrics")
        after = read_scrape(text) if status == 200 else before

        s0 = time.monotonic()
        daemon.popen.send_signal(signal.SIGTERM)
        try:
            code: int | None = daemon.popen.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        stop_s = time.monotonic() - s0

    window = t1 - t0
    user = (ticks1.user - ticks0.user) / CLK_TCK
    system = (ticks1.system - ticks0.system) / CLK_TCK
    cpu_percent = round((user + system) / window * 100, 2)
    shares = thread_shares(threads0, threads1, window)
    floor = pread_floor(held, interval, FLOOR_ROUNDS)
    if floor["pread_floor_percent"]:
        floor["floor_ratio"] = round(cpu_percent / floor["pread_floor_percent"], 2)
    return {
        "tree": tree.kind,
        "pods": tree.pods,
        "containers_per_pod": tree.containers,
        "interval_s": interval,
        "warmup_s": warmup,
        "duration_s": round(window, 2),
        "cpu_percent": cpu_percent,
        "cpu_user_percent": round(user / window * 100, 2),
        "cpu_system_percent": round(system / window * 100, 2),
        "cpu_main_thread_percent": round(shares["main"], 2),
        "cpu_threads_percent": shares,
        **floor,
        **host_share(host0, host1),
        "rss_mib": round(rss[-1], 1),
        "rss_max_mib": round(max(rss), 1),
        "rss_samples": len(rss),
        "threads": threads,
        "ready_s": round(ready_s, 2),
        "pods_in_metrics": before.pods,
        "metrics_samples": before.samples,
        "step_wall_ms": step_means_ms(before, after),
        "exit_code": code,
        "stop_s": round(stop_s, 3),
    }


def build(kind: str, pods: int) -> AbstractContextManager[BenchTree]:
    """``fake`` (cgroup v1 on tmpfs), ``fake-v2`` (cgroup v2 with PSI files, systemd driver),
    ``real`` (this machine's cgroup v1) or ``auto`` (real when possible)."""
    if kind == "auto":
        kind = "real" if real_cgroups_available() is None else "fake"
    if kind == "real":
        return real_tree(pods, CONTAINERS)
    if kind == "fake-v2":
        return fake_tree(pods, CONTAINERS, version=CgroupVersion.V2, driver=CgroupDriver.SYSTEMD)
    return fake_tree(pods, CONTAINERS)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.daemon", description=__doc__)
    parser.add_argument(
        "--json", action="store_true", help="one JSON line instead of key: value lines"
    )
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds")
    parser.add_argument("--interval", type=float, default=1.0, help="collect interval, seconds")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds excluded at start")
    parser.add_argument("--tree", choices=("fake", "fake-v2", "real", "auto"), default="fake")
    parser.add_argument("--command", choices=("module", "script"), default="module")
    parser.add_argument("--log-level", default="info", help="the daemon's --log-level")
    parser.add_argument("--keep-log", action="store_true", help="keep the daemon's log file")
    parser.add_argument(
        "--checkout",
        type=Path,
        default=REPO,
        help="run the koordlet of this checkout (python -m koordlet from there; an A/B against "
        "another commit's worktree), this one by default",
    )
    parser.add_argument(
        "--gates",
        default="",
        help="feature gates (comma-separated, e.g. CPICollector,PSICollector): measure the daemon "
        "without them, then with them on, on the same tree, and report the difference",
    )
    args = parser.parse_args(argv)
    if args.pods < 0 or args.duration < 1 or args.interval <= 0 or args.warmup < 0:
        parser.error("--pods >= 0, --duration >= 1, --interval > 0 and --warmup >= 0")
    cmd = launcher(args.command)
    fd, name = tempfile.mkstemp(prefix="bench-koordlet-", suffix=".log")
    os.close(fd)
    log = Path(name)
    gates = [g.strip() for g in args.gates.split(",") if g.strip()]
    runs: list[list[str]] = [[]]
    if gates:
        runs.append([f"--feature-gates={','.join(f'{g}=true' for g in gates)}"])
    try:
        with exit_on_sigterm(), build(args.tree, args.pods) as tree:
            results = [
                measure(
                    tree,
                    cmd,
                    interval=args.interval,
                    warmup=args.warmup,
                    duration=args.duration,
                    log_level=args.log_level,
                    log=log,
                    extra=extra,
                    cwd=args.checkout.resolve(),
                )
                for extra in runs
            ]
    finally:
        if not args.keep_log:
            log.unlink(missing_ok=True)
    figures = results[0]
    figures["command"] = " ".join([*(Path(c).name for c in cmd[:1]), *cmd[1:]])
    figures["checkout"] = str(args.checkout.resolve())
    # Linear in the pods from the 200-pod target; the resident target is 100 MiB above 200.
    figures["target_cpu_percent"] = round(TARGET_CPU_PERCENT * max(args.pods, 1) / 200, 3)
    figures["target_rss_mib"] = TARGET_RSS_MIB if args.pods <= 200 else TARGET_RSS_MIB_LARGE
    figures["meets_target"] = (
        figures["cpu_percent"] <= figures["target_cpu_percent"]
        and figures["rss_max_mib"] <= figures["target_rss_mib"]
    )
    if gates:
        gated = results[1]
        figures["gates"] = gates
        figures["gated"] = gated
        # One percent of a core is 10 millicores.
        figures["gates_cpu_millicores"] = round(
            (gated["cpu_percent"] - figures["cpu_percent"]) * 10, 2
        )
        figures["gates_rss_mib"] = round(gated["rss_max_mib"] - figures["rss_max_mib"], 1)
        figures["gates_meet_target"] = (
            figures["gates_cpu_millicores"] <= TARGET_GATES_MILLICORES
            and figures["gates_rss_mib"] <= TARGET_GATES_RSS_MIB
        )
    figures["kernel"] = platform.release()
    figures["python"] = platform.python_version()
    figures["cpus"] = os.cpu_count()
    if args.keep_log:
        figures["log"] = str(log)
    print_result(figures, args.json, width=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
