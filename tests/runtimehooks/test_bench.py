"""bench.runtimehooks runs end to end with a few calls and keeps its output contract (times are
never asserted)."""

from __future__ import annotations

from tests.unit.test_bench_smoke import is_number, run_bench

KEYS = {
    "calls",
    "target_added_p99_ms",
    "direct_p50_ms",
    "direct_p99_ms",
    "proxy_p50_ms",
    "proxy_p99_ms",
    "proxy_added_p50_ms",
    "proxy_added_p99_ms",
    "nri_added_p50_ms",
    "nri_added_p99_ms",
    "proxy_rss_mib",
    "proxy_hwm_mib",
}


def test_bench_runtimehooks_reports_added_latency_and_proxy_memory() -> None:
    figures = run_bench("runtimehooks", "--calls", "20")
    assert set(figures) == KEYS
    assert all(is_number(v) for v in figures.values())
    assert figures["calls"] == 20
    assert figures["proxy_hwm_mib"] >= figures["proxy_rss_mib"] > 0
