"""``packaging/grafana/koordlet.json``: Grafana's dashboard schema, a sound layout, and queries
that name only what a live koordlet exports.

No Grafana server can be installed here (Debian bookworm does not package it and PyPI has none),
so the dashboard is validated against Grafana's own dashboard JSON schema (v1, schemaVersion
36+): ``tests/golden/grafana/dashboard.jsonschema.json``, from the Grafana Foundation SDK (see
``tests/golden/README.md``). The PromQL check starts the real ``koordlet`` on a 200-pod fake tree
(``bench/_trees.py``) with the strategies that export metrics switched on, scrapes ``/metrics``,
and compares every expression's metric names with the families it served.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench._trees import fake_tree
from koordlet.server.exporter import FAMILIES
from tests.daemon import free_port
from tests.ui.promql import PromQLShapeError, uses

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "packaging" / "grafana" / "koordlet.json"
SCHEMA = ROOT / "tests" / "golden" / "grafana" / "dashboard.jsonschema.json"
ALERT_RULES = ROOT / "packaging" / "prometheus" / "koordlet-alerts.yaml"
SCRIPT = Path(sys.executable).parent / "koordlet"
CORE_PANELS = {"row", "timeseries", "stat", "table"}
"""Panel types of the dashboard: Grafana's built-in ones, no plugin to install."""
TARGET_LABELS = {"instance", "job", "namespace", "pod", "service", "endpoint", "container"}
"""Labels Prometheus (and its operator's monitors) add to every scraped series."""
LABEL_VALUES = re.compile(r"label_values\((\w+)\s*,\s*(\w+)\)")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created"),
}
NO_SAMPLES_ON_A_FAKE_NODE = {
    "koordlet_container_scaled_cfs_burst_us": "no container has a CFS quota to burst",
    "koordlet_container_scaled_cfs_quota_us": "no container has a CFS quota to scale",
    "koordlet_pod_eviction": "evictions are dry runs here (nothing is killed)",
}
"""Families that the daemon serves without samples on the fake node; their selectors may only
test ``node``, the label docs/metrics.md gives them."""
NO_SAMPLES_IN_A_HEALTHY_RUN = {
    "koordlet_task_restarts_total": "no eternal task failed",
    "koordlet_step_errors_total": "no step failed",
    "koordlet_step_skipped_ticks_total": "no step overran its interval",
    "koordlet_pod_psi": "the fake tree's cgroups have no PSI files",
}
"""Families the live koordlet serves without samples for other reasons: their panels' queries
are evaluated (they must be valid) but cannot return data."""


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def all_panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def expressions(board: dict[str, Any]) -> list[tuple[str, str]]:
    """``(where, PromQL)`` of every query: panel targets and query variables."""
    out = [
        (f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"])
        for p in all_panels(board)
        for t in p.get("targets", [])
    ]
    for v in board["templating"]["list"]:
        if v["type"] == "query":
            # Grafana's label_values(SELECTOR, LABEL): the selector is PromQL, LABEL a label of it.
            m = LABEL_VALUES.fullmatch(v["query"])
            expr = f"{m.group(1)}{{{m.group(2)}!=''}}" if m else v["query"]
            out.append((f"variable {v['name']}", expr))
    return out


# Grafana's schema and the layout ------------------------------------------------------------


def test_the_dashboard_is_valid_against_grafanas_dashboard_schema() -> None:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft7Validator.check_schema(schema)
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(dashboard())
    ]
    assert errors == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("panels", 1, "gridPos", "w"), 25),
        (("panels", 1, "fieldConfig", "defaults", "color", "mode"), "rainbow"),
        (("graphTooltip",), 3),
        (("panels", 1, "titel"), "typo"),
    ],
    ids=["too-wide", "unknown-colour-mode", "unknown-tooltip", "unknown-field"],
)
def test_the_schema_rejects_what_grafana_would(path: tuple[Any, ...], value: Any) -> None:
    """The validator is not a formality: each of these mistakes is caught."""
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    broken = copy.deepcopy(dashboard())
    node: Any = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert list(jsonschema.Draft7Validator(schema).iter_errors(broken))


def test_panels_tile_the_grid_without_overlap_and_use_the_datasource_variable() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in all_panels(board)]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], int] = {}
    for p in all_panels(board):
        assert p["type"] in CORE_PANELS, p["type"]
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24, p["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps panel {cells[(x, y)]}"
                cells[(x, y)] = p["id"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        assert all(t["datasource"] == p["datasource"] for t in p["targets"])
        assert p.get("description"), f"{p['title']!r} says nothing about what it shows"


def test_the_dashboard_covers_what_operators_asked_for() -> None:
    """Node usage against the BE allowance, suppress and burst decisions, evictions by reason,
    pressure and throttling by class, collection health (the protective loops' too)."""
    used = set().union(*(uses(e).metrics for _, e in expressions(dashboard())))
    assert {
        "koordlet_node_used_cpu_cores",
        "koordlet_be_cpu_real_limit_cores",
        "koordlet_be_suppress_cpu_cores",
        "koordlet_container_scaled_cfs_burst_us",
        "koordlet_pod_eviction",
        "koordlet_pod_eviction_dry_run",
        "koordlet_pod_psi",
        "koordlet_pod_cpu_throttled_ratio",
        "koordlet_step_errors_total",
        "koordlet_step_duration_seconds_bucket",
        "koordlet_ready",
        "koordlet_loop_behind",
        "koordlet_loop_round_age_seconds",
    } <= used
    titles = {p["title"] for p in all_panels(dashboard())}
    assert "Evictions by reason" in titles
    assert "CPU throttling by QoS class" in titles


# The lexer -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "metrics", "labels"),
    [
        ("up", {"up"}, {}),
        (
            'rate(a_total{node=~"$node", x!="y"}[$__rate_interval])',
            {"a_total"},
            {"a_total": {"node", "x"}},
        ),
        (
            "sum by (node, qos) (b) * on (instance) group_left (node) group by (instance) (c)",
            {"b", "c"},
            {},
        ),
        (
            'histogram_quantile(0.99, sum by (le) (rate(d_bucket{l="by (x)"}[5m])))',
            {"d_bucket"},
            {"d_bucket": {"l"}},
        ),
        ("e offset 5m > bool 1e3 and f unless g", {"e", "f", "g"}, {}),
        ('{__name__="h"}', set(), {}),
    ],
)
def test_the_lexer_finds_metric_names_and_selector_labels(
    expr: str, metrics: set[str], labels: dict[str, set[str]]
) -> None:
    got = uses(expr)
    assert got.metrics == metrics
    assert got.selector_labels == labels


@pytest.mark.parametrize("expr", ["sum(rate(x[5m])", "x{a='b'", "", "y]"])
def test_the_lexer_rejects_unbalanced_expressions(expr: str) -> None:
    with pytest.raises(PromQLShapeError):
        uses(expr)


# Against a live koordlet ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def live_koordlet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The address of the real koordlet on a 200-pod fake tree, once suppression applied and
    memory eviction decided (dry run), so that their families have samples; stopped after the
    module's tests."""
    tmp = tmp_path_factory.mktemp("live")
    slo = tmp / "nodeslo.yaml"
    threshold = {
        "enable": True,
        "cpuSuppressThresholdPercent": 65,
        "memoryEvictThresholdPercent": 20,
        # the quota policy writes the fake tree's besteffort quota: cgroup writes are timed
        "cpuSuppressPolicy": "cfsQuota",
    }
    slo.write_text(yaml.safe_dump({"spec": {"resourceUsedThresholdWithBE": threshold}}))
    addr = f"127.0.0.1:{free_port()}"
    with fake_tree(200) as tree, open(tmp / "koordlet.log", "wb") as log:
        proc = subprocess.Popen(
            [
                str(SCRIPT),
                "--standalone",
                # Suppression writes the fake tree (its gauge reports what it applied); the
                # evictions only decide.
                *("--qos-dry-run-strategies", "memoryevict,cpuevict"),
                *("--addr", addr, "--state-dir", str(tmp / "state")),
                *("--nodeslo-file", str(slo)),
                *("--feature-gates", "PSICollector=true,BEMemoryEvict=true,BECPUEvict=true"),
                *("--collect-res-used-interval-seconds", "200ms"),
                *tree.daemon_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            text = ""
            while time.monotonic() < deadline:
                assert proc.poll() is None, (tmp / "koordlet.log").read_text()
                try:
                    text = scrape(addr)
                except OSError:
                    time.sleep(0.2)
                    continue
                if (
                    "koordlet_be_suppress_cpu_cores{" in text
                    and "koordlet_pod_eviction_dry_run{" in text
                ):
                    break
                time.sleep(0.2)
            else:
                pytest.fail(f"no suppress and eviction samples within 60s:\n{text[-3000:]}")
            yield addr
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def scrape(addr: str) -> str:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as resp:
        text: str = resp.read().decode()
        return text


@pytest.fixture(scope="module")
def live_metrics(live_koordlet: str) -> str:
    """``/metrics`` of the live koordlet."""
    return scrape(live_koordlet)


def served(text: str) -> tuple[set[str], dict[str, set[str]]]:
    """Sample names the exposition serves (a family's name with its type's suffixes), and the
    labels seen on each sample name."""
    names: set[str] = set()
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        suffixes = SUFFIXES.get(family.type, ("",))
        names.update(family.name + s for s in suffixes)
        if family.type == "counter" and not family.name.endswith("_total"):
            names.add(family.name)  # pragma: no cover - a counter served as such keeps _total
        for sample in family.samples:
            names.add(sample.name)
            labels.setdefault(sample.name, set()).update(sample.labels)
    return names, labels


def test_every_expression_names_only_metrics_a_live_koordlet_exports(live_metrics: str) -> None:
    names, _ = served(live_metrics)
    unknown = {
        where: sorted(uses(expr).metrics - names)
        for where, expr in expressions(dashboard())
        if uses(expr).metrics - names
    }
    assert unknown == {}
    assert all(
        n.startswith("koordlet_") for _, e in expressions(dashboard()) for n in uses(e).metrics
    )


def test_every_selector_tests_labels_the_series_has(live_metrics: str) -> None:
    _, seen = served(live_metrics)
    declared = {f.name: set(f.labels) for f in FAMILIES}
    wrong: dict[str, list[str]] = {}
    for where, expr in expressions(dashboard()):
        for metric, tested in uses(expr).selector_labels.items():
            if metric in seen:
                known = seen[metric]
            elif metric in declared:  # exported without samples here (pod PSI needs cgroup PSI)
                known = declared[metric]
            else:
                assert metric in NO_SAMPLES_ON_A_FAKE_NODE, f"{metric}: no samples to check"
                known = {"node"}
            extra = tested - known - TARGET_LABELS
            if extra:
                wrong.setdefault(where, []).append(f"{metric}: {sorted(extra)}")
    assert wrong == {}


# Evaluated by a real Prometheus ---------------------------------------------------------------


PROMETHEUS_SCRAPE = "1s"
"""How often the test's Prometheus scrapes the live koordlet (and evaluates the rules)."""
GRAFANA_VARIABLES = {"$__rate_interval": "15s", "$__range": "1m", "$__interval": "5s"}
"""What Grafana substitutes for its built-in variables, at a 1 s scrape; ``$node`` is All."""
NODE_ALL = ".*"
"""Grafana's value of a multi-select variable set to All (its regex)."""


class PromAPI:
    """The HTTP API of a Prometheus on loopback."""

    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as resp:
            doc = json.loads(resp.read())
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/v1/query", query=expr)["result"]
        return result


def grafana_render(expr: str) -> str:
    """``expr`` as Grafana sends it: its variables replaced, ``$node`` set to All."""
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    return expr.replace("${node}", NODE_ALL).replace("$node", NODE_ALL)


@pytest.fixture(scope="module")
def prometheus(live_koordlet: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromAPI]:
    """Debian's ``prometheus`` on loopback, scraping the live koordlet every second with the
    shipped alerting rules loaded, once it holds enough samples for the dashboard's rates."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (scripts/dev.sh setup installs Debian's)")
    tmp = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {
            "scrape_interval": PROMETHEUS_SCRAPE,
            "scrape_timeout": PROMETHEUS_SCRAPE,
            "evaluation_interval": PROMETHEUS_SCRAPE,
        },
        "rule_files": [str(ALERT_RULES)],
        "scrape_configs": [
            {"job_name": "koordlet", "static_configs": [{"targets": [live_koordlet]}]}
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    with open(tmp / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        api = PromAPI(f"http://127.0.0.1:{port}")
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-3000:]
                try:
                    samples = api.query('count_over_time(up{job="koordlet"}[30s])')
                except OSError:
                    samples = []
                if samples and float(samples[0]["value"][1]) >= 8:
                    break
                time.sleep(0.5)
            else:
                pytest.fail(
                    "prometheus scraped the koordlet fewer than 8 times in 90s:\n"
                    + (tmp / "prometheus.log").read_text()[-3000:]
                )
            yield api
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def test_every_panel_query_returns_data_where_its_inputs_exist(prometheus: PromAPI) -> None:
    """Each expression of the dashboard, as Grafana renders it, evaluated by the real
    Prometheus: data whenever every metric it reads has samples; the others name only families
    the fake node serves without samples."""
    (up,) = prometheus.query('up{job="koordlet"}')
    assert up["value"][1] == "1"
    answered, empty, no_inputs = [], [], {}
    for where, expr in expressions(dashboard()):
        missing = sorted(
            m for m in uses(expr).metrics if not prometheus.query(f'count({{__name__="{m}"}})')
        )
        if missing:
            no_inputs[where] = missing
            prometheus.query(grafana_render(expr))  # still valid PromQL (status success)
        elif prometheus.query(grafana_render(expr)):
            answered.append(where)
        else:
            empty.append(f"{where}: {grafana_render(expr)}")
    assert empty == []
    unsampled = {m for metrics in no_inputs.values() for m in metrics}
    assert unsampled <= set(NO_SAMPLES_ON_A_FAKE_NODE) | set(NO_SAMPLES_IN_A_HEALTHY_RUN)
    assert len(answered) >= len(expressions(dashboard())) - len(no_inputs)
    assert len(answered) > 3 * len(no_inputs)  # most of the dashboard is checked, not skipped


def test_every_alert_rule_evaluates_against_the_live_koordlet(prometheus: PromAPI) -> None:
    shipped = {r["alert"] for g in yaml.safe_load(ALERT_RULES.read_text())["groups"]
               for r in g["rules"]}  # fmt: skip
    deadline = time.monotonic() + 30
    while True:  # the rule manager's first evaluation follows its first interval
        groups = prometheus.get("/api/v1/rules")["groups"]
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        if set(rules) == shipped and all(r.get("lastEvaluation", "").startswith("2") and
                                         not r["lastEvaluation"].startswith("0001")
                                         for r in rules.values()):  # fmt: skip
            break
        assert time.monotonic() < deadline, f"rules not evaluated: {sorted(rules)}"
        time.sleep(0.5)
    unhealthy = {n: r.get("lastError") for n, r in rules.items() if r["health"] != "ok"}
    assert unhealthy == {}
    firing = [a for a in prometheus.get("/api/v1/alerts")["alerts"] if a["state"] == "firing"]
    assert firing == []  # a healthy koordlet raises none (their `for:` are minutes)
