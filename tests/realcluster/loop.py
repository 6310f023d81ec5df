"""What the real-cluster loop tests share: the slo-controller-config they run with, pods as the
tests create them, and reading the manager's own account of a node (``koord-manager explain``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from envtest.cluster import Cluster
from tests.realcluster.components import NAMESPACE, binary

FAST_COLOCATION: dict[str, Any] = {
    "enable": True,
    # the koordlet raises both to Koordinator's minimums (60 s and 30 s)
    "metricAggregateDurationSeconds": 60,
    "metricReportIntervalSeconds": 30,
    "cpuReclaimThresholdPercent": 60,
    "memoryReclaimThresholdPercent": 65,
    "memoryCalculatePolicy": "usage",
    "degradeTimeMinutes": 15,
    "updateTimeThresholdSeconds": 300,
    "resourceDiffThreshold": 0.1,
}


def patch_slo_config(cluster: Cluster, keys: dict[str, Any]) -> None:
    """Set keys of ``koordinator-system/slo-controller-config`` (each value as its JSON)."""
    data = {k: json.dumps(v) for k, v in keys.items()}
    cluster.kubectl(
        "patch", "configmap", "slo-controller-config", "-n", NAMESPACE, "--type=merge",
        "-p", json.dumps({"data": data}),
    )  # fmt: skip


def last_json(text: str) -> Any:
    """The JSON document a ``--json`` output ends with."""
    try:
        return json.loads(text)
    except ValueError:
        return json.loads(text[text.rindex("\n{") :])


def explain_node(cluster: Cluster, node: str, workdir: Path) -> dict[str, Any]:
    """``koord-manager explain --json`` on the live Node, NodeMetric, NodeResourceTopology,
    pods and config."""
    workdir.mkdir(parents=True, exist_ok=True)
    files = {
        "node": cluster.kubectl("get", "node", node, "-o", "json"),
        "node-metric": cluster.kubectl("get", "nodemetric", node, "-o", "json"),
        "node-resource-topology": cluster.kubectl(
            "get", "noderesourcetopology", node, "-o", "json"
        ),
        "pods": cluster.kubectl(
            "get", "pods", "-A", f"--field-selector=spec.nodeName={node}", "-o", "json"
        ),
        "config": cluster.kubectl(
            "get", "configmap", "slo-controller-config", "-n", NAMESPACE, "-o", "json"
        ),
    }
    args = []
    for flag, body in files.items():
        path = workdir / f"{flag}.json"
        path.write_text(body)
        args.append(f"--{flag}={path}")
    out = subprocess.run(
        [binary("koord-manager"), "explain", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return dict(last_json(out.stdout))
