"""How fast the QoS strategies react, on this machine's real cgroups.

Run as ``python -m bench.reaction --json`` (root, cgroup v1); the last line is one JSON object.

Scenarios, one function each, merged by :func:`main`:

- :func:`suppress_reaction` (``suppress_p50_ms``, ``suppress_p99_ms``, ``suppress_runs``): BE busy
  loops fill every CPU of a kubepods-shaped test tree; the real collectors and the
  ``cpusuppress`` strategy (``cfsQuota`` policy, threshold 100 %) run every ``--interval`` seconds
  (1 s, Koordinator's default for both loops); at a random phase of that cycle LS busy loops start
  on every CPU, which puts the node over the threshold at once. Measured: from the LS start to
  the writer changing the besteffort ``cpu.cfs_quota_us`` to less than half of its value before.
  Between runs the LS loops are killed and the quota restored.

- :func:`memory_evict_reaction` (``memory_evict_p50_ms``, ``memory_evict_p99_ms``): from
  ``bench.reaction_memory``: a child pushes a BE test cgroup over a memcg threshold; measured
  from the crossing to the eviction, which the pressure event wakes (not the tick).

- :func:`memory_distress_reaction` (``memory_distress_p50_ms``, ``memory_distress_p99_ms``): from
  ``bench.reaction_distress``: a hog thrashing at its own test cgroup's limit, the test node far
  below the usage threshold; measured from the storm's start (the hog's first charge over its
  limit) to the BE pod's cgroup emptied, which only the distress trigger (memory PSI ``full``)
  can cause. Target p50 <= 500 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from apis.extension import KubeQOS
from bench._stats import percentile, print_result


async def suppress_reaction(runs: int, interval: float) -> dict[str, float]:
    """See the module docstring; returns ``suppress_p50_ms``, ``suppress_p99_ms``."""
    from tests.integration.qostree import QoSTree, SuppressRig, real_cgroup_v1_available

    if not real_cgroup_v1_available():
        raise SystemExit("bench.reaction needs root and cgroup v1 cpu, cpuacct, cpuset, memory")
    ncpu = os.cpu_count() or 1
    tree = QoSTree.create()
    try:
        _, _, be_container = tree.add_pod(KubeQOS.BESTEFFORT)
        _, _, ls_container = tree.add_pod(KubeQOS.BURSTABLE)
        tree.start_busy(be_container, ncpu)
        slo = {"enable": True, "cpuSuppressPolicy": "cfsQuota", "cpuSuppressThresholdPercent": 100}
        rig = SuppressRig(tree, slo)
        rig.refresh_pods()
        rig.writer.start()
        stop = asyncio.Event()

        async def loop() -> None:
            next_at = time.monotonic()
            while not stop.is_set():
                await rig.round()
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))

        samples: list[float] = []
        ticker = asyncio.create_task(loop(), name="bench/suppress-loop")
        try:
            await asyncio.sleep(3 * interval)  # settle: the quota follows the BE-only load
            for _ in range(runs):
                before = int(tree.read("cpu", tree.be_dir, "cpu.cfs_quota_us"))
                await asyncio.sleep(random.uniform(0, interval))
                t0 = time.monotonic()
                mark = len(rig.writes)
                ls = tree.start_busy(ls_container, ncpu)
                reacted = None
                deadline = t0 + 10 * interval
                while reacted is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
                    for at, res in rig.writes[mark:]:
                        if res.knob == "cpu_cfs_quota" and res.new not in ("-1", "max"):
                            new = int(res.new.split()[0])
                            if before < 0 or new < before / 2:
                                reacted = at
                                break
                tree.stop(ls)
                if reacted is not None:
                    samples.append((reacted - t0) * 1000)
                slo["enable"] = False  # restore, then let the quota settle on BE load again
                await asyncio.sleep(2 * interval)
                slo["enable"] = True
                await asyncio.sleep(3 * interval)
        finally:
            stop.set()
            await ticker
            await asyncio.to_thread(rig.writer.stop)
    finally:
        tree.cleanup()
    if not samples:
        raise SystemExit("bench.reaction: the quota never reacted")
    return {
        "suppress_p50_ms": round(statistics.median(samples), 1),
        "suppress_p99_ms": round(percentile(samples, 99), 1),
        "suppress_runs": float(len(samples)),
    }


async def memory_evict_reaction(runs: int, interval: float) -> dict[str, float]:
    """``bench.reaction_memory``: a memcg threshold crossing to the eviction, on the pressure
    event path (the tick interval plays no part), in a worker thread (it runs its own loops)."""
    from bench.reaction_memory import memory_evict_scenario

    result = await asyncio.to_thread(memory_evict_scenario, runs)
    return {k: v for k, v in result.items() if isinstance(v, int | float)}


async def memory_distress_reaction(runs: int, interval: float) -> dict[str, float]:
    """``bench.reaction_distress``: a reclaim storm below the usage threshold to the eviction,
    through the distress trigger's own sampling (the tick interval plays no part)."""
    from bench.reaction_distress import memory_distress_scenario

    result = await asyncio.to_thread(memory_distress_scenario, runs)
    return {k: v for k, v in result.items() if isinstance(v, int | float)}


Scenario = Callable[[int, float], Coroutine[Any, Any, Mapping[str, float]]]
SCENARIOS: dict[str, Scenario] = {
    "suppress": suppress_reaction,
    "memory_evict": memory_evict_reaction,
    "memory_distress": memory_distress_reaction,
}
"""Scenario name → function; :func:`main` runs the selected ones and merges their keys."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reaction", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--runs", type=int, default=10, help="repetitions per scenario")
    parser.add_argument("--interval", type=float, default=1.0, help="loop interval, seconds")
    parser.add_argument(
        "--scenario", action="append", choices=sorted(SCENARIOS), help="default: all"
    )
    args = parser.parse_args(argv)
    merged: dict[str, float] = {"interval_s": args.interval}
    for name in args.scenario or list(SCENARIOS):
        merged.update(asyncio.run(SCENARIOS[name](args.runs, args.interval)))
    print_result(merged, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
