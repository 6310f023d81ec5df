"""Latency of the pressure event path: a real memcg v1 threshold crossing to the subscriber waking.

Each run makes a fresh memory cgroup ``kpybench-<hex>`` under the v1 memory hierarchy, arms a
64 MiB threshold on it through :class:`~koordlet.events.source.PressureEventSource`, and starts a
child process in it that maps 100 MiB and touches it page by page. The subscriber is a coroutine
awaiting an ``asyncio.Queue``; its wake-up time is ``time.monotonic()`` right after ``get()``
returns.

**When the crossing happens.** The child cannot know it from its own page count (the cgroup is
also charged for the interpreter's heap, page tables, and in batches of 64 pages from the per-CPU
charge stock), so it watches the counter the kernel compares: it reads its cgroup's
``memory.usage_in_bytes`` (an ``os.pread`` on a descriptor opened beforehand; every 64 pages, and
after every page once within 1 MiB of the threshold) and stamps ``time.monotonic()`` right after
the first read at or above the threshold. The crossing happened during the page touch just
before that read, so the stamp is late by at most one page fault and one read (microseconds).
``CLOCK_MONOTONIC`` is one clock for every process, so the child's stamp and the parent's compare
directly. The child sends its stamp through its stdout pipe only after touching the whole 100
MiB, so reporting adds nothing to the path measured; it keeps touching after the crossing as a
real workload would, because the kernel checks thresholds only every 128 page charges per CPU
(``MEM_CGROUP_THRESHOLDS_EVENTS_TARGET``): that up-to-512 KiB lag is part of the latency reported.

Figures, in milliseconds over the runs: ``p50_ms``, ``p99_ms``, ``max_ms`` from crossing to the
subscriber waking; ``dispatch_p50_ms``/``dispatch_p99_ms`` from crossing to the event loop's
callback (the event's own timestamp), so the difference is the queue hand-off.

    python -m bench.pressure_event [--json] [--runs N] [--loop asyncio|uvloop]

Needs root and the cgroup v1 memory hierarchy. With ``--json`` the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench._stats import percentile
from koordlet.events.source import PressureEvent, PressureEventSource
from koordlet.system.paths import HostPaths

MiB = 1 << 20
THRESHOLD = 64 * MiB
ALLOCATE = 100 * MiB
WAIT = 10.0
"""Seconds a run may take before it counts as lost."""

CHILD = """
import mmap, os, sys, time
usage_fd = os.open(sys.argv[1], os.O_RDONLY)
threshold, size = int(sys.argv[2]), int(sys.argv[3])
near = threshold - (1 << 20)
sys.stdin.readline()  # moved into the cgroup: go
block = mmap.mmap(-1, size)
usage, crossed = 0, None
for offset in range(0, size, 4096):
    block[offset] = 1
    if crossed is None and (usage >= near or offset % (64 * 4096) == 0):
        usage = int(os.pread(usage_fd, 32, 0))
        if usage >= threshold:
            crossed = time.monotonic()
print(repr(crossed), flush=True)
sys.stdin.readline()
"""


def _attach(cgroup: str, pid: int) -> None:
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write(str(pid))


async def one_run(memory_root: str) -> tuple[float, float] | None:
    """``(wake - crossing, dispatch - crossing)`` in seconds for one crossing; None if lost."""
    cgroup = os.path.join(memory_root, f"kpybench-{secrets.token_hex(6)}")
    os.mkdir(cgroup)
    source = PressureEventSource()
    queue: asyncio.Queue[PressureEvent] = asyncio.Queue()
    source.subscribe(queue)
    child = None
    try:
        if not await source.watch_memcg_threshold(cgroup, THRESHOLD, "bench"):
            raise SystemExit(f"cannot arm a memcg threshold: {source.unsupported}")
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            os.path.join(cgroup, "memory.usage_in_bytes"),
            str(THRESHOLD),
            str(ALLOCATE),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        await asyncio.to_thread(_attach, cgroup, child.pid)
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdin.write(b"go\n")
        try:
            event = await asyncio.wait_for(queue.get(), WAIT)
        except TimeoutError:
            return None
        woke = time.monotonic()
        line = await asyncio.wait_for(child.stdout.readline(), WAIT)
        crossed = float(line) if line.strip() != b"None" else None
        if crossed is None:
            return None
        return woke - crossed, event.time - crossed
    finally:
        source.close()  # before the child dies: its exit would cross the threshold downwards
        if child is not None:
            if child.returncode is None:
                child.kill()
            await child.wait()
        for _ in range(50):
            try:
                os.rmdir(cgroup)
            except OSError:
                await asyncio.sleep(0.1)
            else:
                break


async def bench(memory_root: str, runs: int) -> dict[str, Any]:
    wake: list[float] = []
    dispatch: list[float] = []
    lost = 0
    for _ in range(runs):
        got = await one_run(memory_root)
        if got is None:
            lost += 1
            continue
        wake.append(got[0] * 1000)
        dispatch.append(got[1] * 1000)
    if not wake:
        raise SystemExit("no run produced an event")
    return {
        "runs": runs,
        "lost": lost,
        "threshold_mib": THRESHOLD // MiB,
        "p50_ms": round(statistics.median(wake), 3),
        "p99_ms": round(percentile(wake, 99), 3),
        "max_ms": round(max(wake), 3),
        "min_ms": round(min(wake), 3),
        "dispatch_p50_ms": round(statistics.median(dispatch), 3),
        "dispatch_p99_ms": round(percentile(dispatch, 99), 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pressure_event", description=__doc__)
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--runs", type=int, default=50, help="crossings to measure (50)")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args(argv)
    memory_root = HostPaths().cgroup("memory")
    if not os.path.isfile(os.path.join(memory_root, "cgroup.event_control")):
        raise SystemExit(f"needs the cgroup v1 memory hierarchy at {memory_root}")
    if args.loop == "uvloop":
        import uvloop

        result = uvloop.run(bench(memory_root, args.runs))
    else:
        result = asyncio.run(bench(memory_root, args.runs))
    result["loop"] = args.loop
    if not args.json:
        for key, value in result.items():
            print(f"{key:>16}: {value}")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
