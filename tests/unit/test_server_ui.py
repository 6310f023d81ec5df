"""``/debug/ui``, ``/debug/summary`` and ``/debug/series`` on a real socket over the real metric
cache; the page's policy and the loopback rule they share with ``/debug``."""

from __future__ import annotations

import base64
import hashlib
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import psutil
import pytest
from prometheus_client import CollectorRegistry

from apis.extension import KubeQOS, QoSClass
from apis.slo_inforce import NodeSLOInForce, node_slo_in_force
from koordlet.config import CollectConfig, KoordletConfig, QoSConfig
from koordlet.metriccache import MetricCache
from koordlet.metriccache import series as s
from koordlet.metriccache.series import Sample, SeriesKey
from koordlet.selfmetrics import Readiness, SelfMetrics
from koordlet.server import ServerDeps, build_app, start_server
from koordlet.server.summary import UiDeps, bucketed, thresholds_of
from koordlet.server.ui import load_page, parse_series_query
from koordlet.statesinformer.model import PodInfo, WorkloadSnapshot
from koordlet.supervisor import Supervisor

NOW = 1_700_000_100.0
GIB = 1 << 30


def pod(uid: str, qos: QoSClass, kube: KubeQOS) -> PodInfo:
    return PodInfo(
        uid=uid,
        name=f"pod-{uid}",
        namespace="ns",
        qos=qos,
        kube_qos=kube,
        cgroup_dir=f"kubepods/pod{uid}",
    )


PODS = {
    "a1": pod("a1", QoSClass.LS, KubeQOS.BURSTABLE),
    "a2": pod("a2", QoSClass.LS, KubeQOS.BURSTABLE),
    "b1": pod("b1", QoSClass.BE, KubeQOS.BESTEFFORT),
    "c1": pod("c1", QoSClass.NONE, KubeQOS.BURSTABLE),
}
SNAPSHOT = WorkloadSnapshot(pods=PODS)
NODE_INFO = {
    "cpus": [{"cpu_id": i, "core_id": i, "socket_id": 0, "numa_node": 0} for i in range(8)],
    "numa": {"0": {"cpus": "0-7", "memory_total_bytes": 16 * GIB}},
}


def filled_cache() -> MetricCache:
    """Ten seconds of one sample a second: node 4 cores, BE allowance 2, pods a1/a2/b1 using
    1, 2 and 0.5 cores (a2 from t-5 on only), memory 1 GiB each; c1 has no samples."""
    cache = MetricCache(clock=lambda: NOW)
    for i in range(10):
        ts = NOW - 9 + i
        rows = [
            (s.NODE_CPU_USAGE, s.NODE, 4.0),
            (s.NODE_MEMORY_USAGE, s.NODE, 6.0 * GIB),
            (s.BE_CPU_REAL_LIMIT, s.BE, 2.0),
            (s.BE_CPU_USAGE, s.BE, 0.5),
            (s.SYSTEM_CPU_USAGE, s.SYSTEM, 0.5),
            (s.POD_CPU_USAGE, s.pod_entity("a1"), 1.0),
            (s.POD_CPU_USAGE, s.pod_entity("b1"), 0.5),
            (s.POD_MEMORY_USAGE, s.pod_entity("a1"), float(GIB)),
            (s.POD_MEMORY_USAGE, s.pod_entity("b1"), float(GIB)),
        ]
        if i >= 5:
            rows.append((s.POD_CPU_USAGE, s.pod_entity("a2"), 2.0))
        cache.append(ts, [Sample(SeriesKey(m, e), v) for m, e, v in rows])
    cache.set_info("node_info", NODE_INFO)
    return cache


def in_force(
    threshold: dict[str, object], previous: NodeSLOInForce | None = None
) -> NodeSLOInForce:
    """The NodeSLO in force after a spec holding only ``resourceUsedThresholdWithBE``."""
    doc = {"resourceUsedThresholdWithBE": threshold}
    return node_slo_in_force(doc, source="test", strict=False, now=NOW, previous=previous)


class Env:
    def __init__(self) -> None:
        self.cache = filled_cache()
        self.slo = in_force(
            {"enable": True, "cpuSuppressThresholdPercent": 50, "memoryEvictThresholdPercent": 75}
        )
        self.config = KoordletConfig(
            node_name="node-a",
            standalone=True,
            collect=CollectConfig(res_used_interval=1.0),
            qos=QoSConfig(dry_run_strategies=frozenset({"memoryevict"})),
        )
        registry = CollectorRegistry()
        self.metrics = SelfMetrics(registry, node_name="node-a", version="0")
        self.registry = registry
        self.allow_remote = False
        self.thresholds = thresholds_of(lambda: self.slo)

    def deps(self) -> tuple[ServerDeps, UiDeps]:
        deps = ServerDeps(
            registry=self.registry,
            readiness=Readiness(("server",), metrics=self.metrics),
            cache=self.cache,
            workloads=lambda: SNAPSHOT,
            capabilities=dict,
            config=dict,
            tasks=Supervisor(self.metrics).describe,
            debug_allow_remote=self.allow_remote,
            max_query_window=3600.0,
            clock=lambda: NOW,
        )
        ui = UiDeps(
            config=self.config,
            thresholds=self.thresholds,
            node_info=lambda: self.cache.get_info("node_info"),
            points=self.cache.points,
        )
        return deps, ui


@pytest.fixture
def env() -> Env:
    return Env()


@pytest.fixture
async def client(env: Env) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    handle = await start_server(build_app(*env.deps()), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            yield session, f"http://127.0.0.1:{handle.port}"
    finally:
        await handle.stop()


async def get_json(client: tuple[aiohttp.ClientSession, str], path: str, status: int = 200) -> Any:
    session, base = client
    async with session.get(base + path) as resp:
        assert resp.status == status, await resp.text()
        return await resp.json()


# /debug/summary ------------------------------------------------------------------------------


async def test_summary_reports_capacity_usage_allowance_thresholds_and_classes(
    client: tuple[aiohttp.ClientSession, str],
) -> None:
    got = await get_json(client, "/debug/summary")
    assert got["node"] == "node-a"
    assert got["mode"] == "standalone"
    assert got["dry_run"] == {"all": False, "strategies": ["memoryevict"]}
    assert got["capacity"] == {"cpu_cores": 8, "memory_bytes": 16 * GIB}
    assert got["usage"]["node_cpu_cores"] == 4.0
    assert got["be"]["cpu_allowance_cores"] == 2.0
    th = got["thresholds"]
    assert th["enable"] is True
    assert th["cpu_suppress_threshold_cores"] == 4.0  # 50 % of 8 CPUs
    assert th["memory_evict_threshold_bytes"] == 12 * GIB  # 75 % of 16 GiB
    assert th["cpu_suppress_policy"] == "cpuset"  # Koordinator's default, merged in
    assert got["classes"] == {
        "LS": {"pods": 2, "cpu_cores": 3.0, "memory_bytes": float(GIB), "unmeasured": 0},
        "BE": {"pods": 1, "cpu_cores": 0.5, "memory_bytes": float(GIB), "unmeasured": 0},
        "unknown": {"pods": 1, "cpu_cores": 0.0, "memory_bytes": 0.0, "unmeasured": 1},
    }


async def test_summary_reports_a_stale_value_as_null_not_zero(env: Env) -> None:
    env.cache = filled_cache()
    deps, ui = env.deps()
    deps = replace(deps, clock=lambda: NOW + 3.5)  # the last sample is 3.5 intervals old
    handle = await start_server(build_app(deps, ui), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            got = await get_json((session, f"http://127.0.0.1:{handle.port}"), "/debug/summary")
    finally:
        await handle.stop()
    assert got["usage"]["node_cpu_cores"] is None
    assert got["be"]["cpu_allowance_cores"] is None
    assert got["classes"]["LS"]["unmeasured"] == 2


async def test_a_rejected_nodeslo_section_is_named_and_the_last_good_values_stay(
    env: Env, client: tuple[aiohttp.ClientSession, str]
) -> None:
    assert (await get_json(client, "/debug/summary"))["thresholds"]["nodeslo_rejected"] == ""
    env.slo = in_force({"cpuSuppressThresholdPercent": 150}, previous=env.slo)
    th = (await get_json(client, "/debug/summary"))["thresholds"]
    assert "cpuSuppressThresholdPercent" in th["nodeslo_rejected"]
    assert th["cpu_suppress_threshold_percent"] == 50


# /debug/series -------------------------------------------------------------------------------


async def test_series_of_one_entity_in_one_second_buckets(
    client: tuple[aiohttp.ClientSession, str],
) -> None:
    got = await get_json(client, "/debug/series?metric=node_cpu_usage&entity=node&window=5&step=1")
    assert got["step"] == 1.0
    assert got["start"] == NOW - 5
    assert got["series"] == {"node": [[NOW - 5 + i, 4.0] for i in range(6)]}
    assert got["members"] == {"node": 1}


async def test_series_grouped_by_qos_sums_the_pods_of_each_class(
    client: tuple[aiohttp.ClientSession, str],
) -> None:
    got = await get_json(client, "/debug/series?metric=pod_cpu_usage&group=qos&window=9&step=3")
    # Buckets [NOW-9, NOW-6), [NOW-6, NOW-3), [NOW-3, NOW]: a2 (2 cores) joins at NOW-4, so the
    # middle bucket holds its mean over its own samples there, summed with a1's.
    assert got["series"]["LS"] == [[NOW - 7, 1.0], [NOW - 4, 3.0], [NOW - 1, 3.0], [NOW, 3.0]]
    assert got["series"]["BE"] == [[NOW - 7, 0.5], [NOW - 4, 0.5], [NOW - 1, 0.5], [NOW, 0.5]]
    assert got["members"] == {"LS": 2, "BE": 1, "unknown": 1}
    assert got["series"]["unknown"] == []


def test_two_calls_agree_on_the_buckets_they_share() -> None:
    cache = filled_cache()
    whole = bucketed(["node"], s.NODE_CPU_USAGE, cache.points, NOW - 9, NOW, 2.0)
    tail = bucketed(["node"], s.NODE_CPU_USAGE, cache.points, NOW - 4, NOW, 2.0)
    assert whole[-len(tail) :] == tail
    assert len(tail) < len(whole)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("metric=node_cpu_usage", "exactly one of entity"),
        ("metric=node_cpu_usage&entity=node&group=qos", "exactly one of entity"),
        ("metric=pod_cpu_usage&group=class", "group must be one of qos"),
        ("metric=x y&entity=node", "metric must be a series name"),
        ("metric=a&entity=node&window=0", "window must be in"),
        ("metric=a&entity=node&window=7200", "window must be in"),
        ("metric=a&entity=node&step=nan", "step must be in"),
        ("metric=a&entity=node&window=600&step=0.1", "more than 2000 points"),
        ("metric=a&entity=node&entity=be", "given more than once"),
        ("metric=a&entity=node&limit=3", "unknown parameter"),
    ],
)
async def test_series_rejects_bad_parameters_with_a_json_400(
    client: tuple[aiohttp.ClientSession, str], query: str, message: str
) -> None:
    got = await get_json(client, "/debug/series?" + query, status=400)
    assert message in got["error"]


def test_the_series_parser_defaults_the_window_and_leaves_the_step_to_the_server() -> None:
    assert parse_series_query([("metric", "m"), ("group", "qos")], 3600) == (
        "m",
        None,
        "qos",
        600.0,
        None,
    )


# /debug/ui -----------------------------------------------------------------------------------


async def test_the_page_is_served_with_a_policy_allowing_only_its_own_inline_code(
    client: tuple[aiohttp.ClientSession, str],
) -> None:
    session, base = client
    async with session.get(base + "/debug/ui") as resp:
        assert resp.status == 200
        assert resp.content_type == "text/html"
        csp = resp.headers["Content-Security-Policy"]
        page = await resp.text()
    assert resp.headers["Cache-Control"] == "no-store"
    policy = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert policy["default-src"] == "'none'"
    assert policy["connect-src"] == "'self'"
    for tag in ("script", "style"):
        (body,) = re.findall(rf"<{tag}>(.*?)</{tag}>", page, re.DOTALL)
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        assert policy[f"{tag}-src"] == f"'sha256-{digest}'"
    # Nothing from elsewhere: no URL with a scheme or host, no script or stylesheet by src/href.
    assert not re.search(r"(https?:)?//[\w.-]+\.\w", page.replace("http://www.w3.org", ""))
    assert not re.search(r"<(script|link)[^>]+(src|href)=\"(?!data:)", page)


def test_the_page_and_its_policy_come_from_the_package() -> None:
    page, csp = load_page()
    assert page.startswith(b"<!doctype html>")
    assert csp.count("sha256-") == 2


async def test_the_debug_index_lists_the_ui_endpoints(
    client: tuple[aiohttp.ClientSession, str],
) -> None:
    endpoints = (await get_json(client, "/debug"))["endpoints"]
    assert {"/debug/ui", "/debug/summary", "/debug/series"} <= set(endpoints)


async def test_without_ui_deps_there_is_no_ui(env: Env) -> None:
    deps, _ = env.deps()
    handle = await start_server(build_app(deps), "127.0.0.1", 0)
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{handle.port}/debug/ui") as resp,
        ):
            assert resp.status == 404
    finally:
        await handle.stop()


def _non_loopback_ipv4() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family == socket.AF_INET and not addr.address.startswith("127."):
                return str(addr.address)
    return None


@pytest.mark.parametrize(
    "path", ["/debug/ui", "/debug/summary", "/debug/series?metric=a&group=qos"]
)
async def test_the_ui_is_answered_to_loopback_peers_only(env: Env, path: str) -> None:
    address = _non_loopback_ipv4()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    handle = await start_server(build_app(*env.deps()), address, 0)
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{address}:{handle.port}{path}") as resp,
        ):
            assert resp.status == 403
    finally:
        await handle.stop()
