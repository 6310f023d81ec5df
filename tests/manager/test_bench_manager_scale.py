"""The manager_scale benchmark runs end to end at a tiny size and keeps its output contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_manager_scale_reports_cpu_time_and_writes_only_for_moved_nodes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.manager_scale", "--nodes", "20", "--pods", "10", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["nodes"] == 20
    assert figures["first_pass_writes"] == 20
    assert figures["node_writes"] == figures["nodes_changed"] == 2
    assert isinstance(figures["pass_cpu_ms"], float)
    assert figures["pass_cpu_ms"] >= 0
