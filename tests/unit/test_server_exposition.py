"""The /metrics bodies: written as prometheus-client writes them, built once per tick.

The other side of the format is prometheus-client's own encoders and parsers (the reference
implementation the Prometheus project maintains for Python): the fast renderer must produce what
its ``generate_latest`` produces for the exporter's families, byte for byte, and every body must
parse with its parsers. The metric cache is the real one, on an injected clock.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.utils import floatToGoString

from apis.extension import KubeQOS, QoSClass
from koordlet.metriccache import series as s
from koordlet.metriccache.series import Sample, SeriesKey
from koordlet.metriccache.store import MetricCache
from koordlet.selfmetrics import Readiness, SelfMetrics
from koordlet.server import KoordletExporter, ServerDeps, build_app, start_server
from koordlet.server.app import EXPOSITION
from koordlet.server.exposition import Exposition
from koordlet.server.render import FamilyRenderer
from koordlet.server.textformat import (
    Format,
    accepts_gzip,
    content_type,
    format_value,
    negotiate,
)
from koordlet.statesinformer.model import ContainerInfo, HostAppInfo, PodInfo, WorkloadSnapshot

NOW = 1_700_000_000.0
NODE = "node-a"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def pod(i: int, *, name: str = "", namespace: str = "shop") -> PodInfo:
    uid = f"uid-{i:04d}"
    containers = tuple(
        ContainerInfo(
            id=f"{i:04d}{c}".ljust(64, "c"),
            name=f"c{c}",
            runtime="containerd" if c else "unknown",
            cgroup_dir=f"kubepods/pod{uid}/{c}",
        )
        for c in range(2)
    )
    return PodInfo(
        uid=uid,
        name=name or f"web-{i}",
        namespace=namespace,
        qos=QoSClass.BE if i % 2 else QoSClass.LS,
        kube_qos=KubeQOS.BURSTABLE,
        cgroup_dir=f"kubepods/pod{uid}",
        containers=containers,
    )


PODS = [
    pod(0),
    pod(1),
    pod(2, name='we"ird\\name', namespace="line\nbreak"),  # every escaped character
    pod(3, namespace="a"),
]
SNAPSHOT = WorkloadSnapshot(
    pods={p.uid: p for p in PODS},
    host_apps=(
        HostAppInfo(name="agent", qos=QoSClass.LS, cgroup_dir="host/agent", priority_class="p"),
        HostAppInfo(name="gone", qos=QoSClass.BE, cgroup_dir="host/gone", present=False),
    ),
    generation=3,
)


def filled(clock: Clock) -> MetricCache:
    """A cache with a value of most kinds of family: node, NUMA, pods, containers, host apps,
    resctrl, PSI with and without ``full`` lines, a stale series and a CPI value."""
    cache = MetricCache(clock=clock)
    samples: list[Sample] = [
        Sample(SeriesKey(s.NODE_CPU_USAGE, s.NODE), 3.25),
        Sample(SeriesKey(s.NODE_MEMORY_USAGE, s.NODE), 12_345_678_901.0),
        Sample(SeriesKey(s.BE_CPU_USAGE, s.BE), 0.5),
        Sample(SeriesKey(s.NUMA_MEMORY_USAGE, s.numa_entity(1)), 2e9),
        Sample(SeriesKey(s.NUMA_MEMORY_USAGE, s.numa_entity(0)), 1e9),
        Sample(SeriesKey(s.HOST_APP_CPU_USAGE, s.host_app_entity("agent")), 0.125),
        Sample(SeriesKey(s.HOST_APP_MEMORY_USAGE, s.host_app_entity("agent")), 3e8),
        Sample(SeriesKey(s.RESCTRL_DOMAIN_LLC_OCCUPANCY, s.resctrl_domain_entity("LS", 1)), 4096),
        Sample(SeriesKey(s.RESCTRL_DOMAIN_LLC_OCCUPANCY, s.resctrl_domain_entity("BE", 0)), 8192),
        Sample(SeriesKey(s.psi_full_supported_series("cpu"), s.NODE), 0.0),
        Sample(SeriesKey(s.psi_series("cpu", "some", "avg10"), s.NODE), 1.5),
    ]
    for i, p in enumerate(PODS):
        entity = s.pod_entity(p.uid)
        samples += [
            Sample(SeriesKey(s.POD_CPU_USAGE, entity), 0.25 * i),
            Sample(SeriesKey(s.POD_MEMORY_USAGE, entity), 1e8 * (i + 1)),
            Sample(SeriesKey(s.psi_full_supported_series("mem"), entity), float(i % 2)),
            Sample(SeriesKey(s.psi_series("mem", "some", "avg60"), entity), 2.0 + i),
            Sample(SeriesKey(s.psi_series("mem", "full", "avg60"), entity), 1.0 + i),
        ]
        for c in p.containers:
            centity = s.container_entity(p.uid, c.id)
            samples += [
                Sample(SeriesKey(s.CONTAINER_CPU_USAGE, centity), 0.1 * (i + 1)),
                Sample(SeriesKey(s.CONTAINER_CPU_THROTTLED_RATIO, centity), 0.0),
            ]
    first = s.container_entity(PODS[0].uid, PODS[0].containers[0].id)
    samples.append(Sample(SeriesKey(s.CONTAINER_CPI_CYCLES, first), 1.5e9))
    cache.append(NOW - 10.0, [Sample(SeriesKey(s.SYSTEM_CPU_USAGE, s.SYSTEM), 0.4)])  # stale
    cache.append(NOW - 1.0, samples)
    return cache


def exporter_for(cache: MetricCache, clock: Clock) -> KoordletExporter:
    return KoordletExporter(
        cache, lambda: SNAPSHOT, node_name=NODE, collect_interval=1.0, clock=clock
    )


@pytest.fixture
def clock() -> Clock:
    return Clock(NOW)


@pytest.mark.parametrize("fmt", list(Format))
def test_the_renderer_writes_what_prometheus_client_writes_for_the_exporter(
    fmt: Format, clock: Clock
) -> None:
    exporter = exporter_for(filled(clock), clock)
    registry = CollectorRegistry()
    registry.register(exporter)
    if fmt is Format.TEXT:
        reference = generate_latest(registry).decode()
    else:
        reference = generate_openmetrics(registry).decode().removesuffix("# EOF\n")

    rendered = FamilyRenderer(exporter).render(fmt)

    assert rendered == reference
    assert 'pod_name="we\\"ird\\\\name",pod_namespace="line\\nbreak"' in rendered
    assert "koordlet_node_used_memory_bytes{" in rendered
    assert "koordlet_container_cpi{" in rendered
    assert "koordlet_system_used_cpu_cores{" not in rendered  # stale


def test_the_renderer_follows_a_new_snapshot_and_leaves_out_what_went_stale(
    clock: Clock,
) -> None:
    cache = filled(clock)
    current = [SNAPSHOT]
    exporter = KoordletExporter(
        cache, lambda: current[0], node_name=NODE, collect_interval=1.0, clock=clock
    )
    renderer = FamilyRenderer(exporter)
    assert "uid-0003" in renderer.render(Format.TEXT)

    current[0] = WorkloadSnapshot(pods={PODS[0].uid: PODS[0]}, generation=4)
    text = renderer.render(Format.TEXT)
    assert "uid-0003" not in text
    assert "uid-0000" in text

    clock.now = NOW + 5.0  # every value is now 6 s old: more than 3 intervals
    assert "koordlet_pod_used_cpu_cores{" not in renderer.render(Format.TEXT)


def registry_with_counter() -> CollectorRegistry:
    registry = CollectorRegistry()
    SelfMetrics(registry, node_name=NODE, version="1.0")
    Counter("koordlet_example", "An example counter.", registry=registry).inc()
    return registry


def test_the_text_body_has_no_created_series_and_openmetrics_keeps_them(clock: Clock) -> None:
    exporter = exporter_for(filled(clock), clock)
    exposition = Exposition(
        registry_with_counter(), FamilyRenderer(exporter), generation=lambda: 1, max_age=1.0
    )

    text = exposition.body(Format.TEXT, gzipped=False).decode()
    om = exposition.body(Format.OPENMETRICS, gzipped=False).decode()

    assert "_created" not in text
    text_families = {f.name: f for f in parse_text(text)}
    assert text_families["koordlet_example"].samples[0].value == 1.0
    assert text_families["koordlet_node_used_cpu_cores"].samples[0].value == 3.25
    assert om.endswith("# EOF\n")
    assert om.count("# EOF") == 1
    om_families = {f.name: f for f in parse_openmetrics(om)}
    example = {smp.name for smp in om_families["koordlet_example"].samples}
    assert example == {"koordlet_example_total", "koordlet_example_created"}
    assert om_families["koordlet_node_used_cpu_cores"].samples[0].value == 3.25


def test_a_body_is_built_once_a_tick_and_again_when_the_tick_moves_or_it_ages(
    clock: Clock,
) -> None:
    tick = [1]
    monotonic = Clock(100.0)
    exporter = exporter_for(filled(clock), clock)
    exposition = Exposition(
        registry_with_counter(),
        FamilyRenderer(exporter),
        generation=lambda: tick[0],
        max_age=1.0,
        clock=monotonic,
    )

    first = exposition.body(Format.TEXT, gzipped=False)
    for _ in range(20):
        assert exposition.body(Format.TEXT, gzipped=False) is first
    zipped = exposition.body(Format.TEXT, gzipped=True)
    assert gzip.decompress(zipped) == first
    assert exposition.body(Format.TEXT, gzipped=True) is zipped
    assert exposition.builds == 1

    tick[0] = 2
    assert exposition.body(Format.TEXT, gzipped=True) is not zipped
    assert exposition.builds == 2
    monotonic.now += 1.0  # no tick for one interval: rebuilt all the same
    exposition.body(Format.TEXT, gzipped=True)
    assert exposition.builds == 3


async def test_a_stale_body_is_dropped_so_nothing_is_held_between_scrapes(clock: Clock) -> None:
    exposition = Exposition(
        registry_with_counter(),
        FamilyRenderer(exporter_for(filled(clock), clock)),
        generation=lambda: 1,
        max_age=0.01,
    )
    exposition.body(Format.OPENMETRICS, gzipped=True)
    assert exposition.held() == [Format.OPENMETRICS]
    async with asyncio.timeout(5.0):
        while exposition.held():  # noqa: ASYNC110 - the drop is a timer of the running loop
            await asyncio.sleep(0.005)


def test_a_registry_family_named_like_an_exporter_family_is_refused(clock: Clock) -> None:
    registry = CollectorRegistry()
    Gauge("koordlet_node_used_cpu_cores", "A clash.", registry=registry)
    renderer = FamilyRenderer(exporter_for(filled(clock), clock))
    with pytest.raises(ValueError, match="koordlet_node_used_cpu_cores"):
        Exposition(registry, renderer, generation=lambda: 0, max_age=1.0)


PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,"
    "*/*;q=0.1"
)


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (PROMETHEUS_2, Format.OPENMETRICS),  # Prometheus 2.x's default scrape protocols
        (PROMETHEUS_3, Format.OPENMETRICS),  # Prometheus 3.x's
        ("", Format.TEXT),
        ("*/*", Format.TEXT),
        ("text/plain", Format.TEXT),
        ("text/plain;version=0.0.4", Format.TEXT),
        ("application/openmetrics-text", Format.OPENMETRICS),
        ("application/openmetrics-text; version=0.0.1", Format.OPENMETRICS),
        ("application/openmetrics-text;q=0.4, text/plain;q=0.9", Format.TEXT),
        ("application/openmetrics-text;q=0, */*", Format.TEXT),
        ("application/openmetrics-text;version=2.0.0, text/plain;q=0.1", Format.TEXT),
        ("application/json", Format.TEXT),
        ("garbage;;;q=x,,", Format.TEXT),
    ],
)
def test_accept_is_negotiated_by_q_value(accept: str, expected: Format) -> None:
    assert negotiate(accept) is expected


@pytest.mark.parametrize(
    ("accept_encoding", "gzipped"),
    [
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("br;q=1.0, gzip;q=0.5", True),
        ("*", True),
        ("gzip;q=0", False),
        ("*;q=0", False),
        ("identity", False),
        ("", False),
        ("gzip;q=0, *;q=1", False),  # an explicit refusal wins over the wildcard
    ],
)
def test_accept_encoding_allows_gzip_only_with_a_positive_q(
    accept_encoding: str, gzipped: bool
) -> None:
    assert accepts_gzip(accept_encoding) is gzipped


# Over HTTP -------------------------------------------------------------------------------------


@pytest.fixture
async def served(clock: Clock) -> AsyncIterator[tuple[str, Exposition]]:
    registry = registry_with_counter()
    metrics = SelfMetrics(CollectorRegistry())
    readiness = Readiness(("only",), metrics=metrics)
    cache = filled(clock)
    deps = ServerDeps(
        registry=registry,
        readiness=readiness,
        cache=cache,
        workloads=lambda: SNAPSHOT,
        capabilities=dict,
        config=dict,
        tasks=list,
        exporter=exporter_for(cache, clock),
        clock=clock,
    )
    app = build_app(deps)
    handle = await start_server(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{handle.port}", app[EXPOSITION]
    finally:
        await handle.stop()


async def test_metrics_serves_the_negotiated_format_gzipped_from_one_build(
    served: tuple[str, Exposition],
) -> None:
    base, exposition = served
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        bodies = []
        for _ in range(10):
            headers = {"Accept": PROMETHEUS_2, "Accept-Encoding": "gzip"}
            async with session.get(base + "/metrics", headers=headers) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"] == content_type(Format.OPENMETRICS)
                assert resp.headers["Content-Encoding"] == "gzip"
                assert "Accept-Encoding" in resp.headers["Vary"]
                bodies.append(await resp.read())
        async with session.get(base + "/metrics", headers={"Accept-Encoding": "identity"}) as resp:
            assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert "Content-Encoding" not in resp.headers
            text = (await resp.read()).decode()
        async with session.head(base + "/metrics") as resp:
            assert resp.status == 200
            assert await resp.read() == b""

    assert len(set(bodies)) == 1
    om = gzip.decompress(bodies[0]).decode()
    assert om.endswith("# EOF\n")
    assert {f.name for f in parse_openmetrics(om)} >= {"koordlet_node_used_cpu_cores"}
    assert "_created" not in text
    assert exposition.builds == 2  # one OpenMetrics body, one text body, for 12 requests


@pytest.mark.parametrize(
    "value",
    [0.0, -0.0, 0.25, 1.0, 3.0, 123456.0, 1234567.0, 12_345_678_901.0, 1.5e9, 1e16, 1e22, 2.5e-7,
     -1234567.0, -3.5, 7e-300, float("inf"), float("-inf"), float("nan")],
)  # fmt: skip
def test_values_are_written_as_prometheus_client_writes_them(value: float) -> None:
    assert format_value(value) == floatToGoString(value)
