"""The HTTP server on a real socket, the exporter's families, and the /debug peer check.

The metric cache is a small dict-backed fake implementing the server's protocols; the inventory
is a hand-built snapshot; the server runs on 127.0.0.1 port 0 through ``start_server``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import socket
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from apis.extension import KubeQOS, QoSClass
from koordlet.executor.audit import AuditLog
from koordlet.metriccache import series as s
from koordlet.metriccache.series import SeriesKey
from koordlet.selfmetrics import Readiness, SelfMetrics
from koordlet.server import (
    FAMILIES,
    KoordletExporter,
    ServerDeps,
    build_app,
    is_loopback_peer,
    start_server,
)
from koordlet.server.exporter import STALE_INTERVALS, container_id_label
from koordlet.server.health import LoopHealth
from koordlet.server.limiter import LimiterFamilies
from koordlet.statesinformer.model import ContainerInfo, HostAppInfo, PodInfo, WorkloadSnapshot
from koordlet.supervisor import Supervisor

NOW = 1_700_000_000.0
INTERVAL = 1.0
NODE_NAME = "node-a"


# Fakes ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeAggregate:
    count: int
    avg: float
    p50: float
    p90: float
    p95: float
    p99: float
    last: float
    min: float
    max: float
    first_ts: float
    last_ts: float


def _rank(ordered: list[float], q: float) -> float:
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class DictCache:
    """A dict of series -> [(ts, value)], implementing the server's ``MetricStore``."""

    points: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)

    def add(self, metric: str, entity: str, ts: float, value: float) -> None:
        self.points.setdefault((metric, entity), []).append((ts, value))

    def last_sample(self, metric: str, entity: str, /) -> tuple[float, float] | None:
        pts = self.points.get((metric, entity))
        return pts[-1] if pts else None

    def entities(self, metric: str | None = None, /) -> Iterable[str]:
        return sorted({e for (m, e) in self.points if metric is None or m == metric})

    def aggregate(
        self, metric: str, entity: str, start: float, end: float, /
    ) -> FakeAggregate | None:
        pts = [(t, v) for t, v in self.points.get((metric, entity), []) if start <= t <= end]
        if not pts:
            return None
        values = sorted(v for _, v in pts)
        return FakeAggregate(
            count=len(pts),
            avg=sum(values) / len(values),
            p50=_rank(values, 0.5),
            p90=_rank(values, 0.9),
            p95=_rank(values, 0.95),
            p99=_rank(values, 0.99),
            last=pts[-1][1],
            min=values[0],
            max=values[-1],
            first_ts=pts[0][0],
            last_ts=pts[-1][0],
        )

    def last_values(self, keys: Sequence[SeriesKey], since: float, /) -> list[float | None]:
        out: list[float | None] = []
        for key in keys:
            sample = self.last_sample(*key)
            out.append(sample[1] if sample is not None and sample[0] >= since else None)
        return out

    def has_series(self, metric: str, /) -> bool:
        return any(m == metric for m, _ in self.points)

    def stats(self) -> dict[str, int]:
        return {"series": len(self.points), "samples": sum(map(len, self.points.values()))}


WEB = ContainerInfo(id="c0ffee" * 4, name="web", runtime="containerd", cgroup_dir="kubepods/pa/c1")
SIDE = ContainerInfo(id="beef" * 6, name="beef" * 3, runtime="unknown", cgroup_dir="kubepods/pa/c2")
POD_A = PodInfo(
    uid="aaaa-1111",
    name="web-0",
    namespace="shop",
    qos=QoSClass.LS,
    kube_qos=KubeQOS.BURSTABLE,
    cgroup_dir="kubepods/burstable/podaaaa-1111",
    containers=(WEB, SIDE),
    priority_class="koord-prod",
    source="kubepods",
)
POD_B = PodInfo(
    uid="bbbb-2222",
    name="batch-0",
    namespace="jobs",
    qos=QoSClass.BE,
    kube_qos=KubeQOS.BESTEFFORT,
    cgroup_dir="kubepods/besteffort/podbbbb-2222",
)
AGENT = HostAppInfo(name="agent", qos=QoSClass.LS, cgroup_dir="host-latency-sensitive/agent")
GONE_APP = HostAppInfo(name="gone", qos=QoSClass.BE, cgroup_dir="host-be/gone", present=False)
SNAPSHOT = WorkloadSnapshot(
    pods={POD_A.uid: POD_A, POD_B.uid: POD_B},
    host_apps=(AGENT, GONE_APP),
    generation=7,
    taken_at=NOW - 2,
)

FRESH = NOW - 1.0
STALE = NOW - STALE_INTERVALS * INTERVAL - 0.5


def filled_cache() -> DictCache:
    cache = DictCache()
    cache.add(s.NODE_CPU_USAGE, s.NODE, FRESH, 3.5)
    cache.add(s.NODE_MEMORY_USAGE, s.NODE, FRESH, 8e9)
    cache.add(s.BE_CPU_USAGE, s.BE, FRESH, 1.25)
    cache.add(s.BE_CPU_REAL_LIMIT, s.BE, FRESH, 6.0)
    cache.add(s.SYSTEM_CPU_USAGE, s.SYSTEM, STALE, 0.4)  # stale: must be absent
    cache.add(s.NUMA_MEMORY_USAGE, s.numa_entity(1), FRESH, 2e9)
    cache.add(s.NUMA_MEMORY_USAGE, s.numa_entity(0), FRESH, 1e9)
    cache.add(s.POD_CPU_USAGE, s.pod_entity(POD_A.uid), FRESH, 0.75)
    cache.add(s.POD_CPU_USAGE, s.pod_entity(POD_B.uid), FRESH, 1.25)
    cache.add(s.POD_MEMORY_USAGE, s.pod_entity(POD_A.uid), STALE, 5e8)  # stale
    cache.add(s.POD_CPU_USAGE, s.pod_entity("gone-uid"), FRESH, 9.0)  # not in the inventory
    cache.add(s.CONTAINER_CPU_USAGE, s.container_entity(POD_A.uid, WEB.id), FRESH, 0.5)
    cache.add(s.CONTAINER_CPU_USAGE, s.container_entity(POD_A.uid, SIDE.id), FRESH, 0.25)
    cache.add(s.CONTAINER_CPU_THROTTLED_RATIO, s.container_entity(POD_A.uid, WEB.id), FRESH, 0.1)
    cache.add(s.HOST_APP_CPU_USAGE, s.host_app_entity(AGENT.name), FRESH, 0.2)
    cache.add(s.HOST_APP_MEMORY_USAGE, s.host_app_entity(AGENT.name), FRESH, 3e8)
    cache.add(s.HOST_APP_CPU_USAGE, s.host_app_entity(GONE_APP.name), FRESH, 0.1)
    return cache


@dataclass
class Env:
    cache: DictCache
    registry: CollectorRegistry
    exporter: KoordletExporter
    readiness: Readiness
    supervisor: Supervisor
    capabilities: dict[str, Any]
    config: dict[str, Any]
    debug_allow_remote: bool = False
    audit: AuditLog | None = None
    qos: dict[str, Any] | None = None
    runtimehooks: dict[str, Any] | None = None

    def audit_query(self, limit: int, strategy: str | None, kind: str | None) -> dict[str, Any]:
        assert self.audit is not None
        entries = self.audit.recent(limit, strategy=strategy, kind=kind)
        return {"entries": [e.as_dict() for e in entries], "log": self.audit.stats()}

    def deps(self) -> ServerDeps:
        return ServerDeps(
            registry=self.registry,
            readiness=self.readiness,
            cache=self.cache,
            workloads=lambda: SNAPSHOT,
            capabilities=lambda: self.capabilities,
            config=lambda: self.config,
            tasks=self.supervisor.describe,
            audit=None if self.audit is None else self.audit_query,
            qos=None if self.qos is None else (lambda: self.qos or {}),
            runtimehooks=None if self.runtimehooks is None else (lambda: self.runtimehooks or {}),
            debug_allow_remote=self.debug_allow_remote,
            max_query_window=3600.0,
            clock=lambda: NOW,
            exporter=self.exporter,
        )


def make_exporter(cache: DictCache) -> KoordletExporter:
    return KoordletExporter(
        cache,
        lambda: SNAPSHOT,
        node_name=NODE_NAME,
        collect_interval=INTERVAL,
        clock=lambda: NOW,
    )


@pytest.fixture
def env() -> Env:
    registry = CollectorRegistry()
    metrics = SelfMetrics(registry, node_name=NODE_NAME, version="0.1.0")
    metrics.mark_started(NOW - 60)
    metrics.record_capabilities({"cpu.cfs_quota": True, "cpu.idle": False})
    cache = filled_cache()
    return Env(
        cache=cache,
        registry=registry,
        exporter=make_exporter(cache),
        readiness=Readiness(("probe", "inventory"), metrics=metrics),
        supervisor=Supervisor(metrics),
        capabilities={"knobs": {"cpu.idle": {"supported": False, "reason": "kernel < 5.15"}}},
        config={"collect_interval": INTERVAL, "node_name": NODE_NAME},
        audit=AuditLog(None, clock=lambda: NOW),
        qos={"dry_run": {"all": False, "strategies": []}, "strategies": {}, "disabled": {}},
    )


@pytest.fixture
async def client(env: Env) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    handle = await start_server(build_app(env.deps()), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            yield session, f"http://127.0.0.1:{handle.port}"
    finally:
        await handle.stop()
        await env.supervisor.stop(timeout=1.0)


async def get_json(client: tuple[aiohttp.ClientSession, str], path: str, status: int = 200) -> Any:
    session, base = client
    async with session.get(base + path) as resp:
        assert resp.status == status, await resp.text()
        assert resp.content_type == "application/json"
        return await resp.json()


def samples_of(text: str, family: str) -> list[Sample]:
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            return list(fam.samples)
    return []


# Exporter ------------------------------------------------------------------------------------


def collected(exporter: KoordletExporter) -> dict[str, list[Sample]]:
    return {fam.name: list(fam.samples) for fam in exporter.collect()}


def test_the_exporter_labels_pod_and_container_usage_from_the_inventory() -> None:
    families = collected(make_exporter(filled_cache()))

    pods = {smp.labels["pod_uid"]: smp for smp in families["koordlet_pod_used_cpu_cores"]}
    assert set(pods) == {POD_A.uid, POD_B.uid}  # the uid missing from the inventory is absent
    for pod in (POD_A, POD_B):
        assert pods[pod.uid].labels == {
            "node": NODE_NAME,
            "pod_uid": pod.uid,
            "pod_name": pod.name,
            "pod_namespace": pod.namespace,
            "qos": pod.qos.value,
        }
    containers = {
        smp.labels["container_name"]: smp for smp in families["koordlet_container_used_cpu_cores"]
    }
    assert containers[WEB.name].labels["container_id"] == f"containerd://{WEB.id}"
    assert containers[SIDE.name].labels["container_id"] == SIDE.id  # runtime unknown
    assert containers[WEB.name].labels["pod_uid"] == POD_A.uid
    assert containers[WEB.name].value == 0.5


def test_the_exporter_leaves_out_values_older_than_three_collect_intervals() -> None:
    cache = DictCache()
    max_age = STALE_INTERVALS * INTERVAL
    cache.add(s.NODE_CPU_USAGE, s.NODE, NOW - max_age, 1.0)  # exactly at the limit: kept
    cache.add(s.NODE_MEMORY_USAGE, s.NODE, NOW - max_age - 0.001, 1.0)  # just past it
    families = collected(make_exporter(cache))

    assert len(families["koordlet_node_used_cpu_cores"]) == 1
    assert families["koordlet_node_used_memory_bytes"] == []
    assert families["koordlet_pod_used_cpu_cores"] == []  # no data is no sample, not zero


def test_the_exporter_reports_host_applications_by_resource_and_numa_nodes_by_id() -> None:
    families = collected(make_exporter(filled_cache()))

    usage = families["koordlet_host_application_resource_usage"]
    assert {(smp.labels["host_application_name"], smp.labels["resource"]) for smp in usage} == {
        (AGENT.name, "cpu"),
        (AGENT.name, "memory"),
    }  # the absent host application reports nothing
    assert all(smp.labels["qos"] == AGENT.qos.value for smp in usage)
    numa = families["koordlet_numa_node_used_memory_bytes"]
    assert [smp.labels["numa_node_id"] for smp in numa] == ["0", "1"]


def test_every_family_is_described_so_a_registry_refuses_a_second_exporter() -> None:
    registry = CollectorRegistry()
    exporter = make_exporter(DictCache())
    registry.register(exporter)

    assert [f.name for f in exporter.describe()] == [f.name for f in FAMILIES]
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(make_exporter(DictCache()))


def test_the_container_id_label_is_written_as_a_pod_status_writes_it() -> None:
    assert container_id_label("cri-o", "abc") == "cri-o://abc"
    assert container_id_label("unknown", "abc") == "abc"


# /metrics, /healthz, /readyz -----------------------------------------------------------------


async def test_metrics_exposes_usage_and_self_metrics_with_koordinator_labels(
    client: tuple[aiohttp.ClientSession, str], env: Env
) -> None:
    session, base = client
    async with session.get(base + "/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()

    node_cpu = samples_of(text, "koordlet_node_used_cpu_cores")
    assert [(smp.labels, smp.value) for smp in node_cpu] == [({"node": NODE_NAME}, 3.5)]
    be_used = samples_of(text, "koordlet_be_suppress_be_used_cpu_cores")
    be_sample = env.cache.last_sample(s.BE_CPU_USAGE, s.BE)
    assert be_sample is not None
    assert [(smp.labels, smp.value) for smp in be_used] == [({"node": NODE_NAME}, be_sample[1])]
    assert samples_of(text, "koordlet_system_used_cpu_cores") == []  # stale
    assert samples_of(text, "koordlet_pod_used_memory_bytes") == []  # stale
    start = samples_of(text, "koordlet_start_time")
    assert [(smp.labels, smp.value) for smp in start] == [({"node": NODE_NAME}, NOW - 60)]
    caps = {
        smp.labels["name"]: smp.value for smp in samples_of(text, "koordlet_capability_supported")
    }
    assert caps == {"cpu.cfs_quota": 1.0, "cpu.idle": 0.0}
    assert samples_of(text, "koordlet_build_info")[0].labels["version"] == "0.1.0"


async def test_metrics_speaks_openmetrics_when_the_scraper_asks_for_it(
    client: tuple[aiohttp.ClientSession, str],
) -> None:
    session, base = client
    headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
    async with session.get(base + "/metrics", headers=headers) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert (await resp.text()).rstrip().endswith("# EOF")


async def test_healthz_answers_ok(client: tuple[aiohttp.ClientSession, str]) -> None:
    session, base = client
    async with session.get(base + "/healthz") as resp:
        assert (resp.status, await resp.text()) == (200, "ok")


async def test_readyz_names_the_pending_stage_until_every_stage_is_done(
    client: tuple[aiohttp.ClientSession, str], env: Env
) -> None:
    session, base = client

    async def readyz() -> tuple[int, str]:
        async with session.get(base + "/readyz") as resp:
            return resp.status, await resp.text()

    def ready_gauge() -> float | None:
        return env.registry.get_sample_value("koordlet_ready")

    status, text = await readyz()
    assert status == 503
    assert "probe" in text
    assert ready_gauge() == 0
    env.readiness.mark_done("probe")
    status, text = await readyz()
    assert status == 503
    assert "inventory" in text
    assert "probe" not in text
    env.readiness.mark_done("inventory")
    assert await readyz() == (200, "ok")
    assert ready_gauge() == 1


# /debug ----------------------------------------------------------------------------------------


async def test_debug_workloads_lists_pods_containers_and_host_apps(
    client: tuple[aiohttp.ClientSession, str],
) -> None:
    body = await get_json(client, "/debug/workloads")

    assert body["generation"] == SNAPSHOT.generation
    pods = {p["uid"]: p for p in body["pods"]}
    assert set(pods) == set(SNAPSHOT.pods)
    a = pods[POD_A.uid]
    assert (a["name"], a["namespace"], a["qos"], a["kube_qos"], a["cgroup_dir"]) == (
        POD_A.name,
        POD_A.namespace,
        POD_A.qos.value,
        POD_A.kube_qos.value,
        POD_A.cgroup_dir,
    )
    assert a["containers"][0] == {
        "id": WEB.id,
        "name": WEB.name,
        "runtime": WEB.runtime,
        "cgroup_dir": WEB.cgroup_dir,
    }
    apps = {h["name"]: h for h in body["host_apps"]}
    assert apps[GONE_APP.name]["present"] is False
    assert apps[AGENT.name]["cgroup_dir"] == AGENT.cgroup_dir


async def test_debug_metrics_shows_the_latest_sample_of_every_series_by_entity(
    client: tuple[aiohttp.ClientSession, str], env: Env
) -> None:
    body = await get_json(client, "/debug/metrics")

    pod_entity = s.pod_entity(POD_A.uid)
    ts, value = env.cache.last_sample(s.POD_CPU_USAGE, pod_entity) or (0.0, 0.0)
    assert body["entities"][pod_entity][s.POD_CPU_USAGE] == {
        "value": value,
        "ts": ts,
        "age_s": NOW - ts,
    }
    assert s.POD_MEMORY_USAGE in body["entities"][pod_entity]  # stale values still show here
    assert body["cache"] == env.cache.stats()

    only = await get_json(client, f"/debug/metrics?entity={pod_entity}")
    assert list(only["entities"]) == [pod_entity]


async def test_debug_views_answer_from_snapshots_until_the_inventory_or_the_tick_moves(
    env: Env,
) -> None:
    snapshot = [SNAPSHOT]
    tick = [1]
    deps = dataclasses.replace(
        env.deps(), workloads=lambda: snapshot[0], tick=lambda: tick[0], collect_interval=3600.0
    )
    handle = await start_server(build_app(deps), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:

            async def get(path: str) -> Any:
                async with session.get(f"http://127.0.0.1:{handle.port}{path}") as resp:
                    return await resp.json()

            assert len((await get("/debug/workloads"))["pods"]) == 2
            first = await get("/debug/metrics")
            env.cache.add(s.NODE_CPU_USAGE, s.NODE, NOW, 7.0)
            # Same tick: the full view is the one built at the tick; one entity is read fresh.
            assert await get("/debug/metrics") == first
            node = await get(f"/debug/metrics?entity={s.NODE}")
            assert node["entities"][s.NODE][s.NODE_CPU_USAGE]["value"] == 7.0

            snapshot[0] = dataclasses.replace(SNAPSHOT, pods={POD_A.uid: POD_A}, generation=8)
            tick[0] = 2
            assert [p["uid"] for p in (await get("/debug/workloads"))["pods"]] == [POD_A.uid]
            later = await get("/debug/metrics")
            assert later["entities"][s.NODE][s.NODE_CPU_USAGE]["value"] == 7.0
    finally:
        await handle.stop()


async def test_debug_query_returns_the_window_aggregate(
    client: tuple[aiohttp.ClientSession, str], env: Env
) -> None:
    entity = s.pod_entity(POD_B.uid)
    for k in range(10):
        env.cache.add(s.POD_CPU_USAGE, entity, NOW - 100 + k, float(k))
    env.cache.add(s.POD_CPU_USAGE, entity, NOW - 500, 100.0)  # outside the window

    body = await get_json(
        client, f"/debug/query?metric={s.POD_CPU_USAGE}&entity={entity}&window=200"
    )

    expected = env.cache.aggregate(s.POD_CPU_USAGE, entity, NOW - 200, NOW)
    assert expected is not None
    assert body["window"] == 200
    assert (body["start"], body["end"]) == (NOW - 200, NOW)
    for key in ("count", "avg", "p50", "p90", "p95", "p99", "last", "min", "max"):
        assert body[key] == getattr(expected, key), key


@pytest.mark.parametrize(
    ("query", "complaint"),
    [
        ("entity=node", "metric"),
        ("metric=node_cpu_usage", "entity"),
        ("metric=node_cpu_usage&entity=node&window=abc", "window"),
        ("metric=node_cpu_usage&entity=node&window=-5", "window"),
        ("metric=node_cpu_usage&entity=node&window=inf", "window"),
        ("metric=node_cpu_usage&entity=node&window=86400", "window"),  # past max_query_window
        ("metric=node_cpu_usage&entity=node&step=5", "unknown"),
        ("metric=node_cpu_usage&metric=x&entity=node", "more than once"),
        ("metric=no%20spaces&entity=node", "metric"),
    ],
)
async def test_debug_query_rejects_bad_parameters_with_a_json_400(
    client: tuple[aiohttp.ClientSession, str], query: str, complaint: str
) -> None:
    body = await get_json(client, f"/debug/query?{query}", status=400)

    assert complaint in body["error"]


async def test_debug_query_without_samples_in_the_window_is_a_404(
    client: tuple[aiohttp.ClientSession, str],
) -> None:
    body = await get_json(client, "/debug/query?metric=pod_cpu_usage&entity=pod/nobody", 404)

    assert "no samples" in body["error"]
    assert s.POD_CPU_USAGE in body["known_metrics"]


async def test_debug_tasks_shows_the_supervisor_tasks(
    client: tuple[aiohttp.ClientSession, str], env: Env
) -> None:
    ran = asyncio.Event()

    async def step() -> None:
        ran.set()

    env.supervisor.spawn_loop("collect", step, 60.0, component="collector")
    await ran.wait()

    body = await get_json(client, "/debug/tasks")
    (task,) = body["tasks"]
    assert (task["name"], task["kind"], task["component"], task["interval"]) == (
        "collect",
        "loop",
        "collector",
        60.0,
    )
    assert task["runs"] == 1
    assert task["errors"] == 0


async def test_debug_capabilities_and_config_serve_what_the_daemon_hands_in(
    client: tuple[aiohttp.ClientSession, str], env: Env
) -> None:
    assert await get_json(client, "/debug/capabilities") == env.capabilities
    assert await get_json(client, "/debug/config") == env.config
    index = await get_json(client, "/debug")
    assert "/debug/query" in index["endpoints"]
    assert await get_json(client, "/debug/") == index  # as README and --help write it


async def test_debug_audit_serves_the_newest_entries_filtered(
    client: tuple[aiohttp.ClientSession, str], env: Env
) -> None:
    assert env.audit is not None
    env.audit.record("write", strategy="cpusuppress", path="/c/cpu.cfs_quota_us", new="2000")
    env.audit.record("decision", strategy="memoryevict", old="default/be", dry_run=True)
    env.audit.record("write", strategy="cpuburst", path="/c/cpu.cfs_burst_us", new="100")
    body = await get_json(client, "/debug/audit")
    assert [e["strategy"] for e in body["entries"]] == ["cpuburst", "memoryevict", "cpusuppress"]
    assert body["log"]["recorded"] == 3
    only = await get_json(client, "/debug/audit?strategy=memoryevict")
    assert [(e["kind"], e["dry_run"]) for e in only["entries"]] == [("decision", True)]
    writes = await get_json(client, "/debug/audit?kind=write&limit=1")
    assert [e["strategy"] for e in writes["entries"]] == ["cpuburst"]


@pytest.mark.parametrize(
    "query",
    ["limit=0", "limit=1001", "limit=x", "kind=delete", "strategy=Bad%20Name", "limit=1&limit=2",
     "user=root"],
)  # fmt: skip
async def test_debug_audit_rejects_bad_parameters_with_a_json_400(
    client: tuple[aiohttp.ClientSession, str], query: str
) -> None:
    body = await get_json(client, f"/debug/audit?{query}", 400)
    assert body["error"]


async def test_debug_qos_serves_the_manager_description(
    client: tuple[aiohttp.ClientSession, str], env: Env
) -> None:
    assert await get_json(client, "/debug/qos") == env.qos
    index = await get_json(client, "/debug")
    assert {"/debug/audit", "/debug/qos"} <= set(index["endpoints"])


async def test_debug_runtimehooks_serves_the_hooks_description(env: Env) -> None:
    env.runtimehooks = {"reconciler": {"node_files": {"TerwayQoS": {"files": {}}}}}
    handle = await start_server(build_app(env.deps()), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            client = (session, f"http://127.0.0.1:{handle.port}")
            assert await get_json(client, "/debug/runtimehooks") == env.runtimehooks
            assert "/debug/runtimehooks" in (await get_json(client, "/debug"))["endpoints"]
    finally:
        await handle.stop()
        await env.supervisor.stop(timeout=1.0)


async def test_debug_audit_and_qos_are_404_without_their_sources(env: Env) -> None:
    env.audit, env.qos = None, None
    handle = await start_server(build_app(env.deps()), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            client = (session, f"http://127.0.0.1:{handle.port}")
            assert "no audit log" in (await get_json(client, "/debug/audit", 404))["error"]
            assert "no QoS manager" in (await get_json(client, "/debug/qos", 404))["error"]
            hooks = await get_json(client, "/debug/runtimehooks", 404)
            assert "no runtime hooks" in hooks["error"]
    finally:
        await handle.stop()
        await env.supervisor.stop(timeout=1.0)


async def test_debug_is_read_only(client: tuple[aiohttp.ClientSession, str]) -> None:
    session, base = client
    async with session.post(base + "/debug/tasks") as resp:
        assert resp.status == 405


@pytest.mark.parametrize(
    ("peer", "loopback"),
    [
        (("127.0.0.1", 51000), True),
        (("127.3.2.1", 1), True),
        (("::1", 51000, 0, 0), True),
        (("::ffff:127.0.0.1", 51000, 0, 0), True),
        (("192.0.2.10", 51000), False),
        (("::ffff:192.0.2.10", 51000, 0, 0), False),
        (("fd00::2", 51000, 0, 0), False),
        (("fe80::1%eth0", 51000, 0, 2), False),
        (("localhost", 80), False),  # a name is not an address
        (None, False),
        ("", False),
        ((), False),
    ],
)
def test_the_debug_peer_check_accepts_only_loopback_addresses(peer: object, loopback: bool) -> None:
    assert is_loopback_peer(peer) is loopback


def _non_loopback_ipv4() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family == socket.AF_INET and not addr.address.startswith("127."):
                return str(addr.address)
    return None


@pytest.mark.parametrize("allow_remote", [False, True])
async def test_debug_answers_a_non_loopback_peer_only_when_remote_access_is_allowed(
    env: Env, allow_remote: bool
) -> None:
    address = _non_loopback_ipv4()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    env.debug_allow_remote = allow_remote
    handle = await start_server(build_app(env.deps()), address, 0)
    try:
        async with aiohttp.ClientSession() as session:
            base = f"http://{address}:{handle.port}"
            async with session.get(base + "/debug/tasks") as resp:
                assert resp.status == (200 if allow_remote else 403)
            async with session.get(base + "/healthz") as resp:
                assert resp.status == 200  # probes and /metrics are not restricted
    finally:
        await handle.stop()


def test_docs_metrics_md_documents_every_family_served() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    registry = CollectorRegistry()
    SelfMetrics(registry)
    registry.register(LoopHealth())
    registry.register(LimiterFamilies({}))
    served = [f.name for f in FAMILIES] + [fam.name for fam in registry.collect()]

    missing = [name for name in served if f"`{name}" not in docs]
    assert not missing, f"docs/metrics.md lacks {missing}"
