"""The reconciler keeps each pod's results between rounds: a round with kept results plans the
same batch (and the same core scheduling targets) as a fresh reconciler would, each input
changed alone; a kept result still meets the kernel (a value rewritten behind our back is
repaired); hooks without node inputs, and results with a failed hook, are run every round; the
hook duration family is not observed by the reconciler, bad input is counted once a pod."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from apis.extension import (
    ANNOTATION_RESOURCE_STATUS,
    LABEL_CORE_SCHED_GROUP_ID,
    LABEL_POD_QOS,
    KubeQOS,
    QoSClass,
)
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY
from apis.slo_inforce import NodeSLOInForce
from koordlet.collectors.nodeinfo import node_info_dict
from koordlet.executor import CgroupWriter
from koordlet.executor.batch import BatchWrite
from koordlet.runtimehooks.framework import HookDispatcher
from koordlet.runtimehooks.metrics import HookMetrics
from koordlet.runtimehooks.model import (
    Change,
    ContainerRequest,
    HookPoint,
    PodMeta,
    PodRequest,
    Resources,
)
from koordlet.runtimehooks.reconciler import HookReconciler
from koordlet.runtimehooks.sharepool import CPUSetRule, CPUSharedPool, share_pools_of
from koordlet.runtimehooks.table import HOOKS, HookContext, HookSpec, Level
from koordlet.statesinformer.model import PodInfo, WorkloadSnapshot
from koordlet.statesinformer.podmemo import PodMemo
from koordlet.system.knobs import CPU_CFS_QUOTA, CPU_SHARES
from koordlet.system.probe import Capabilities, probe_capabilities
from koordlet.system.topology import read_cpu_topology
from tests.fakehost import FakeHost
from tests.runtimehooks.test_reconciler import _pod
from tests.strategyrig import in_force

ON = frozenset({"BatchResource", "CPUSetAllocator", "GroupIdentity", "CoreSched"})
LS = {LABEL_POD_QOS: "LS"}
DURATION = "koordlet_runtime_hook_invoked_duration_milliseconds_count"
BATCH = {
    "main": {
        "requests": {BATCH_CPU: "1000", BATCH_MEMORY: "1Gi"},
        "limits": {BATCH_CPU: "2000", BATCH_MEMORY: "1Gi"},
    }
}
QOS: dict[str, Any] = {
    "policies": {"cpuPolicy": "coreSched"},
    "lsrClass": {"cpuQOS": {"enable": True}},
    "lsClass": {"cpuQOS": {"enable": True}},
    "beClass": {"cpuQOS": {"enable": True}},
}


class Effects:
    """Records the core scheduling targets a round hands to the cookie manager."""

    def __init__(self) -> None:
        self.applied: list[tuple[str, object]] = []

    async def apply(self, pod: PodMeta, key: str, rel: str, change: Change, **_: Any) -> None:
        self.applied.append((key, change.core_sched))


@dataclass
class Node:
    """The inputs a test changes: every callable of the context reads these."""

    fake: FakeHost
    writer: CgroupWriter
    registry: CollectorRegistry
    slo: NodeSLOInForce
    caps: Capabilities | None
    rule: CPUSetRule
    pods: dict[str, PodInfo]

    def reconciler(self, table: Any = HOOKS, gates: frozenset[str] = ON) -> HookReconciler:
        """A new reconciler; :attr:`registry` becomes its metrics'."""
        self.registry = CollectorRegistry()
        ctx = HookContext(
            node_slo=lambda: self.slo,
            host=lambda: self.fake.host,
            capabilities=lambda: self.caps,
            cpuset_rule=lambda: self.rule,
        )
        dispatcher = HookDispatcher(
            table, ctx, enabled=lambda g: g in gates, metrics=HookMetrics(self.registry),
            writer=self.writer,
        )  # fmt: skip
        dispatcher.effects = Effects()  # type: ignore[assignment]
        return HookReconciler(
            dispatcher,
            workloads=lambda: WorkloadSnapshot(pods={p.uid: p for p in self.pods.values()}),
            host=lambda: self.fake.host,
            executor=self.writer,
            capabilities=lambda: self.caps,
        )


@pytest.fixture
def node(fake_host: FakeHost) -> Iterator[Node]:
    fake = fake_host
    pods = {
        "be": _pod(fake, "be", QoSClass.BE, KubeQOS.BESTEFFORT, extended=BATCH),
        "lsr": _pod(fake, "lsr", QoSClass.LSR, KubeQOS.GUARANTEED,
                    annotations={ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "0-1"})}),
        "ls": _pod(fake, "ls", QoSClass.LS, KubeQOS.BURSTABLE),
    }  # fmt: skip
    info = node_info_dict(read_cpu_topology(fake.paths))
    caps = probe_capabilities(fake.host)
    writer = CgroupWriter(fake.host, capabilities=caps)
    writer.start()
    try:
        yield Node(
            fake, writer, CollectorRegistry(), in_force(resourceQOSStrategy=QOS), caps,
            CPUSetRule(share_pools_of(info, pods.values())), pods,
        )  # fmt: skip
    finally:
        writer.stop()


async def _round(reconciler: HookReconciler) -> tuple[list[BatchWrite[Any]], list[Any], int]:
    """The writes the round submitted, the core scheduling targets, the pods reused."""
    submitted: list[BatchWrite[Any]] = []
    writer = reconciler._executor
    submit = CgroupWriter.submit_batch

    def recording(writes: Any) -> Any:
        submitted.extend(writes)
        return submit(writer, writes)

    writer.submit_batch = recording  # type: ignore[method-assign]
    try:
        report = await reconciler.reconcile()
    finally:
        del writer.submit_batch
    effects: Any = reconciler._dispatcher.effects
    targets, effects.applied = effects.applied, []
    return submitted, targets, report.reused


async def _same_as_fresh(node: Node, kept: HookReconciler) -> tuple[list[BatchWrite[Any]], int]:
    """One round of ``kept`` against a fresh reconciler's first: equal plans."""
    writes, targets, reused = await _round(kept)
    fresh_writes, fresh_targets, fresh_reused = await _round(node.reconciler())
    assert fresh_reused == 0
    assert writes == fresh_writes
    assert targets == fresh_targets
    return writes, reused


def _value(writes: list[BatchWrite[Any]], knob: str, rel: str) -> Any:
    return next(w.value for w in writes if (w.knob_name, w.rel_dir) == (knob, rel))


async def test_kept_results_equal_fresh_ones_as_each_input_changes_alone(node: Node) -> None:
    kept = node.reconciler()
    first, reused = await _same_as_fresh(node, kept)
    assert reused == 0
    steady, reused = await _same_as_fresh(node, kept)
    assert reused == len(node.pods)
    be, lsr, ls = node.pods["be"], node.pods["lsr"], node.pods["ls"]
    lsr_c, ls_c, be_c = (p.containers[0].cgroup_dir for p in (lsr, ls, be))

    # the pod's annotations: its allocation
    status = {ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "1"})}
    node.pods["lsr"] = replace(lsr, annotations=status)
    writes, reused = await _same_as_fresh(node, kept)
    assert reused == 2
    assert _value(writes, "cpuset_cpus", lsr_c) == "1"
    # the spec's extended resources
    more = {"main": {**BATCH["main"], "limits": {BATCH_CPU: "3000", BATCH_MEMORY: "1Gi"}}}
    node.pods["be"] = be = replace(be, extended_resources=more)
    writes, _ = await _same_as_fresh(node, kept)
    assert _value(writes, "cpu_cfs_quota", be_c) == 300_000
    # the labels: a core scheduling group
    node.pods["ls"] = ls = replace(ls, labels={**ls.labels, LABEL_CORE_SCHED_GROUP_ID: "g"})
    writes, _ = await _same_as_fresh(node, kept)
    # the labels: the class (an unclassed Burstable pod under an unknown kubelet policy keeps
    # the cpuset the kubelet gave it)
    assert _value(writes, "cpuset_cpus", ls_c)
    node.pods["ls"] = ls = replace(ls, labels={})
    writes, _ = await _same_as_fresh(node, kept)
    assert not [w for w in writes if (w.knob_name, w.rel_dir) == ("cpuset_cpus", ls_c)]
    # the containers: one renamed (the spec names "main" only)
    renamed = replace(be.containers[0], name="side")
    node.pods["be"] = be = replace(be, containers=(renamed,))
    writes, _ = await _same_as_fresh(node, kept)
    assert not [w for w in writes if w.rel_dir == be_c]
    # the cgroup
    node.pods["lsr"] = lsr = replace(lsr, cgroup_dir=lsr.cgroup_dir + "-moved")
    writes, _ = await _same_as_fresh(node, kept)
    assert _value(writes, "cpu_cfs_quota", lsr.cgroup_dir) is None
    # the NodeSLO: BE suppressed by CFS quota (BatchResource's rule)
    quota_rule = {"enable": True, "cpuSuppressPolicy": "cfsQuota"}
    node.slo = in_force(resourceQOSStrategy=QOS, resourceUsedThresholdWithBE=quota_rule)
    node.pods["be"] = be = replace(be, containers=(replace(renamed, name="main"),))
    writes, reused = await _same_as_fresh(node, kept)
    assert reused == 0
    assert _value(writes, "cpu_cfs_quota", be_c) is None
    # the NodeSLO: the class's CPU QoS (GroupIdentity, CoreSched)
    ls_idle = {"cpuQOS": {"enable": True, "schedIdle": 1}}
    node.slo = in_force(resourceQOSStrategy={**QOS, "lsClass": ls_idle})
    await _same_as_fresh(node, kept)
    # the share pools (CPUSetAllocator's rule)
    node.pods["ls"] = ls = replace(ls, labels={LABEL_POD_QOS: "LS"})
    await _same_as_fresh(node, kept)
    node.rule = CPUSetRule((CPUSharedPool(0, 0, frozenset({3})),))
    writes, reused = await _same_as_fresh(node, kept)
    assert (reused, _value(writes, "cpuset_cpus", ls_c)) == (0, "3")
    # the capabilities: a knob found unsupported is left out of every kept result
    assert node.caps is not None
    caps = [replace(c, supported=False) if c.name == "cpu_shares" else c
            for c in node.caps.values()]  # fmt: skip
    node.caps = Capabilities(caps, node.caps.version)
    writes, reused = await _same_as_fresh(node, kept)
    assert reused == 0
    assert not [w for w in writes if w.knob_name == "cpu_shares"]
    # a pod gone is forgotten
    del node.pods["lsr"]
    await _same_as_fresh(node, kept)
    assert len(kept._memo) == 2
    assert first == steady  # the steady round planned what the first did


async def test_a_kept_result_still_repairs_a_value_rewritten_behind_its_back(node: Node) -> None:
    kept = node.reconciler()
    await kept.reconcile()
    be = node.pods["be"]
    assert node.writer.read(CPU_CFS_QUOTA, be.cgroup_dir) == 200_000
    version = node.fake.layout.version
    unlimited = "max 100000" if version.value == "v2" else "-1"  # the kubelet's, say
    node.fake.write("cpu", be.cgroup_dir, CPU_CFS_QUOTA.file_for(version) or "", unlimited)
    assert node.writer.read(CPU_CFS_QUOTA, be.cgroup_dir) is None
    report = await kept.reconcile()
    assert report.reused == len(node.pods)
    assert report.changed >= 1
    assert node.writer.read(CPU_CFS_QUOTA, be.cgroup_dir) == 200_000


class Counting:
    """A hook without node inputs (or one that raises): run every round."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    def pod(self, req: PodRequest) -> Change | None:
        self.calls += 1
        if self.fail:
            raise RuntimeError("broken hook")
        return Change(resources=Resources(cpu_shares=64), reason="counting")

    def container(self, req: ContainerRequest) -> Change | None:
        return None


@pytest.mark.parametrize("fail", [False, True])
async def test_a_hook_without_node_inputs_or_that_fails_runs_every_round(
    node: Node, fail: bool
) -> None:
    hook = Counting(fail)
    spec = HookSpec("Counting", "Counting", "counts", frozenset({HookPoint.PRE_RUN_POD_SANDBOX}),
                    lambda ctx: hook, reconcile=frozenset({Level.POD}))  # fmt: skip
    table = {"Counting": spec, "GroupIdentity": HOOKS["GroupIdentity"]}
    if fail:
        table = {"Counting": replace(spec, factory=lambda ctx: _WithInputs(hook))}
    reconciler = node.reconciler(table, frozenset({"Counting", "GroupIdentity"}))
    for _ in range(3):
        writes, _, reused = await _round(reconciler)
        assert reused == 0
        shares = {w.rel_dir: w.value for w in writes if w.knob is CPU_SHARES}
        assert shares == ({} if fail else {p.cgroup_dir: 64 for p in node.pods.values()})
    assert hook.calls == 3 * len(node.pods)


class _WithInputs:
    """``Counting`` with node inputs: only its failures keep it from being reused."""

    def __init__(self, inner: Counting) -> None:
        self.inner = inner

    def node_inputs(self) -> object:
        return ()

    def pod(self, req: PodRequest) -> Change | None:
        return self.inner.pod(req)

    def container(self, req: ContainerRequest) -> Change | None:
        return None


async def test_the_reconciler_observes_no_hook_duration_and_counts_bad_input_once(
    node: Node,
) -> None:
    """Upstream observes ``runtime_hook_invoked_duration_milliseconds`` in ``RunHooks``, at hook
    points only (pkg/koordlet/runtimehooks/hooks/hooks.go); its reconciler does not."""
    bad = {ANNOTATION_RESOURCE_STATUS: "{not json"}
    node.pods["lsr"] = replace(node.pods["lsr"], annotations=bad)
    reconciler = node.reconciler()
    for _ in range(3):
        await reconciler.reconcile()
    families = {m.name for m in node.registry.collect() for s in m.samples if s.name == DURATION}
    assert families == set()
    counted = [
        s.value
        for m in node.registry.collect()
        for s in m.samples
        if s.name == "koordlet_runtime_hook_bad_input_total"
    ]
    assert counted == [1.0]
    # at a hook point the family is observed, one sample a hook
    parent = node.pods["ls"].cgroup_dir
    meta = PodMeta("x", "default", "u")
    req = PodRequest(HookPoint.PRE_RUN_POD_SANDBOX, meta, labels=dict(LS), cgroup_parent=parent)
    reconciler._dispatcher.compute(req)
    labels = {"node": "", "hook": "GroupIdentity", "stage": "PreRunPodSandbox",
              "status": "succeeded"}  # fmt: skip
    assert node.registry.get_sample_value(DURATION, labels) == 1


def test_pod_memo_keeps_a_value_while_its_key_holds_and_forgets_pods_not_asked() -> None:
    memo: PodMemo[str] = PodMemo()
    assert memo.get("a", 1) is None
    memo.put("a", 1, "one")
    memo.put("b", 2, "two")
    memo.commit()
    assert len(memo) == 2
    assert memo.get("a", 1) == "one"
    assert memo.get("b", 3) is None  # another key: not this value
    memo.commit()  # b was not kept this round
    assert len(memo) == 1
    assert memo.get("b", 2) is None
    assert memo.get("a", 1) == "one"
    memo.clear()
    memo.commit()
    assert memo.get("a", 1) is None
