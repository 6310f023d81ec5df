"""The cold-memory collector on fake hosts of every layout with kidled's files in their real
format: cold bytes and memory with hot page cache for the node, pods, containers and host
applications, and what it says when kidled cannot measure."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from apis.extension import KubeQOS, QoSClass
from koordlet.collectors.coldmemory import (
    DEFAULT_INTERVAL,
    FEATURE_GATE,
    INFO_KEY,
    NAME,
    ColdMemoryCollector,
)
from koordlet.collectors.framework import CollectorContext, CollectResult
from koordlet.collectors.runner import TickState
from koordlet.collectors.table import build_collectors
from koordlet.config import CollectConfig, KoordletConfig
from koordlet.features import KOORDLET_FEATURES, parse_feature_gates
from koordlet.metriccache import series as s
from koordlet.metriccache.store import MetricCache
from koordlet.server.exporter import KoordletExporter
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import HostAppInfo, WorkloadSnapshot
from koordlet.system.kidled import IDLE_PAGE_STATS, kidled_file
from tests.fakehost import FakeHost, container_id
from tests.unit.test_kidled import golden, render_idle_page_stats

UID = "3c1f6a0e-7d2b-4e8a-9c5f-1a2b3c4d5e6f"
CID = container_id("cold-app")
MiB = 1 << 20
KiB = 1 << 10
POD = s.pod_entity(UID)
CONTAINER = s.container_entity(UID, CID)
APP = s.host_app_entity("agent")


def enable_kidled(fake: FakeHost, period: int = 5, hierarchy: int = 1) -> None:
    for name, value in (("scan_period_in_seconds", period), ("use_hierarchy", hierarchy)):
        path = Path(kidled_file(fake.paths, name))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")


def write_cold(fake: FakeHost, rel: str, cold: int, young: int = 0) -> None:
    """A histogram with ``cold`` bytes at 60+ scans (file pages) and ``young`` under 60."""
    fake.write(
        "memory",
        rel,
        IDLE_PAGE_STATS,
        render_idle_page_stats({"cfei": [young, 0, 0, 0, 0, cold, 0, 0], "csea": [0] * 8}),
    )


def snapshot(fake: FakeHost, apps: tuple[HostAppInfo, ...] = ()) -> WorkloadSnapshot:
    return WorkloadSnapshot(pods=KubepodsSource(fake.host).list_pods(), host_apps=apps)


def run(collector: ColdMemoryCollector, snap: WorkloadSnapshot) -> CollectResult:
    return collector.collect(TickState(100.0, snap))


def values(result: CollectResult) -> dict[tuple[str, str], float]:
    return {(x.key.metric, x.key.entity): x.value for x in result.samples}


@pytest.fixture
def workload(fake_host: FakeHost) -> tuple[str, str, str]:
    """A pod with one container and a host application, with memory and cold pages set."""
    pod, (container,) = fake_host.add_pod(UID, KubeQOS.BURSTABLE, [("containerd", CID)])
    app = fake_host.add_host_app_cgroup("host-apps/agent")
    enable_kidled(fake_host)
    fake_host.set_meminfo(MemTotal=16 * MiB, MemFree=6 * MiB)  # kB: 16 GiB total, 6 GiB free
    write_cold(fake_host, "", cold=3 << 30, young=1 << 30)
    fake_host.set_memory(pod, anon=300 * MiB, file=200 * MiB, unevictable=10 * MiB)
    write_cold(fake_host, pod, cold=120 * MiB, young=50 * MiB)
    fake_host.set_memory(container, anon=250 * MiB, file=100 * MiB)
    write_cold(fake_host, container, cold=80 * MiB)
    fake_host.set_memory(app, anon=64 * MiB, file=32 * MiB)
    write_cold(fake_host, app, cold=16 * MiB)
    return pod, container, app


def agent(rel: str) -> tuple[HostAppInfo, ...]:
    return (HostAppInfo("agent", QoSClass.LS, rel),)


def test_node_hot_page_cache_is_total_minus_free_minus_cold(
    fake_host: FakeHost, workload: tuple[str, str, str]
) -> None:
    got = values(run(ColdMemoryCollector(fake_host.host), snapshot(fake_host)))

    assert got[(s.NODE_MEMORY_COLD_PAGE, s.NODE)] == 3 << 30
    assert got[(s.NODE_MEMORY_WITH_HOT_PAGE_CACHE, s.NODE)] == (16 - 6 - 3) << 30


def test_cgroup_hot_page_cache_is_usage_with_page_cache_minus_cold(
    fake_host: FakeHost, workload: tuple[str, str, str]
) -> None:
    _, _, app = workload
    got = values(run(ColdMemoryCollector(fake_host.host), snapshot(fake_host, agent(app))))

    assert got[(s.POD_MEMORY_COLD_PAGE, POD)] == 120 * MiB
    assert got[(s.POD_MEMORY_WITH_HOT_PAGE_CACHE, POD)] == (300 + 10 + 200 - 120) * MiB
    assert got[(s.CONTAINER_MEMORY_COLD_PAGE, CONTAINER)] == 80 * MiB
    assert got[(s.CONTAINER_MEMORY_WITH_HOT_PAGE_CACHE, CONTAINER)] == (250 + 100 - 80) * MiB
    assert got[(s.HOST_APP_MEMORY_COLD_PAGE, APP)] == 16 * MiB
    assert got[(s.HOST_APP_MEMORY_WITH_HOT_PAGE_CACHE, APP)] == (64 + 32 - 16) * MiB


def test_cold_larger_than_usage_clamps_hot_page_cache_at_zero(
    fake_host: FakeHost, workload: tuple[str, str, str]
) -> None:
    pod, _, _ = workload
    write_cold(fake_host, pod, cold=900 * MiB)  # kidled also counts slab and off-LRU pages
    write_cold(fake_host, "", cold=12 << 30)

    got = values(run(ColdMemoryCollector(fake_host.host), snapshot(fake_host)))

    assert got[(s.POD_MEMORY_WITH_HOT_PAGE_CACHE, POD)] == 0.0
    assert got[(s.NODE_MEMORY_WITH_HOT_PAGE_CACHE, s.NODE)] == 0.0
    assert got[(s.POD_MEMORY_COLD_PAGE, POD)] == 900 * MiB


def test_the_sources_facts_are_reported_as_info(
    fake_host: FakeHost, workload: tuple[str, str, str]
) -> None:
    result = run(ColdMemoryCollector(fake_host.host), snapshot(fake_host))

    assert result.info[INFO_KEY] == {
        "source": "kidled",
        "scan_period_seconds": 5,
        "cold_age_scans": 60,
        "cold_age_seconds": 300,
    }
    assert result.unsupported == {}


@pytest.mark.parametrize(
    ("period", "hierarchy", "reason"),
    [(0, 1, "scanning is off"), (5, 0, "use_hierarchy is 0")],
)
def test_kidled_that_cannot_measure_yields_only_the_reason(
    fake_host: FakeHost, workload: tuple[str, str, str], period: int, hierarchy: int, reason: str
) -> None:
    enable_kidled(fake_host, period, hierarchy)

    result = run(ColdMemoryCollector(fake_host.host), snapshot(fake_host))

    assert not result.samples
    assert reason in result.unsupported["kidled"]


def test_a_kernel_without_kidled_yields_only_the_reason(fake_host: FakeHost) -> None:
    result = run(ColdMemoryCollector(fake_host.host), snapshot(fake_host))

    assert not result.samples
    assert "absent: kernel without kidled" in result.unsupported["kidled"]


def test_a_root_memcg_without_the_histogram_is_unsupported(fake_host: FakeHost) -> None:
    enable_kidled(fake_host)

    result = run(ColdMemoryCollector(fake_host.host), snapshot(fake_host))

    assert not result.samples
    assert "root memory cgroup has no cold-page file" in result.unsupported["kidled"]


def test_cgroups_without_accounting_are_skipped_with_the_count_and_reason(
    fake_host: FakeHost, workload: tuple[str, str, str]
) -> None:
    pod, _, _ = workload
    fake_host.write("memory", pod, IDLE_PAGE_STATS, golden("nobuckets").decode())

    result = run(ColdMemoryCollector(fake_host.host), snapshot(fake_host))
    got = values(result)

    assert (s.POD_MEMORY_COLD_PAGE, POD) not in got
    assert got[(s.CONTAINER_MEMORY_COLD_PAGE, CONTAINER)] == 80 * MiB
    assert result.unsupported["memcg"].startswith("1 cgroups skipped; first: ")
    assert "accounting is off" in result.unsupported["memcg"]


def test_a_vanished_cgroup_is_skipped_and_the_rest_reported(
    fake_host: FakeHost, workload: tuple[str, str, str]
) -> None:
    _, container, _ = workload
    snap = snapshot(fake_host)
    fake_host.remove_cgroup(container)

    result = run(ColdMemoryCollector(fake_host.host), snap)
    got = values(result)

    assert (s.CONTAINER_MEMORY_COLD_PAGE, CONTAINER) not in got
    assert got[(s.POD_MEMORY_COLD_PAGE, POD)] == 120 * MiB
    assert result.unsupported == {}


def test_absent_host_applications_are_not_read(
    fake_host: FakeHost, workload: tuple[str, str, str]
) -> None:
    apps = (HostAppInfo("agent", QoSClass.LS, "host-apps/agent", present=False),)

    got = values(run(ColdMemoryCollector(fake_host.host), snapshot(fake_host, apps)))

    assert (s.HOST_APP_MEMORY_COLD_PAGE, APP) not in got
    assert (s.POD_MEMORY_COLD_PAGE, POD) in got


def test_the_factory_takes_the_configured_interval_and_koordinators_gate(
    fake_host: FakeHost,
) -> None:
    gate = parse_feature_gates(f"{FEATURE_GATE}=true")
    default = KoordletConfig(node_name="n", feature_gates=gate)
    other_base = dataclasses.replace(default, collect=CollectConfig(res_used_interval=2.0))
    own = dataclasses.replace(default, collect=CollectConfig(cold_page_interval=7.0))

    def interval(cfg: KoordletConfig) -> float:
        built = build_collectors(CollectorContext(fake_host.host, cfg))
        return next(c.interval for c in built if c.name == NAME)

    assert interval(default) == DEFAULT_INTERVAL == 5.0
    assert interval(other_base) == DEFAULT_INTERVAL
    assert interval(own) == 7.0
    assert FEATURE_GATE in KOORDLET_FEATURES
    assert not KOORDLET_FEATURES[FEATURE_GATE].default


def test_the_exporter_serves_cold_and_hot_families_with_the_scopes_labels(
    fake_host: FakeHost, workload: tuple[str, str, str]
) -> None:
    _, _, app = workload
    snap = snapshot(fake_host, agent(app))
    cache = MetricCache(clock=lambda: 100.0)
    cache.append(100.0, run(ColdMemoryCollector(fake_host.host), snap).samples)
    exporter = KoordletExporter(
        cache, lambda: snap, node_name="n1", collect_interval=5.0, clock=lambda: 100.0
    )
    pod = snap.pods[UID]

    got = {
        (f.name, tuple(sorted(x.labels.items()))): x.value
        for f in exporter.collect()
        for x in f.samples
        if "cold_page" in f.name or "hot_page" in f.name
    }

    node = (("node", "n1"),)
    pod_labels = (
        ("node", "n1"),
        ("pod_name", pod.name),
        ("pod_namespace", pod.namespace),
        ("pod_uid", UID),
        ("qos", str(pod.qos)),
    )
    assert got[("koordlet_node_memory_cold_page_bytes", node)] == 3 << 30
    assert got[("koordlet_node_used_memory_with_hot_page_cache_bytes", node)] == 7 << 30
    assert got[("koordlet_pod_memory_cold_page_bytes", pod_labels)] == 120 * MiB
    hot = "koordlet_pod_used_memory_with_hot_page_cache_bytes"
    assert got[(hot, pod_labels)] == 390 * MiB
    names = {name for name, _ in got}
    assert "koordlet_container_used_memory_with_hot_page_cache_bytes" in names
    assert "koordlet_host_application_memory_cold_page_bytes" in names
    assert len(got) == 8
