"""CPU time of one full QoS round at 200 pods: every strategy of ``koordlet.qos.table`` once.

A fake kubepods tree (``bench._trees.fake_tree``: FakeHost on tmpfs, 200 pods of 3 containers,
a quarter BestEffort) is collected by the real collector table for a few ticks, so the metric
cache holds what the strategies read; then each round calls ``reconcile()`` of every strategy in
the table, in table order, and measures ``time.process_time()`` around the whole round (the
executor's writer thread included: its writes go to the fake tree's files). A collector tick runs
between rounds (not measured) so that inputs stay fresh.

The NodeSLO turns everything on with upstream-like values (``enable: true``, memory eviction at
95%, BE satisfaction bounds set, a resourceQOSStrategy with memory and CPU QoS on), so strategies
do their full arithmetic; on the fake node nothing crosses an eviction threshold, the common case.
The evictor is in dry run: a round that did decide to evict would audit instead of killing.

Keys: ``qos_round_cpu_ms`` (median over rounds), ``qos_round_cpu_p90_ms``, and
``qos_round_<strategy>_cpu_ms`` (median per strategy, ``thread_time`` of the event loop's
thread, without the writer thread).

    python -m bench.qos_round [--json] [--pods N] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from apis.slo_inforce import node_slo_in_force
from bench._stats import percentile, print_result
from bench._trees import fake_tree
from bench.collect import Sweep
from koordlet.collectors.runner import CollectorRunner
from koordlet.collectors.table import build_collectors
from koordlet.executor import CgroupWriter
from koordlet.executor.audit import AuditLog
from koordlet.metriccache.store import MetricCache
from koordlet.qos.cpuevict import CPUEvict
from koordlet.qos.evictor import CgroupKillEvictor, Evictor
from koordlet.qos.framework import QoSBook, StrategyContext
from koordlet.qos.table import STRATEGIES
from koordlet.system.probe import probe_capabilities

EVICTION_GATES = (
    "BEMemoryEvict",
    "MemoryEvict",
    "MemoryAllocatableEvict",
    "BECPUEvict",
    "CPUEvict",
    "CPUAllocatableEvict",
)
"""Gates of the eviction tasks; each task checks its own (upstream's triggerFeatures)."""

SLO = node_slo_in_force(
    {
        "resourceUsedThresholdWithBE": {
            "enable": True,
            "cpuSuppressThresholdPercent": 65,
            "memoryEvictThresholdPercent": 95,
            "cpuEvictBESatisfactionLowerPercent": 60,
            "cpuEvictBESatisfactionUpperPercent": 80,
            "cpuEvictTimeWindowSeconds": 10,
        },
        "resourceQOSStrategy": {
            "lsClass": {"memoryQOS": {"enable": True}, "cpuQOS": {"enable": True}},
            "beClass": {"memoryQOS": {"enable": True}, "cpuQOS": {"enable": True}},
        },
    },
    source="bench",
    strict=True,
    now=0.0,
)


async def _rounds(pods: int, rounds: int) -> dict[str, Any]:
    with fake_tree(pods) as tree:
        sweep = Sweep(tree)
        cache = MetricCache(clock=lambda: sweep.now)
        runner = CollectorRunner(
            build_collectors(sweep.ctx, disabled=sweep.skipped),
            cache,
            lambda: sweep.snapshot,
            base_interval=sweep.base,
        )
        for _ in range(12):  # seed rates and the CPU-eviction window
            sweep.tick(runner)
        writer = CgroupWriter(tree.host)
        writer.start()
        try:
            audit = AuditLog(None)
            # a standalone node (no Node object: memory eviction's capacity is MemTotal) with
            # every eviction task's gate on, so each task does its arithmetic
            config = dataclasses.replace(
                sweep.config,
                standalone=True,
                feature_gates=sweep.config.feature_gates.merged(
                    dict.fromkeys(EVICTION_GATES, True)
                ),
            )
            ctx = StrategyContext(
                host=lambda: tree.host,
                config=config,
                cache=cache,
                executor=writer,
                workloads=lambda: sweep.snapshot,
                node_slo=lambda: SLO,
                capabilities=probe_capabilities(tree.host),
                evictor=Evictor(CgroupKillEvictor(lambda: tree.host), dry_run=True, audit=audit),
                audit=audit,
                book=QoSBook(clock=lambda: sweep.now),
            )
            strategies = [spec.build(ctx, spec.interval(ctx.config.qos)) for spec in STRATEGIES]
            for s in strategies:
                if isinstance(s, CPUEvict):
                    s.cool_time = 0.0  # no start-up cool-down: measure its full arithmetic
            totals: list[float] = []
            per: dict[str, list[float]] = {s.name: [] for s in strategies}
            for _ in range(rounds + 1):  # the first round warms caches and is dropped
                sweep.tick(runner)
                c0 = time.process_time()
                for s in strategies:
                    t0 = time.thread_time()
                    await s.reconcile()
                    per[s.name].append(time.thread_time() - t0)
                totals.append(time.process_time() - c0)
            for s in strategies:
                close = getattr(s, "close", None)
                if close is not None:
                    await close()
        finally:
            await asyncio.to_thread(writer.stop)
    out: dict[str, Any] = {
        "qos_round_pods": pods,
        "qos_round_strategies": [s.name for s in strategies],
        "qos_round_cpu_ms": round(statistics.median(totals[1:]) * 1e3, 3),
        "qos_round_cpu_p90_ms": round(percentile(totals[1:], 90) * 1e3, 3),
    }
    for name, values in per.items():
        out[f"qos_round_{name}_cpu_ms"] = round(statistics.median(values[1:]) * 1e3, 3)
    return out


def qos_round_scenario(pods: int = 200, rounds: int = 20) -> dict[str, Any]:
    """See the module docstring."""
    return asyncio.run(_rounds(pods, rounds))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    result = qos_round_scenario(args.pods, args.rounds)
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
