"""Benchmark of what one ``/metrics`` scrape costs: the koordlet against Debian's node-exporter.

Starts the koordlet as ``bench.daemon`` does (standalone, on a tree of ``--pods`` pods of three
containers, collecting every ``--interval`` seconds) and Debian's ``prometheus-node-exporter``
on another loopback port (installed with apt-get when missing), then, for each of the two in
turn, measures the CPU a scrape costs it:

- twice ``--scrapes`` windows of ``--spacing`` seconds alternate: a window that begins with one
  scrape, then a window without; the process's CPU time (``utime + stime`` of
  ``/proc/<pid>/stat``) is read at every window edge. A scrape's cost is the CPU of the scrape
  windows minus that of the quiet windows, over the number of scrapes: the koordlet's own
  collection, which costs the same in both kinds of window, cancels out, and adjacent windows
  share the machine's state.
- A scrape asks what Prometheus asks (``Accept`` preferring OpenMetrics, then the text format;
  ``Accept-Encoding: gzip``). Its samples are the body's sample lines (not comments).
- The default spacing equals the collection interval, so that every koordlet scrape lands on a
  new tick and pays a fresh build of its exposition: the figure is what a Prometheus scraping at
  the collection interval or slower costs, not the cheaper cached answer.

The output: ``scrape_us_per_sample`` (the koordlet) and ``node_exporter_us_per_sample``, CPU
microseconds per sample served, their ``ratio`` (target at most 1.0), and per target the CPU
milliseconds a scrape, the samples and bytes of a scrape, and the content type served.

    python -m bench.scrape [--json] [--pods N] [--scrapes N] [--spacing S] [--interval S]
                           [--tree fake|real|auto] [--warmup S]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench._stats import machine_figures, print_result
from bench._tools import ensure_program, process_cpu
from bench._trees import BenchTree, exit_on_sigterm
from bench.daemon import READY_TIMEOUT, build, free_port, launcher, read_scrape, running

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
"""The ``Accept`` header Prometheus 2.x sends with its default scrape protocols."""
TARGET_RATIO = 1.0
"""The issue's target: the koordlet costs at most what node-exporter costs per sample."""


def scrape(url: str) -> tuple[int, int, str]:
    """One scrape as Prometheus makes it: (samples, bytes on the wire, content type)."""
    request = urllib.request.Request(
        url, headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        raw = resp.read()
        ctype = resp.headers.get("Content-Type", "")
        encoding = resp.headers.get("Content-Encoding", "")
    body = gzip.decompress(raw) if encoding == "gzip" else raw
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return samples, len(raw), ctype


def cost_per_scrape(pid: int, url: str, *, scrapes: int, spacing: float) -> dict[str, Any]:
    """Alternate scrape and quiet windows; the CPU a scrape costs the process ``pid``."""
    busy = quiet = 0.0
    samples: list[int] = []
    sizes: list[int] = []
    ctype = ""
    edge = time.monotonic()
    cpu = process_cpu(pid)
    for i in range(2 * scrapes):
        scraping = i % 2 == 0
        if scraping:
            n, size, ctype = scrape(url)
            samples.append(n)
            sizes.append(size)
        edge += spacing
        time.sleep(max(edge - time.monotonic(), 0.0))
        now_cpu = process_cpu(pid)
        if scraping:
            busy += now_cpu - cpu
        else:
            quiet += now_cpu - cpu
        cpu = now_cpu
    per_scrape = max(busy - quiet, 0.0) / scrapes
    mean_samples = statistics.fmean(samples)
    return {
        "cpu_ms_per_scrape": round(per_scrape * 1e3, 3),
        "us_per_sample": round(per_scrape / mean_samples * 1e6, 3),
        "samples": round(mean_samples),
        "bytes": round(statistics.fmean(sizes)),
        "content_type": ctype,
        "quiet_cpu_ms_per_window": round(quiet / scrapes * 1e3, 3),
    }


@contextlib.contextmanager
def node_exporter(log: Path) -> Iterator[tuple[int, str]]:
    """Debian's node-exporter on a free loopback port: (pid, /metrics URL); always killed."""
    program = ensure_program("prometheus-node-exporter", "prometheus-node-exporter")
    port = free_port()
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            [program, f"--web.listen-address=127.0.0.1:{port}"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        until(lambda: _answers(url), READY_TIMEOUT, "node-exporter", popen)
        yield popen.pid, url
    finally:
        popen.kill()
        popen.wait(timeout=10)


def _answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status == 200)


def until(
    check: Callable[[], bool], timeout: float, what: str, popen: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise SystemExit(f"{what} exited with {popen.returncode}")
        with contextlib.suppress(OSError):
            if check():
                return
        time.sleep(0.05)
    raise SystemExit(f"{what} did not answer within {timeout:g}s")


def measure(
    tree: BenchTree, cmd: Sequence[str], args: argparse.Namespace, logs: Path
) -> dict[str, Any]:
    daemon_args = [
        "--standalone",
        *("--nodeslo-file", ""),
        *("--node-name", "bench-node"),
        *("--collect-res-used-interval-seconds", f"{args.interval:g}"),
        *tree.daemon_args,
    ]
    with (
        running(cmd, daemon_args, logs / "koordlet.log") as daemon,
        node_exporter(logs / "node-exporter.log") as (ne_pid, ne_url),
    ):
        daemon.until("/readyz", lambda: daemon.get("/readyz")[0] == 200, READY_TIMEOUT)
        daemon.until(
            "every pod in /metrics",
            lambda: read_scrape(daemon.get("/metrics")[1]).pods >= tree.pods,
            timeout=10 * args.interval + 10,
        )
        time.sleep(args.warmup)
        koordlet = cost_per_scrape(
            daemon.pid, daemon.base + "/metrics", scrapes=args.scrapes, spacing=args.spacing
        )
        daemon.alive()
        exporter = cost_per_scrape(ne_pid, ne_url, scrapes=args.scrapes, spacing=args.spacing)
    ratio = (
        koordlet["us_per_sample"] / exporter["us_per_sample"] if exporter["us_per_sample"] else None
    )
    return {
        "tree": tree.kind,
        "pods": tree.pods,
        "interval_s": args.interval,
        "scrapes": args.scrapes,
        "spacing_s": args.spacing,
        "scrape_us_per_sample": koordlet["us_per_sample"],
        "node_exporter_us_per_sample": exporter["us_per_sample"],
        "ratio": None if ratio is None else round(ratio, 3),
        "koordlet": koordlet,
        "node_exporter": exporter,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scrape", description=__doc__)
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--scrapes", type=int, default=40, help="scrapes of each target")
    parser.add_argument("--spacing", type=float, default=None, help="seconds per window")
    parser.add_argument("--interval", type=float, default=1.0, help="collect interval, seconds")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring")
    parser.add_argument("--tree", choices=("fake", "real", "auto"), default="fake")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    args = parser.parse_args(argv)
    if args.spacing is None:
        args.spacing = args.interval
    if args.pods < 1 or args.scrapes < 1 or args.spacing <= 0 or args.interval <= 0:
        parser.error("--pods >= 1, --scrapes >= 1, --spacing > 0 and --interval > 0")
    logs = Path(tempfile.mkdtemp(prefix="bench-scrape-"))
    try:
        with exit_on_sigterm(), build(args.tree, args.pods) as tree:
            figures = measure(tree, launcher("module"), args, logs)
    finally:
        if not args.keep_logs:
            for log in logs.iterdir():
                log.unlink()
            logs.rmdir()
    figures["target_ratio"] = TARGET_RATIO
    figures["meets_target"] = figures["ratio"] is not None and figures["ratio"] <= TARGET_RATIO
    figures.update(machine_figures())
    if args.keep_logs:
        figures["logs"] = str(logs)
    print_result(figures, args.json, width=28)
    return 0


if __name__ == "__main__":
    sys.exit(main())
