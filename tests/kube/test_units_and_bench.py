"""Quantities and durations as Kubernetes writes them; the report benchmark's output contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kubeclient.units import (
    cpu_milli,
    format_bytes,
    format_cpu,
    format_duration,
    memory_bytes,
    parse_duration,
    parse_quantity,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("cores", "text"),
    [(0.0, "0"), (0.1234, "123m"), (1.0, "1"), (2.5, "2500m"), (12.0, "12"), (0.0009, "0")],
)
def test_cpu_is_printed_in_whole_milli_cores_canonically(cores: float, text: str) -> None:
    assert format_cpu(cores) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (1000, "1000"), (1024, "1Ki"), (1536 * 1024, "1536Ki"), (2**30, "1Gi"), (1.9, "1")],
)
def test_memory_is_printed_in_canonical_binary_form(value: float, text: str) -> None:
    assert format_bytes(value) == text


@pytest.mark.parametrize(
    ("text", "value"),
    [("100m", 0.1), ("2", 2.0), ("1.5Gi", 1.5 * 2**30), ("1k", 1000.0), ("2e3", 2000.0)],
)
def test_quantities_parse_to_base_units(text: str, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value)


def test_requests_round_up_as_kubernetes_does() -> None:
    assert cpu_milli("100m") == 100
    assert cpu_milli("0.0001") == 1
    assert memory_bytes("1.5Ki") == 1536
    with pytest.raises(ValueError):
        parse_quantity("ten")


@pytest.mark.parametrize(
    ("seconds", "text"), [(300, "5m0s"), (1800, "30m0s"), (3600, "1h0m0s"), (45, "45s")]
)
def test_durations_round_trip_in_gos_format(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds
    assert parse_duration("1m30s") == 90
    with pytest.raises(ValueError):
        parse_duration("5 minutes")


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
