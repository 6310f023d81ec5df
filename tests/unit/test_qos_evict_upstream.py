"""Memory and CPU eviction against Koordinator's own test tables, ported as data.

Each case comes from ``pkg/koordlet/qosmanager/plugins/memoryevict/memory_evict_test.go``
(``Test_memoryEvict``, ``Test_generateConfigCheck``, ``Test_getPodEvictInfoAndSortByPriority``,
``Test_calculateReleaseByUsedThresholdPercent``,
``Test_calculateReleaseByAllocatableThresholdPercent``) or ``cpuevict/cpu_evict_test.go``
(``Test_cpuEvict``, ``Test_CPUEvict_calculateMilliReleaseByBESatisfaction``,
``Test_calculateReleaseByUsedThresholdPercent``,
``Test_calculateMilliReleaseByAllocatableThresholdPercent``,
``Test_isAllocatableThresholdConfigValid``, ``Test_isUsedThresholdConfigValid``),
koordinator-sh/koordinator at HEAD. Pods are built as the
upstream helpers build them (``createMemoryEvictTestPod``, ``mockBEPodForCPUEvict``...) and read
by the Kubernetes states source (``koordlet.statesinformer.kube.pod_info``), so the labels,
priorities and extended-resource requests take the same path as in a cluster.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from apis.extension import LABEL_POD_PRIORITY_CLASS
from koordlet.executor.audit import AuditLog
from koordlet.metriccache import series
from koordlet.metriccache.store import MetricCache
from koordlet.qos.cpuevict import CPUEvict
from koordlet.qos.cpuevictrules import (
    CPUEvictSettings,
    satisfaction_bounds,
    satisfaction_release,
)
from koordlet.qos.cpuevictrules import allocatable_thresholds as cpu_allocatable_thresholds
from koordlet.qos.cpuevictrules import order_be as cpu_order_be
from koordlet.qos.cpuevictrules import release_by_used as cpu_release_by_used
from koordlet.qos.cpuevictrules import used_thresholds as cpu_used_thresholds
from koordlet.qos.evictor import Evictor, Victim
from koordlet.qos.evicttask import (
    Candidate,
    allocatable_release,
    by_priority,
    priority_value_with_default,
    request_of,
)
from koordlet.qos.evicttask import Candidate as EvictCandidate
from koordlet.qos.framework import QoSBook, StrategyContext
from koordlet.qos.memoryevict import MemoryEvict
from koordlet.qos.memoryrules import (
    MemoryEvictSettings,
    allocatable_thresholds,
    priority_threshold,
    release_by_used,
    used_thresholds,
)
from koordlet.qos.shared import InvalidThreshold
from koordlet.statesinformer.kube import pod_info
from koordlet.statesinformer.model import PodInfo, WorkloadSnapshot
from koordlet.system.cgroups import CgroupDriver, CgroupLayout, CgroupVersion
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths
from tests.strategyrig import config, in_force

Gi = 1024**3
G = 10**9
PATHS = HostPaths("/nonexistent/cgroup", "/nonexistent/proc", "/nonexistent/sys")
LAYOUT = CgroupLayout(PATHS, CgroupVersion.V1, CgroupDriver.CGROUPFS, "kubepods")
EVICT = {"koordinator.sh/eviction-enabled": "true"}
BATCH_MEMORY = "kubernetes.io/batch-memory"
MID_MEMORY = "kubernetes.io/mid-memory"
BATCH_CPU = "kubernetes.io/batch-cpu"
MID_CPU = "kubernetes.io/mid-cpu"
PRIORITY_BATCH_MIN, PRIORITY_BATCH_MAX = 5000, 5999
PRIORITY_MID_MAX, PRIORITY_PROD_MAX = 7999, 9999


# Upstream's helpers ------------------------------------------------------------------------------


def uid_of(name: str) -> str:
    """Upstream's tests use the name as the UID; cgroup names need a UUID."""
    return str(uuid.uuid5(uuid.NAMESPACE_OID, name))


def upstream_pod(
    name: str,
    qos: str,
    priority: int,
    *,
    requests: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    """A pod as ``createMemoryEvictTestPod`` / ``mockPodForCPUEvictWithPriority`` build it: the
    QoS label, ``spec.priority``, one container (with the given requests as requests and limits),
    a running docker container status."""
    resources = {"requests": dict(requests), "limits": dict(requests)} if requests else {}
    return {
        "metadata": {
            "name": name,
            "namespace": "test-ns",
            "uid": uid_of(name),
            "labels": {"koordinator.sh/qosClass": qos, **(labels or {})},
        },
        "spec": {
            "priority": priority,
            "containers": [{"name": f"{name}_main", "resources": resources}],
        },
        "status": {
            "phase": phase,
            "containerStatuses": [{"name": f"{name}_main", "containerID": f"docker://{name}_main"}],
        },
    }


def info(obj: dict[str, Any]) -> PodInfo:
    return pod_info(obj, LAYOUT)


def mock_node(cpu: str, memory: str, extended: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``testutil.MockTestNode`` / ``MockTestNodeWithExtendResource``: the same capacity and
    allocatable."""
    resources = {"cpu": cpu, "memory": memory, **(extended or {})}
    return {
        "metadata": {"name": "test-node"},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


class Gates:
    def __init__(self, *on: str) -> None:
        self.on = set(on)

    def enabled(self, name: str) -> bool:
        return name in self.on


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Backend:
    name: str = "recording"
    evicted: list[str] = field(default_factory=list)

    async def evict(self, victim: Victim, *, reason: str, message: str) -> str:
        self.evicted.append(victim.name.split("/")[-1])
        return "ok"


def memory_strategy(
    gates: tuple[str, ...],
    node: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    node_used: float,
    pod_used: Mapping[str, float],
    threshold: Mapping[str, Any] | None,
) -> tuple[MemoryEvict, Backend]:
    clock = Clock()
    cache = MetricCache(clock=clock)
    samples = [series.Sample(series.SeriesKey(series.NODE_MEMORY_USAGE, series.NODE), node_used)]
    for uid, used in pod_used.items():
        key = series.SeriesKey(series.POD_MEMORY_USAGE, series.pod_entity(uid_of(uid)))
        samples.append(series.Sample(key, used))
    cache.append(clock.now, samples)
    infos = {p["metadata"]["uid"]: info(p) for p in pods if p["status"]["phase"] == "Running"}
    backend = Backend()
    evictor = Evictor(backend, audit=AuditLog(None, clock=clock), clock=clock, max_per_round=20)
    slo = {} if threshold is None else {"resourceUsedThresholdWithBE": dict(threshold)}
    ctx = StrategyContext(
        host=lambda: Host(PATHS, LAYOUT),
        config=config(Gates(*gates)),
        cache=cache,
        executor=None,  # type: ignore[arg-type]  # eviction writes no cgroup file
        workloads=lambda: WorkloadSnapshot(pods=infos),
        node_slo=lambda: in_force(**slo),
        node=lambda: node,
        evictor=evictor,
        book=QoSBook(clock=clock),
    )
    return MemoryEvict(ctx, clock=clock), backend


# Memory: Test_memoryEvict ------------------------------------------------------------------------


def _memory_pods() -> list[dict[str, Any]]:
    return [
        upstream_pod("test_lsr_pod", "LSR", 1000),
        upstream_pod("test_ls_pod", "LS", 500),
        upstream_pod("test_noqos_pod", "", 100),
        upstream_pod("test_be_pod_priority100_1", "BE", 100),
        upstream_pod("test_be_pod_priority100_2", "BE", 100),
        upstream_pod("test_be_pod_priority120", "BE", 120),
    ]


MEMORY_USED = {
    "test_lsr_pod": 40 * G,
    "test_ls_pod": 30 * G,
    "test_noqos_pod": 10 * G,
    "test_be_pod_priority100_1": 5 * G,
    "test_be_pod_priority100_2": 20 * G,
    "test_be_pod_priority120": 10 * G,
}


def _batch_pod(name: str, gib: int) -> dict[str, Any]:
    amount = gib * Gi
    return upstream_pod(
        name,
        "BE",
        PRIORITY_BATCH_MIN,
        requests={"memory": amount, BATCH_MEMORY: amount},
        labels=EVICT,
    )


BE_ALL = {"test_be_pod_priority100_2", "test_be_pod_priority100_1", "test_be_pod_priority120"}
NOT_BE = {"test_lsr_pod", "test_ls_pod", "test_noqos_pod"}

MEMORY_CASES: list[tuple[Any, ...]] = [
    ("no thresholdConfig", (), None, [], 0, {}, None, set(), set()),
    (
        "threshold not valid",
        ("BEMemoryEvict",),
        mock_node("80", "120G"),
        _memory_pods(),
        115 * G,
        MEMORY_USED,
        {"enable": True, "memoryEvictThresholdPercent": -1},
        set(),
        BE_ALL,
    ),
    (
        "node nil",
        ("BEMemoryEvict",),
        None,
        _memory_pods(),
        115 * G,
        MEMORY_USED,
        {"enable": True, "memoryEvictThresholdPercent": 80},
        set(),
        BE_ALL,
    ),
    (
        "node memory capacity invalid",
        ("BEMemoryEvict",),
        mock_node("80", "0"),
        _memory_pods(),
        115 * G,
        MEMORY_USED,
        {"enable": True, "memoryEvictThresholdPercent": 80},
        set(),
        BE_ALL,
    ),
    (
        "memory under evict line",
        ("BEMemoryEvict",),
        mock_node("80", "120G"),
        _memory_pods(),
        80 * G,
        MEMORY_USED,
        {"enable": True, "memoryEvictThresholdPercent": 80},
        set(),
        BE_ALL | NOT_BE,
    ),
    (
        "only BEMemoryEvict: sort by priority and usage, 82",
        ("BEMemoryEvict",),
        mock_node("80", "120G"),
        _memory_pods(),
        115 * G,
        MEMORY_USED,
        {"enable": True, "memoryEvictThresholdPercent": 82},
        {"test_be_pod_priority100_2"},
        NOT_BE | {"test_be_pod_priority100_1", "test_be_pod_priority120"},
    ),
    (
        "only BEMemoryEvict: 80",
        ("BEMemoryEvict",),
        mock_node("80", "120G"),
        _memory_pods(),
        115 * G,
        MEMORY_USED,
        {"enable": True, "memoryEvictThresholdPercent": 80},
        {"test_be_pod_priority100_2", "test_be_pod_priority100_1"},
        NOT_BE | {"test_be_pod_priority120"},
    ),
    (
        "only BEMemoryEvict: 50",
        ("BEMemoryEvict",),
        mock_node("80", "120G"),
        _memory_pods(),
        115 * G,
        MEMORY_USED,
        {"enable": True, "memoryEvictThresholdPercent": 50},
        BE_ALL,
        NOT_BE,
    ),
    (
        "only BEMemoryEvict: lower 80",
        ("BEMemoryEvict",),
        mock_node("80", "120G"),
        _memory_pods(),
        115 * G,
        MEMORY_USED,
        {"enable": True, "memoryEvictThresholdPercent": 82, "memoryEvictLowerPercent": 80},
        {"test_be_pod_priority100_2"},
        NOT_BE | {"test_be_pod_priority100_1", "test_be_pod_priority120"},
    ),
    (
        "only BEMemoryEvict: lower 78",
        ("BEMemoryEvict",),
        mock_node("80", "120G"),
        _memory_pods(),
        115 * G,
        MEMORY_USED,
        {"enable": True, "memoryEvictThresholdPercent": 82, "memoryEvictLowerPercent": 78},
        {"test_be_pod_priority100_2", "test_be_pod_priority100_1"},
        NOT_BE | {"test_be_pod_priority120"},
    ),
    (
        "only BEMemoryEvict: lower 74",
        ("BEMemoryEvict",),
        mock_node("80", "120G"),
        _memory_pods(),
        115 * G,
        MEMORY_USED,
        {"enable": True, "memoryEvictThresholdPercent": 82, "memoryEvictLowerPercent": 74},
        BE_ALL,
        NOT_BE,
    ),
    (
        "only MemoryAllocatableEvict: 80/70",
        ("MemoryAllocatableEvict",),
        mock_node("80", "120G"),
        [_batch_pod("batch-pod-1", 20), _batch_pod("batch-pod-2", 30)],
        115 * G,
        {"batch-pod-1": 10 * G, "batch-pod-2": 20 * G},
        {
            "enable": True,
            "memoryAllocatableEvictThresholdPercent": 80,
            "memoryAllocatableEvictLowerPercent": 70,
            "allocatableEvictPriorityThreshold": PRIORITY_BATCH_MIN,
        },
        {"batch-pod-1", "batch-pod-2"},
        set(),
    ),
    (
        "BEMemoryEvict ok, MemoryEvict invalid configuration",
        ("BEMemoryEvict", "MemoryEvict"),
        mock_node("80", "120G"),
        _memory_pods(),
        115 * G,
        MEMORY_USED,
        {"enable": True, "memoryEvictThresholdPercent": 82, "memoryEvictLowerPercent": 74},
        BE_ALL,
        NOT_BE,
    ),
    (
        "BEMemoryEvict/MemoryEvict ok",
        ("BEMemoryEvict", "MemoryEvict"),
        mock_node("80", "120G"),
        _memory_pods(),
        115 * G,
        MEMORY_USED,
        {
            "enable": True,
            "memoryEvictThresholdPercent": 82,
            "memoryEvictLowerPercent": 74,
            "evictEnabledPriorityThreshold": 3000,
        },
        BE_ALL,
        NOT_BE,
    ),
    (
        "BEMemoryEvict/MemoryEvict ok, MemoryAllocatableEvict invalid configuration",
        ("BEMemoryEvict", "MemoryEvict", "MemoryAllocatableEvict"),
        mock_node("80", "120G"),
        _memory_pods(),
        115 * G,
        MEMORY_USED,
        {
            "enable": True,
            "memoryEvictThresholdPercent": 82,
            "memoryEvictLowerPercent": 74,
            "evictEnabledPriorityThreshold": 3000,
        },
        BE_ALL,
        NOT_BE,
    ),
    (
        "the three tasks, batch requests over the allocatable",
        ("BEMemoryEvict", "MemoryEvict", "MemoryAllocatableEvict"),
        mock_node("80", "120G", {BATCH_MEMORY: str(100 * Gi)}),
        [*_memory_pods(), _batch_pod("batch-pod-1", 20), _batch_pod("batch-pod-2", 30)],
        115 * G,
        {**MEMORY_USED, "batch-pod-1": 10 * G, "batch-pod-2": 20 * G},
        {
            "enable": True,
            "memoryEvictThresholdPercent": 82,
            "memoryEvictLowerPercent": 74,
            "evictEnabledPriorityThreshold": 3000,
            "memoryAllocatableEvictThresholdPercent": 45,
            "memoryAllocatableEvictLowerPercent": 40,
            "allocatableEvictPriorityThreshold": PRIORITY_BATCH_MIN,
        },
        BE_ALL | {"batch-pod-2"},
        NOT_BE | {"batch-pod-1"},
    ),
]


@pytest.mark.parametrize(
    ("name", "gates", "node", "pods", "node_used", "pod_used", "threshold", "evicted", "kept"),
    MEMORY_CASES,
    ids=[c[0] for c in MEMORY_CASES],
)
async def test_memory_evict_as_upstream(
    name: str,
    gates: tuple[str, ...],
    node: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    node_used: float,
    pod_used: dict[str, float],
    threshold: dict[str, Any] | None,
    evicted: set[str],
    kept: set[str],
) -> None:
    strategy, backend = memory_strategy(gates, node, pods, node_used, pod_used, threshold)
    await strategy.reconcile()
    assert set(backend.evicted) == evicted, name
    assert not set(backend.evicted) & kept


async def test_memory_capacity_is_the_nodes_not_the_numa_sum() -> None:
    # 24 GiB on the Node; the NUMA totals (9.08 GB) must not matter
    strategy, backend = memory_strategy(
        ("BEMemoryEvict",),
        mock_node("8", "24Gi"),
        [upstream_pod("be", "BE", 100)],
        int(8 * Gi),
        {"be": 2 * Gi},
        {"enable": True, "memoryEvictThresholdPercent": 70},
    )
    strategy.ctx.cache.append(
        strategy.ctx.now(),
        [series.Sample(series.SeriesKey(series.NUMA_MEMORY_TOTAL, "numa/0"), 9.08 * G)],
    )
    await strategy.reconcile()
    assert backend.evicted == []  # 8 GiB of 24 GiB is 33%
    report = strategy.ctx.book.describe("memoryevict")["last_round"]
    assert report["inputs"]["capacity"] == 24 * Gi
    assert report["inputs"]["capacity_source"] == "Node status.capacity.memory"


# Memory: the smaller tables ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "fields", "error"),
    [
        ("used", {"memoryEvictThresholdPercent": None}, "threshold percent is nil"),
        (
            "used",
            {"memoryEvictThresholdPercent": -1},
            "threshold percent(-1) should equal or greater than 0",
        ),
        ("used", {"memoryEvictThresholdPercent": 80, "memoryEvictLowerPercent": None}, None),
        (
            "used",
            {"memoryEvictThresholdPercent": 80, "memoryEvictLowerPercent": 90},
            "lower percent(90) should less than threshold percent(80)",
        ),
        ("used", {"memoryEvictThresholdPercent": 80, "memoryEvictLowerPercent": 70}, None),
        (
            "priority",
            {"memoryEvictThresholdPercent": 80, "memoryEvictLowerPercent": 70},
            "EvictEnabledPriorityThreshold not config",
        ),
        (
            "used",
            {"memoryEvictThresholdPercent": 80, "memoryEvictLowerPercent": 80},
            "lower percent(80) should less than threshold percent(80)",
        ),
        ("allocatable", {}, "MemoryAllocatableEvictThresholdPercent not config"),
        (
            "allocatable",
            {"memoryAllocatableEvictThresholdPercent": -1},
            "threshold percent(-1) should greater than 0",
        ),
        (
            "allocatable",
            {
                "memoryAllocatableEvictThresholdPercent": 80,
                "memoryAllocatableEvictLowerPercent": 70,
            },
            "AllocatableEvictPriorityThreshold not config",
        ),
        (
            "allocatable",
            {
                "memoryAllocatableEvictThresholdPercent": 80,
                "memoryAllocatableEvictLowerPercent": 70,
                "allocatableEvictPriorityThreshold": PRIORITY_MID_MAX + 1,
            },
            "priorityThresholdPercent(8000) should less than 7999, koor-prod pods should not be "
            "killed",
        ),
        (
            "allocatable",
            {
                "memoryAllocatableEvictThresholdPercent": 85,
                "memoryAllocatableEvictLowerPercent": 75,
                "allocatableEvictPriorityThreshold": PRIORITY_BATCH_MAX,
            },
            None,
        ),
        # ours: upstream's task dereferences a missing lower percent, so it is refused here
        (
            "allocatable",
            {
                "memoryAllocatableEvictThresholdPercent": 85,
                "allocatableEvictPriorityThreshold": PRIORITY_BATCH_MAX,
            },
            "MemoryAllocatableEvictLowerPercent not config",
        ),
    ],
)
def test_memory_config_checks_as_upstream(
    check: str, fields: dict[str, Any], error: str | None
) -> None:
    # upstream's nil fields are None here (the typed model gives the threshold its default 70
    # when a NodeSLO leaves it out, so the checks are called with the raw values)
    s = MemoryEvictSettings(
        enabled=True,
        threshold=fields.get("memoryEvictThresholdPercent"),
        lower=fields.get("memoryEvictLowerPercent"),
        evict_enabled_priority_threshold=fields.get("evictEnabledPriorityThreshold"),
        allocatable_threshold=fields.get("memoryAllocatableEvictThresholdPercent"),
        allocatable_lower=fields.get("memoryAllocatableEvictLowerPercent"),
        allocatable_priority_threshold=fields.get("allocatableEvictPriorityThreshold"),
    )
    run = {
        "used": lambda: used_thresholds(s.threshold, s.lower),
        "priority": lambda: (used_thresholds(s.threshold, s.lower), priority_threshold(s)),
        "allocatable": lambda: allocatable_thresholds(s),
    }[check]
    if error is None:
        run()
    else:
        with pytest.raises(InvalidThreshold) as caught:
            run()
        assert str(caught.value) == error


def test_memory_priority_order_as_upstream() -> None:
    # Test_getPodEvictInfoAndSortByPriority: a failed pod, a pod not opted in and one above the
    # priority threshold are left out; the rest by priority, koordinator.sh/priority, usage
    def labelled(
        name: str, qos: str, prio: int, extra: dict[str, str], phase: str = "Running"
    ) -> dict[str, Any]:
        return upstream_pod(name, qos, prio, labels=extra, phase=phase)

    pods = [
        labelled(
            "test_failed_pod", "LSR", 1000, {**EVICT, "koordinator.sh/priority": "1000"}, "Failed"
        ),
        labelled(
            "test_evictDisabled_pod",
            "LSR",
            1000,
            {"koordinator.sh/eviction-enabled": "false", "koordinator.sh/priority": "1000"},
        ),
        labelled("test_higher_priority", "LS", 3400, {**EVICT, "koordinator.sh/priority": "1000"}),
        labelled(
            "test_podPriority_120_2000", "", 120, {**EVICT, "koordinator.sh/priority": "2000"}
        ),
        labelled(
            "test_podPriority_120_3000", "BE", 120, {**EVICT, "koordinator.sh/priority": "3000"}
        ),
        labelled(
            "test_podPriority_120_4000", "BE", 120, {**EVICT, "koordinator.sh/priority": "4000"}
        ),
        labelled("test_podPriority_100_9999", "BE", 100, EVICT),
        labelled("test_podPriority_100_9999_1", "BE", 100, EVICT),
    ]
    used = {
        "test_evictDisabled_pod": 40 * G,
        "test_higher_priority": 30 * G,
        "test_podPriority_120_2000": 10 * G,
        "test_podPriority_120_3000": 5 * G,
        "test_podPriority_120_4000": 20 * G,
        "test_podPriority_100_9999": 10 * G,
        "test_podPriority_100_9999_1": 11 * G,
    }
    running = [info(p) for p in pods if p["status"]["phase"] == "Running"]
    ordered = by_priority(
        running,
        "BEMemoryEvict",
        3000,
        lambda p: Candidate(p, int(used[p.name])) if p.name in used else None,
        "used",
    )
    assert [c.pod.name for c in ordered] == [
        "test_podPriority_100_9999_1",
        "test_podPriority_100_9999",
        "test_podPriority_120_2000",
        "test_podPriority_120_3000",
        "test_podPriority_120_4000",
    ]


@pytest.mark.parametrize(
    ("threshold", "lower", "used", "expected"),
    [(80, None, 115 * G, 20_400_000_000), (80, 80, 115 * G, 18_000_000_000), (80, 80, 80 * G, 0)],
)
def test_memory_release_by_used_as_upstream(
    threshold: int, lower: int | None, used: int, expected: int
) -> None:
    # calculateReleaseByUsedThresholdPercent alone (the config check is a step of its own)
    low = threshold - 2 if lower is None else lower
    assert release_by_used(used, 120 * G, threshold, low) == expected


@pytest.mark.parametrize(
    ("allocatable", "requested", "prio_max", "release"),
    [
        # not exceeded: 50 of 100 GiB
        ({BATCH_MEMORY: 100 * Gi}, {BATCH_MEMORY: 50 * Gi}, PRIORITY_BATCH_MAX, {}),
        # 85 of 100 GiB over 80%: down to 70%, in float32 as upstream computes it
        # (memory_evict.go, rqValue/sumValue as float32): 16106131456, the value upstream's
        # Test_calculateReleaseByAllocatableThresholdPercent expects ("allocatable threshold
        # exceeded - batch memory"); float64 would give 16106127360
        (
            {BATCH_MEMORY: 100 * Gi},
            {BATCH_MEMORY: 85 * Gi},
            PRIORITY_BATCH_MAX,
            {BATCH_MEMORY: 16106131456},
        ),
        # batch and mid apart
        (
            {BATCH_MEMORY: 100 * Gi, MID_MEMORY: 100 * Gi},
            {BATCH_MEMORY: 85 * Gi, MID_MEMORY: 85 * Gi},
            PRIORITY_MID_MAX,
            {BATCH_MEMORY: 16106131456, MID_MEMORY: 16106131456},
        ),
    ],
)
def test_memory_allocatable_release_as_upstream(
    allocatable: dict[str, int], requested: dict[str, int], prio_max: int, release: dict[str, int]
) -> None:
    assert allocatable_release(requested, allocatable, 80, 70) == release


def test_requests_follow_the_priority_class() -> None:
    batch = info(_batch_pod("b", 20))
    mid = info(upstream_pod("m", "LS", 7000, requests={"memory": Gi, MID_MEMORY: 2 * Gi}))
    prod = info(upstream_pod("p", "LS", 9500, requests={"memory": 3 * Gi}))
    be_unbanded = info(upstream_pod("u", "BE", 100, requests={BATCH_CPU: "85000"}))
    assert request_of(batch, "memory") == (BATCH_MEMORY, 20 * Gi)
    assert request_of(mid, "memory") == (MID_MEMORY, 2 * Gi)
    assert request_of(prod, "memory") == ("memory", 3 * Gi)
    # priority 100 is in no band: the BE QoS makes it koord-batch
    assert request_of(be_unbanded, "cpu") == (BATCH_CPU, 85000)
    assert priority_value_with_default(info(upstream_pod("z", "BE", 0))) == 5500
    assert priority_value_with_default(info(upstream_pod("z", "LS", 0))) == 9500


def test_the_priority_class_label_comes_first_as_upstreams_with_default_rule() -> None:
    """GetRequestTypeAndValueFromPod and GetPodPriorityValueWithDefault take
    GetPodPriorityClassWithDefault (apis/extension/priority.go): the koordinator.sh/priority-class
    label, then spec.priority's band, then the QoS class. A band-only rule would take this
    koord-mid LS pod for koord-prod and count its cpu request, not its mid-cpu."""
    label = {LABEL_POD_PRIORITY_CLASS: "koord-mid"}
    requests = {"cpu": "2", MID_CPU: "3000", MID_MEMORY: 2 * Gi}
    mid = info(upstream_pod("m", "LS", 0, labels=label, requests=requests))
    assert request_of(mid, "cpu") == (MID_CPU, 3000)
    assert request_of(mid, "memory") == (MID_MEMORY, 2 * Gi)
    assert priority_value_with_default(mid) == 7500
    # the label wins over the band of spec.priority too; an unknown label value gives no class
    # (then the QoS default), as GetPodPriorityClassRaw
    batch = info(upstream_pod("b", "LS", 9500, labels={LABEL_POD_PRIORITY_CLASS: "koord-batch"},
                              requests={BATCH_CPU: "1000"}))  # fmt: skip
    assert request_of(batch, "cpu") == (BATCH_CPU, 1000)
    odd = info(upstream_pod("o", "BE", 0, labels={LABEL_POD_PRIORITY_CLASS: "gold"},
                            requests={BATCH_CPU: "500"}))  # fmt: skip
    assert request_of(odd, "cpu") == (BATCH_CPU, 500)


# CPU ----------------------------------------------------------------------------------------


def cpu_strategy(
    gates: tuple[str, ...],
    node: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    node_used: float,
    pod_used: Mapping[str, float],
    threshold: Mapping[str, Any] | None,
) -> tuple[CPUEvict, Backend]:
    clock = Clock()
    cache = MetricCache(clock=clock)
    for i in range(3):  # the window (twice the interval) holds the node's usage
        samples = [series.Sample(series.SeriesKey(series.NODE_CPU_USAGE, series.NODE), node_used)]
        for name, used in pod_used.items():
            key = series.SeriesKey(series.POD_CPU_USAGE, series.pod_entity(uid_of(name)))
            samples.append(series.Sample(key, used))
        cache.append(clock.now + i, samples)
    clock.now += 2
    infos = {p["metadata"]["uid"]: info(p) for p in pods if p["status"]["phase"] == "Running"}
    backend = Backend()
    evictor = Evictor(backend, audit=AuditLog(None, clock=clock), clock=clock, max_per_round=20)
    slo = {} if threshold is None else {"resourceUsedThresholdWithBE": dict(threshold)}
    ctx = StrategyContext(
        host=lambda: Host(PATHS, LAYOUT),
        config=config(Gates(*gates)),
        cache=cache,
        executor=None,  # type: ignore[arg-type]  # eviction writes no cgroup file
        workloads=lambda: WorkloadSnapshot(pods=infos),
        node_slo=lambda: in_force(**slo),
        node=lambda: node,
        evictor=evictor,
        book=QoSBook(clock=clock),
    )
    strategy = CPUEvict(ctx, clock=clock)
    strategy._last_evict -= strategy.cool_time  # as upstream's test: lastEvictTime = now - 30s
    return strategy, backend


def _cpu_labelled(name: str, qos: str, prio: int, labels: dict[str, str], phase: str = "Running"):
    return upstream_pod(name, qos, prio, labels=labels, phase=phase)


def _cpu_pods() -> list[dict[str, Any]]:
    return [
        _cpu_labelled(
            "test_failed_pod", "LSR", 1000, {**EVICT, "koordinator.sh/priority": "1000"}, "Failed"
        ),
        _cpu_labelled("test_evictDisabled_pod", "LSR", 1000, {"koordinator.sh/priority": "1000"}),
        _cpu_labelled(
            "test_higher_priority", "LS", 3400, {**EVICT, "koordinator.sh/priority": "1000"}
        ),
        _cpu_labelled(
            "test_podPriority_120_2000", "", 120, {**EVICT, "koordinator.sh/priority": "2000"}
        ),
        _cpu_labelled(
            "test_podPriority_120_3000", "BE", 120, {**EVICT, "koordinator.sh/priority": "3000"}
        ),
        _cpu_labelled(
            "test_podPriority_120_4000", "BE", 120, {**EVICT, "koordinator.sh/priority": "4000"}
        ),
        _cpu_labelled("test_podPriority_100_9999", "BE", 100, EVICT),
        _cpu_labelled("test_podPriority_100_9999_1", "BE", 100, EVICT),
    ]


def _batch_cpu_pod() -> dict[str, Any]:  # mockBEPodForCPUEvictWithAnnotationsLabels
    return upstream_pod("batch-pod-1", "BE", 100, requests={BATCH_CPU: "85000"}, labels=EVICT)


def _mid_cpu_pod() -> dict[str, Any]:
    return upstream_pod(
        "mid-pod-1", "LS", 7000, requests={"cpu": "85", MID_CPU: "85000"}, labels=EVICT
    )


CPU_USED = {
    "test_evictDisabled_pod": 4,
    "test_higher_priority": 3,
    "test_podPriority_120_2000": 1,
    "test_podPriority_120_3000": 5,
    "test_podPriority_120_4000": 2,
    "test_podPriority_100_9999": 1,
    "test_podPriority_100_9999_1": 2,
    "batch-pod-1": 4,
    "mid-pod-1": 3,
}
CPU_EVICT = {
    "enable": True,
    "cpuEvictThresholdPercent": 78,
    "evictEnabledPriorityThreshold": 3000,
}
CPU_ALLOCATABLE = {
    "enable": True,
    "cpuAllocatableEvictThresholdPercent": 80,
    "cpuAllocatableEvictLowerPercent": 70,
    "allocatableEvictPriorityThreshold": 7999,
}
BY_USAGE = {
    "test_podPriority_120_2000",
    "test_podPriority_120_3000",
    "test_podPriority_100_9999",
    "test_podPriority_100_9999_1",
}
EVERY_OPTED_IN = BY_USAGE | {
    "test_higher_priority",
    "test_podPriority_120_4000",
    "batch-pod-1",
    "mid-pod-1",
}
EXTENDED = {BATCH_CPU: "100000", MID_CPU: "100000"}

CPU_CASES: list[tuple[Any, ...]] = [
    (
        "invalid nodeCapacity",
        ("CPUEvict",),
        mock_node("0", "120G"),
        _cpu_pods(),
        CPU_EVICT,
        set(),
        set(),
    ),
    (
        "no thresholdConfig",
        ("CPUEvict",),
        mock_node("100", "120G"),
        _cpu_pods(),
        None,
        set(),
        set(),
    ),
    (
        "disable",
        ("CPUEvict",),
        mock_node("100", "120G"),
        _cpu_pods(),
        {"enable": False},
        set(),
        set(),
    ),
    # 81% used of 100 CPUs, threshold 78 (lower 76): release 5 cores, by priority then usage
    (
        "only feature: CPUEvict",
        ("CPUEvict",),
        mock_node("100", "120G"),
        _cpu_pods(),
        CPU_EVICT,
        BY_USAGE,
        {"test_evictDisabled_pod", "test_higher_priority", "test_podPriority_120_4000"},
    ),
    (
        "only feature: CPUAllocatableEvict",
        ("CPUAllocatableEvict",),
        mock_node("100", "120G", EXTENDED),
        [_batch_cpu_pod(), _mid_cpu_pod()],
        CPU_ALLOCATABLE,
        {"batch-pod-1", "mid-pod-1"},
        set(),
    ),
    (
        "CPUEvict ok, BECPUEvict invalid configuration",
        ("CPUEvict", "BECPUEvict"),
        mock_node("100", "120G"),
        _cpu_pods(),
        CPU_EVICT,
        BY_USAGE,
        {"test_evictDisabled_pod"},
    ),
    (
        "CPUAllocatableEvict ok, BECPUEvict invalid configuration",
        ("CPUAllocatableEvict", "BECPUEvict"),
        mock_node("100", "120G"),
        [*_cpu_pods(), _batch_cpu_pod(), _mid_cpu_pod()],
        {**CPU_ALLOCATABLE, **CPU_EVICT},
        {"batch-pod-1", "mid-pod-1"},
        {"test_evictDisabled_pod"},
    ),
    # no batch-cpu on the Node: every request is released, so every opted-in pod goes
    (
        "CPUEvict/CPUAllocatableEvict ok",
        ("CPUAllocatableEvict", "CPUEvict"),
        mock_node("100", "120G"),
        [*_cpu_pods(), _batch_cpu_pod(), _mid_cpu_pod()],
        {**CPU_ALLOCATABLE, **CPU_EVICT},
        EVERY_OPTED_IN,
        {"test_evictDisabled_pod"},
    ),
]


@pytest.mark.parametrize(
    ("name", "gates", "node", "pods", "threshold", "evicted", "kept"),
    CPU_CASES,
    ids=[c[0] for c in CPU_CASES],
)
async def test_cpu_evict_as_upstream(
    name: str,
    gates: tuple[str, ...],
    node: dict[str, Any],
    pods: list[dict[str, Any]],
    threshold: dict[str, Any] | None,
    evicted: set[str],
    kept: set[str],
) -> None:
    strategy, backend = cpu_strategy(gates, node, pods, 81.0, CPU_USED, threshold)
    await strategy.reconcile()
    assert evicted <= set(backend.evicted), name
    assert not set(backend.evicted) & kept
    if not evicted:
        assert backend.evicted == []


@pytest.mark.parametrize(
    ("used", "threshold", "lower", "expected"),
    [(81, 80, None, 3000), (81, 80, 80, 1000), (11, 80, 80, 0)],
)
def test_cpu_release_by_used_as_upstream(
    used: float, threshold: int, lower: int | None, expected: int
) -> None:
    low = threshold - 2 if lower is None else lower
    assert cpu_release_by_used(used, 100_000, threshold, low) == expected


@pytest.mark.parametrize(
    ("allocatable", "requested", "threshold", "lower", "release"),
    [
        ({BATCH_CPU: 100}, {BATCH_CPU: 0}, 80, 70, {}),
        ({BATCH_CPU: 100_000}, {BATCH_CPU: 85_000}, 80, 70, {BATCH_CPU: 15_000}),
        (
            {BATCH_CPU: 100_000, MID_CPU: 100_000},
            {BATCH_CPU: 85_000, MID_CPU: 85_000},
            80,
            70,
            {BATCH_CPU: 15_000, MID_CPU: 15_000},
        ),
        ({BATCH_CPU: 100_000}, {BATCH_CPU: 85_000}, 0, 0, {BATCH_CPU: 85_000}),
        ({}, {BATCH_CPU: 85_000}, 80, 70, {BATCH_CPU: 85_000}),  # no batch-cpu on the Node
    ],
)
def test_cpu_allocatable_release_as_upstream(
    allocatable: dict[str, int],
    requested: dict[str, int],
    threshold: int,
    lower: int,
    release: dict[str, int],
) -> None:
    assert allocatable_release(requested, allocatable, threshold, lower) == release


def test_cpu_allocatable_release_counts_only_batch_and_mid_pods() -> None:
    # the mixed-priority case with the priority threshold at batch's max: only batch-pod-1's
    # batch-cpu is requested under it; mid-pod-1 (7000) is above
    pods = [info(_batch_cpu_pod()), info(_mid_cpu_pod())]
    requested: dict[str, int] = {}
    for p in pods:
        if priority_value_with_default(p) <= PRIORITY_BATCH_MAX:
            name, value = request_of(p, "cpu")
            requested[name] = requested.get(name, 0) + value
    assert requested == {BATCH_CPU: 85_000}


SAT_CFG = (30, 40, None)  # lower, upper, usage threshold (default 90)
SAT_CFG_50 = (30, 40, 50)


@pytest.mark.parametrize(
    ("cfg", "avg", "current", "expected"),
    [
        # (usage, request, limit) in milli-cores, from Test_CPUEvict_calculateMilliReleaseBy...
        (SAT_CFG, (20_000, 0, 0), (0, 0, 0), 0),  # real limit zero
        (SAT_CFG, (10_000, 0, 20_000), (0, 0, 0), 0),  # usage not enough
        (SAT_CFG, (19_000, 0, 20_000), (0, 0, 0), 0),  # request zero
        (SAT_CFG, (19_000, 40_000, 20_000), (0, 0, 0), 0),  # satisfaction enough
        (SAT_CFG, (9_500, 50_000, 10_000), (0, 0, 0), 0),  # current invalid
        (SAT_CFG, (9_500, 50_000, 10_000), (5_000, 50_000, 10_000), 0),  # current usage low
        (SAT_CFG, (9_500, 50_000, 10_000), (13_000, 50_000, 14_000), 6_000),  # avg > current
        (SAT_CFG, (12_000, 50_000, 13_000), (10_000, 50_000, 11_000), 7_000),  # avg < current
        (SAT_CFG_50, (9_000, 0, 20_000), (0, 0, 0), 0),
        (SAT_CFG_50, (6_000, 50_000, 10_000), (4_000, 50_000, 10_000), 0),
        (SAT_CFG_50, (6_000, 50_000, 10_000), (8_000, 50_000, 14_000), 6_000),
        # evictByAllocatable: the limit is the Node's batch-cpu allocatable (8000; 0 counts 1)
        (SAT_CFG_50, (6_000, 50_000, 8_000), (4_000, 50_000, 8_000), 12_000),
        (SAT_CFG_50, (6_000, 50_000, 1), (4_000, 50_000, 1), 20_000 - 1),
    ],
)
def test_be_satisfaction_release_as_upstream(
    cfg: tuple[int, int, int | None],
    avg: tuple[float, float, float],
    current: tuple[float, float, float],
    expected: int,
) -> None:
    lower, upper, usage = cfg
    assert satisfaction_release(avg, current, lower, upper, usage) == expected


def _cpu_settings(**fields: Any) -> CPUEvictSettings:
    return CPUEvictSettings(
        enabled=True,
        satisfaction_lower=fields.get("lower_sat"),
        satisfaction_upper=fields.get("upper_sat"),
        be_usage_threshold=None,
        threshold=fields.get("threshold"),
        lower=fields.get("lower"),
        window=None,
        by_allocatable=False,
        evict_enabled_priority_threshold=fields.get("prio"),
        allocatable_threshold=fields.get("alloc"),
        allocatable_lower=fields.get("alloc_lower"),
        allocatable_priority_threshold=fields.get("alloc_prio"),
    )


@pytest.mark.parametrize(
    ("check", "fields", "error"),
    [
        (
            "satisfaction",
            {},
            "CPUEvictBESatisfactionLowerPercent or CPUEvictBESatisfactionUpperPercent not config",
        ),
        (
            "satisfaction",
            {"lower_sat": 0, "upper_sat": 50},
            "CPUEvictBESatisfactionLowerPercent(0) is not valid! must (0,60]",
        ),
        (
            "satisfaction",
            {"lower_sat": 30, "upper_sat": 100},
            "CPUEvictBESatisfactionUpperPercent(100) is not valid,must (0,100)",
        ),
        (
            "satisfaction",
            {"lower_sat": 40, "upper_sat": 30},
            "CPUEvictBESatisfactionUpperPercent(30) < CPUEvictBESatisfactionLowerPercent(40)",
        ),
        ("satisfaction", {"lower_sat": 30, "upper_sat": 40}, None),
        ("used", {}, "CPUEvictThresholdPercent not config"),
        ("used", {"threshold": -1}, "threshold percent(-1) should greater than 0"),
        ("used", {"threshold": 20, "prio": 0}, None),
        (
            "used",
            {"threshold": 20, "lower": 30},
            "lower percent(30) should less than threshold percent(20)",
        ),
        ("used", {"threshold": 20, "lower": 10}, "EvictEnabledPriorityThreshold not config"),
        ("used", {"threshold": 20, "lower": 10, "prio": 0}, None),
        ("allocatable", {}, "CPUAllocatableEvictThresholdPercent not config"),
        ("allocatable", {"alloc": -1}, "threshold percent(-1) should equal or greater than 0"),
        # ours: upstream's check table passes a missing lower percent ("CPUAllocatableEvict
        # LowerPercent == nil" in cpu_evict_test.go's Test_isAllocatableThresholdConfigValid);
        # as 0 it would release every request above the threshold, so it is refused as the
        # memory one is
        (
            "allocatable",
            {"alloc": 80, "alloc_prio": PRIORITY_BATCH_MAX},
            "CPUAllocatableEvictLowerPercent not config",
        ),
        (
            "allocatable",
            {"alloc": 80, "alloc_lower": 90},
            "lower percent(90) should less than threshold percent(80)",
        ),
        (
            "allocatable",
            {"alloc": 80, "alloc_lower": 80},
            "lower percent(80) should less than threshold percent(80)",
        ),
        (
            "allocatable",
            {"alloc": 80, "alloc_lower": 70},
            "AllocatableEvictPriorityThreshold not config",
        ),
        (
            "allocatable",
            {"alloc": 90, "alloc_lower": 0, "alloc_prio": PRIORITY_PROD_MAX},
            "priorityThresholdPercent(9999) should less than 7999, koor-prod pods should not be "
            "killed",
        ),
        ("allocatable", {"alloc": 80, "alloc_lower": 70, "alloc_prio": 7500}, None),
        ("allocatable", {"alloc": 85, "alloc_lower": 75, "alloc_prio": PRIORITY_MID_MAX}, None),
    ],
)
def test_cpu_config_checks_as_upstream(
    check: str, fields: dict[str, Any], error: str | None
) -> None:
    s = _cpu_settings(**fields)
    run = {
        "satisfaction": lambda: satisfaction_bounds(s.satisfaction_lower, s.satisfaction_upper),
        "used": lambda: cpu_used_thresholds(s),
        "allocatable": lambda: cpu_allocatable_thresholds(s),
    }[check]
    if error is None:
        run()
    else:
        with pytest.raises(InvalidThreshold) as caught:
            run()
        assert str(caught.value) == error


def test_be_order_as_upstream() -> None:
    # Test_getBEPodEvictInfoAndSort: priority 10 first, then usage / request descending
    def be(name: str, prio: int) -> PodInfo:
        return info(upstream_pod(name, "BE", prio, requests={BATCH_CPU: "16000"}))

    used = {"pod_be_1_priority100": 3000, "pod_be_2_priority100": 4000, "pod_be_3_priority10": 4000}
    pods = [
        be("pod_be_1_priority100", 100),
        be("pod_be_2_priority100", 100),
        be("pod_be_3_priority10", 10),
    ]
    ordered = cpu_order_be(
        EvictCandidate(p, used[p.name], p.extended_requests[BATCH_CPU], BATCH_CPU) for p in pods
    )
    assert [c.pod.name for c in ordered] == [
        "pod_be_3_priority10",
        "pod_be_2_priority100",
        "pod_be_1_priority100",
    ]
    assert [c.request for c in ordered] == [16000] * 3
