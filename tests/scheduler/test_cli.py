"""``koord-scheduler explain`` end to end, as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from tests.scheduler.builders import NOW, as_list, node, node_metric, nrt, pod, ts

NOW_TEXT = ts(NOW)


def explain(tmp_path: Path, objects, p, *extra: str, config=None):
    snap = tmp_path / "snapshot.yaml"
    snap.write_text(yaml.safe_dump(as_list(*objects)))
    pod_file = tmp_path / "pod.yaml"
    pod_file.write_text(yaml.safe_dump(p))
    args = ["explain", "--pod", str(pod_file), "--snapshot", str(snap), "--now", NOW_TEXT, *extra]
    if config is not None:
        cfg = tmp_path / "config.yaml"
        cfg.write_text(yaml.safe_dump(config))
        args += ["--config", str(cfg)]
    return subprocess.run(
        [sys.executable, "-m", "scheduler_plugins.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


CLUSTER = [
    node("hot"),
    node_metric("hot", cpu="24", memory="8Gi"),
    node("cool"),
    node_metric("cool", cpu="4", memory="8Gi"),
    node("numa", cpu="16"),
    nrt("numa"),
]


def test_explain_json_last_line_reports_verdicts_reasons_and_scores_per_node(tmp_path):
    done = explain(tmp_path, CLUSTER, pod("p", requests={"cpu": "2", "memory": "2Gi"}), "--json")
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(last) == {"nodes"}
    assert set(last["nodes"]) == {"hot", "cool", "numa"}
    hot, cool = last["nodes"]["hot"], last["nodes"]["cool"]
    assert hot == {
        "feasible": False,
        "reasons": ["node(s) cpu usage exceed threshold"],
        "scores": {},
        "score": 0,
    }
    assert cool["feasible"] is True
    assert cool["reasons"] == []
    assert set(cool) == {"feasible", "reasons", "scores", "score"}
    assert 0 < cool["scores"]["LoadAwareScheduling"] <= 100
    assert cool["score"] == cool["scores"]["LoadAwareScheduling"]  # the only plugin that scored
    assert last["nodes"]["numa"]["scores"]["LoadAwareScheduling"] == 0  # no NodeMetric
    assert "result: cool" in done.stdout


def test_explain_text_shows_each_plugins_verdict_and_the_reserved_cpuset(tmp_path):
    lsr = pod(
        "lsr",
        requests={"cpu": "4", "memory": "1Gi"},
        limits={"cpu": "4", "memory": "1Gi"},
        labels={"koordinator.sh/qosClass": "LSR"},
        priority=9500,
    )
    done = explain(tmp_path, CLUSTER, lsr)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "LoadAwareScheduling  FAIL  node(s) cpu usage exceed threshold" in out
    assert "NodeNUMAResource     FAIL  node(s) invalid CPU Topology" in out
    assert "result: numa" in out
    assert 'scheduling.koordinator.sh/resource-status: {"cpuset":"0-1,8-9"}' in out


def test_config_file_thresholds_change_the_verdict(tmp_path):
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [
            {
                "schedulerName": "koord-scheduler",
                "pluginConfig": [
                    {
                        "name": "LoadAwareScheduling",
                        "args": {"kind": "LoadAwareSchedulingArgs", "usageThresholds": {"cpu": 90}},
                    }
                ],
            }
        ],
    }
    done = explain(tmp_path, CLUSTER, pod("p", requests={"cpu": "1"}), "--json", config=config)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["nodes"]["hot"]["feasible"] is True


def test_bad_inputs_exit_2_naming_the_file_and_the_field(tmp_path):
    broken = node("n1", cpu="lots")
    done = explain(tmp_path, [broken], pod("p"))
    assert done.returncode == 2
    assert "snapshot.yaml: items[0].status.allocatable.cpu" in done.stderr
    config = {
        "pluginConfig": [{"name": "LoadAwareScheduling", "args": {"usageThresholds": {"cpu": "x"}}}]
    }
    done = explain(tmp_path, [node("n1")], pod("p"), config=config)
    assert done.returncode == 2
    assert "config.yaml: pluginConfig[LoadAwareScheduling].args.usageThresholds.cpu" in done.stderr
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler_plugins.cli",
            "explain",
            "--pod",
            str(tmp_path / "nope.yaml"),
            "--snapshot",
            str(tmp_path / "snapshot.yaml"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert missing.returncode == 2
    assert "nope.yaml" in missing.stderr
