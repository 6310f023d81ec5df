"""What every benchmark reports the same way: one percentile rule and one way to print a result.

The percentile is the nearest rank (the smallest sample with at least ``pct`` percent of the
samples at or below it), so a p99 of 10 runs is the largest and every figure is a sample that
was measured, never an interpolation; ``latency_figures`` reports a latency series with it.
``print_result`` prints ``key: value`` lines for people and, with ``--json``, one JSON object as
the last line for scripts; ``machine_figures`` names the machine a result was measured on.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from collections.abc import Mapping, Sequence
from typing import Any


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of ``values`` (not empty), ``pct`` in 0..100."""
    ordered = sorted(values)
    rank = math.ceil(pct / 100 * len(ordered))
    return ordered[min(len(ordered) - 1, max(0, rank - 1))]


def latency_figures(prefix: str, ms: Sequence[float]) -> dict[str, float]:
    """``<prefix>_p50_ms``, ``_p99_ms``, ``_max_ms`` and ``_mean_ms`` of ``ms`` (milliseconds,
    not empty), rounded to the microsecond."""
    return {
        f"{prefix}_p50_ms": round(percentile(ms, 50), 3),
        f"{prefix}_p99_ms": round(percentile(ms, 99), 3),
        f"{prefix}_max_ms": round(max(ms), 3),
        f"{prefix}_mean_ms": round(statistics.fmean(ms), 3),
    }


def print_result(result: Mapping[str, Any], as_json: bool, width: int = 0) -> None:
    """``key: value`` lines (keys right-aligned to ``width``), or one JSON line."""
    if as_json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:>{width}}: {value}")


def machine_figures() -> dict[str, Any]:
    """The kernel, the Python and the CPU count: what a result needs to be compared."""
    return {
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
