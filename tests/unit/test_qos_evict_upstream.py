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

from koordlet.executor.audit import AuditLog
from koordlet.metriccache import series
from koordlet.metriccache.store import MetricCache
from koordlet.qos.evictor import Evictor, Victim
from koordlet.qos.evicttask import (
    Candidate,
    allocatable_release,
    by_priority,
    priority_value_with_default,
    request_of,
)
from koordlet.qos.framework import QoSBook, StrategyContext
from koordlet.qos.memoryevict import (
    MemoryEvict,
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
        # 85 of 100 GiB over 80%: down to 70%, in float32 as upstream (16106131456, not
        # 16106127360)
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
