"""The benchmarks run end to end with tiny sizes and keep their output contract.

Each bench is run as a user runs it (``python -m bench.<name> --json`` from the repository root)
and its last line must be one JSON object with the documented keys. Times are never asserted:
only that they are there, numbers, and consistent with each other where that is a fact (the floor
reads exactly the files the sweep read).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench._trees import REAL_CONTROLLERS, real_cgroups_available
from envtest import assets as envtest_assets
from koordlet.system.paths import HostPaths

REPO = Path(__file__).resolve().parents[2]


def run_bench(name: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    figures = json.loads(last)
    assert isinstance(figures, dict)
    return figures


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@pytest.mark.parametrize(
    ("version", "driver"),
    [("v1", "cgroupfs"), ("v2", "systemd")],
    ids=["v1-cgroupfs", "v2-systemd"],
)
def test_collect_bench_ends_with_one_json_line_of_sweep_and_floor_figures(
    version: str, driver: str
) -> None:
    figures = run_bench(
        "collect", "--tree", "fake", "--version", version, "--driver", driver,
        "--pods", "2", "--repeat", "2", "--warmup", "0",
    )  # fmt: skip

    for key in ("sweep_cpu_ms", "sweep_cpu_p90_ms", "floor_cpu_ms", "floor_cpu_p90_ms", "ratio"):
        assert is_number(figures[key]), key
        assert figures[key] >= 0, key
    assert figures["tree"] == f"fake-{version}"
    assert figures["driver"] == driver
    assert (figures["pods"], figures["containers_per_pod"], figures["repeat"]) == (2, 3, 2)
    assert figures["files"] > 0
    assert figures["files"] == sum(figures["files_by_name"].values())
    # Each of the 2 pods and 6 containers has its memory file read once by the sweep (v1: the
    # hierarchical LRU sums of memory.numa_stat, v2: memory.stat).
    memory_file = "memory.numa_stat" if figures["tree"] == "fake-v1" else "memory.stat"
    assert figures["files_by_name"][memory_file] == 8
    assert figures["reads_per_sweep"] == [figures["files"]]  # the floor reads what the tick read
    assert figures["files_missing"] == 0
    assert figures["failing_collectors"] == []
    assert "nodeinfo" not in figures["collectors"]  # 60 s interval: not part of a base sweep
    assert set(figures["collector_cpu_ms"]) == set(figures["collectors"])
    assert [r["pods"] for r in figures["runs"]] == [2]


def test_collect_bench_runs_every_pod_count_and_heads_with_the_200_pod_run() -> None:
    figures = run_bench(
        "collect", "--tree", "fake", "--pods", "1", "3", "--repeat", "1", "--warmup", "0"
    )

    assert [r["pods"] for r in figures["runs"]] == [1, 3]
    assert figures["pods"] == 3  # no 200-pod run: the largest one heads
    assert figures["runs"][0]["files"] < figures["runs"][1]["files"]


@pytest.mark.realcgroup
@pytest.mark.skipif(real_cgroups_available() is not None, reason=str(real_cgroups_available()))
def test_collect_bench_on_real_cgroups_removes_its_tree() -> None:
    figures = run_bench("collect", "--tree", "real", "--pods", "2", "--repeat", "1")

    assert figures["tree"] == "real-cgroup-v1"
    assert figures["failing_collectors"] == []
    top = figures["kube_path"].split("/")[0]
    assert top.startswith("kpytest-bench-")
    paths = HostPaths()
    assert not [c for c in REAL_CONTROLLERS if os.path.exists(paths.cgroup(c, top))]


@pytest.mark.daemon
@pytest.mark.skipif(
    shutil.which("prometheus-node-exporter") is None,
    reason="Debian's prometheus-node-exporter is not installed (bench.scrape installs it)",
)
def test_scrape_bench_compares_the_koordlet_with_node_exporter_per_sample() -> None:
    figures = run_bench("scrape", "--pods", "2", "--scrapes", "2", "--warmup", "0")

    for key in ("scrape_us_per_sample", "node_exporter_us_per_sample"):
        assert is_number(figures[key]), key
        assert figures[key] >= 0, key
    koordlet, exporter = figures["koordlet"], figures["node_exporter"]
    # Prometheus' Accept header: the koordlet answers OpenMetrics, gzip'd.
    assert koordlet["content_type"].startswith("application/openmetrics-text; version=1.0.0")
    assert koordlet["samples"] > 0
    assert exporter["samples"] > 0
    if figures["node_exporter_us_per_sample"] > 0:
        expected = figures["scrape_us_per_sample"] / figures["node_exporter_us_per_sample"]
        assert figures["ratio"] == pytest.approx(expected, rel=0.01)


@pytest.mark.skipif(
    shutil.which("wrk") is None, reason="Debian's wrk is not installed (bench.scrape_load does)"
)
def test_scrape_load_bench_reports_the_loops_quiet_and_under_wrk() -> None:
    figures = run_bench("scrape_load", "--pods", "2", "--duration", "2", "--warmup", "0")

    for phase in ("quiet", "load"):
        collect = figures[phase]["collect"]
        assert is_number(collect["rounds_per_s"])
        assert collect["steps_seen"] >= 1
        assert is_number(collect["step_p99_ms"])
    wrk = figures["load"]["wrk"]
    assert set(wrk) == {"/metrics", "/debug/workloads"}
    assert wrk["/metrics"]["answered_per_s"] > 0
    assert figures["load"]["readyz"]["asked"] >= 1
    assert figures["ticks_per_s_load"] == figures["load"]["collect"]["rounds_per_s"]
    assert figures["http_cpu_charged_percent"] > 0  # the limiter charged the load's requests
    assert is_number(figures["http_cpu_extra_percent"])


def test_daemon_bench_ends_with_one_json_line_of_cpu_and_memory_figures() -> None:
    figures = run_bench(
        "daemon", "--pods", "2", "--duration", "2", "--warmup", "1", "--interval", "0.2"
    )

    for key in ("cpu_percent", "rss_mib", "rss_max_mib", "duration_s", "stop_s"):
        assert is_number(figures[key]), key
    assert figures["cpu_percent"] >= 0
    assert 0 < figures["rss_mib"] <= figures["rss_max_mib"]
    assert figures["duration_s"] >= 2
    assert figures["pods"] == 2
    assert figures["pods_in_metrics"] == 2  # the daemon exported both pods
    assert figures["exit_code"] == 0  # stopped cleanly by SIGTERM
    assert figures["tree"] == "fake-v1"
    assert "daemon/collect" in figures["step_wall_ms"]
    assert 0 <= figures["cpu_main_thread_percent"] <= figures["cpu_percent"]
    threads = figures["cpu_threads_percent"]  # by the names the koordlet gives its threads
    assert {"main", "collect_0", "cgroup-writer_0"} <= set(threads)
    assert sum(threads.values()) <= figures["cpu_percent"] + 1  # clock ticks: a tick or so off
    # regular files are not held open from tick to tick: no floor to measure on this tree
    assert (figures["tick_files"], figures["pread_floor_percent"]) == (0, None)


@pytest.mark.daemon
def test_daemon_ab_bench_runs_two_koordlets_at_once_and_reports_each_window() -> None:
    figures = run_bench(
        "daemon_ab",
        *("--tree", "fake", "--pods", "2", "--windows", "2", "--window", "1"),
        *("--warmup", "0.5", "--interval", "0.2"),
    )

    assert len(figures["windows"]) == 2
    for row in figures["windows"]:
        assert row["a"] >= 0
        assert row["b"] >= 0
        assert row["rss_a"] > 0
        assert row["rss_b"] > 0
    means = [statistics.fmean(r[k] for r in figures["windows"]) for k in ("a", "b")]
    assert [figures["cpu_a_percent"], figures["cpu_b_percent"]] == pytest.approx(means, abs=1e-3)
    assert figures["diff_percent"] == pytest.approx(means[0] - means[1], abs=2e-3)
    assert figures["a"] == figures["b"]  # this checkout twice: an A/A run
    assert figures["tree"] == "fake-v1"


@pytest.mark.daemon
@pytest.mark.skipif(
    real_cgroups_available() is not None or envtest_assets.why_not() is not None,
    reason="needs real cgroup v1 (root) and the Kubernetes binaries of ../shared/k8s",
)
def test_cluster_daemon_bench_runs_the_koordlet_against_a_real_api_server() -> None:
    figures = run_bench(
        "daemon_cluster", "--pods", "2", "--duration", "2", "--warmup", "1", "--interval", "0.5"
    )

    for key in ("cpu_percent", "rss_mib", "rss_max_mib", "setup_s"):
        assert is_number(figures[key]), key
    assert figures["mode"] == "cluster"
    assert figures["tree"] == "real-cgroup-v1"
    assert figures["pods"] == 2
    assert figures["pods_in_metrics"] == 2  # the API server's pods, on the tree's cgroups
    assert figures["exit_code"] == 0
    assert "daemon/collect" in figures["step_wall_ms"]
    # the kernel files it held open: at least the two pods' and six containers' CPU, memory and
    # throttling files, read again by the bench for the pread floor
    assert figures["tick_files"] >= 24
    assert figures["pread_floor_percent"] > 0
    assert figures["floor_ratio"] == pytest.approx(
        figures["cpu_percent"] / figures["pread_floor_percent"], rel=0.01
    )


def test_runtimehooks_reconcile_bench_ends_with_one_json_line_of_round_figures() -> None:
    figures = run_bench("runtimehooks_reconcile", "--pods", "8", "--rounds", "2")
    assert figures["pods"] == 8
    assert figures["writes"] > 0
    for key in ("first_round_ms", "round_ms", "round_p90_ms", "round_cpu_ms"):
        assert is_number(figures[key]), key
    assert figures["round_ms"] <= figures["round_p90_ms"]


@pytest.mark.skipif(
    not (
        os.geteuid() == 0
        and os.path.isfile(HostPaths().cgroup("memory", "tasks"))
        and os.path.isdir(HostPaths().sys("kernel", "mm", "damon", "admin"))
        and os.access(HostPaths().proc("kpagecgroup"), os.R_OK)
    ),
    reason="needs root, cgroup v1 memory, DAMON sysfs and /proc/kpagecgroup",
)
def test_coldmemory_damon_bench_ends_with_one_json_line_of_snapshot_and_kdamond_figures() -> None:
    figures = run_bench(
        "coldmemory_damon", "--pods", "2", "--touchers", "1", "--touch-mib", "8",
        "--repeat", "1", "--window", "0.5",
    )  # fmt: skip

    assert figures["cgroups"] == 6
    assert figures["min_toucher_bytes_found"] >= 8 << 20
    for key in ("snapshot_cpu_ms_p50", "ns_per_frame", "ours_cpu_percent", "total_cpu_percent"):
        assert is_number(figures[key]), key
    assert figures["kdamond"]["whose"] in ("ours", "not ours")
    assert is_number(figures["kdamond"]["cpu_percent"])
