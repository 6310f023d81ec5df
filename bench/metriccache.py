"""Benchmark of the metric cache at a busy node's steady state.

Simulates one collector tick a second for 200 pods of 3 containers (4 metrics each) plus 10
node-level series, long enough for the 30-minute node series to reach steady state, on a fake
clock. Reports the memory the cache holds (``MetricCache.memory_bytes``; with ``--tracemalloc``
also what ``tracemalloc`` saw allocated from ``store.py``, as a cross-check), the CPU time of one
``append`` of a tick (mean over the steady-state ticks, p99, max; CPU rather than wall time so
that other processes on a shared machine do not inflate it; the median wall time is reported too;
``append_floor_ms`` is the same samples through a bare dict lookup and two array appends, the
floor of any per-series store on this machine), and of aggregating a 300 s pod window and a
1,800 s node window.

``--columns`` hands the pod and container series over as the pod collectors do at steady state:
four ``(keys, values)`` columns a tick (CPU, memory, memory with page cache, throttling), stored
with ``MetricCache.append_columns`` (groups of series sharing one tail); the node series stay
samples. ``--churn N`` replaces one pod every ``N`` ticks (its series dropped, a new pod's
created, the columns' keys tuples rebuilt, as a pod deleted and another scheduled do).

The values decide how small the sealed chunks get (``koordlet.metriccache.store``): ``--values
busy`` (default) is a busy node's (CPU usage as noisy floats, memory moving by whole pages,
throttling mostly 0), ``--values idle`` is what ``bench.daemon``'s trees give (counters that do
not move).

    python -m bench.metriccache [--json] [--ticks N] [--pods N] [--values busy|idle]
                                [--columns] [--churn N] [--tracemalloc]

With ``--json`` the last line is one JSON object (``memory_mib``, ``append_ms``,
``aggregate_ms``, ``series``, ...).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import tracemalloc
from array import array
from collections.abc import Sequence

from bench._stats import print_result
from koordlet.metriccache import chunks, store
from koordlet.metriccache.series import (
    BE,
    BE_CPU_REAL_LIMIT,
    BE_CPU_REQUEST,
    BE_CPU_USAGE,
    CONTAINER_CPU_THROTTLED_RATIO,
    CONTAINER_CPU_USAGE,
    CONTAINER_MEMORY_USAGE,
    CONTAINER_MEMORY_WITH_PAGE_CACHE,
    NODE,
    NODE_CPU_USAGE,
    NODE_MEMORY_USAGE,
    NODE_MEMORY_WITH_PAGE_CACHE,
    NUMA_MEMORY_USAGE,
    POD_CPU_THROTTLED_RATIO,
    POD_CPU_USAGE,
    POD_MEMORY_USAGE,
    POD_MEMORY_WITH_PAGE_CACHE,
    SYSTEM,
    SYSTEM_CPU_USAGE,
    SYSTEM_MEMORY_USAGE,
    Sample,
    SeriesKey,
    container_entity,
    numa_entity,
    pod_entity,
)

START = 1_700_000_000.0
GiB = 1 << 30
PAGE = 4096


def node_keys() -> list[tuple[SeriesKey, float]]:
    """Ten node-level series with a typical magnitude each."""
    return [
        (SeriesKey(NODE_CPU_USAGE, NODE), 24.0),
        (SeriesKey(NODE_MEMORY_USAGE, NODE), 180.0 * GiB),
        (SeriesKey(NODE_MEMORY_WITH_PAGE_CACHE, NODE), 220.0 * GiB),
        (SeriesKey(SYSTEM_CPU_USAGE, SYSTEM), 1.5),
        (SeriesKey(SYSTEM_MEMORY_USAGE, SYSTEM), 6.0 * GiB),
        (SeriesKey(BE_CPU_USAGE, BE), 8.0),
        (SeriesKey(BE_CPU_REQUEST, BE), 16.0),
        (SeriesKey(BE_CPU_REAL_LIMIT, BE), 20.0),
        (SeriesKey(NUMA_MEMORY_USAGE, numa_entity(0)), 90.0 * GiB),
        (SeriesKey(NUMA_MEMORY_USAGE, numa_entity(1)), 90.0 * GiB),
    ]


def workload_keys(pods: int, containers: int, first: int = 0) -> list[tuple[SeriesKey, float]]:
    """Four series a pod and four a container (pods numbered from ``first``)."""
    keys: list[tuple[SeriesKey, float]] = []
    for p in range(first, first + pods):
        uid = f"{p:08x}-0000-4000-8000-{p:012x}"
        pod = pod_entity(uid)
        keys += [
            (SeriesKey(POD_CPU_USAGE, pod), 0.5),
            (SeriesKey(POD_MEMORY_USAGE, pod), 0.8 * GiB),
            (SeriesKey(POD_MEMORY_WITH_PAGE_CACHE, pod), 1.1 * GiB),
            (SeriesKey(POD_CPU_THROTTLED_RATIO, pod), 0.01),
        ]
        for c in range(containers):
            ctr = container_entity(uid, f"{p:04x}{c:02x}" + "ab" * 29)
            keys += [
                (SeriesKey(CONTAINER_CPU_USAGE, ctr), 0.2),
                (SeriesKey(CONTAINER_MEMORY_USAGE, ctr), 0.25 * GiB),
                (SeriesKey(CONTAINER_MEMORY_WITH_PAGE_CACHE, ctr), 0.35 * GiB),
                (SeriesKey(CONTAINER_CPU_THROTTLED_RATIO, ctr), 0.005),
            ]
    return keys


class Values:
    """Each tick's values, as a busy node's collectors produce them (``busy``: CPU usage as noisy
    floats, memory in whole pages moving by a few pages, throttling ratios mostly 0) or as the
    benchmark trees of ``bench.daemon`` do (``idle``: counters that do not move, so every
    value is the same from tick to tick). Seeded: the same run gives the same values."""

    def __init__(self, keys: Sequence[tuple[SeriesKey, float]], kind: str) -> None:
        self.kind = kind
        self.rng = random.Random(42)
        self.keys = keys
        self.pages = [round(v / PAGE) for _, v in keys]

    def tick(self, i: int) -> list[Sample]:
        if self.kind == "idle":
            return [Sample(k, 0.0 if "throttled" in k.metric else v) for k, v in self.keys]
        rng = self.rng.random
        out = []
        for j, (key, magnitude) in enumerate(self.keys):
            metric = key.metric
            if "memory" in metric:
                if rng() < 0.5:
                    self.pages[j] += int(rng() * 41) - 20
                value = float(self.pages[j] * PAGE)
            elif "throttled" in metric:
                value = 0.0 if rng() < 0.97 else rng()
            else:
                value = magnitude * (0.7 + 0.6 * rng())
            out.append(Sample(key, value))
        return out


def floor_append(
    buffers: dict[SeriesKey, tuple[array[int], array[float]]], tms: int, samples: Sequence[Sample]
) -> None:
    """The least any per-series store can do: one dict lookup and two array appends a sample."""
    get = buffers.__getitem__
    for key, value in samples:
        ts, vals = get(key)
        ts.append(tms)
        vals.append(value)


_KINDS = ("_cpu_usage", "_memory_usage", "_memory_with_page_cache", "_cpu_throttled_ratio")


def columns_of(keys: Sequence[tuple[SeriesKey, float]], first: int) -> list[list[int]]:
    """Indices (from ``first``) of each column: the workload keys by metric kind, pods and
    containers mixed, in key order (as the pod collectors' plans hold them)."""
    out: list[list[int]] = [[] for _ in _KINDS]
    for i in range(first, len(keys)):
        metric = keys[i][0].metric
        out[[metric.endswith(k) for k in _KINDS].index(True)].append(i)
    return out


def run(
    ticks: int,
    pods: int,
    containers: int,
    trace: bool,
    values: str = "busy",
    *,
    columns: bool = False,
    churn: int = 0,
) -> dict[str, float | int | str]:
    now = [START]
    nodes = len(node_keys())
    per_pod = 4 + 4 * containers
    keys = node_keys() + workload_keys(pods, containers)
    source = Values(keys, values)
    layout = columns_of(keys, nodes)
    plans = [tuple(keys[i][0] for i in idx) for idx in layout]
    replaced = 0
    if trace:
        tracemalloc.start()
    cache = store.MetricCache(clock=lambda: now[0])
    append_s: list[float] = []
    append_wall_s: list[float] = []
    floor_s: list[float] = []
    buffers = {k: (array("I"), array("d")) for k, _ in keys}
    cpu, wall = time.process_time, time.perf_counter
    for i in range(ticks):
        ts = START + i
        now[0] = ts
        if churn and i and i % churn == 0:
            p = replaced % pods
            replaced += 1
            at = nodes + p * per_pod
            old = keys[at][0].entity.partition("/")[2]
            cache.drop_entity(f"pod/{old}")
            cache.drop_prefix(f"container/{old}/")
            keys[at : at + per_pod] = workload_keys(1, containers, pods + replaced)
            plans = [tuple(keys[j][0] for j in idx) for idx in layout]  # new tuples
        samples = tick_samples = source.tick(i)
        if columns:
            cols = [
                (plan, [samples[j][1] for j in idx])
                for plan, idx in zip(plans, layout, strict=True)
            ]
            samples = samples[:nodes]
        c0, w0 = cpu(), wall()
        cache.append(ts, samples)
        if columns:
            cache.append_columns(ts, cols)
        append_wall_s.append(wall() - w0)
        append_s.append(cpu() - c0)
        if i >= ticks - 300 and not churn:  # the floor, same samples, the last 300 ticks
            samples = tick_samples
            c0 = cpu()
            floor_append(buffers, i, samples)
            floor_s.append(cpu() - c0)
    traced = 0
    if trace:
        # the cache's own allocations: its index (store) and its series' buffers (chunks)
        owned = [
            tracemalloc.Filter(True, store.__file__),
            tracemalloc.Filter(True, chunks.__file__),
        ]
        snap = tracemalloc.take_snapshot().filter_traces(owned)
        traced = sum(stat.size for stat in snap.statistics("filename"))
        tracemalloc.stop()

    end = now[0]
    pod_entities = cache.entities(POD_CPU_USAGE)
    agg300: list[float] = []
    for entity in pod_entities:
        t0 = cpu()
        result = cache.aggregate(POD_CPU_USAGE, entity, end - 300.0, end)
        agg300.append(cpu() - t0)
        if result is None or (not churn and result.count != 301):
            raise SystemExit(f"bench bug: {entity} has {result} in a 300 s window")
    agg1800: list[float] = []
    for _ in range(100):
        t0 = cpu()
        cache.aggregate(NODE_MEMORY_USAGE, NODE, end - 1800.0, end)
        agg1800.append(cpu() - t0)
    first = min(1800, ticks // 2)
    steady = sorted(append_s[first:])
    steady_wall = sorted(append_wall_s[first:])
    stats = cache.stats()
    figures: dict[str, float | int | str] = {
        "ticks": ticks,
        "values": values,
        "columns": columns,
        "churn_every": churn,
        "samples_per_tick": len(keys),
        "series": stats["series"],
        "samples": stats["samples"],
        "memory_mib": round(stats["memory_bytes"] / 2**20, 2),
        "bytes_per_sample": round(stats["memory_bytes"] / stats["samples"], 2),
        "append_ms": round(statistics.fmean(steady) * 1e3, 3),
        "append_p99_ms": round(steady[int(len(steady) * 0.99) - 1] * 1e3, 3),
        "append_max_ms": round(steady[-1] * 1e3, 3),
        "append_floor_ms": round(statistics.fmean(floor_s) * 1e3, 3) if floor_s else 0.0,
        "append_wall_median_ms": round(steady_wall[len(steady_wall) // 2] * 1e3, 3),
        "aggregate_ms": round(statistics.fmean(agg300) * 1e3, 4),
        "aggregate_1800_ms": round(statistics.fmean(agg1800) * 1e3, 4),
    }
    if trace:
        figures["tracemalloc_mib"] = round(traced / 2**20, 2)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.metriccache", description=__doc__)
    parser.add_argument(
        "--json", action="store_true", help="one JSON line instead of key: value lines"
    )
    parser.add_argument("--ticks", type=int, default=2400, help="1 s ticks to simulate")
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--containers-per-pod", type=int, default=3)
    parser.add_argument(
        "--values",
        choices=("busy", "idle"),
        default="busy",
        help="busy: noisy CPU, memory moving by pages; idle: constant, as bench.daemon's trees",
    )
    parser.add_argument(
        "--columns", action="store_true", help="pod and container series as columns"
    )
    parser.add_argument(
        "--churn", type=int, default=0, metavar="N", help="replace a pod every N ticks"
    )
    parser.add_argument("--tracemalloc", action="store_true", help="cross-check memory (slow)")
    args = parser.parse_args(argv)
    if args.ticks < 301:
        parser.error("--ticks must be at least 301 (a full 300 s window)")
    figures = run(
        args.ticks,
        args.pods,
        args.containers_per_pod,
        args.tracemalloc,
        args.values,
        columns=args.columns,
        churn=args.churn,
    )
    print_result(figures, args.json, width=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
