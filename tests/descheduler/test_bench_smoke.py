"""bench.descheduler_scale runs end to end on a small cluster and prints its JSON contract (the
figures at 5,000 nodes are in docs/benchmarks.md; tests never check numbers)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_descheduler_scale_prints_round_and_arbitration_figures() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.descheduler_scale",
            "--json",
            "--nodes",
            "60",
            "--pods-per-node",
            "20",
            "--jobs",
            "50",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert {
        "round_cpu_s",
        "round_wall_s",
        "pod_index_cpu_s",
        "migrations",
        "hot_nodes",
        "candidate_pods",
        "arbitration_ms",
        "arbitration_passed",
        "arbitration_held",
        "arbitration_failed",
    } <= set(figures)
    assert figures["hot_nodes"] == 6  # 10 % of the nodes
    assert figures["migrations"] == 12  # maxMigratingPerNode (2) on each hot node
    assert figures["arbitration_passed"] + figures["arbitration_held"] == 50
