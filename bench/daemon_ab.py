"""A/B of two checkouts' koordlets running at once on one tree: CPU and memory, window by window.

``bench.daemon`` measures one daemon at a time, and on a shared VM its figure moves by ±0.3 % of
a core from one minute to the next with the machine's speed: two commits measured one after the
other differ by that much with no change at all. Here both daemons run together, over the same
windows, on the same tree (``bench._trees``: real cgroup v1 with ``--tree real``, the default, or
the fake tree), each in standalone mode with a state directory of its own, so the machine's speed
moves both alike and the difference between them is the code's.

Each daemon is ``python -m koordlet`` started from its checkout (``--a`` and ``--b``; this
repository by default, so an A/A run shows the method's own noise), collecting every
``--interval`` seconds. After both are ready and ``--warmup`` seconds, the bench reads each
process's ``utime + stime`` (``/proc/<pid>/stat``) at the ends of ``--windows`` windows of
``--window`` seconds, and its ``VmRSS`` at each window's end. It reports each window's figures,
the means, and the mean of the per-window differences (A minus B) with their standard
deviation. Both processes are killed, and the tree removed, in a ``finally``.

    python -m bench.daemon_ab --a ../wt-before [--b .] [--pods 200] [--tree real|fake]
                              [--windows 4] [--window 40] [--json]

The two daemons read the same files, so each sees the kernel's caches the other warmed; a
daemon alone runs a little slower than here, and both alike (an A/A run: differences within
0.05 % of a core over four 40 s windows in docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._stats import print_result
from bench._trees import exit_on_sigterm
from bench.daemon import (
    CLK_TCK,
    CONTAINERS,
    READY_TIMEOUT,
    REPO,
    build,
    daemon_flags,
    host_share,
    is_ready,
    read_cpu_ticks,
    read_host_cpu,
    rss_mib,
    running,
)


def window_figures(pids: Sequence[int], seconds: float) -> tuple[list[float], list[float]]:
    """CPU (% of a core) of each process over the next ``seconds``, and its RSS (MiB) at the
    end."""
    before = [read_cpu_ticks(pid) for pid in pids]
    t0 = time.monotonic()
    time.sleep(seconds)
    after = [read_cpu_ticks(pid) for pid in pids]
    elapsed = time.monotonic() - t0
    cpu = [
        round((a.user + a.system - b.user - b.system) / CLK_TCK / elapsed * 100, 3)
        for b, a in zip(before, after, strict=True)
    ]
    return cpu, [round(rss_mib(pid), 1) for pid in pids]


def compare(
    tree_kind: str,
    pods: int,
    checkouts: tuple[Path, Path],
    *,
    windows: int,
    window: float,
    warmup: float,
    interval: float,
) -> dict[str, Any]:
    with (
        exit_on_sigterm(),
        build(tree_kind, pods) as tree,
        tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        daemons = []
        for name, checkout in zip("ab", checkouts, strict=True):
            state = ("--state-dir", str(Path(tmp, name)))
            args = daemon_flags(tree, interval, "warning", extra=state)
            cmd = [sys.executable, "-m", "koordlet"]
            daemons.append(
                stack.enter_context(running(cmd, args, Path(tmp, f"{name}.log"), checkout))
            )
        for daemon in daemons:
            daemon.until("/readyz", functools.partial(is_ready, daemon), READY_TIMEOUT)
        time.sleep(warmup)
        host0 = read_host_cpu()
        rows = []
        for _ in range(windows):
            cpu, rss = window_figures([d.pid for d in daemons], window)
            for daemon in daemons:
                daemon.alive()
            rows.append({"a": cpu[0], "b": cpu[1], "rss_a": rss[0], "rss_b": rss[1]})
        host1 = read_host_cpu()
    diffs = [r["a"] - r["b"] for r in rows]
    return {
        "tree": tree.kind,
        "pods": pods,
        "containers_per_pod": CONTAINERS,
        "interval_s": interval,
        "window_s": window,
        "windows": rows,
        "a": str(checkouts[0]),
        "b": str(checkouts[1]),
        "cpu_a_percent": round(statistics.fmean(r["a"] for r in rows), 3),
        "cpu_b_percent": round(statistics.fmean(r["b"] for r in rows), 3),
        "diff_percent": round(statistics.fmean(diffs), 3),
        "diff_stdev": round(statistics.stdev(diffs), 3) if len(diffs) > 1 else None,
        "rss_a_mib": round(rows[-1]["rss_a"], 1),
        "rss_b_mib": round(rows[-1]["rss_b"], 1),
        **host_share(host0, host1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.daemon_ab", description=__doc__)
    parser.add_argument("--json", action="store_true", help="one JSON line at the end")
    parser.add_argument("--a", type=Path, default=REPO, help="checkout A (this one by default)")
    parser.add_argument("--b", type=Path, default=REPO, help="checkout B (this one by default)")
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--tree", choices=("fake", "fake-v2", "real", "auto"), default="real")
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--window", type=float, default=40.0, help="seconds a window")
    parser.add_argument("--warmup", type=float, default=12.0, help="seconds excluded at start")
    parser.add_argument("--interval", type=float, default=1.0, help="collect interval, seconds")
    args = parser.parse_args(argv)
    if args.pods < 0 or args.windows < 1 or args.window < 1 or args.interval <= 0:
        parser.error("--pods >= 0, --windows >= 1, --window >= 1 and --interval > 0")
    figures = compare(
        args.tree,
        args.pods,
        (args.a.resolve(), args.b.resolve()),
        windows=args.windows,
        window=args.window,
        warmup=args.warmup,
        interval=args.interval,
    )
    print_result(figures, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
