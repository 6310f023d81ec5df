"""CPU suppress: Koordinator's arithmetic in tables, and what one round writes on a fake host."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from apis.extension import ANNOTATION_RESOURCE_STATUS, KubeQOS, QoSClass
from koordlet.collectors.nodeinfo import node_info_dict
from koordlet.executor import CgroupWriter
from koordlet.executor.writer import WriteResult
from koordlet.metriccache import series
from koordlet.metriccache.store import MetricCache
from koordlet.qos.cpupicker import Processor, be_cpuset_count, pick_be_cpus, pick_cpus
from koordlet.qos.cpusuppress import CPUSuppress
from koordlet.qos.cpusuppressrules import (
    Usage,
    be_cgroup_dirs,
    be_suppress_milli,
    cfs_quota_target,
    node_reserved_milli,
    split_usage,
)
from koordlet.qos.framework import QoSBook, StrategyContext
from koordlet.statesinformer.model import ContainerInfo, HostAppInfo, PodInfo, WorkloadSnapshot
from koordlet.system.knobs import knob
from koordlet.system.topology import read_cpu_topology
from tests.fakehost import FakeHost, container_id
from tests.strategyrig import config, following, in_force

# Arithmetic -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "pods", "be", "apps", "reserved", "expected"),
    [
        # system = node - all pods - all host apps
        (6.0, {"ls": 2.0, "be": 1.0}, {"be"}, {}, 0.0, Usage(2.0, 0.0, 3.0, 1.0)),
        # system never negative
        (2.0, {"ls": 2.0, "be": 1.0}, {"be"}, {}, 0.0, Usage(2.0, 0.0, 0.0, 1.0)),
        # system at least the node reservation
        (3.5, {"ls": 2.0, "be": 1.0}, {"be"}, {}, 1.0, Usage(2.0, 0.0, 1.0, 1.0)),
        # a pod the inventory does not know counts as LS
        (4.0, {"ls": 1.0, "unknown": 1.0}, set(), {}, 0.0, Usage(2.0, 0.0, 2.0, 0.0)),
        # host apps: LS ones count, BE ones do not
        (5.0, {"ls": 1.0}, set(), {"db": 1.5, "batch": 0.5}, 0.0, Usage(1.0, 1.5, 2.0, 0.5)),
    ],
)
def test_usage_splits_into_ls_pods_host_apps_system_and_be(
    node: float,
    pods: dict[str, float],
    be: set[str],
    apps: dict[str, float],
    reserved: float,
    expected: Usage,
) -> None:
    assert split_usage(node, pods, be, apps, {"batch"}, reserved) == expected


@pytest.mark.parametrize(
    ("capacity", "threshold", "usage", "min_percent", "expected"),
    [
        (8000, 65, Usage(2.0, 0.0, 0.5, 1.0), None, 2700),  # 5200 - 2000 - 500
        (8000, 65, Usage(2.0, 1.0, 0.5, 1.0), None, 1700),  # LS host apps count too
        (8000, 65, Usage(6.0, 0.0, 1.0, 1.0), None, -1800),  # negative: the callers floor it
        (8000, 65, Usage(6.0, 0.0, 1.0, 1.0), 10, 800),  # cpuSuppressMinPercent floor
        (3000, 33, Usage(0.0, 0.0, 0.0, 0.0), None, 990),  # integer percent of capacity
        (4000, 50, Usage(0.0009, 0.0, 0.0, 0.0), None, 2000),  # usage truncated to milli
    ],
)
def test_be_suppress_is_capacity_share_minus_ls_and_system(
    capacity: int, threshold: int, usage: Usage, min_percent: int | None, expected: int
) -> None:
    assert be_suppress_milli(capacity, threshold, usage, min_percent) == expected


@pytest.mark.parametrize(
    ("milli", "old", "total", "expected"),
    [
        (2700, 8, 8, 3),  # ceil(2.7)
        (3000, 8, 8, 3),  # exact
        (500, 8, 8, 2),  # at least 2 CPUs
        (-1800, 8, 8, 2),  # negative: 2 CPUs
        (10000, 2, 16, 4),  # growth limited to ceil(16 * 10%) = 2 CPUs a round
        (10000, 2, 8, 3),  # ceil(0.8) = 1
        (1000, 12, 16, 2),  # shrinking is not limited
    ],
)
def test_cpuset_size_rounds_up_keeps_two_and_grows_slowly(
    milli: int, old: int, total: int, expected: int
) -> None:
    assert be_cpuset_count(milli, old, total) == expected


@pytest.mark.parametrize(
    ("milli", "current", "cores", "expected"),
    [
        (2700, None, 8, 270000),  # cores x 100 ms period
        (-1800, None, 8, 2000),  # floor 2000 us
        (10, 300000, 8, 2000),  # down to the floor in one step
        (2750, 270000, 8, None),  # within 1% of 8 cores (8000 us): skipped
        (20, 2500, 8, 2000),  # the floor is written even within the dead band
        (3000, 100000, 8, 180000),  # growth limited to 10% of 8 cores (80000 us)
        (3000, None, 8, 300000),  # from unlimited: no growth limit
        (1000, 300000, 8, 100000),  # shrinking is not limited
    ],
)
def test_cfs_quota_floor_dead_band_and_growth_limit(
    milli: int, current: int | None, cores: int, expected: int | None
) -> None:
    assert cfs_quota_target(milli, current, cores) == expected


def _ht_two_sockets() -> list[Processor]:
    """8 CPUs: 2 sockets = NUMA nodes x 2 cores x 2 threads, numbered as x86 Linux does."""
    procs = []
    for cpu in range(8):
        core = cpu % 4
        procs.append(Processor(cpu, core, core // 2, core // 2))
    return procs


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (2, [0, 4]),  # one whole core of the first NUMA node
        (4, [0, 4, 2, 6]),  # one core on each NUMA node
        (3, [0, 4, 2]),  # a pair, then a single CPU from the next node
        (6, [0, 4, 2, 6, 1, 5]),
        (8, [0, 4, 2, 6, 1, 5, 3, 7]),
        (9, []),  # upstream: too few CPUs picks nothing
    ],
)
def test_picker_spreads_whole_cores_over_numa_nodes(count: int, expected: list[int]) -> None:
    assert pick_cpus(count, _ht_two_sockets()) == expected


def test_picker_without_hyperthreads_takes_single_cpus_round_robin() -> None:
    procs = [Processor(c, c, c // 2, c // 2) for c in range(4)]
    assert pick_cpus(3, procs) == [0, 2, 1]


def test_picker_never_takes_lse_cpus_and_splits_lsr_by_share() -> None:
    procs = [Processor(c, c, 0, 0) for c in range(8)]
    # CPUs 6-7 belong to an LSE pod; 4-5 to an LSR pod: of 6 usable CPUs 2 are LSR (1/3).
    cpus = pick_be_cpus(3, procs, lsr_cpus=frozenset({4, 5}), excluded=frozenset({6, 7}))
    assert cpus == [0, 1, 4]
    assert not {6, 7} & set(pick_be_cpus(6, procs, excluded=frozenset({6, 7})))


def _node(capacity: str | None, allocatable: str | None, reservation: object = None) -> Any:
    status: dict[str, Any] = {}
    if capacity is not None:
        status["capacity"] = {"cpu": capacity}
    if allocatable is not None:
        status["allocatable"] = {"cpu": allocatable}
    annotations = {}
    if reservation is not None:
        annotations["node.koordinator.sh/reservation"] = (
            reservation if isinstance(reservation, str) else json.dumps(reservation)
        )
    return {"metadata": {"annotations": annotations}, "status": status}


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (None, 0),  # standalone: no Node object
        (_node("8", "7500m"), 500),  # kubelet --system-reserved/--kube-reserved
        (_node("8", "8"), 0),
        (_node("8", None), 0),  # allocatable unknown: nothing assumed
        (_node("8", "7", {"resources": {"cpu": "2"}}), 2000),  # the larger one
        (_node("8", "6", {"resources": {"cpu": "500m"}}), 2000),
        (_node("8", "8", {"reservedCPUs": "0-2", "resources": {"cpu": "1"}}), 3000),  # CPU count
        (_node("8", "7", "not json"), 1000),  # a bad annotation is ignored
        # apis.nodetopo.parse_node_reservation reads it, as json.Unmarshal would: a field of the
        # wrong type refuses the whole annotation (upstream then counts no reservation)
        (_node("8", "8", {"reservedCPUs": 3, "resources": {"cpu": "2"}}), 0),
        (_node("8", "8", {"reservedCPUs": "x-y"}), 0),
        (_node("8", "8", {"reservedCPUs": "", "resources": {"cpu": "1500m"}}), 1500),
    ],
)
def test_node_reservation_is_the_larger_of_kubelet_and_annotation(node: Any, expected: int) -> None:
    assert node_reserved_milli(node) == expected


# Reconcile on a fake host ---------------------------------------------------------------------

NOW = 10_000.0


@dataclass
class Rig:
    fake: FakeHost
    cache: MetricCache
    strategy: CPUSuppress
    snapshot: WorkloadSnapshot
    slo: dict[str, Any]
    be_dir: str
    be_pod: str
    be_container: str
    ls_pod: str
    node: dict[str, Any] | None
    changes: list[WriteResult]

    def usage(self, node: float, ls: float, be: float, *, at: float = NOW) -> None:
        self.cache.append(
            at,
            [
                series.Sample(series.SeriesKey(series.NODE_CPU_USAGE, series.NODE), node),
                series.Sample(series.SeriesKey(series.POD_CPU_USAGE, "pod/a5-1"), ls),
                series.Sample(series.SeriesKey(series.POD_CPU_USAGE, "pod/be-1"), be),
            ],
        )

    def quota(self, rel: str) -> int | None:
        k = knob("cpu_cfs_quota")
        text = self.fake.read("cpu", rel, k.file_for(self.fake.version) or "")
        value: int | None = k.decode(text, self.fake.version)
        return value

    def cpuset(self, rel: str) -> str:
        return self.fake.read("cpuset", rel, "cpuset.cpus").strip()


@pytest.fixture
async def rig(fake_host: FakeHost) -> AsyncIterator[Rig]:
    fake = fake_host
    be_uid, ls_uid = "be-1", "a5-1"
    cid = container_id("be")
    be_pod, [be_container] = fake.add_pod(be_uid, KubeQOS.BESTEFFORT, [("containerd", cid)])
    ls_pod, _ = fake.add_pod(ls_uid, KubeQOS.BURSTABLE)
    be_dir = fake.layout.qos_dir(KubeQOS.BESTEFFORT)
    for rel in (be_dir, be_pod, be_container, ls_pod):
        fake.write("cpuset", rel, "cpuset.cpus", fake.all_cpus)
    snapshot = WorkloadSnapshot(
        pods={
            be_uid: PodInfo(
                be_uid,
                "be",
                "default",
                QoSClass.BE,
                KubeQOS.BESTEFFORT,
                be_pod,
                (ContainerInfo(cid, "main", "containerd", be_container),),
            ),
            ls_uid: PodInfo(ls_uid, "ls", "default", QoSClass.LS, KubeQOS.BURSTABLE, ls_pod),
        }
    )
    clock = SimpleNamespace(now=NOW)
    cache = MetricCache(clock=lambda: clock.now)
    cache.set_info("node_info", node_info_dict(read_cpu_topology(fake.paths)))
    slo: dict[str, Any] = {"enable": True, "cpuSuppressThresholdPercent": 50}
    changes: list[WriteResult] = []
    writer = CgroupWriter(fake.host, on_change=changes.append)
    writer.start()
    rig_box: dict[str, Rig] = {}
    ctx = StrategyContext(
        host=lambda: fake.host,
        config=config(node_name="node-a"),
        cache=cache,
        executor=writer,
        workloads=lambda: rig_box["rig"].snapshot,
        node_slo=following(lambda: {"resourceUsedThresholdWithBE": dict(rig_box["rig"].slo)}),
        book=QoSBook(clock=lambda: clock.now),
    )
    strategy = CPUSuppress(ctx, node=lambda: rig_box["rig"].node)
    rig_box["rig"] = Rig(
        fake, cache, strategy, snapshot, slo, be_dir, be_pod, be_container, ls_pod, None, changes
    )
    try:
        yield rig_box["rig"]
    finally:
        await asyncio.to_thread(writer.stop)


async def test_cfs_quota_policy_shrinks_the_be_cgroup_quota_to_what_ls_leaves(rig: Rig) -> None:
    rig.slo["cpuSuppressPolicy"] = "cfsQuota"
    # 4 CPUs x 50% = 2 cores; LS 0.5 and system 3.2 - 0.5 - 1.0 = 1.7: BE gets -0.2 -> floor.
    rig.usage(node=3.2, ls=0.5, be=1.0)
    await rig.strategy.reconcile()
    assert rig.quota(rig.be_dir) == 2000
    # LS load gone, system 0.1: BE gets 2 - 0 - 0.1 = 1.9 cores; step limit 40000 us a round.
    rig.usage(node=1.1, ls=0.0, be=1.0, at=NOW + 1)
    await rig.strategy.reconcile()
    assert rig.quota(rig.be_dir) == 42000
    families = {f.name: f for f in rig.strategy.collect()}
    [sample] = families["koordlet_be_suppress_cpu_cores"].samples
    assert sample.labels == {"node": "node-a", "type": "cfsQuota"}
    assert sample.value == pytest.approx(0.42)
    # The pods below are untouched by the quota policy: their cpusets stay whole.
    assert rig.cpuset(rig.be_container) == rig.fake.all_cpus


async def test_cpuset_policy_writes_the_same_cpus_to_qos_pod_and_container(rig: Rig) -> None:
    rig.usage(node=3.2, ls=0.5, be=1.0)
    await rig.strategy.reconcile()
    for rel in (rig.be_dir, rig.be_pod, rig.be_container):
        assert rig.cpuset(rel) == "0-1"  # at least 2 CPUs
    assert rig.cpuset(rig.ls_pod) == rig.fake.all_cpus
    # No quota was ever set: restoring it under the cpuset policy leaves it unlimited.
    assert rig.quota(rig.be_dir) is None


async def test_disabling_the_threshold_restores_cpuset_and_quota(rig: Rig) -> None:
    rig.slo["cpuSuppressPolicy"] = "cfsQuota"
    rig.usage(node=3.2, ls=0.5, be=1.0)
    await rig.strategy.reconcile()
    assert rig.quota(rig.be_dir) == 2000
    rig.slo["enable"] = False
    await rig.strategy.reconcile()
    assert rig.quota(rig.be_dir) is None
    assert rig.cpuset(rig.be_container) == rig.fake.all_cpus


async def test_switching_policy_restores_what_the_other_policy_set(rig: Rig) -> None:
    rig.usage(node=3.2, ls=0.5, be=1.0)
    await rig.strategy.reconcile()
    assert rig.cpuset(rig.be_container) == "0-1"
    rig.slo["cpuSuppressPolicy"] = "cfsQuota"
    rig.usage(node=3.2, ls=0.5, be=1.0, at=NOW + 1)
    await rig.strategy.reconcile()
    assert rig.quota(rig.be_dir) == 2000
    for rel in (rig.be_dir, rig.be_pod, rig.be_container):
        assert rig.cpuset(rel) == rig.fake.all_cpus


async def test_stale_node_usage_holds_the_last_applied_state(rig: Rig) -> None:
    rig.slo["cpuSuppressPolicy"] = "cfsQuota"
    rig.usage(node=3.2, ls=0.5, be=1.0, at=NOW - 2.5)  # older than 2 x 1 s
    await rig.strategy.reconcile()
    assert rig.quota(rig.be_dir) is None
    assert rig.strategy.stale_rounds == 1
    report = rig.strategy._ctx.book.last_report("cpusuppress")
    assert report is not None
    assert report.stale
    assert report.decision.startswith("hold")


async def test_be_host_app_under_besteffort_gets_the_cpuset_and_counts_as_be(rig: Rig) -> None:
    app_dir = rig.fake.add_host_app_cgroup(f"{rig.be_dir}/batch-app")
    rig.fake.write("cpuset", app_dir, "cpuset.cpus", rig.fake.all_cpus)
    rig.snapshot = WorkloadSnapshot(
        pods=rig.snapshot.pods, host_apps=(HostAppInfo("batch-app", QoSClass.BE, app_dir),)
    )
    # The app's 1.5 cores are BE: system = 3.2 - 1.5 - 1.5 = 0.2, BE = 2 - 0.2 = 1.8 -> 2 CPUs.
    rig.cache.append(
        NOW,
        [series.Sample(series.SeriesKey(series.HOST_APP_CPU_USAGE, "hostapp/batch-app"), 1.5)],
    )
    rig.usage(node=3.2, ls=0.0, be=1.5)
    await rig.strategy.reconcile()
    assert rig.cpuset(app_dir) == "0-1"
    inputs: Mapping[str, float] = rig.strategy.debug_state()["inputs"]
    assert inputs["be"] == pytest.approx(3.0)
    assert inputs["system"] == pytest.approx(0.2)


def test_be_cgroups_are_listed_parents_first() -> None:
    snapshot = WorkloadSnapshot(
        pods={
            "u": PodInfo(
                "u",
                "p",
                "",
                QoSClass.BE,
                KubeQOS.BESTEFFORT,
                "kubepods/besteffort/podu",
                (ContainerInfo("c", "c", "containerd", "kubepods/besteffort/podu/c"),),
            ),
            "g": PodInfo("g", "g", "", QoSClass.LS, KubeQOS.GUARANTEED, "kubepods/podg"),
        }
    )
    assert be_cgroup_dirs(snapshot, "kubepods/besteffort") == [
        "kubepods/besteffort",
        "kubepods/besteffort/podu",
        "kubepods/besteffort/podu/c",
    ]


async def test_a_rejected_nodeslo_keeps_suppressing_with_the_last_good_threshold(rig: Rig) -> None:
    rig.slo["cpuSuppressPolicy"] = "cfsQuota"
    rig.usage(node=3.2, ls=0.5, be=1.0)
    await rig.strategy.reconcile()
    assert rig.quota(rig.be_dir) == 2000
    rig.slo["cpuSuppressThresholdPercent"] = 250  # outside 0..100: the NodeSLO is rejected
    rig.usage(node=3.2, ls=0.5, be=1.0, at=NOW + 1)
    await rig.strategy.reconcile()
    assert rig.quota(rig.be_dir) == 2000  # still 50 %: at 250 % BE would get more
    rejected = rig.strategy._ctx.node_slo().rejected["resourceUsedThresholdWithBE"]
    assert rejected.error.field == "resourceUsedThresholdWithBE.cpuSuppressThresholdPercent"


async def test_first_quota_round_grows_from_the_real_quota_not_from_unlimited(rig: Rig) -> None:
    # A quota left by an earlier run: 1 core. BE may have 2 - 0.1 = 1.9 cores; the rise is
    # limited to 10 % of 4 CPUs a round, counted from the real 100000 us.
    rig.fake.write("cpu", rig.be_dir, knob("cpu_cfs_quota").file_for(rig.fake.version) or "",
                   "100000" if rig.fake.version.value == "v1" else "100000 100000")  # fmt: skip
    rig.slo["cpuSuppressPolicy"] = "cfsQuota"
    rig.usage(node=1.1, ls=0.0, be=1.0)
    await rig.strategy.reconcile()
    assert rig.quota(rig.be_dir) == 140000
    assert rig.strategy.debug_state()["current_quota"] == 100000


async def test_first_cpuset_round_grows_from_the_real_cpuset_parents_first(rig: Rig) -> None:
    # An earlier run left BE on CPUs 0-1; now it may have all 4, but grows 1 CPU a round.
    for rel in (rig.be_container, rig.be_pod, rig.be_dir):
        rig.fake.write("cpuset", rel, "cpuset.cpus", "0-1")
    rig.slo["cpuSuppressThresholdPercent"] = 100
    rig.usage(node=1.0, ls=0.0, be=1.0)
    await rig.strategy.reconcile()
    for rel in (rig.be_dir, rig.be_pod, rig.be_container):
        assert rig.cpuset(rel) == "0-2"
    order = [r.path for r in rig.changes if r.knob == "cpuset_cpus"]
    assert order == [
        rig.fake.path("cpuset", rel, "cpuset.cpus")
        for rel in (rig.be_dir, rig.be_pod, rig.be_container)
    ]


async def test_cpuset_shrink_is_written_children_first_and_once_per_cgroup(rig: Rig) -> None:
    rig.usage(node=3.2, ls=0.5, be=1.0)
    await rig.strategy.reconcile()
    order = [(r.path, r.new) for r in rig.changes if r.knob == "cpuset_cpus"]
    assert order == [
        (rig.fake.path("cpuset", rel, "cpuset.cpus"), "0-1")
        for rel in (rig.be_container, rig.be_pod, rig.be_dir)
    ]
    # The same decision again, with nothing moved: nothing is written.
    rig.changes.clear()
    rig.usage(node=3.2, ls=0.5, be=1.0, at=NOW + 1)
    await rig.strategy.reconcile()
    assert [r for r in rig.changes if r.knob == "cpuset_cpus"] == []


async def test_node_reservation_is_the_floor_of_system_usage(rig: Rig) -> None:
    rig.slo["cpuSuppressPolicy"] = "cfsQuota"
    # No reservation: system 1.5 - 0.5 - 1.0 = 0; BE = 2 - 0.5 = 1.5 cores.
    rig.usage(node=1.5, ls=0.5, be=1.0)
    await rig.strategy.reconcile()
    assert rig.quota(rig.be_dir) == 150000
    # The node annotation reserves CPU 0-1 (2 cores): system is at least 2, BE gets nothing.
    rig.node = _node("4", "4", {"reservedCPUs": "0-1"})
    rig.usage(node=1.5, ls=0.5, be=1.0, at=NOW + 1)
    await rig.strategy.reconcile()
    assert rig.quota(rig.be_dir) == 2000
    inputs = rig.strategy.debug_state()["inputs"]
    assert (inputs["reserved"], inputs["system"]) == (2.0, 2.0)


async def test_dry_run_round_writes_nothing_and_keeps_no_applied_state(fake_host: FakeHost) -> None:
    fake = fake_host
    be_dir = fake.layout.qos_dir(KubeQOS.BESTEFFORT)
    fake.write("cpuset", be_dir, "cpuset.cpus", fake.all_cpus)
    changes: list[WriteResult] = []
    writer = CgroupWriter(fake.host, on_change=changes.append, dry_run_all=True)
    writer.start()
    cache = MetricCache(clock=lambda: NOW)
    cache.set_info("node_info", node_info_dict(read_cpu_topology(fake.paths)))
    cache.append(NOW, [series.Sample(series.SeriesKey(series.NODE_CPU_USAGE, series.NODE), 3.5)])
    ctx = StrategyContext(
        host=lambda: fake.host,
        config=config(),
        cache=cache,
        executor=writer,
        workloads=WorkloadSnapshot,
        node_slo=lambda: in_force(resourceUsedThresholdWithBE={"enable": True}),
        dry_run_all=True,
        book=QoSBook(clock=lambda: NOW),
    )
    try:
        strategy = CPUSuppress(ctx)
        for _ in range(2):
            await strategy.reconcile()
    finally:
        await asyncio.to_thread(writer.stop)
    assert fake.read("cpuset", be_dir, "cpuset.cpus").strip() == fake.all_cpus
    decisions = [r for r in changes if r.knob == "cpuset_cpus"]
    assert decisions
    assert all(r.dry_run and r.new == "0-1" for r in decisions)


# Reserved and SYSTEM QoS CPUs, the 2-CPU floor, logs ---------------------------------------------


def _annotated(**annotations: object) -> dict[str, Any]:
    return {
        "metadata": {
            "annotations": {
                f"node.koordinator.sh/{k}": json.dumps(v) for k, v in annotations.items()
            }
        }
    }


async def test_cpuset_policy_leaves_reserved_and_system_qos_cpus_to_the_system(rig: Rig) -> None:
    # upstream adjustByCPUSet: CPUs in the reservation's reservedCPUs and the exclusive SYSTEM
    # QoS cpuset are never BE's
    # 4 CPUs x 50% - system 0.1 = 1.9 cores: 2 CPUs out of the usable 1-2
    rig.node = _annotated(
        **{"reservation": {"reservedCPUs": "0"}, "system-qos-resource": {"cpuset": "3"}}
    )
    rig.usage(node=0.4, ls=0.0, be=0.3)
    await rig.strategy.reconcile()
    for rel in (rig.be_dir, rig.be_pod, rig.be_container):
        assert rig.cpuset(rel) == "1-2"
    excluded = rig.strategy.debug_state()["inputs"]["excluded_cpus"]
    assert excluded == {"lse": "", "reserved": "0", "system_qos": "3"}


async def test_each_round_sees_new_pods_node_info_and_node_annotations(rig: Rig) -> None:
    # the CPUs are kept from one round to the next while their inputs are the same: each input
    # changed alone shows in the next round
    async def excluded() -> dict[str, str]:
        await rig.strategy.reconcile()
        value: dict[str, str] = rig.strategy.debug_state()["inputs"]["excluded_cpus"]
        return value

    rig.usage(node=0.4, ls=0.0, be=0.3)
    assert await excluded() == {"lse": "", "reserved": "", "system_qos": ""}
    rig.node = _annotated(reservation={"reservedCPUs": "0"})
    assert await excluded() == {"lse": "", "reserved": "0", "system_qos": ""}
    rig.node = _annotated(
        reservation={"reservedCPUs": "0"}, **{"system-qos-resource": {"cpuset": "3"}}
    )
    assert await excluded() == {"lse": "", "reserved": "0", "system_qos": "3"}
    lse = PodInfo(
        "lse-1",
        "lse",
        "default",
        QoSClass.LSE,
        KubeQOS.GUARANTEED,
        "kubepods/podlse-1",
        annotations={ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "2"})},
    )
    rig.snapshot = WorkloadSnapshot(pods={**rig.snapshot.pods, lse.uid: lse})
    assert await excluded() == {"lse": "2", "reserved": "0", "system_qos": "3"}
    rig.cache.set_info("node_info", {"cpus": []})  # a new value: no CPUs known
    await rig.strategy.reconcile()
    assert "node_info" in rig.strategy.debug_state()["decision"]


async def test_restore_gives_be_every_cpu_but_reserved_and_system_qos(rig: Rig) -> None:
    # calcBECPUSet: all CPUs less LSE, reserved and exclusive SYSTEM QoS; a non-exclusive SYSTEM
    # QoS cpuset stays BE's
    rig.node = _annotated(
        **{
            "reservation": {"resources": {"cpu": "1"}},
            "system-qos-resource": {"cpuset": "2-3", "cpusetExclusive": False},
        }
    )
    rig.slo["enable"] = False
    rig.usage(node=0.4, ls=0.0, be=0.3)
    await rig.strategy.reconcile()
    # one CPU reserved by count: CPU 0, picked by topology
    assert rig.cpuset(rig.be_dir) == "1-3"


async def test_the_two_cpu_floor_is_explained_when_it_covers_every_usable_cpu(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    # 4 CPUs, two reserved: the cpuset policy cannot leave BE fewer than 2, which is all of them
    rig.node = _annotated(reservation={"reservedCPUs": "0-1"})
    rig.usage(node=3.9, ls=3.0, be=0.8)  # LS wants everything: BE would get nothing
    with caplog.at_level("INFO", logger="koordlet.qos.cpusuppress"):
        await rig.strategy.reconcile()
        rig.usage(node=3.9, ls=3.0, be=0.8, at=NOW + 1)
        await rig.strategy.reconcile()
    assert rig.cpuset(rig.be_dir) == "2-3"
    last = rig.strategy.debug_state()
    assert "2-CPU floor" in last["decision"]
    assert "cfsQuota" in last["decision"]
    assert last["floor"] == {
        "cpus": 2,
        "usable": 2,
        "wanted_milli": last["inputs"]["suppress_milli"],
    }
    report = rig.strategy._ctx.book.last_report("cpusuppress")
    assert report is not None
    assert "2-CPU floor" in report.decision
    floor_lines = [r for r in caplog.records if "2-CPU floor" in r.getMessage()]
    assert len(floor_lines) == 1  # said once, not every round


async def test_quota_steps_log_at_info_only_when_the_direction_turns(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.slo["cpuSuppressPolicy"] = "cfsQuota"
    steps = [(3.2, 0.5), (3.0, 0.3), (2.8, 0.2), (1.1, 0.0), (1.0, 0.0), (3.2, 0.5)]
    with caplog.at_level("DEBUG", logger="koordlet.qos.cpusuppress"):
        for i, (node, ls) in enumerate(steps):
            rig.usage(node=node, ls=ls, be=1.0, at=NOW + i)
            await rig.strategy.reconcile()
    info = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    debug = [r.getMessage() for r in caplog.records if r.levelname == "DEBUG"]
    # down (first), up (LS gone), down again: three turns at info, the rest at debug
    turns = [m for m in info if "suppressing BE" in m or "releasing BE" in m]
    assert [m.split(",")[0] for m in turns] == [
        "cpusuppress: suppressing BE",
        "cpusuppress: releasing BE",
        "cpusuppress: suppressing BE",
    ]
    assert any("cpu_cfs_quota" in m for m in debug)  # each write at debug
    assert not [m for m in caplog.records if "None" in m.getMessage()]
    assert "unlimited -> 2000 us" in turns[0]


async def test_restores_are_logged_when_they_change_a_file(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.slo["cpuSuppressPolicy"] = "cfsQuota"
    rig.usage(node=3.2, ls=0.5, be=1.0)
    await rig.strategy.reconcile()
    rig.slo["enable"] = False
    with caplog.at_level("INFO", logger="koordlet.qos.cpusuppress"):
        await rig.strategy.reconcile()
        await rig.strategy.reconcile()
    restored = [r.getMessage() for r in caplog.records if "restored" in r.getMessage()]
    assert restored == [
        "cpusuppress: BE cfs quota restored 2000 us -> unlimited (BE suppress disabled)"
    ]
    assert rig.quota(rig.be_dir) is None


async def test_a_be_pod_in_a_new_snapshot_gets_the_cpuset_and_an_unchanged_one_writes_nothing(
    rig: Rig,
) -> None:
    rig.usage(node=3.2, ls=0.5, be=1.0)
    await rig.strategy.reconcile()
    assert rig.cpuset(rig.be_container) == "0-1"
    rig.changes.clear()
    await rig.strategy.reconcile()  # the same snapshot object: the same cgroups, in place
    assert rig.changes == []

    cid = container_id("be2")
    pod, [container] = rig.fake.add_pod("be-2", KubeQOS.BESTEFFORT, [("containerd", cid)])
    for rel in (pod, container):
        rig.fake.write("cpuset", rel, "cpuset.cpus", rig.fake.all_cpus)
    be2 = PodInfo(
        "be-2",
        "be2",
        "default",
        QoSClass.BE,
        KubeQOS.BESTEFFORT,
        pod,
        (ContainerInfo(cid, "main", "containerd", container),),
    )
    rig.snapshot = WorkloadSnapshot(pods={**rig.snapshot.pods, be2.uid: be2}, generation=2)
    await rig.strategy.reconcile()
    assert rig.cpuset(pod) == rig.cpuset(container) == "0-1"
    assert rig.cpuset(rig.ls_pod) == rig.fake.all_cpus
