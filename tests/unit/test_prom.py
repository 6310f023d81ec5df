"""koordlet.prom against prometheus-client itself: the same operations on the same instruments give
the same samples, and both encoders write the same bytes for the same families (the text format
without prometheus-client's ``_created`` gauges, as the koordlet has always served it)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import prometheus_client
import pytest
from prometheus_client import metrics_core as pm
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.utils import floatToGoString

from koordlet import prom
from koordlet.prom.encode import encode_openmetrics, encode_text
from koordlet.prom.textvalue import go_float

NOW = 1_700_000_000.25


def exercise(lib: Any, registry: Any) -> None:
    """The same instruments and operations, on prometheus-client (``lib``) or ours."""
    steps = lib.Histogram(
        "koordlet_step_duration_seconds",
        'Duration of one step, "quoted" and \\ back-slashed\nover two lines.',
        ("component", "name"),
        buckets=(0.001, 0.01, 0.1, 1.0),
        registry=registry,
    )
    for seconds in (0.0005, 0.002, 0.05, 0.05, 3.0):
        steps.labels("collector", "podresource").observe(seconds)
    steps.labels(component="qos", name="cpuburst").observe(0.2)
    errors = lib.Counter("koordlet_step_errors_total", "Steps that raised.", ("component",),
                         registry=registry)  # fmt: skip
    errors.labels("collector").inc()
    errors.labels("qos").inc(2.5)
    plain = lib.Counter("koordlet_nodeslo_file_errors", "Unlabelled.", registry=registry)
    plain.inc()
    ready = lib.Gauge("koordlet_ready", "1 once ready.", registry=registry)
    ready.set(1)
    start = lib.Gauge("koordlet_start_time", "Start.", ("node",), registry=registry)
    start.labels('node "a"\\b\nc').set(1.7e9)
    start.labels("inf").set(math.inf)
    info = lib.Info("koordlet_build", "Version.", registry=registry)
    info.info({"version": "0.1.0", "python_version": "3.11.7"})


class Families:
    """A collector of custom families, built with ``lib``'s family classes."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    def collect(self) -> Iterator[Any]:
        lib = self.lib
        gauge = lib.GaugeMetricFamily("koordlet_qos_cpu_suppress_cores", "Cores.", labels=["pool"])
        gauge.add_metric(["be"], 1.5)
        gauge.add_metric(["ls"], 12345678.5)
        yield gauge
        counter = lib.CounterMetricFamily("koordlet_evictions", "Evictions.", labels=["reason"])
        counter.add_metric(["memory"], 3, created=NOW)
        counter.add_metric(["cpu"], 0)
        yield counter
        unknown = lib.UnknownMetricFamily("koordlet_unknown", "Untyped.", value=-2.0)
        yield unknown
        yield lib.GaugeMetricFamily("koordlet_nan", "NaN.", value=math.nan)


class WithoutCreated:
    """prometheus-client's registry minus its ``_created`` samples (the text format we serve)."""

    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[pm.Metric]:
        for metric in self.registry.collect():
            kept = pm.Metric(metric.name, metric.documentation, metric.type, metric.unit)
            kept.samples = [s for s in metric.samples if s.name != metric.name + "_created"]
            yield kept


@pytest.fixture
def both() -> tuple[prometheus_client.CollectorRegistry, prom.CollectorRegistry]:
    theirs = prometheus_client.CollectorRegistry()
    ours = prom.CollectorRegistry()
    with mock.patch("time.time", return_value=NOW):
        exercise(prometheus_client, theirs)
        exercise(prom, ours)
    theirs.register(Families(pm))
    ours.register(Families(prom))
    return theirs, ours


def test_the_same_operations_give_the_same_samples(
    both: tuple[prometheus_client.CollectorRegistry, prom.CollectorRegistry],
) -> None:
    theirs, ours = both
    expected = [(m.name, m.type, [tuple(s)[:4] for s in m.samples]) for m in theirs.collect()]
    got = [(m.name, m.type, [tuple(s)[:4] for s in m.samples]) for m in ours.collect()]

    assert _nan_safe(got) == _nan_safe(expected)
    assert (
        ours.get_sample_value(
            "koordlet_step_duration_seconds_bucket",
            {"component": "collector", "name": "podresource", "le": "0.01"},
        )
        == 2
    )


def test_the_text_format_is_byte_for_byte_prometheus_clients_without_created_gauges(
    both: tuple[prometheus_client.CollectorRegistry, prom.CollectorRegistry],
) -> None:
    theirs, ours = both
    assert encode_text(ours.collect()) == generate_latest(WithoutCreated(theirs)).decode()


def test_openmetrics_is_byte_for_byte_prometheus_clients(
    both: tuple[prometheus_client.CollectorRegistry, prom.CollectorRegistry],
) -> None:
    theirs, ours = both
    expected = generate_openmetrics(theirs).decode().removesuffix("# EOF\n")
    assert encode_openmetrics(ours.collect()) == expected


def test_families_of_either_library_are_collected_and_encoded_by_the_other() -> None:
    theirs = prometheus_client.CollectorRegistry()
    ours = prom.CollectorRegistry()
    theirs.register(Families(prom))
    ours.register(Families(pm))
    with mock.patch("time.time", return_value=NOW):
        prom.Counter("koordlet_x", "ours in theirs", registry=theirs).inc()
        prometheus_client.Counter("koordlet_y", "theirs in ours", registry=ours).inc()

    assert generate_openmetrics(theirs).decode().removesuffix("# EOF\n") == encode_openmetrics(
        theirs.collect()
    )
    assert encode_openmetrics(ours.collect()) == generate_openmetrics(ours).decode().removesuffix(
        "# EOF\n"
    )


def test_a_series_name_another_instrument_produces_is_refused() -> None:
    registry = prom.CollectorRegistry()
    prom.Counter("koordlet_dup", "first", registry=registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        prom.Gauge("koordlet_dup_total", "second", registry=registry)


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: prom.Counter("c", "d").inc(-1), "non-negative"),
        (lambda: prom.Counter("c", "d", ("a",)).inc(), "missing label values"),
        (lambda: prom.Gauge("g", "d", ("a", "b")).labels("x"), "Incorrect label count"),
        (lambda: prom.Histogram("h", "d", buckets=(2.0, 1.0)), "sorted order"),
        (lambda: prom.Gauge("bad-name", "d"), "Invalid metric name"),
    ],
    ids=["negative", "no-labels", "label-count", "buckets", "name"],
)
def test_misuse_is_refused_as_prometheus_client_refuses_it(
    make: Callable[[], object], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        make()


@pytest.mark.parametrize(
    "value", [0.0, -0.0, 1.0, 0.25, 1e-9, 123456.0, 1234567.0, 1.5e9, 12345678901.5, 1e300, -1e300]
)
def test_values_are_written_as_prometheus_clients_float_to_go_string(value: float) -> None:
    assert go_float(value) == floatToGoString(value)


def _nan_safe(rows: list[Any]) -> list[Any]:
    """NaN != NaN: compare it as its text."""
    return [
        (n, t, [(s[0], s[1], "NaN" if s[2] != s[2] else s[2], s[3]) for s in samples])
        for n, t, samples in rows
    ]
