"""The runtime hooks reconciler on this machine's real cgroup v1 (``QoSTree``: its own
``kpytest-<hex>`` cgroups, removed in a ``finally``): a round whose pods' results were kept from
the last one still meets the kernel, so a quota the kubelet (here: the test) rewrote is put back,
and a kept result follows a changed allocation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from apis.extension import ANNOTATION_RESOURCE_STATUS, LABEL_POD_QOS, KubeQOS, QoSClass
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY
from koordlet.collectors.nodeinfo import node_info_dict
from koordlet.executor import CgroupWriter
from koordlet.runtimehooks.framework import HookDispatcher
from koordlet.runtimehooks.metrics import HookMetrics
from koordlet.runtimehooks.reconciler import HookReconciler
from koordlet.runtimehooks.sharepool import CPUSetRule, share_pools_of
from koordlet.runtimehooks.table import HOOKS, HookContext
from koordlet.statesinformer.model import ContainerInfo, PodInfo, WorkloadSnapshot
from koordlet.system.probe import probe_capabilities
from koordlet.system.topology import read_cpu_topology
from tests.integration.qostree import QoSTree, qos_tree, real_cgroup_v1_available
from tests.strategyrig import in_force

pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.skipif(not real_cgroup_v1_available(), reason="needs root and cgroup v1"),
]

GATES = frozenset({"BatchResource", "CPUSetAllocator", "GroupIdentity"})
BATCH = {
    "main": {
        "requests": {BATCH_CPU: "500", BATCH_MEMORY: "64Mi"},
        "limits": {BATCH_CPU: "1000", BATCH_MEMORY: "128Mi"},
    }
}


@pytest.fixture
def tree() -> Iterator[QoSTree]:
    with qos_tree(check_removed=False) as made:
        yield made


def _pod(tree: QoSTree, name: str, qos: QoSClass, kube_qos: KubeQOS, **kw: object) -> PodInfo:
    uid, rel, crel = tree.add_pod(kube_qos)
    container = ContainerInfo(crel.rsplit("/", 1)[-1], "main", "containerd", crel)
    return PodInfo(
        uid, name, "default", qos, kube_qos, rel, (container,),
        labels={LABEL_POD_QOS: qos.value}, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


async def test_kept_results_still_repair_the_kernel_and_follow_a_new_allocation(
    tree: QoSTree,
) -> None:
    cpus = sorted(c.cpu_id for c in read_cpu_topology(tree.host.paths).cpus)
    be = _pod(tree, "be", QoSClass.BE, KubeQOS.BESTEFFORT, extended_resources=BATCH)
    status = {ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": str(cpus[0])})}
    lsr = _pod(tree, "bound", QoSClass.LS, KubeQOS.BURSTABLE, annotations=status)
    pods = {p.uid: p for p in (be, lsr)}
    info = node_info_dict(read_cpu_topology(tree.host.paths))
    caps = probe_capabilities(tree.host)
    ctx = HookContext(
        node_slo=lambda: in_force(),
        host=lambda: tree.host,
        capabilities=lambda: caps,
        cpuset_rule=lambda: CPUSetRule(share_pools_of(info, pods.values())),
    )
    writer = CgroupWriter(tree.host, capabilities=caps)
    writer.start()
    try:
        metrics = HookMetrics(CollectorRegistry())
        dispatcher = HookDispatcher(
            HOOKS, ctx, enabled=lambda g: g in GATES, metrics=metrics, writer=writer
        )
        reconciler = HookReconciler(
            dispatcher,
            workloads=lambda: WorkloadSnapshot(pods=dict(pods)),
            host=lambda: tree.host,
            executor=writer,
            capabilities=lambda: caps,
        )
        first = await reconciler.reconcile()
        assert first.errors == []
        assert tree.read("cpu", be.cgroup_dir, "cpu.cfs_quota_us").strip() == "100000"
        lsr_c = lsr.containers[0].cgroup_dir
        assert tree.read("cpuset", lsr_c, "cpuset.cpus").strip() == str(cpus[0])

        # the kubelet lifts the BE pod's quota behind our back: the next round, its results
        # kept, reads the file and puts the quota back
        tree.write("cpu", be.cgroup_dir, "cpu.cfs_quota_us", "-1")
        again = await reconciler.reconcile()
        assert (again.reused, again.errors) == (2, [])
        assert again.changed >= 1
        assert tree.read("cpu", be.cgroup_dir, "cpu.cfs_quota_us").strip() == "100000"

        # a new allocation: the pod's kept result is not reused
        if len(cpus) > 1:
            moved = {ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": str(cpus[1])})}
            pods[lsr.uid] = replace(lsr, annotations=moved)
            third = await reconciler.reconcile()
            assert (third.reused, third.errors) == (1, [])
            assert tree.read("cpuset", lsr_c, "cpuset.cpus").strip() == str(cpus[1])
    finally:
        writer.stop()
