"""CPU suppress against writes this machine's real cgroup v1 refuses: a BE pod whose own CFS quota
is above the new besteffort quota (``EINVAL``, what switching the policy from cpuset to cfsQuota
meets). Known pods have their quota removed first, children before the parent; a cgroup the
inventory does not know yet blocks the quota, and the round still restores every BE cpuset,
reports the decision and the refusal, logs it once and counts the repeats
(``tests/integration/qostree.py`` builds the tree)."""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Iterator

import pytest

from apis.extension import KubeQOS
from koordlet.errors import WritesRefusedError
from koordlet.qos.cpusuppressrules import BE_MIN_QUOTA_US
from tests.integration.qostree import QoSTree, SuppressRig, qos_tree, real_cgroup_v1_available

pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.skipif(
        not real_cgroup_v1_available(),
        reason="needs root and the cgroup v1 cpu, cpuacct, cpuset and memory hierarchies",
    ),
]

POD_QUOTA = 200_000
"""A BE pod limited to 2 CPUs (its ``batch-cpu`` limit, as the BatchResource hook writes it)."""
SUPPRESS_ALL = {"enable": True, "cpuSuppressPolicy": "cfsQuota", "cpuSuppressThresholdPercent": 1}
"""1 % of the node, less what LS and the system use: the quota goes to its 2000 µs floor."""
TICK = 0.5
"""Seconds between the collections of a round (the node's CPU usage is a rate over them)."""


@pytest.fixture
def tree() -> Iterator[QoSTree]:
    with qos_tree() as made:
        yield made


def limited_be_pod(tree: QoSTree) -> tuple[str, str]:
    """A BE pod and its container, each with its own 2-CPU quota (the kubelet sets both)."""
    _, pod, container = tree.add_pod(KubeQOS.BESTEFFORT)
    tree.write("cpu", pod, "cpu.cfs_quota_us", str(POD_QUOTA))
    tree.write("cpu", container, "cpu.cfs_quota_us", str(POD_QUOTA))
    return pod, container


def test_the_kernel_refuses_a_besteffort_quota_below_a_be_pods_own(tree: QoSTree) -> None:
    limited_be_pod(tree)
    with pytest.raises(OSError) as refused:
        tree.write("cpu", tree.be_dir, "cpu.cfs_quota_us", str(BE_MIN_QUOTA_US))
    assert refused.value.errno == errno.EINVAL
    assert tree.read("cpu", tree.be_dir, "cpu.cfs_quota_us").strip() == "-1"


async def test_switching_to_cfs_quota_removes_the_be_pods_own_quota_first(tree: QoSTree) -> None:
    pod, container = limited_be_pod(tree)
    rig = SuppressRig(tree, dict(SUPPRESS_ALL))
    rig.refresh_pods()
    rig.writer.start()
    try:
        rig.collect()
        await asyncio.sleep(TICK)
        await rig.round()  # no WritesRefusedError: nothing was refused
    finally:
        await asyncio.to_thread(rig.writer.stop)

    assert tree.read("cpu", tree.be_dir, "cpu.cfs_quota_us").strip() == str(BE_MIN_QUOTA_US)
    assert tree.read("cpu", pod, "cpu.cfs_quota_us").strip() == "-1"
    assert tree.read("cpu", container, "cpu.cfs_quota_us").strip() == "-1"
    quota_writes = [
        e.path for e in reversed(rig.audit.recent(strategy="cpusuppress", kind="write"))
        if e.knob == "cpu_cfs_quota"
    ]  # fmt: skip
    layout = tree.host.layout
    assert len(quota_writes) == 3
    assert set(quota_writes[:2]) == {  # the pod's quotas removed before the parent's lowered
        layout.file("cpu", rel, "cpu.cfs_quota_us") for rel in (container, pod)
    }
    assert quota_writes[2] == layout.file("cpu", tree.be_dir, "cpu.cfs_quota_us")
    state = rig.strategy.debug_state()
    assert state["decision"] == f"cfsQuota: {BE_MIN_QUOTA_US} us"
    assert state["children_unlimited"] == [container, pod]


async def test_a_refused_quota_is_that_knobs_alone_the_cpusets_are_restored_and_reported(
    tree: QoSTree, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="koordlet.qos.cpusuppress")
    _, known_pod, known_container = tree.add_pod(KubeQOS.BESTEFFORT)
    levels = (tree.be_dir, known_pod, known_container)
    for rel in reversed(levels):  # left narrowed by the cpuset policy
        tree.write("cpuset", rel, "cpuset.cpus", "0")
    rig = SuppressRig(tree, dict(SUPPRESS_ALL))
    rig.refresh_pods()
    # created after the inventory's refresh: a pod it does not know yet, with its own quota
    _, new_pod, _ = tree.add_pod(KubeQOS.BESTEFFORT)
    tree.write("cpu", new_pod, "cpu.cfs_quota_us", str(POD_QUOTA))
    whole = tree.read("cpuset", tree.host.layout.kube_root, "cpuset.cpus").strip()
    rig.writer.start()
    try:
        rig.collect()
        await asyncio.sleep(TICK)
        with pytest.raises(WritesRefusedError) as failed:
            await rig.round()
        report = rig.book.last_report("cpusuppress")
        for _ in range(2):  # refused again: counted, not logged again
            with pytest.raises(WritesRefusedError):
                await rig.round()
        refused = rig.strategy.refused

        rig.refresh_pods()  # the inventory finds the new pod: its quota is removed first
        await rig.round()
        healed = rig.strategy.refused
    finally:
        await asyncio.to_thread(rig.writer.stop)

    assert "cpu_cfs_quota" in str(failed.value)
    assert "Invalid argument" in str(failed.value)
    # The rest of the round went on: every known BE cpuset restored (the cfsQuota policy
    # restores what the cpuset policy narrowed), parents first.
    assert [tree.read("cpuset", rel, "cpuset.cpus").strip() for rel in levels] == [whole] * 3
    assert report is not None
    assert report.decision == f"cfsQuota: {BE_MIN_QUOTA_US} us"
    assert "1 writes refused" in report.result
    assert f"cpusets restored to {whole}" in report.result
    (key,) = refused
    assert key == f"cpu_cfs_quota {tree.be_dir}"
    assert refused[key]["count"] == 3
    warnings = [
        r.getMessage() for r in caplog.records
        if r.levelno == logging.WARNING and "refused" in r.getMessage()
    ]  # fmt: skip
    assert len(warnings) == 1  # once per change, not once a round
    assert any("written again after 3 refusals" in r.getMessage() for r in caplog.records)
    assert healed == {}
    assert tree.read("cpu", tree.be_dir, "cpu.cfs_quota_us").strip() == str(BE_MIN_QUOTA_US)
    assert tree.read("cpu", new_pod, "cpu.cfs_quota_us").strip() == "-1"
