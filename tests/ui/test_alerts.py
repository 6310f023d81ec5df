"""The shipped alerting rules (``packaging/prometheus/koordlet-alerts.yaml`` and the
PrometheusRule of ``packaging/kubernetes/koordlet/monitoring``), checked by Debian's real
``promtool``: ``check rules`` on both, and ``test rules`` on
``tests/ui/prometheus/koordlet-alerts.test.yaml`` (each alert fires once its condition has held
for its ``for:``, not before, with its annotations rendered). The rules evaluated by a real
Prometheus against a live koordlet are in ``test_grafana_dashboard.py``."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "packaging" / "prometheus" / "koordlet-alerts.yaml"
MONITORING = ROOT / "packaging" / "kubernetes" / "koordlet" / "monitoring"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
RULE_TESTS = Path(__file__).parent / "prometheus" / "koordlet-alerts.test.yaml"
DOCS = ROOT / "docs" / "alerts.md"
EXPECTED = {
    "KoordletDown": "the koordlet down",
    "KoordletNotReady": "start-up not done",
    "KoordletProtectiveLoopBehind": "protective loop behind",
    "KoordletStepErrors": "step errors",
    "KoordletStateNotWritable": "state or audit not writable",
    "KoordletNodeSLOSectionRejected": "NodeSLO section rejected",
    "KoordletEvictionsFailing": "evictions failing or refused",
    "KoordletCapabilityLost": "a capability lost since start",
}
"""Every shipped alert, with what it watches (issue 25's list)."""


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool is not installed (scripts/dev.sh setup installs Debian's prometheus)")
    return subprocess.run(
        [tool, *args], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )


def rules(path: Path = RULES) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    groups: list[dict[str, Any]] = doc["groups"] if "groups" in doc else doc["spec"]["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promtool_checks_the_rules_file() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(EXPECTED)} rules found" in done.stdout


def test_the_prometheus_rule_holds_the_same_groups_and_promtool_checks_them(
    tmp_path: Path,
) -> None:
    doc = yaml.safe_load(PROMETHEUS_RULE.read_text(encoding="utf-8"))
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    plain = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    assert doc["spec"]["groups"] == plain["groups"]
    extracted = tmp_path / "prometheusrule-groups.yaml"
    extracted.write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}), encoding="utf-8")
    done = promtool("check", "rules", str(extracted))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_every_alert() -> None:
    done = promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert tested == set(EXPECTED)


def test_the_alerts_cover_the_list_and_each_is_documented_with_a_severity() -> None:
    shipped = {rule["alert"]: rule for rule in rules()}
    assert set(shipped) == set(EXPECTED)
    docs = DOCS.read_text(encoding="utf-8")
    for name, rule in shipped.items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert {"summary", "description"} <= set(rule["annotations"]), name
        assert f"`{name}`" in docs, f"docs/alerts.md lacks {name}"


def test_the_down_alert_matches_the_job_either_monitor_gives_the_koordlet() -> None:
    (down,) = (rule for rule in rules() if rule["alert"] == "KoordletDown")
    match = re.search(r'job=~"([^"]+)"', down["expr"])
    assert match is not None
    job = re.compile(match.group(1))
    service = yaml.safe_load((MONITORING / "service.yaml").read_text(encoding="utf-8"))
    pod_monitor = yaml.safe_load((MONITORING / "podmonitor.yaml").read_text(encoding="utf-8"))
    # the operator names the job after the Service (ServiceMonitor) or namespace/PodMonitor
    assert job.fullmatch(service["metadata"]["name"])
    meta = pod_monitor["metadata"]
    assert job.fullmatch(f"{meta['namespace']}/{meta['name']}")
    assert job.fullmatch("koordlet")  # a plain prometheus.yml job (docs/alerts.md)
