"""Memory eviction's distress trigger on this machine's real kernel: a thrashing storm in a test
cgroup, far below the usage threshold, gets the BE pod killed.

The tree is ``bench.reaction_distress.DistressRig``'s (``kpytest-<hex>/kubepods/...`` in the
memory and freezer hierarchies): an LS pod whose container, limited to 64 MiB, reads a 192 MiB
file on disk in a loop (every pass refaults it: node memory PSI ``full`` moves, the test node's
usage stays near 30 % of its 256 MiB), and a BE pod holding 8 MiB. The signal is the node's own
``/proc/pressure/memory`` (cgroup v1 has no per-cgroup pressure files), read through a real
collector runner. The file, the processes and the cgroups are removed whatever happens.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from bench.reaction_distress import DistressRig, available, make_file
from koordlet.executor.kill import subtree_pids
from koordlet.qos.distress import PSI_FULL
from koordlet.qos.evictor import REASON_MEMORY_DISTRESS

pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.skipif(available() is not None, reason=str(available())),
]


@pytest.fixture
def hog_file() -> Iterator[str]:
    path = make_file()
    try:
        yield path
    finally:
        os.remove(path)


async def test_a_storm_below_the_usage_threshold_gets_the_be_pod_killed_not_the_ls_pod(
    hog_file: str,
) -> None:
    rig = DistressRig(hog_file, prefix="kpytest")
    try:
        await rig.settle(0.6)  # a quiet node: the trigger stays off
        hog = rig.start_hog()
        rig.go()
        started = float(await asyncio.wait_for(asyncio.to_thread(hog.readline), 10.0))
        evicted = await rig.wait_evicted(rig.be_pod)
        assert evicted > started

        be_cgroup = rig.tree.layout.abs_dir("memory", rig.be_pod.cgroup_dir)
        assert not subtree_pids(be_cgroup)
        assert rig.be.proc.wait(timeout=5) != 0  # killed
        assert hog.proc.poll() is None  # the LS pod keeps running

        report = rig.ctx.book.last_report(rig.strategy.name)
        assert report is not None
        assert report.inputs["node_usage_percent"] < 70  # below the usage threshold
        assert report.inputs["distress"].startswith("memory PSI full ")
        distress = rig.strategy.distress
        assert distress is not None
        assert distress.signals[PSI_FULL].since is not None
        [entry] = [e for e in rig.ctx.audit.recent() if e.kind == "evict"]  # type: ignore[union-attr]
        assert entry.reason.startswith(REASON_MEMORY_DISTRESS)
    finally:
        await rig.close()
