"""NodeMetric status: content field by field for known samples, and how it is written."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from apis.crdschema import validate
from apis.extension import KubeQOS, QoSClass
from apis.slo import NodeSLOSpec, parse_node_slo
from koordlet.metriccache import MetricCache, Sample, SeriesKey
from koordlet.metriccache import series as s
from koordlet.reporter.nodemetric import FIRST_REPORT_RETRY_S, NodeMetricReporter, build_status
from koordlet.statesinformer.kube import CollectPolicy, KubeStatesSource
from koordlet.statesinformer.model import PodInfo
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from kubeclient.backoff import Backoff
from kubeclient.client import KubeClient, Obj
from kubeclient.informer import Informer
from kubeclient.resources import NODE_METRICS
from kubeclient.writes import WriteRateLimiter
from tests.fakehost import FakeHost
from tests.kube.conftest import eventually, running_source
from tests.kubefake import FakeApiServer

NOW = 1_800_000_000.0
GiB = 2**30
MiB = 2**20
UID_A = "aaaaaaaa-0000-0000-0000-000000000001"
UID_B = "bbbbbbbb-0000-0000-0000-000000000002"


def _pod(uid: str, name: str, qos: QoSClass, priority_class: str) -> PodInfo:
    return PodInfo(
        uid=uid,
        name=name,
        namespace="ns",
        qos=qos,
        kube_qos=KubeQOS.BURSTABLE,
        cgroup_dir=f"kubepods/burstable/pod{uid}",
        priority_class=priority_class,
    )


def _fill(cache: MetricCache, *, samples: int = 180) -> None:
    """One tick every 10 s ending at NOW (``j`` ticks before it). The node uses 4 cores in the
    last 5 minutes (j <= 30) and 2 before; everything else is constant."""
    for j in reversed(range(samples)):
        ts = NOW - 10 * j
        batch = [
            Sample(SeriesKey(s.NODE_CPU_USAGE, s.NODE), 4.0 if j <= 30 else 2.0),
            Sample(SeriesKey(s.NODE_MEMORY_USAGE, s.NODE), 8 * GiB),
            Sample(SeriesKey(s.NODE_MEMORY_WITH_PAGE_CACHE, s.NODE), 10 * GiB),
            Sample(SeriesKey(s.SYSTEM_CPU_USAGE, s.SYSTEM), 0.5),
            Sample(SeriesKey(s.SYSTEM_MEMORY_USAGE, s.SYSTEM), GiB + 512),
            Sample(SeriesKey(s.NUMA_MEMORY_USAGE, s.numa_entity(1)), 5 * GiB),
            Sample(SeriesKey(s.NUMA_MEMORY_USAGE, s.numa_entity(0)), 3 * GiB),
            Sample(SeriesKey(s.NUMA_CPU_USAGE, s.numa_entity(0)), 1.0),
            Sample(SeriesKey(s.HOST_APP_CPU_USAGE, s.host_app_entity("nginx")), 0.1),
            Sample(SeriesKey(s.HOST_APP_MEMORY_USAGE, s.host_app_entity("nginx")), 1.5 * MiB),
        ]
        if j <= 60:  # pods keep 10 minutes
            batch += [
                Sample(SeriesKey(s.POD_CPU_USAGE, s.pod_entity(UID_A)), 0.25),
                Sample(SeriesKey(s.POD_MEMORY_USAGE, s.pod_entity(UID_A)), 100 * MiB),
                Sample(SeriesKey(s.POD_MEMORY_WITH_PAGE_CACHE, s.pod_entity(UID_A)), 200 * MiB),
            ]
        cache.append(ts, batch)


def _host_apps() -> NodeSLOSpec:
    return parse_node_slo(
        {"hostApplications": [{"name": "nginx", "qos": "LS", "priority": "koord-prod"}]}, "test"
    )


PODS = [
    _pod(UID_A, "web", QoSClass.LS, "koord-prod"),
    _pod(UID_B, "new", QoSClass.BE, "koord-batch"),  # no samples yet: left out
]


def _status(policy: CollectPolicy | None = None, samples: int = 180) -> Obj:
    cache = MetricCache(clock=lambda: NOW)
    _fill(cache, samples=samples)
    return build_status(cache, policy or CollectPolicy(), PODS, _host_apps().host_applications, NOW)


def _res(cpu: str, memory: str) -> Obj:
    return {"resources": {"cpu": cpu, "memory": memory}}


def test_node_usage_is_the_average_over_the_aggregate_duration() -> None:
    status = _status()
    assert status["updateTime"] == "2027-01-15T08:00:00Z"
    node = status["nodeMetric"]
    assert node["nodeUsage"] == _res("4", "8Gi")
    assert node["systemUsage"] == _res("500m", "1073742336")


def test_aggregated_usages_follow_the_nearest_rank_percentiles_per_window() -> None:
    windows = {a["duration"]: a["usage"] for a in _status()["nodeMetric"]["aggregatedNodeUsages"]}
    assert list(windows) == ["5m0s", "10m0s", "30m0s"]
    # 5 minutes: 31 samples, all 4 cores.
    assert windows["5m0s"] == {k: _res("4", "8Gi") for k in ("avg", "p50", "p90", "p95", "p99")}
    # 10 minutes: 30 samples of 2 then 31 of 4; p50 is the 30th of 61 sorted (index 29).
    ten = windows["10m0s"]
    assert ten["p50"] == _res("2", "8Gi")
    assert ten["p90"] == ten["p95"] == ten["p99"] == _res("4", "8Gi")
    assert ten["avg"] == _res(f"{int((30 * 2 + 31 * 4) / 61 * 1000)}m", "8Gi")
    # 30 minutes: 149 of 2 then 31 of 4; p90's index is int(180 * 0.9) - 1 = 161, a 4.
    thirty = windows["30m0s"]
    assert thirty["p50"] == _res("2", "8Gi")
    assert thirty["p90"] == _res("4", "8Gi")
    assert thirty["avg"] == _res(f"{int((149 * 2 + 31 * 4) / 180 * 1000)}m", "8Gi")
    system = _status()["nodeMetric"]["aggregatedSystemUsages"]
    assert [a["usage"]["p99"] for a in system] == [_res("500m", "1073742336")] * 3


def test_windows_less_than_half_covered_are_reported_empty() -> None:
    # 13 ticks: 120 s of samples; 5m is 40 % covered, 10m and 30m less.
    node = _status(samples=13)["nodeMetric"]
    assert node["nodeUsage"] == _res("4", "8Gi")  # the average is reported regardless
    for agg in node["aggregatedNodeUsages"]:
        assert agg["usage"] == {k: {} for k in ("avg", "p50", "p90", "p95", "p99")}


def test_pods_host_applications_and_numa_nodes_are_reported() -> None:
    status = _status()
    assert status["podsMetric"] == [
        {
            "namespace": "ns",
            "name": "web",
            "podUsage": _res("250m", "100Mi"),
            "priority": "koord-prod",
            "qos": "LS",
        }
    ]
    assert status["hostApplicationMetric"] == [
        {"name": "nginx", "usage": _res("100m", "1536Ki"), "priority": "koord-prod", "qos": "LS"}
    ]
    # NUMA 0: 1 core of the node's average; its system CPU is the node's system CPU (0.5) times
    # its share of the node's CPU usage (the CRD's rule); NUMA 1 has no CPU series
    node_cpu = (31 * 4.0 + 0 * 2.0) / 31  # the 300 s window holds the 4-core ticks only
    assert status["nodeMetric"]["numaUsages"] == [
        {
            "numaNodeID": 0,
            "nodeUsage": _res("1", "3Gi"),
            "systemUsage": {"resources": {"cpu": f"{int(0.5 * 1.0 / node_cpu * 1000)}m"}},
        },
        {"numaNodeID": 1, "nodeUsage": {"resources": {"memory": "5Gi"}}},
    ]


def test_the_memory_collect_policy_picks_the_page_cache_series() -> None:
    status = _status(CollectPolicy(node_memory_collect_policy="usageWithPageCache"))
    assert status["nodeMetric"]["nodeUsage"] == _res("4", "10Gi")
    assert status["podsMetric"][0]["podUsage"] == _res("250m", "200Mi")
    hot = _status(CollectPolicy(node_memory_collect_policy="usageWithHotPageCache"))
    assert hot["nodeMetric"]["nodeUsage"] == _res("4", "8Gi")  # no cold-page series: default


def test_the_status_validates_against_the_nodemetric_crd() -> None:
    for samples in (180, 13):
        obj = {
            "apiVersion": "slo.koordinator.sh/v1alpha1",
            "kind": "NodeMetric",
            "metadata": {"name": "node-1"},
            "status": _status(samples=samples),
        }
        assert validate(obj) == []


# Writing ---------------------------------------------------------------------------------------
@dataclass
class _States:
    """A states view with fixed content (the reporter's input)."""

    node_name: str = "node-1"
    collect_policy: CollectPolicy = field(default_factory=CollectPolicy)
    node_slo: NodeSLOSpec = field(default_factory=_host_apps)
    exists: bool = True

    def node_metric(self) -> Obj | None:
        return {"metadata": {"name": self.node_name}} if self.exists else None

    def list_pods(self) -> Mapping[str, PodInfo]:
        return {p.uid: p for p in PODS}


def _reporter(
    client: KubeClient, states: object, limiter: WriteRateLimiter | None = None
) -> NodeMetricReporter:
    cache = MetricCache(clock=lambda: NOW)
    _fill(cache)

    async def no_sleep(_: float) -> None:
        return None

    return NodeMetricReporter(
        client,
        states,
        cache,
        limiter=limiter,
        clock=lambda: NOW,
        sleep=no_sleep,  # type: ignore[arg-type]
    )


async def test_the_status_is_written_through_the_subresource_spec_untouched(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    spec = {"metricCollectPolicy": {"reportIntervalSeconds": 60}}
    kube_api.put("nodemetrics", {"metadata": {"name": "node-1"}, "spec": spec})
    reporter = _reporter(kube_client, _States())
    assert await reporter.report_once()
    (put,) = kube_api.writes("PUT")
    assert put.path.endswith("/nodemetrics/node-1/status")
    stored = kube_api.get("nodemetrics", "node-1")
    assert stored is not None
    assert stored["spec"] == spec
    assert stored["status"] == put.body["status"]
    assert stored["status"]["nodeMetric"]["nodeUsage"]["resources"]
    assert validate(stored) == []


async def test_a_conflict_is_retried_with_a_fresh_read(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodemetrics", {"metadata": {"name": "node-1"}, "spec": {}})
    reporter = _reporter(kube_client, _States())
    original_get = kube_client.get
    interfered = []

    async def get_then_interfere(*args: object, **kw: object) -> Obj:
        got = await original_get(*args, **kw)  # type: ignore[arg-type]
        if not interfered:  # the manager updates the spec between our read and our write
            interfered.append(
                kube_api.put(
                    "nodemetrics",
                    {"metadata": {"name": "node-1"}, "spec": {"metricCollectPolicy": {}}},
                )
            )
        return got

    kube_client.get = get_then_interfere  # type: ignore[method-assign]
    assert await reporter.report_once()
    puts = kube_api.writes("PUT")
    assert len(puts) == 2
    stored = kube_api.get("nodemetrics", "node-1")
    assert stored is not None
    assert stored["status"] == puts[-1].body["status"]
    assert stored["spec"] == {"metricCollectPolicy": {}}  # the manager's update kept


async def test_nothing_is_written_until_the_nodemetric_exists(
    kube_api: FakeApiServer, kube_client: KubeClient, tmp_path: Path
) -> None:
    host = FakeHost(tmp_path / "host", CgroupVersion.V1, CgroupDriver.CGROUPFS)

    def informer(*args: object, **kw: object) -> Informer:
        kw["backoff"] = Backoff(base=0.01, cap=0.05, rng=random.Random(3))
        return Informer(*args, **kw)  # type: ignore[arg-type]

    states = KubeStatesSource(
        kube_client, "node-1", lambda: host.layout, str(tmp_path), informer_factory=informer
    )
    reporter = _reporter(kube_client, states)
    async with running_source(states):
        assert await states.wait_synced(5.0)
        assert not await reporter.report_once()
        assert kube_api.writes() == []
        kube_api.put("nodemetrics", {"metadata": {"name": "node-1"}, "spec": {}})
        await eventually(lambda: states.node_metric() is not None)
        assert await reporter.report_once()
        # the watch hands the written status back; the informer keeps the spec, not our report
        written = await kube_client.get(NODE_METRICS, "node-1")
        assert written["status"]["nodeMetric"]["nodeUsage"]["resources"]
        await eventually(
            lambda: (
                (states.node_metric() or {}).get("metadata", {}).get("resourceVersion")
                == written["metadata"]["resourceVersion"]
            )
        )
        kept = states.node_metric()
        assert kept is not None
        assert "status" not in kept
        assert kept["spec"] == {}
    assert reporter.stats.skipped_missing == 1
    assert len(kube_api.writes("PUT", "/status")) == 1


async def test_the_write_rate_is_bounded(kube_api: FakeApiServer, kube_client: KubeClient) -> None:
    kube_api.put("nodemetrics", {"metadata": {"name": "node-1"}, "spec": {}})
    limiter = WriteRateLimiter(0.1, 2, clock=lambda: 0.0)  # time stands still: 2 writes at most
    reporter = _reporter(kube_client, _States(), limiter)
    results = [await reporter.report_once() for _ in range(5)]
    assert results == [True, True, False, False, False]
    assert len(kube_api.writes("PUT")) == 2
    assert reporter.stats.limited == 3


@pytest.mark.parametrize("policy", [CollectPolicy(), CollectPolicy(node_aggregate_durations=())])
def test_every_policy_builds_a_valid_status(policy: CollectPolicy) -> None:
    obj = {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeMetric",
        "metadata": {"name": "n"},
        "status": _status(policy),
    }
    assert validate(obj) == []


async def test_the_first_report_goes_out_at_once_and_is_retried_until_written(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    # upstream's reporter runs under wait.Until (its first call immediate): no interval is
    # waited before the first report; until one is written (no NodeMetric yet), it is tried
    # again every FIRST_REPORT_RETRY_S seconds, then every reportIntervalSeconds
    states = _States(exists=False)
    slept: list[float] = []
    reporter = _reporter(kube_client, states)

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:  # the manager made the NodeMetric meanwhile
            kube_api.put("nodemetrics", {"metadata": {"name": "node-1"}, "spec": {}})
            states.exists = True
        if len(slept) == 5:
            raise asyncio.CancelledError

    reporter._sleep = sleep
    with pytest.raises(asyncio.CancelledError):
        await reporter.run()
    interval = states.collect_policy.report_interval_seconds
    assert slept == [FIRST_REPORT_RETRY_S] * 3 + [interval] * 2
    assert reporter.stats.skipped_missing == 3
    assert reporter.stats.written == 2
    assert len(kube_api.writes("PUT")) == 2


async def test_no_status_is_written_before_a_node_sample_is_collected(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodemetrics", {"metadata": {"name": "node-1"}, "spec": {}})

    async def no_sleep(_: float) -> None:
        return None

    reporter = NodeMetricReporter(
        kube_client, _States(), MetricCache(clock=lambda: NOW), clock=lambda: NOW, sleep=no_sleep
    )
    assert not await reporter.report_once()
    assert reporter.stats.skipped_no_samples == 1
    assert kube_api.writes("PUT") == []
