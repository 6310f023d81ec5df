"""Cgroup QoS reconcile: Koordinator's memory QoS arithmetic, the group identity rule, the CPU
QoS fallbacks and the cpusets, in tables and in rounds on a fake host (v1 and v2; Anolis knobs
present and absent)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from apis.extension import KubeQOS, QoSClass
from apis.pod_overrides import ANNOTATION_POD_CPU_QOS
from apis.slo_qos import CPUQOSPolicy, MemoryQOSConfig
from apis.slo_strategies import ResourceQOSStrategy
from koordlet.collectors.nodeinfo import node_info_dict
from koordlet.executor import CgroupWriter
from koordlet.features import FeatureGates
from koordlet.metriccache.store import MetricCache
from koordlet.qos.cgplan import (
    MECH_CPU_IDLE,
    MECH_GROUP_IDENTITY,
    MECH_SHARES,
    PlanMemo,
    build_plan,
    cpu_mechanism,
    kube_dir_bvt,
    memory_high,
    memory_protection,
    pod_bvt,
    share_pool,
)
from koordlet.qos.cgreconcile import CgroupReconcile
from koordlet.qos.framework import QoSBook, StrategyContext
from koordlet.qos.podwarnings import PodAnnotationWarnings
from koordlet.statesinformer.model import ContainerInfo, HostAppInfo, PodInfo, WorkloadSnapshot
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from koordlet.system.probe import probe_capabilities
from koordlet.system.topology import read_cpu_topology
from tests.fakehost import FakeHost, container_id
from tests.strategyrig import config, in_force

GIB = 1 << 30
MIB = 1 << 20
STATUS = "scheduling.koordinator.sh/resource-status"

HOOKS_OFF = FeatureGates({"GroupIdentity": False, "CPUSetAllocator": False})
"""The runtime hooks that own pods' group identity and cpusets while their gates are on are off:
this strategy writes those too (docs/runtimehooks.md, "Who writes what")."""


def qos_strategy(raw: dict[str, Any]) -> ResourceQOSStrategy:
    return in_force(resourceQOSStrategy=raw).resource_qos_strategy


# Memory QoS arithmetic --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("req", "min_pct", "low_pct", "expected"),
    [
        (1000 * MIB, 0, 0, (0, 0)),
        (1000 * MIB, 50, 80, (500 * MIB, 800 * MIB)),
        (1000 * MIB, 80, 50, (800 * MIB, 800 * MIB)),  # low below min is raised to min
        (1000 * MIB, 80, 0, (800 * MIB, 0)),  # ...unless it is 0 (upstream's correction)
        (None, 50, 50, (0, 0)),  # unknown request: no protection
        (1001, 33, 33, (330, 330)),  # integer arithmetic, truncated
    ],
)
def test_memory_min_and_low_are_request_percentages(
    req: int | None, min_pct: int, low_pct: int, expected: tuple[int, int]
) -> None:
    cfg = MemoryQOSConfig(min_limit_percent=min_pct, low_limit_percent=low_pct)
    assert memory_protection(cfg, req) == expected


@pytest.mark.parametrize(
    ("throttling", "min_pct", "req", "limit", "node", "expected"),
    [
        (0, 0, GIB, 2 * GIB, 16 * GIB, None),  # 0: unlimited
        (50, 0, GIB, 2 * GIB, 16 * GIB, GIB + GIB // 2),
        (80, 0, 0, 1000 * MIB, None, 800 * MIB),
        (1, 0, 0, 1000001, None, 8192),  # 10000 bytes rounded down to a page
        (50, 0, GIB, None, 16 * GIB, GIB + 15 * GIB // 2),  # no limit: node memory
        (50, 0, GIB, None, None, "pod without a memory limit and node memory unknown"),
        (1, 100, 5000, 6000, None, 5000),  # page rounding never goes below memory.min
    ],
)
def test_memory_high_lies_between_request_and_limit(
    throttling: int,
    min_pct: int,
    req: int,
    limit: int | None,
    node: int | None,
    expected: int | str | None,
) -> None:
    cfg = MemoryQOSConfig(throttling_percent=throttling, min_limit_percent=min_pct)
    assert memory_high(cfg, req, limit, node) == expected


# CPU QoS ----------------------------------------------------------------------------------------


def _pod(
    name: str,
    qos: QoSClass,
    kube_qos: KubeQOS,
    fake: FakeHost | None = None,
    *,
    cpus: str = "",
    request: int | None = None,
    limit: int | None = None,
) -> PodInfo:
    uid = f"{abs(hash(name)) % 10**8:08d}-0000-4000-8000-000000000000"
    rel, containers = "kubepods/pod" + uid, []
    if fake is not None:
        rel, crels = fake.add_pod(uid, kube_qos, [("containerd", container_id(name))])
        containers = [
            ContainerInfo(
                container_id(name),
                "main",
                "containerd",
                crels[0],
                memory_request_bytes=request,
                memory_limit_bytes=limit,
            )
        ]
    annotations = {STATUS: json.dumps({"cpuset": cpus})} if cpus else {}
    return PodInfo(
        uid,
        name,
        "default",
        qos,
        kube_qos,
        rel,
        tuple(containers),
        memory_request_bytes=request,
        memory_limit_bytes=limit,
        annotations=annotations,
    )


ALL_ON = {
    cls: {"cpuQOS": {"enable": True}, "memoryQOS": {"enable": True}}
    for cls in ("lsrClass", "lsClass", "beClass")
}


@pytest.mark.parametrize(
    ("raw", "qos", "kube_qos", "expected"),
    [
        (ALL_ON, QoSClass.LSR, KubeQOS.GUARANTEED, 2),
        (ALL_ON, QoSClass.LS, KubeQOS.BURSTABLE, 2),
        (ALL_ON, QoSClass.BE, KubeQOS.BESTEFFORT, -1),
        ({}, QoSClass.BE, KubeQOS.BESTEFFORT, 0),  # disabled: the none value
        (ALL_ON, QoSClass.LSE, KubeQOS.GUARANTEED, 2),  # by Kubernetes QoS: LSR's when on
        ({"lsClass": {"cpuQOS": {"enable": True}}}, QoSClass.LSE, KubeQOS.GUARANTEED, 2),
        ({"beClass": {"cpuQOS": {"enable": True}}}, QoSClass.NONE, KubeQOS.GUARANTEED, 0),
        ({"beClass": {"cpuQOS": {"enable": True}}}, QoSClass.NONE, KubeQOS.BESTEFFORT, -1),
    ],
)
def test_pod_group_identity_follows_upstreams_rule(
    raw: dict[str, Any], qos: QoSClass, kube_qos: KubeQOS, expected: int
) -> None:
    assert pod_bvt(qos_strategy(raw), _pod("p", qos, kube_qos)) == expected


def test_qos_cgroups_get_ls_and_be_identities_and_the_root_stays_zero() -> None:
    strategy = qos_strategy(ALL_ON)
    assert [kube_dir_bvt(strategy, q) for q in KubeQOS] == [0, 2, -1]


@pytest.mark.parametrize(
    ("supported", "policy", "expected"),
    [
        (
            {"cpu_bvt_warp_ns": True, "cpu_idle": True},
            CPUQOSPolicy.GROUP_IDENTITY,
            MECH_GROUP_IDENTITY,
        ),
        ({"cpu_bvt_warp_ns": False, "cpu_idle": True}, CPUQOSPolicy.GROUP_IDENTITY, MECH_CPU_IDLE),
        ({"cpu_bvt_warp_ns": True, "cpu_idle": True}, CPUQOSPolicy.CORE_SCHED, MECH_CPU_IDLE),
        ({"cpu_bvt_warp_ns": False, "cpu_idle": False}, CPUQOSPolicy.GROUP_IDENTITY, MECH_SHARES),
    ],
)
def test_cpu_mechanism_falls_back_from_group_identity_to_idle_to_shares(
    supported: dict[str, bool], policy: CPUQOSPolicy, expected: str
) -> None:
    assert cpu_mechanism(supported, policy) == expected


def test_share_pool_is_online_cpus_minus_lsr_and_lse_cpus() -> None:
    pods = [
        _pod("a", QoSClass.LSR, KubeQOS.GUARANTEED, cpus="0-1"),
        _pod("b", QoSClass.LSE, KubeQOS.GUARANTEED, cpus="6"),
        _pod("c", QoSClass.LS, KubeQOS.BURSTABLE, cpus="3"),  # LS annotations hold nothing
    ]
    assert share_pool(frozenset(range(8)), pods) == frozenset({2, 3, 4, 5, 7})


def test_plan_without_node_info_skips_cpusets_and_says_why(host_root: Path) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    pod = _pod("lsr", QoSClass.LSR, KubeQOS.GUARANTEED, fake, cpus="0-1")
    snapshot = WorkloadSnapshot(pods={pod.uid: pod})
    plan = build_plan(
        qos_strategy({}),
        fake.layout,
        snapshot,
        mechanism=MECH_CPU_IDLE,
        online=frozenset(),
        node_memory=None,
    )
    assert plan.skipped["cpusets"] == "online CPUs unknown (no node info yet)"
    assert not [w for w in plan.writes if w.knob_name == "cpuset_cpus"]


# Rounds on the fake host ------------------------------------------------------------------------

ANOLIS_CPU = {"cpu.bvt_warp_ns": "0"}
ANOLIS_MEMORY = {
    "memory.wmark_ratio": "0",
    "memory.wmark_scale_factor": "50",
    "memory.wmark_min_adj": "0",
    "memory.priority": "0",
    "memory.use_priority_oom": "0",
    "memory.oom.group": "0",
}
ANOLIS_V1_MEMORY = {"memory.min": "0", "memory.low": "0", "memory.high": "9223372036854771712"}


def add_anolis_files(fake: FakeHost, rels: list[str]) -> None:
    """What an Anolis kernel shows: group identity and the memcg QoS files (v1 also min, low,
    high), in every given cgroup."""
    memory = dict(ANOLIS_MEMORY)
    if fake.version is CgroupVersion.V1:
        memory |= ANOLIS_V1_MEMORY
    for rel in rels:
        for name, text in ANOLIS_CPU.items():
            fake.write("cpu", rel, name, text)
        for name, text in memory.items():
            fake.write("memory", rel, name, text)


@pytest.fixture
def rig(fake_host: FakeHost) -> Iterator[SimpleNamespace]:
    fake = fake_host
    lsr = _pod("lsr", QoSClass.LSR, KubeQOS.GUARANTEED, fake, cpus="0-1", request=GIB)
    ls = _pod("ls", QoSClass.LS, KubeQOS.BURSTABLE, fake, request=GIB, limit=2 * GIB)
    be = _pod("be", QoSClass.BE, KubeQOS.BESTEFFORT, fake, request=512 * MIB)
    app_rel = fake.add_host_app_cgroup("host-latency-sensitive/nginx")
    snapshot = WorkloadSnapshot(
        pods={p.uid: p for p in (lsr, ls, be)},
        host_apps=(HostAppInfo("nginx", QoSClass.LS, app_rel),),
    )
    cache = MetricCache()
    cache.set_info("node_info", node_info_dict(read_cpu_topology(fake.paths)))
    box: dict[str, Any] = {"raw": {}}
    writer = CgroupWriter(fake.host)
    writer.start()
    book = QoSBook()
    ctx = StrategyContext(
        host=lambda: fake.host,
        config=config(HOOKS_OFF),
        cache=cache,
        executor=writer,
        workloads=lambda: snapshot,
        node_slo=lambda: in_force(resourceQOSStrategy=box["raw"]),
        book=book,
    )
    try:
        yield SimpleNamespace(
            fake=fake, lsr=lsr, ls=ls, be=be, app=app_rel, box=box, book=book, ctx=ctx
        )
    finally:
        writer.stop()


def _rels(rig: SimpleNamespace) -> list[str]:
    fake: FakeHost = rig.fake
    out = [fake.layout.qos_dir(q) for q in KubeQOS]
    for pod in (rig.lsr, rig.ls, rig.be):
        out += [pod.cgroup_dir, *(c.cgroup_dir for c in pod.containers)]
    return [*out, rig.app]


def _report(rig: SimpleNamespace) -> Any:
    report = rig.book.last_report("cgreconcile")
    assert report is not None
    return report


async def test_lsr_cpusets_come_from_the_annotation_and_ls_gets_the_share_pool(
    rig: SimpleNamespace,
) -> None:
    fake: FakeHost = rig.fake
    be_before = fake.read("cpuset", rig.be.cgroup_dir, "cpuset.cpus")
    strategy = CgroupReconcile(replace(rig.ctx, capabilities=probe_capabilities(fake.host)))
    await strategy.reconcile()
    for rel in (rig.lsr.cgroup_dir, rig.lsr.containers[0].cgroup_dir):
        assert fake.read("cpuset", rel, "cpuset.cpus").strip() == "0-1"
    for rel in (rig.ls.cgroup_dir, rig.ls.containers[0].cgroup_dir, rig.app):
        assert fake.read("cpuset", rel, "cpuset.cpus").strip() == "2-3"
    # BE cpusets belong to CPU suppress
    assert fake.read("cpuset", rig.be.cgroup_dir, "cpuset.cpus") == be_before
    quota_file = "cpu.cfs_quota_us" if fake.version is CgroupVersion.V1 else "cpu.max"
    for rel in (rig.lsr.cgroup_dir, rig.lsr.containers[0].cgroup_dir):
        assert fake.read("cpu", rel, quota_file).split()[0] in ("-1", "max")


async def test_mainline_kernel_reports_the_idle_fallback_and_the_missing_anolis_knobs(
    rig: SimpleNamespace,
) -> None:
    fake: FakeHost = rig.fake
    rig.box["raw"] = {"beClass": {"cpuQOS": {"enable": True}}}
    strategy = CgroupReconcile(replace(rig.ctx, capabilities=probe_capabilities(fake.host)))
    await strategy.reconcile()
    be_dir = fake.layout.qos_dir(KubeQOS.BESTEFFORT)
    assert fake.read("cpu", be_dir, "cpu.idle").strip() == "1"
    assert fake.read("cpu", fake.layout.qos_dir(KubeQOS.BURSTABLE), "cpu.idle").strip() == "0"
    report = _report(rig)
    assert report.inputs["cpu_mechanism"] == MECH_CPU_IDLE
    unsupported = report.detail["unsupported"]
    assert "Anolis kernels only" in unsupported["cpu_bvt_warp_ns"]
    assert "Anolis kernels only" in unsupported["memory_wmark_ratio"]
    if fake.version is CgroupVersion.V1:
        assert "memory_min" in unsupported  # mainline v1 has no memory.min
    # BE CPU QoS off again: the BE QoS cgroup is no longer SCHED_IDLE
    rig.box["raw"] = {}
    await strategy.reconcile()
    assert fake.read("cpu", be_dir, "cpu.idle").strip() == "0"


async def test_without_cpu_idle_be_keeps_minimum_shares_reported_as_the_fallback(
    rig: SimpleNamespace,
) -> None:
    fake: FakeHost = rig.fake
    for rel in ["", *_rels(rig)]:
        with contextlib.suppress(FileNotFoundError):  # the v2 root has none
            os.unlink(fake.path("cpu", rel, "cpu.idle"))
    rig.box["raw"] = {"beClass": {"cpuQOS": {"enable": True}}}
    strategy = CgroupReconcile(replace(rig.ctx, capabilities=probe_capabilities(fake.host)))
    await strategy.reconcile()
    report = _report(rig)
    assert report.inputs["cpu_mechanism"] == MECH_SHARES
    assert "cpu_idle" in report.detail["unsupported"]
    be_dir = fake.layout.qos_dir(KubeQOS.BESTEFFORT)
    shares = fake.read(
        "cpu", be_dir, "cpu.shares" if fake.version is CgroupVersion.V1 else "cpu.weight"
    )
    assert shares.strip() in ("2", "1")  # v2 keeps shares 2 as weight 1


async def test_anolis_kernel_gets_group_identity_and_memory_qos(rig: SimpleNamespace) -> None:
    fake: FakeHost = rig.fake
    add_anolis_files(fake, ["", *_rels(rig)])
    rig.box["raw"] = {
        **ALL_ON,
        "lsClass": {
            "cpuQOS": {"enable": True},
            "memoryQOS": {
                "enable": True,
                "minLimitPercent": 50,
                "lowLimitPercent": 80,
                "throttlingPercent": 50,
            },
        },
    }
    strategy = CgroupReconcile(replace(rig.ctx, capabilities=probe_capabilities(fake.host)))
    await strategy.reconcile()
    report = _report(rig)
    assert report.inputs["cpu_mechanism"] == MECH_GROUP_IDENTITY
    assert report.detail["unsupported"] == {}
    layout = fake.layout
    bvt = {rel: fake.read("cpu", rel, "cpu.bvt_warp_ns").strip() for rel in _rels(rig)}
    assert bvt[layout.qos_dir(KubeQOS.GUARANTEED)] == "0"
    assert bvt[layout.qos_dir(KubeQOS.BURSTABLE)] == "2"
    assert bvt[layout.qos_dir(KubeQOS.BESTEFFORT)] == "-1"
    assert (bvt[rig.lsr.cgroup_dir], bvt[rig.ls.cgroup_dir], bvt[rig.be.cgroup_dir]) == (
        "2",
        "2",
        "-1",
    )
    ls_dir, ls_container = rig.ls.cgroup_dir, rig.ls.containers[0].cgroup_dir
    assert int(fake.read("memory", ls_dir, "memory.min")) == GIB // 2
    assert int(fake.read("memory", ls_dir, "memory.low")) == GIB * 8 // 10
    # the one container holds the whole request and limit: the same protection, and the high
    # mark between its request and limit
    assert int(fake.read("memory", ls_container, "memory.min")) == GIB // 2
    assert int(fake.read("memory", ls_container, "memory.low")) == GIB * 8 // 10
    assert int(fake.read("memory", ls_container, "memory.high")) == GIB + GIB // 2
    # QoS cgroups: burstable sums its pods, the kubepods root sums all (LSR and BE give 0)
    assert int(fake.read("memory", layout.qos_dir(KubeQOS.BURSTABLE), "memory.min")) == GIB // 2
    assert int(fake.read("memory", layout.qos_dir(KubeQOS.GUARANTEED), "memory.min")) == GIB // 2
    for rel in (ls_dir, ls_container):
        assert fake.read("memory", rel, "memory.wmark_ratio").strip() == "95"
        assert fake.read("memory", rel, "memory.wmark_scale_factor").strip() == "20"
        assert fake.read("memory", rel, "memory.wmark_min_adj").strip() == "-25"
    be_dir = rig.be.cgroup_dir
    assert fake.read("memory", be_dir, "memory.wmark_min_adj").strip() == "50"


async def test_an_unsupported_knob_is_reported_once_and_not_retried(
    rig: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    # no capabilities: the strategy learns from the executor's refusal
    strategy = CgroupReconcile(rig.ctx)
    caplog.set_level("INFO", logger="koordlet.qos.cgreconcile")
    await strategy.reconcile()
    first = _report(rig)
    assert "memory_wmark_ratio" in strategy.unsupported
    await strategy.reconcile()
    second = _report(rig)
    assert second.detail["errors"] == []
    lines = [r for r in caplog.records if "memory_wmark_ratio unsupported" in r.getMessage()]
    assert len(lines) == 1
    assert first.detail["unsupported"] == second.detail["unsupported"]


async def test_a_second_round_resubmits_nothing_that_is_in_place(rig: SimpleNamespace) -> None:
    fake: FakeHost = rig.fake
    strategy = CgroupReconcile(replace(rig.ctx, capabilities=probe_capabilities(fake.host)))
    await strategy.reconcile()
    await strategy.reconcile()
    assert _report(rig).result == "nothing to apply"


async def test_dry_run_writes_no_cpuset(rig: SimpleNamespace) -> None:
    fake: FakeHost = rig.fake
    before = fake.read("cpuset", rig.lsr.cgroup_dir, "cpuset.cpus")
    dry = CgroupWriter(fake.host, dry_run_strategies=frozenset({"cgreconcile"}))
    dry.start()
    try:
        ctx = replace(rig.ctx, executor=dry, dry_run_strategies=frozenset({"cgreconcile"}))
        strategy = CgroupReconcile(replace(ctx, capabilities=probe_capabilities(fake.host)))
        await strategy.reconcile()
        assert "(dry run)" in _report(rig).result
        await strategy.reconcile()  # the decisions are not re-audited every round
        assert _report(rig).result == "nothing to apply"
    finally:
        dry.stop()
    assert fake.read("cpuset", rig.lsr.cgroup_dir, "cpuset.cpus") == before


def test_quota_is_lifted_only_for_pods_bound_to_their_own_cpus(host_root: Path) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    bound = _pod("bound", QoSClass.LSR, KubeQOS.GUARANTEED, fake, cpus="1")
    plain = _pod("plain", QoSClass.NONE, KubeQOS.GUARANTEED, fake)  # LSR by default
    snapshot = WorkloadSnapshot(pods={p.uid: p for p in (bound, plain)})
    plan = build_plan(
        qos_strategy({}),
        fake.layout,
        snapshot,
        mechanism=MECH_CPU_IDLE,
        online=frozenset(range(4)),
        node_memory=None,
    )
    unset = {w.rel_dir for w in plan.writes if w.knob_name == "cpu_cfs_quota"}
    assert unset == {bound.cgroup_dir, bound.containers[0].cgroup_dir}
    assert "without a resource-status cpuset" in plan.skipped["pod/plain: cpuset"]


# The plan memo: a pod's memory entries reused while their inputs hold ---------------------------


def test_a_plan_built_with_the_memo_equals_one_built_without_as_inputs_change(
    host_root: Path,
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    ls = _pod("ls", QoSClass.LS, KubeQOS.BURSTABLE, fake, request=GIB, limit=2 * GIB)
    be = _pod("be", QoSClass.BE, KubeQOS.BESTEFFORT, fake)  # no limit: node memory decides
    on = {"memoryQOS": {"enable": True, "minLimitPercent": 50, "throttlingPercent": 80}}
    strategy = qos_strategy({"lsrClass": on, "lsClass": on, "beClass": on})
    memo = PlanMemo()

    def both(pods: list[PodInfo], strategy: ResourceQOSStrategy, node: int | None) -> Any:
        snapshot = WorkloadSnapshot(pods={p.uid: p for p in pods})
        plans = [
            build_plan(
                strategy,
                fake.layout,
                snapshot,
                mechanism=MECH_CPU_IDLE,
                online=frozenset(range(4)),
                node_memory=node,
                memo=m,
            )
            for m in (memo, None)
        ]
        assert plans[0].writes == plans[1].writes
        assert plans[0].skipped == plans[1].skipped
        return plans[0]

    first = both([ls, be], strategy, 16 * GIB)
    again = both([ls, be], strategy, 16 * GIB)
    pod_dirs = {
        ls.cgroup_dir,
        be.cgroup_dir,
        *(c.cgroup_dir for p in (ls, be) for c in p.containers),
    }
    kept = [w for w in again.writes if w.rel_dir in pod_dirs and w.knob_name.startswith("memory")]
    # each pod: min, low and the six static knobs; its container: min, low, high and the six
    assert len(kept) == 2 * (2 + 6 + 3 + 6)
    assert all(any(w is f for f in first.writes) for w in kept), "unchanged: reused, not rebuilt"

    # each input of a pod's entries, changed alone, is seen (both() compares every step)
    ls = replace(ls, memory_request_bytes=2 * GIB)  # the pod's request
    assert _write(both([ls, be], strategy, 16 * GIB), "memory_min", ls.cgroup_dir).value == GIB
    main = replace(ls.containers[0], memory_request_bytes=2 * GIB)  # a container's
    ls = replace(ls, containers=(main,))
    assert _write(both([ls, be], strategy, 16 * GIB), "memory_min", main.cgroup_dir).value == GIB
    plan = both([ls, be], strategy, 8 * GIB)  # the node's memory
    high = _write(plan, "memory_high", be.containers[0].cgroup_dir).value
    assert high == 8 * GIB * 80 // 100 // 4096 * 4096
    plan = both([ls, be], strategy, None)  # unknown: said, not written
    assert "pod/be/main: memory_high" in plan.skipped
    be = replace(be, name="be-renamed")  # the pod's name
    assert "pod/be-renamed/main: memory_high" in both([ls, be], strategy, None).skipped
    be = replace(be, cgroup_dir=be.cgroup_dir + "-moved")  # the pod's cgroup
    assert _write(both([ls, be], strategy, None), "memory_min", be.cgroup_dir).value == 0
    ls = replace(ls, qos=QoSClass.LSR)  # the class (LSR's section equals LS's)
    plan = both([ls, be], strategy, None)
    assert _write(plan, "memory_low", ls.cgroup_dir).reason == "memoryQOS of LSR (on)"
    plan = both([ls, be], qos_strategy({"lsrClass": on, "lsClass": on}), None)  # BE's section
    assert "pod/be-renamed/main: memory_high" not in plan.skipped
    both([ls], strategy, None)  # a pod gone is forgotten
    assert len(memo) == 1


def _write(plan: Any, knob_name: str, rel_dir: str) -> Any:
    return next(w for w in plan.writes if (w.knob_name, w.rel_dir) == (knob_name, rel_dir))


# koordinator.sh/cpuQOS (upstream's groupidentity hook test cases, pkg/koordlet/runtimehooks/
# hooks/groupidentity/bvt_test.go: an LS pod's annotation overrides its class's value) ----------


def _annotated(rig: SimpleNamespace, pod: PodInfo, value: str) -> SimpleNamespace:
    pods = dict(rig.ctx.workloads().pods)
    pods[pod.uid] = replace(pod, annotations={**pod.annotations, ANNOTATION_POD_CPU_QOS: value})
    snapshot = WorkloadSnapshot(pods=pods, host_apps=rig.ctx.workloads().host_apps)
    sink = RecordingSink()
    ctx = replace(
        rig.ctx,
        workloads=lambda: snapshot,
        capabilities=probe_capabilities(rig.fake.host),
        pod_warnings=PodAnnotationWarnings(sink),
    )
    return SimpleNamespace(strategy=CgroupReconcile(ctx), sink=sink, ctx=ctx)


class RecordingSink:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warn(self, pod: PodInfo, reason: str, message: str) -> None:
        self.warnings.append(message)


@pytest.mark.parametrize(
    ("value", "ls_bvt"),
    [
        ('{"enable":true,"groupIdentity":-1}', "-1"),  # "annotation override succeed"
        ('{"enable":false}', "0"),  # "annotation override failed": disabled gives 0
        ('{"groupIdentity":-1}', "0"),  # enable absent: upstream treats it as disabled
        ('{"enable":true}', "2"),  # no identity: the class's
    ],
)
async def test_an_ls_pods_cpu_qos_annotation_overrides_its_group_identity(
    rig: SimpleNamespace, value: str, ls_bvt: str
) -> None:
    fake: FakeHost = rig.fake
    add_anolis_files(fake, ["", *_rels(rig)])
    rig.box["raw"] = {**ALL_ON, "lsClass": {"cpuQOS": {"enable": True}}}
    run = _annotated(rig, rig.ls, value)
    await run.strategy.reconcile()
    assert fake.read("cpu", rig.ls.cgroup_dir, "cpu.bvt_warp_ns").strip() == ls_bvt
    assert fake.read("cpu", rig.be.cgroup_dir, "cpu.bvt_warp_ns").strip() == "-1"
    assert run.sink.warnings == []


async def test_the_annotation_is_ignored_on_other_classes_as_upstream(
    rig: SimpleNamespace,
) -> None:
    fake: FakeHost = rig.fake
    add_anolis_files(fake, ["", *_rels(rig)])
    rig.box["raw"] = ALL_ON
    run = _annotated(rig, rig.be, '{"enable":true,"groupIdentity":2}')  # BE may not become LS
    await run.strategy.reconcile()
    assert fake.read("cpu", rig.be.cgroup_dir, "cpu.bvt_warp_ns").strip() == "-1"


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ('{"enable":true,"groupIdentity":3}', "bad group identity value: 3"),
        ('{"enable":"yes"}', "enable: want true or false"),
        ("not json", "not JSON"),
    ],
)
async def test_a_malformed_cpu_qos_keeps_the_class_value_and_warns_once(
    rig: SimpleNamespace, value: str, error: str
) -> None:
    fake: FakeHost = rig.fake
    add_anolis_files(fake, ["", *_rels(rig)])
    rig.box["raw"] = {**ALL_ON, "lsClass": {"cpuQOS": {"enable": True}}}
    run = _annotated(rig, rig.ls, value)
    await run.strategy.reconcile()
    await run.strategy.reconcile()
    assert fake.read("cpu", rig.ls.cgroup_dir, "cpu.bvt_warp_ns").strip() == "2"
    [message] = run.sink.warnings
    assert f"annotation {ANNOTATION_POD_CPU_QOS} ignored" in message
    assert error in message
    [entry] = run.ctx.pod_warnings.describe()
    assert entry["annotation"] == ANNOTATION_POD_CPU_QOS


@pytest.mark.parametrize(
    ("value", "idle"),
    [
        ('{"enable":true,"groupIdentity":-1}', "1"),
        ('{"enable":true,"schedIdle":1}', "1"),
        ('{"enable":true,"groupIdentity":2}', "0"),
        ('{"enable":false}', "0"),
    ],
)
async def test_on_a_mainline_kernel_the_annotation_sets_the_pods_cpu_idle(
    rig: SimpleNamespace, value: str, idle: str
) -> None:
    fake: FakeHost = rig.fake
    fake.write("cpu", rig.ls.cgroup_dir, "cpu.idle", "1" if idle == "0" else "0")
    rig.box["raw"] = {"beClass": {"cpuQOS": {"enable": True}}}
    run = _annotated(rig, rig.ls, value)
    await run.strategy.reconcile()
    assert fake.read("cpu", rig.ls.cgroup_dir, "cpu.idle").strip() == idle


async def test_with_the_hook_gates_on_pods_group_identity_and_cpusets_are_left_to_the_hooks(
    rig: SimpleNamespace,
) -> None:
    """One writer per knob and cgroup: while GroupIdentity and CPUSetAllocator are on (their
    defaults), the runtime hooks' reconciler owns the QoS cgroups' and pods' group identity and
    the pods' cpusets; this strategy keeps the host applications' and says why in the report."""
    fake: FakeHost = rig.fake
    add_anolis_files(fake, ["", *_rels(rig)])
    rig.box["raw"] = {**ALL_ON, "lsClass": {"cpuQOS": {"enable": True}}}
    ctx = replace(rig.ctx, config=config(), capabilities=probe_capabilities(fake.host))
    lsr_before = fake.read("cpuset", rig.lsr.cgroup_dir, "cpuset.cpus")
    await CgroupReconcile(ctx).reconcile()
    layout = fake.layout
    for rel in (*(layout.qos_dir(q) for q in KubeQOS), rig.lsr.cgroup_dir, rig.be.cgroup_dir):
        assert fake.read("cpu", rel, "cpu.bvt_warp_ns").strip() == "0", rel  # untouched
    assert fake.read("cpu", rig.app, "cpu.bvt_warp_ns").strip() == "2"  # the host app's: ours
    assert fake.read("cpuset", rig.lsr.cgroup_dir, "cpuset.cpus") == lsr_before
    assert fake.read("cpuset", rig.app, "cpuset.cpus").strip() == "2-3"
    skipped = _report(rig).detail["skipped"]
    assert "GroupIdentity" in skipped["pod_cpu_qos"]
    assert "CPUSetAllocator" in skipped["pod_cpusets"]


async def test_with_group_identity_on_the_cpu_qos_annotation_is_the_hooks_not_ours(
    rig: SimpleNamespace,
) -> None:
    """One writer per knob: with the GroupIdentity gate on (its default) the runtime hook applies
    koordinator.sh/cpuQOS and reports a bad one; this strategy neither writes the pod's identity
    nor warns about its annotation."""
    fake: FakeHost = rig.fake
    add_anolis_files(fake, ["", *_rels(rig)])
    rig.box["raw"] = {**ALL_ON, "lsClass": {"cpuQOS": {"enable": True}}}
    for value in ('{"enable":true,"groupIdentity":-1}', "not json"):
        run = _annotated(rig, rig.ls, value)
        await CgroupReconcile(replace(run.ctx, config=config())).reconcile()
        assert fake.read("cpu", rig.ls.cgroup_dir, "cpu.bvt_warp_ns").strip() == "0"
        assert run.sink.warnings == []
        assert run.ctx.pod_warnings.describe() == []
