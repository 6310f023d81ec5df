"""Memory eviction on this machine's real cgroup v1 hierarchy.

Each test builds its own kubepods-shaped tree ``kpytest-<hex>/kubepods/{besteffort,burstable}``
in the memory and freezer hierarchies (``bench.reaction_memory.EvictTree``), with a BE pod and an
LS pod, each a child process this test started holding memory. The "node" of the strategy is the
test's kubepods cgroup (capacity 256 MiB, threshold 70%), so the machine's own memory plays no
part. The tree is removed, and anything left in it killed, whatever happens.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import pytest

from apis.extension import QoSClass
from bench.reaction_memory import (
    GROW,
    THRESHOLD_BYTES,
    Child,
    EvictTree,
    available,
    build_strategy,
)
from koordlet.events.source import PressureEventSource
from koordlet.executor.audit import AuditLog
from koordlet.executor.kill import subtree_pids

pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.skipif(available() is not None, reason=str(available())),
]


@pytest.fixture
def tree() -> Iterator[EvictTree]:
    t = EvictTree("kpytest")
    try:
        yield t
    finally:
        t.close()


def _grow_past_threshold(tree: EvictTree, be_child: Child) -> None:
    be_child.grow(GROW)
    line = be_child.readline()
    assert float(line) > 0  # the child saw the kubepods usage reach the threshold
    assert tree.usage() >= THRESHOLD_BYTES * 0.99


async def test_memory_eviction_kills_the_be_pod_and_leaves_the_ls_pod(tree: EvictTree) -> None:
    ls = tree.start(tree.add_pod("ls", QoSClass.LS))
    be_pod = tree.add_pod("be", QoSClass.BE)
    be = tree.start(be_pod, threshold=THRESHOLD_BYTES)
    strategy, cache, _, ctx = build_strategy(tree, events=None)
    await asyncio.to_thread(_grow_past_threshold, tree, be)
    await asyncio.to_thread(be.readline)  # "grown": all of it touched
    tree.sample(cache, time.time())
    await strategy.reconcile()
    assert be.proc.wait(timeout=10) == -signal.SIGKILL
    assert subtree_pids(tree.layout.abs_dir("memory", be_pod.cgroup_dir)) == set()
    assert ls.proc.poll() is None
    assert tree.usage() < THRESHOLD_BYTES
    report = ctx.book.describe("memoryevict")["last_round"]
    assert report["decision"] == "evict 1 pods"
    assert report["result"] == "1 evicted"
    assert ctx.audit is not None
    [entry] = ctx.audit.recent()
    assert (entry.kind, entry.path, entry.dry_run) == ("evict", be_pod.cgroup_dir, False)


async def test_dry_run_kills_nothing_and_the_audit_records_the_decision(tree: EvictTree) -> None:
    ls = tree.start(tree.add_pod("ls", QoSClass.LS))
    be_pod = tree.add_pod("be", QoSClass.BE)
    be = tree.start(be_pod, threshold=THRESHOLD_BYTES)
    audit = AuditLog(None)
    strategy, cache, backend, _ = build_strategy(tree, events=None, dry_run=True, audit=audit)
    await asyncio.to_thread(_grow_past_threshold, tree, be)
    await asyncio.to_thread(be.readline)
    tree.sample(cache, time.time())
    await strategy.reconcile()
    await asyncio.sleep(0.2)
    assert be.proc.poll() is None
    assert ls.proc.poll() is None
    assert backend.done == {}
    assert be.proc.pid in subtree_pids(tree.layout.abs_dir("memory", be_pod.cgroup_dir))
    [entry] = audit.recent()
    assert (entry.kind, entry.dry_run, entry.path) == ("decision", True, be_pod.cgroup_dir)
    assert entry.strategy == "memoryevict"
    assert entry.reason.startswith("EvictPodByNodeMemoryUsage")


async def test_a_memcg_threshold_event_evicts_without_waiting_for_the_tick(
    tree: EvictTree,
) -> None:
    ls = tree.start(tree.add_pod("ls", QoSClass.LS))
    be_pod = tree.add_pod("be", QoSClass.BE)
    be = tree.start(be_pod, threshold=THRESHOLD_BYTES)
    source = PressureEventSource()
    try:
        strategy, cache, backend, _ = build_strategy(tree, events=source)
        tree.sample(cache, time.time())
        await strategy.reconcile()  # below the threshold: nothing to evict, the watch armed
        assert strategy.describe()["armed"] is not None
        assert strategy.event_rounds == 0
        be.grow(GROW)  # from now on, nobody calls reconcile()
        assert await asyncio.to_thread(be.proc.wait, 10) == -signal.SIGKILL
        await strategy.settle()
        assert strategy.event_rounds >= 1
        assert f"pod/{be_pod.uid}" in backend.done
        assert ls.proc.poll() is None
        await strategy.close()
    finally:
        source.close()
