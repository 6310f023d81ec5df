"""The report benchmark's output contract (quantities and durations: ``tests/apis``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_report_bench_prints_its_json_contract() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.report",
            "--json",
            "--pods",
            "5",
            "--minutes",
            "2",
            "--repeat",
            "1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["pods"] == result["pods_reported"] == 5
    assert result["build_cpu_ms"] >= 0
    assert result["writes_per_hour_default"] == 60
    assert result["writes_per_hour_limit"] == 360
