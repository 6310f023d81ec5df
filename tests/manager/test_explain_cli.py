"""``koord-manager explain`` end to end: the installed console script on real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manager.builders import NOW, config_map, node, node_metric, pod, pod_list, rfc3339

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".venv/bin/koord-manager"
GI = 1 << 30


def command() -> list[str]:
    if SCRIPT.exists():
        return [str(SCRIPT)]
    return [sys.executable, "-m", "manager.cli"]


def write(path: Path, doc: Any) -> Path:
    if path.suffix == ".json":
        path.write_text(json.dumps(doc))
    else:
        path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def case(tmp_path: Path) -> dict[str, Path]:
    return {
        "node": write(tmp_path / "node.yaml", node(alloc_cpu="31", alloc_memory="126Gi")),
        "node-metric": write(
            tmp_path / "nodemetric.json",
            node_metric(
                system_usage=("1500m", "6Gi"),
                pods=[
                    ("default/web", "koord-prod", "3", "10Gi"),
                    ("default/spark", "koord-batch", "8", "20Gi"),
                ],
                prod_reclaimable=("2", "8Gi"),
            ),
        ),
        "pods": write(
            tmp_path / "pods.yaml",
            pod_list(
                pod("web", cpu="6", memory="16Gi", priority=9500),
                pod("spark", cpu="4", memory="8Gi", priority=5500),
                pod("fresh", cpu="1", memory="2Gi", priority=9000),
            ),
        ),
        "config": write(
            tmp_path / "cm.yaml",
            config_map(
                colocation_config={"enable": True, "memoryCalculatePolicy": "maxUsageRequest"}
            ),
        ),
    }


def explain(files: dict[str, Path], *extra: str) -> subprocess.CompletedProcess[str]:
    args = [f"--{k}={v}" for k, v in files.items()]
    return subprocess.run(
        [*command(), "explain", *args, "--now", rfc3339(NOW), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_json_is_one_document_of_resources_and_terms(case: dict[str, Path]) -> None:
    proc = explain(case, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)  # the whole output: nothing but the JSON document
    margin_cpu = int(32_000 * 0.4)
    margin_mem = int(128 * GI * 0.35)
    # usage: max(system 1.5 cores, kubelet 1 core) and web's usage 3 + fresh's request 1
    assert out["resources"]["kubernetes.io/batch-cpu"] == 32_000 - margin_cpu - 1_500 - (
        3_000 + 1_000
    )
    # maxUsageRequest: max(6Gi system, 2Gi kubelet), max(10, 16) for web + 2 for fresh
    assert (
        out["resources"]["kubernetes.io/batch-memory"]
        == 128 * GI - margin_mem - 6 * GI - (16 + 2) * GI
    )
    assert out["resources"]["kubernetes.io/mid-cpu"] == 2_000
    assert out["resources"]["kubernetes.io/mid-memory"] == 8 * GI
    pods = {p["pod"]: p for p in out["terms"]["batch"]["pods"]}
    assert pods["default/fresh"]["reason"].endswith("counted by request")
    assert pods["default/spark"]["counted"] is False
    assert out["terms"]["batch"]["memory"]["policy"] == "maxUsageRequest"


def test_text_shows_each_term_and_pod(case: dict[str, Path]) -> None:
    proc = explain(case)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "kubernetes.io/batch-cpu (policy usage): capacity 32000m - safetyMargin 12800m" in text
    assert "default/spark [koord-batch" in text
    assert "low priority (koord-batch)" in text
    assert "result:" in text
    assert not text.strip().splitlines()[-1].startswith("{")


def test_stale_metric_explains_the_reset(case: dict[str, Path]) -> None:
    proc = explain(case, "--json", "--now", rfc3339(NOW.replace(hour=13)))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out["resources"].values()) == {0}
    assert "degradeTimeMinutes" in out["terms"]["resetReason"]
    assert "RESET" in explain(case, "--now", rfc3339(NOW.replace(hour=13))).stdout


def test_bad_quantity_exits_2_naming_file_and_field(case: dict[str, Path], tmp_path: Path) -> None:
    bad = node()
    bad["status"]["capacity"]["cpu"] = "lots"
    case["node"] = write(tmp_path / "bad-node.yaml", bad)
    proc = explain(case)
    assert proc.returncode == 2
    assert "bad-node.yaml: status.capacity.cpu" in proc.stderr
    assert proc.stdout == ""


def test_bad_config_value_exits_2_naming_key_and_field(
    case: dict[str, Path], tmp_path: Path
) -> None:
    case["config"] = write(
        tmp_path / "bad-cm.yaml", config_map(colocation_config={"cpuReclaimThresholdPercent": -5})
    )
    proc = explain(case)
    assert proc.returncode == 2
    assert "bad-cm.yaml: colocation-config: cpuReclaimThresholdPercent: must be >= 0" in proc.stderr


def test_unparsable_file_and_missing_file_exit_2(case: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "pods.json"
    broken.write_text("{")
    case["pods"] = broken
    proc = explain(case)
    assert proc.returncode == 2
    assert "pods.json: invalid JSON" in proc.stderr
    case["pods"] = tmp_path / "absent.yaml"
    proc = explain(case)
    assert proc.returncode == 2
    assert "absent.yaml: cannot read" in proc.stderr


def test_missing_required_field_names_it(case: dict[str, Path], tmp_path: Path) -> None:
    nm = node_metric()
    nm["status"]["podsMetric"] = {"not": "a list"}
    case["node-metric"] = write(tmp_path / "nm.yaml", nm)
    proc = explain(case)
    assert proc.returncode == 2
    assert "nm.yaml: status.podsMetric: must be a list" in proc.stderr


def test_the_node_resource_topology_gives_the_cpu_basic_info_normalization_uses(
    case: dict[str, Path], tmp_path: Path
) -> None:
    # the koordlet reports the CPU basic info on the NodeResourceTopology, and the controller
    # normalizes from there; explain reads the same file (1.25 for this model: 32 cores of batch
    # room become 1.25 x as many)
    info = {"cpuModel": "Test CPU @ 2.5GHz", "hyperThreadEnabled": True, "turboEnabled": False}
    nrt = {
        "apiVersion": "topology.node.k8s.io/v1alpha1",
        "kind": "NodeResourceTopology",
        "metadata": {
            "name": "node-1",
            "annotations": {"node.koordinator.sh/cpu-basic-info": json.dumps(info)},
        },
    }
    config = config_map(
        colocation_config={"enable": True, "memoryCalculatePolicy": "maxUsageRequest"}
    )
    config["data"]["cpu-normalization-config"] = json.dumps(
        {"enable": True, "ratioModel": {info["cpuModel"]: {"hyperThreadEnabledRatio": 1.25}}}
    )
    files = {**case, "config": write(tmp_path / "cm-norm.yaml", config)}
    without = explain(files, "--json")
    with_nrt = explain(
        {**files, "node-resource-topology": write(tmp_path / "nrt.json", nrt)}, "--json"
    )
    assert without.returncode == 0, without.stderr
    assert with_nrt.returncode == 0, with_nrt.stderr
    before = json.loads(without.stdout)
    after = json.loads(with_nrt.stdout)
    assert before["terms"]["cpuNormalization"]["ratio"] is None
    assert after["terms"]["cpuNormalization"]["ratio"] == 1.25
    cpu = after["terms"]["batch"]["cpu"]
    assert cpu["value"] == int(cpu["beforeNormalization"] * 1.25)


def test_a_topology_file_whose_annotations_are_not_strings_exits_2_naming_the_field(
    case: dict[str, Path], tmp_path: Path
) -> None:
    nrt = {"metadata": {"name": "node-1", "annotations": {"node.koordinator.sh/cpu-basic-info": 3}}}
    proc = explain({**case, "node-resource-topology": write(tmp_path / "nrt.yaml", nrt)})
    assert proc.returncode == 2
    assert "nrt.yaml" in proc.stderr
    assert "metadata.annotations.node.koordinator.sh/cpu-basic-info" in proc.stderr
