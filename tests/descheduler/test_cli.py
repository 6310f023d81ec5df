"""``koord-descheduler explain``: the human lines, the JSON line, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from descheduler.cli import main
from tests.descheduler.builders import (
    NOW,
    as_list,
    build_node,
    build_pod,
    low_node_load_config,
    node_metric,
    pdb,
    replica_set,
    ts,
)


def write(path: Path, doc: Any) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def cluster(tmp_path: Path, *, with_pdb: int | None = None) -> Path:
    nodes = [
        build_node("hot", 4000, 8000),
        build_node("cold", 4000, 8000),
        build_node("mid", 4000, 8000),
    ]
    pods = [build_pod(f"web-{i}", 1000, 1000, "hot", labels={"app": "web"}) for i in range(3)]
    pods.append(build_pod("ds", 500, 100, "hot", owner=("DaemonSet", "ds", "uid-ds")))
    pods.append(build_pod("idle", 200, 100, "cold"))
    pods.append(build_pod("busy", 2200, 100, "mid"))
    metrics = [node_metric(n["metadata"]["name"], pods) for n in nodes]
    extra = [replica_set(replicas=10)]
    if with_pdb is not None:
        extra.append(pdb("web", {"app": "web"}, with_pdb))
    return write(tmp_path / "cluster.yaml", as_list(*nodes, *pods, *metrics, *extra))


def config(tmp_path: Path, **args: Any) -> Path:
    args.setdefault("lowThresholds", {"cpu": 20, "memory": 50})
    args.setdefault("highThresholds", {"cpu": 70, "memory": 80})
    return write(tmp_path / "config.yaml", low_node_load_config(**args))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_explain_prints_classes_usage_and_migrations_or_one_json_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["explain", "--snapshot", str(cluster(tmp_path)), "--config", str(config(tmp_path))]
    code, lines, _ = run(capsys, *argv, "--now", ts(NOW), "--json")
    assert code == 0
    doc = json.loads("\n".join(lines))  # the whole output: nothing but the JSON document
    assert doc["nodes"]["hot"] == {"class": "high", "usage": {"cpu": 87.5, "memory": 38.75}}
    assert doc["nodes"]["cold"]["class"] == "low"
    assert doc["nodes"]["mid"]["class"] == "normal"
    assert doc["migrations"] == [
        {
            "pod": "default/web-0",
            "from": "hot",
            "plugin": "LowNodeLoad",
            "reason": "node is overutilized, node cpu usage(87.50%)>threshold(70.00%)",
        }
    ]
    code, lines, _ = run(capsys, *argv, "--now", ts(NOW))
    assert code == 0
    text = "\n".join(lines)
    assert not text.lstrip().startswith("{")
    assert "node hot   high" in text
    assert "cpu 87.50% (low 20.00%, high 70.00%)" in text
    assert "default/ds  skip    pod is a DaemonSet pod" in text
    assert "1. default/web-0 from hot by LowNodeLoad" in text


def test_a_budget_that_allows_no_disruption_keeps_the_pods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines, _ = run(
        capsys,
        "explain",
        "--snapshot",
        str(cluster(tmp_path, with_pdb=0)),
        "--config",
        str(config(tmp_path)),
        "--now",
        ts(NOW),
    )
    assert code == 0
    assert "migrations: none" in lines
    assert any("PodDisruptionBudget default/web allows no disruption" in line for line in lines)


def test_the_first_round_alone_moves_nothing_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines, _ = run(
        capsys,
        "explain",
        "--snapshot",
        str(cluster(tmp_path)),
        "--config",
        str(config(tmp_path)),
        "--now",
        ts(NOW),
        "--rounds",
        "1",
    )
    assert code == 0
    assert any("not anomalous yet" in line for line in lines)
    assert "migrations: none" in lines


def test_a_bad_config_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = config(tmp_path, highThresholds={"cpu": "hot"})
    code, _, err = run(
        capsys, "explain", "--snapshot", str(cluster(tmp_path)), "--config", str(bad)
    )
    assert code == 2
    assert (
        f"{bad}: profiles[0].pluginConfig[0].args.highThresholds.cpu: must be a percentage" in err
    )


def test_a_bad_snapshot_exits_2_naming_the_item(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metric = node_metric("n1", [])
    metric["status"]["nodeMetric"]["systemUsage"] = {"resources": {"cpu": "lots"}}
    snap = write(tmp_path / "s.yaml", as_list(build_node("n1"), metric))
    code, _, err = run(capsys, "explain", "--snapshot", str(snap))
    assert code == 2
    assert "s.yaml: items[1].status.nodeMetric.systemUsage.resources.cpu" in err
