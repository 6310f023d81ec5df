"""The reconciler mode on a fake node (every cgroup version and driver): running pods' cgroups
get what the hooks would have given them at creation, through the executor (leveled batch,
audit, dry run), once per round; bad pod data warns once; unsupported knobs are left out."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from apis.extension import (
    ANNOTATION_EXTENDED_RESOURCE_SPEC,
    ANNOTATION_RESOURCE_STATUS,
    LABEL_POD_QOS,
    KubeQOS,
    QoSClass,
)
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY
from apis.pod_overrides import ANNOTATION_POD_CPU_QOS, INVALID_ANNOTATION_REASON
from koordlet.collectors.nodeinfo import node_info_dict
from koordlet.executor import CgroupWriter
from koordlet.executor.audit import AuditLog
from koordlet.runtimehooks.framework import HookDispatcher
from koordlet.runtimehooks.metrics import HookMetrics
from koordlet.runtimehooks.model import PodMeta
from koordlet.runtimehooks.reconciler import HookReconciler
from koordlet.runtimehooks.sharepool import CPUSetRule, share_pools_of
from koordlet.runtimehooks.table import HOOKS, HookContext
from koordlet.statesinformer.model import ContainerInfo, PodInfo, WorkloadSnapshot
from koordlet.system.knobs import (
    CPU_BVT_WARP_NS,
    CPU_CFS_QUOTA,
    CPU_IDLE,
    CPU_SHARES,
    CPUSET_CPUS,
    MEMORY_LIMIT,
)
from koordlet.system.probe import probe_capabilities
from koordlet.system.topology import read_cpu_topology
from tests.fakehost import FakeHost, container_id
from tests.strategyrig import in_force

GI = 1 << 30
ON = frozenset({"BatchResource", "CPUSetAllocator", "GroupIdentity"})


@dataclass
class Events:
    """The Warning Events the hooks recorded."""

    seen: list[tuple[str, str]] = field(default_factory=list)

    def warn(self, pod: PodMeta, reason: str, message: str) -> None:
        self.seen.append((pod.name, reason))


def _pod(
    fake: FakeHost,
    name: str,
    qos: QoSClass,
    kube_qos: KubeQOS,
    *,
    annotations: dict[str, str] | None = None,
    extended: dict[str, Any] | None = None,
) -> PodInfo:
    uid = f"00000000-0000-4000-8000-{abs(hash(name)) % 10**12:012d}"
    cid = container_id(name)
    pod_rel, (crel,) = fake.add_pod(uid, kube_qos, [("containerd", cid)])
    return PodInfo(
        uid, name, "default", qos, kube_qos, pod_rel,
        (ContainerInfo(cid, "main", "containerd", crel),),
        labels={LABEL_POD_QOS: qos.value} if qos is not QoSClass.NONE else {},
        annotations=annotations or {},
        extended_resources=extended or {},
    )  # fmt: skip


@dataclass
class Rig:
    fake: FakeHost
    writer: CgroupWriter
    audit: AuditLog
    events: Events
    pods: dict[str, PodInfo]
    reconciler: HookReconciler

    def read(self, knob: Any, rel: str) -> Any:
        return self.writer.read(knob, rel)


CPU_QOS = {
    "lsrClass": {"cpuQOS": {"enable": True, "groupIdentity": 2}},
    "lsClass": {"cpuQOS": {"enable": True, "groupIdentity": 2}},
    "beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}},
}


async def _rig(
    fake: FakeHost,
    *,
    dry_run: bool = False,
    gates: frozenset[str] = ON,
    qos: dict[str, Any] | None = None,
    ls_annotations: dict[str, str] | None = None,
) -> AsyncIterator[Rig]:
    pods = {
        p.name: p
        for p in (
            _pod(fake, "be", QoSClass.BE, KubeQOS.BESTEFFORT, extended={
                "main": {"requests": {BATCH_CPU: "1000", BATCH_MEMORY: "1Gi"},
                         "limits": {BATCH_CPU: "2000", BATCH_MEMORY: "1Gi"}}}),
            _pod(fake, "lsr", QoSClass.LSR, KubeQOS.GUARANTEED,
                 annotations={ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "0-1"})}),
            _pod(fake, "ls", QoSClass.LS, KubeQOS.BURSTABLE, annotations=ls_annotations),
            _pod(fake, "bad", QoSClass.BE, KubeQOS.BESTEFFORT,
                 annotations={ANNOTATION_EXTENDED_RESOURCE_SPEC: "{not json"}),
        )
    }  # fmt: skip
    snapshot = WorkloadSnapshot(pods={p.uid: p for p in pods.values()})
    caps = probe_capabilities(fake.host)
    info = node_info_dict(read_cpu_topology(fake.paths))
    slo = in_force(resourceQOSStrategy=qos or CPU_QOS)
    ctx = HookContext(
        node_slo=lambda: slo,
        host=lambda: fake.host,
        capabilities=lambda: caps,
        cpuset_rule=lambda: CPUSetRule(share_pools_of(info, snapshot.pods.values())),
    )
    audit = AuditLog(None)
    writer = CgroupWriter(fake.host, on_change=audit.on_write, dry_run_all=dry_run)
    writer.capabilities = caps
    writer.start()
    events = Events()
    dispatcher = HookDispatcher(
        HOOKS, ctx, enabled=lambda gate: gate in gates,
        metrics=HookMetrics(CollectorRegistry()), writer=writer, audit=audit, events=events,
    )  # fmt: skip
    reconciler = HookReconciler(
        dispatcher,
        workloads=lambda: snapshot,
        host=lambda: fake.host,
        executor=writer,
        capabilities=lambda: caps,
        interval=1.0,
    )
    try:
        yield Rig(fake, writer, audit, events, pods, reconciler)
    finally:
        writer.stop()


@pytest.fixture
async def rig(fake_host: FakeHost) -> AsyncIterator[Rig]:
    async for r in _rig(fake_host):
        yield r


async def test_running_pods_get_what_the_hooks_would_have_given_them(rig: Rig) -> None:
    be, lsr, ls = rig.pods["be"], rig.pods["lsr"], rig.pods["ls"]
    assert rig.read(CPU_SHARES, be.cgroup_dir) <= 2  # as the kubelet made it
    report = await rig.reconciler.reconcile()
    assert report.changed > 0
    assert report.errors == []
    # BatchResource from the pod's spec (no annotation)
    for rel in (be.cgroup_dir, be.containers[0].cgroup_dir):
        assert rig.read(CPU_SHARES, rel) in range(1024 - 27, 1025)  # v2 keeps it as a weight
        assert rig.read(CPU_CFS_QUOTA, rel) == 200_000
        assert rig.read(MEMORY_LIMIT, rel) == GI
    # CPUSetAllocator: the LSR container on its CPUs, unlimited; the LS one on the share pool
    assert rig.read(CPUSET_CPUS, lsr.containers[0].cgroup_dir) == frozenset({0, 1})
    for rel in (lsr.cgroup_dir, lsr.containers[0].cgroup_dir):
        assert rig.read(CPU_CFS_QUOTA, rel) is None
    assert rig.read(CPUSET_CPUS, ls.containers[0].cgroup_dir) == frozenset({2, 3})
    # every change audited under the hooks that asked for it
    by_path = {e.path: e.strategy for e in rig.audit.recent(500, kind="write")}
    layout = rig.fake.host.layout
    be_quota = layout.file("cpu", be.cgroup_dir, CPU_CFS_QUOTA.file_for(layout.version) or "")
    assert "BatchResource" in by_path[be_quota]
    lsr_cpus = layout.file("cpuset", lsr.containers[0].cgroup_dir, "cpuset.cpus")
    assert by_path[lsr_cpus] == "runtimehooks/CPUSetAllocator"


async def test_a_second_round_changes_nothing_and_bad_pod_data_warns_once(rig: Rig) -> None:
    await rig.reconciler.reconcile()
    second = await rig.reconciler.reconcile()
    assert second.changed == 0
    assert second.errors == []
    assert rig.events.seen == [("bad", "InvalidExtendedResourceSpec")]


async def test_on_a_mainline_kernel_pods_get_cpu_idle_and_no_group_identity(
    fake_host: FakeHost,
) -> None:
    # the fake kernel has cpu.idle and no cpu.bvt_warp_ns: GroupIdentity writes the pods'
    # cpu.idle (LS asks for schedIdle), never bvt, never the QoS cgroups (koordinator#2732)
    qos = {**CPU_QOS, "lsClass": {"cpuQOS": {"enable": True, "schedIdle": 1}}}
    async for r in _rig(fake_host, qos=qos):
        await r.reconciler.reconcile()
        assert r.read(CPU_IDLE, r.pods["ls"].cgroup_dir) == 1
        assert r.read(CPU_IDLE, r.pods["be"].cgroup_dir) == 0
        writes = r.audit.recent(500, kind="write")
        assert [e.path for e in writes if e.knob == "cpu_idle"] == [
            r.fake.host.layout.file("cpu", r.pods["ls"].cgroup_dir, "cpu.idle")
        ]
        assert not [e for e in writes if e.knob == "cpu_bvt_warp_ns"]


async def test_on_an_anolis_kernel_pods_and_qos_cgroups_get_their_group_identity(
    fake_host: FakeHost,
) -> None:
    fake = fake_host
    rels = ["", *(fake.layout.qos_dir(q) for q in KubeQOS)]
    async for r in _rig(fake):
        for pod in r.pods.values():
            rels += [pod.cgroup_dir, *(c.cgroup_dir for c in pod.containers)]
        for rel in rels:
            fake.write("cpu", rel, "cpu.bvt_warp_ns", "0")
    async for r in _rig(fake):  # probed again, with the files
        await r.reconciler.reconcile()
        layout = fake.layout
        want = {KubeQOS.GUARANTEED: 0, KubeQOS.BURSTABLE: 2, KubeQOS.BESTEFFORT: -1}
        for kube_qos, value in want.items():
            assert r.read(CPU_BVT_WARP_NS, layout.qos_dir(kube_qos)) == value
        assert r.read(CPU_BVT_WARP_NS, r.pods["lsr"].cgroup_dir) == 2
        assert r.read(CPU_BVT_WARP_NS, r.pods["be"].cgroup_dir) == -1


async def test_an_ls_pods_cpu_qos_annotation_is_applied_and_a_bad_one_warns_once(
    fake_host: FakeHost,
) -> None:
    """The reconciler owns pods' group identity while GroupIdentity is on: the LS pod's
    koordinator.sh/cpuQOS takes precedence there (docs/qos-overrides.md), and a malformed value
    keeps the class's with one Warning Event, not one a round."""
    fake = fake_host
    rels = ["", *(fake.layout.qos_dir(q) for q in KubeQOS)]
    own = {ANNOTATION_POD_CPU_QOS: '{"enable":true,"groupIdentity":-1}'}
    async for r in _rig(fake, ls_annotations=own):
        for pod in r.pods.values():
            rels += [pod.cgroup_dir, *(c.cgroup_dir for c in pod.containers)]
        for rel in rels:
            fake.write("cpu", rel, "cpu.bvt_warp_ns", "0")
    async for r in _rig(fake, ls_annotations=own):
        await r.reconciler.reconcile()
        assert r.read(CPU_BVT_WARP_NS, r.pods["ls"].cgroup_dir) == -1
        assert r.read(CPU_BVT_WARP_NS, r.pods["lsr"].cgroup_dir) == 2
        path = fake.layout.file("cpu", r.pods["ls"].cgroup_dir, "cpu.bvt_warp_ns")
        writes = [e for e in r.audit.recent(500, kind="write") if e.path == path]
        assert [(e.strategy, e.new) for e in writes] == [("runtimehooks/GroupIdentity", "-1")]
    bad = {ANNOTATION_POD_CPU_QOS: '{"enable":true,"groupIdentity":7}'}
    async for r in _rig(fake, ls_annotations=bad):
        await r.reconciler.reconcile()
        await r.reconciler.reconcile()
        assert r.read(CPU_BVT_WARP_NS, r.pods["ls"].cgroup_dir) == 2
        assert ("ls", INVALID_ANNOTATION_REASON) in r.events.seen
        assert r.events.seen.count(("ls", INVALID_ANNOTATION_REASON)) == 1


async def test_in_dry_run_the_round_is_audited_and_nothing_is_written(
    fake_host: FakeHost,
) -> None:
    async for r in _rig(fake_host, dry_run=True):
        be = r.pods["be"]
        before = r.read(CPU_CFS_QUOTA, be.cgroup_dir)
        await r.reconciler.reconcile()
        assert r.read(CPU_CFS_QUOTA, be.cgroup_dir) == before
        decisions = [e for e in r.audit.recent(500) if e.dry_run and be.cgroup_dir in e.path]
        assert decisions, "no dry-run decision audited for the BE pod"


async def test_with_every_hook_gate_off_the_reconciler_has_nothing_to_do(
    fake_host: FakeHost,
) -> None:
    async for r in _rig(fake_host, gates=frozenset()):
        report = await r.reconciler.reconcile()
        assert (report.writes, report.pods) == (0, 0)
        assert r.reconciler.describe()["hooks"] == {}
