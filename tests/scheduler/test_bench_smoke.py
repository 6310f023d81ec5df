"""bench.scheduler_scale and bench.scheduler_apiserver run end to end on tiny clusters and print
their JSON contracts (the real API server's one skips with one line where the binaries are
absent)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from envtest import assets

_WHY = assets.why_not(node=False)


def test_scheduler_scale_prints_latency_and_throughput_keys():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.scheduler_scale",
            "--json",
            "--nodes",
            "40",
            "--pods",
            "5",
            "--warmup",
            "1",
            "--standalone-pods",
            "30",
            "--all-nodes-pods",
            "10",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert {
        "extender_p50_ms",
        "extender_p99_ms",
        "inprocess_p50_ms",
        "inprocess_p99_ms",
        "extender_subset_p50_ms",
        "extender_subset_p99_ms",
        "standalone_pods_per_s",
        "standalone_all_nodes_pods_per_s",
    } <= set(figures)
    assert figures["extender_p50_ms"] <= figures["extender_p99_ms"]
    # the ratio of the unrounded medians: within what rounding each to 0.01 ms allows
    p50, ref = figures["inprocess_p50_ms"], figures["reference_p50_ms"]
    assert ref > 0
    low, high = (p50 - 0.005) / (ref + 0.005), (p50 + 0.005) / max(ref - 0.005, 1e-9)
    assert low - 0.001 <= figures["inprocess_to_reference"] <= high + 0.001
    assert figures["standalone_bound"] == 30  # 40 nodes with room for every pod
    assert figures["standalone_all_nodes_bound"] == 10
    assert figures["extender_subset_nodes"] == 40  # under 100 nodes kube-scheduler sends all


@pytest.mark.skipif(_WHY is not None, reason=f"real API server: {_WHY}")
def test_scheduler_apiserver_runs_both_schedulers_on_a_real_api_server_and_prints_json():
    done = subprocess.run(
        [sys.executable, "-m", "bench.scheduler_apiserver", "--json", "--nodes", "20",
         "--pods", "20", "--backlog", "10", "--rounds", "1", "--creators", "4",
         "--report-interval", "5"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("kube-scheduler", "koord-scheduler"):
        (run,) = figures["20"][name]["runs"]
        assert run["bound"] == 20
        assert run["over_capacity"] == 0
        assert run["backlog"] == 10
        assert run["nodemetric_reports"] > 0  # the koordlets' reports went on meanwhile
        for key in ("pods_per_s", "drain_pods_per_s", "peak_rss_mib", "startup_s"):
            assert run[key] > 0
        # CPU comes from /proc/<pid>/stat in clock ticks (10 ms): 20 bindings can fit in less
        # than one tick, and then the figure is an honest 0.0 (CI saw it for one scheduler)
        assert run["cpu_ms_per_pod"] >= 0
        assert figures["20"][name]["ranges"]["pods_per_s"] == [run["pods_per_s"]] * 2
