"""The co-location loop on the real nodes, the components as host processes (the bare-metal
install): the koordlet on each node publishes NodeMetric and NodeResourceTopology, the manager
writes batch and mid resources and the CPU normalization ratio on the Node, from the live
objects as ``koord-manager explain`` computes them."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from apis.manager_keys import (
    ANNOTATION_CPU_BASIC_INFO,
    ANNOTATION_CPU_NORMALIZATION_RATIO,
    ANNOTATION_NODE_RESOURCE_AMPLIFICATION_RATIO,
    BATCH_CPU,
    BATCH_MEMORY,
)
from apis.quantity import int_value
from envtest.cluster import Cluster
from envtest.koordinator import HostProcs, wait
from envtest.workloads import explain_node, patch_slo_config

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def loop(hostprocs: HostProcs) -> HostProcs:
    return hostprocs


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict(cluster.get("nodemetric", name).get("status") or {})


def test_each_koordlet_publishes_its_real_nodes_usage_in_the_nodemetric(
    cluster: Cluster, loop: HostProcs
) -> None:
    for i in range(2):
        name = cluster.node_name(i)
        status = wait(
            f"NodeMetric {name} status",
            lambda name=name: _status(cluster, name).get("nodeMetric"),
            90,
        )
        usage = status["nodeUsage"]["resources"]
        assert int_value(usage["memory"]) > 0
        updated = datetime.fromisoformat(
            _status(cluster, name)["updateTime"].replace("Z", "+00:00")
        )
        assert abs((datetime.now(UTC) - updated).total_seconds()) < 120


def test_each_koordlet_publishes_the_topology_with_the_cpu_basic_info(
    cluster: Cluster, loop: HostProcs
) -> None:
    for i in range(2):
        name = cluster.node_name(i)
        nrt = wait(
            f"NodeResourceTopology {name}",
            lambda name=name: cluster.get("noderesourcetopology", name),
        )
        info = json.loads(nrt["metadata"]["annotations"][ANNOTATION_CPU_BASIC_INFO])
        assert info["cpuModel"]
        zones = nrt.get("zones") or []
        assert zones, nrt
        cpus = sum(
            int_value(r["capacity"])
            for z in zones
            for r in z.get("resources", [])
            if r["name"] == "cpu"
        )
        assert cpus == len(os.sched_getaffinity(0)) or cpus == os.cpu_count()


def test_the_manager_writes_batch_resources_on_each_node_as_explain_computes_them(
    cluster: Cluster, loop: HostProcs, tmp_path: Path
) -> None:
    for i in range(2):
        name = cluster.node_name(i)
        wait(
            f"NodeMetric {name} status",
            lambda name=name: _status(cluster, name).get("nodeMetric"),
            90,
        )

        def agreed(name: str = name) -> dict[str, Any] | None:
            # the manager's own rule (decide_update, upstream's resourceDiffThreshold): with a
            # write just made, the Node's values need no update against what the live objects
            # give now
            now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
            out = explain_node(cluster, name, tmp_path / name, f"--last-update={now}")
            return None if out["terms"]["update"]["needed"] else out

        explained = wait(f"batch resources on {name} as explain gives them", agreed, 90, 1.0)
        alloc = cluster.get("node", name)["status"]["allocatable"]
        # memory has room on any machine here; CPU may be all used by a busy 2-core host
        assert int_value(alloc[BATCH_MEMORY]) > 0
        assert explained["resources"][BATCH_MEMORY] > 0
        # the API server writes a quantity in its canonical form: 1000 milli-cores come back as
        # "1k", so a Node's values are read as quantities, never as plain integers
        assert int_value(alloc[BATCH_CPU]) >= 0


def test_cpu_normalization_follows_the_model_the_koordlet_reports(
    cluster: Cluster, loop: HostProcs, tmp_path: Path
) -> None:
    name = cluster.node_name(0)
    nrt = wait("NodeResourceTopology", lambda: cluster.get("noderesourcetopology", name))
    model = json.loads(nrt["metadata"]["annotations"][ANNOTATION_CPU_BASIC_INFO])["cpuModel"]
    ratios = {
        "baseRatio": 1.5,
        "hyperThreadEnabledRatio": 1.5,
        "turboEnabledRatio": 1.5,
        "hyperThreadTurboEnabledRatio": 1.5,
    }
    patch_slo_config(
        cluster, {"cpu-normalization-config": {"enable": True, "ratioModel": {model: ratios}}}
    )
    try:

        def annotations() -> dict[str, str]:
            return dict(cluster.get("node", name)["metadata"].get("annotations") or {})

        wait(
            "ratio 1.50",
            lambda: annotations().get(ANNOTATION_CPU_NORMALIZATION_RATIO) == "1.50",
            60,
        )
        amplification = json.loads(
            wait(
                "amplification",
                lambda: annotations().get(ANNOTATION_NODE_RESOURCE_AMPLIFICATION_RATIO),
                60,
            )
        )
        assert amplification == {"cpu": 1.5}
        terms = explain_node(cluster, name, tmp_path)["terms"]
        assert terms["cpuNormalization"]["ratio"] == 1.5
    finally:
        patch_slo_config(cluster, {"cpu-normalization-config": {"enable": False}})
        wait(
            "ratio back to 1.00",
            lambda: annotations().get(ANNOTATION_CPU_NORMALIZATION_RATIO) == "1.00",
            60,
        )


def numa_usage_now(node_id: int) -> int:
    """Usage without page cache of one NUMA node, as the koordlet computes it from that node's
    own meminfo (``MemTotal - MemFree - Active(file) - Inactive(file)``)."""
    info: dict[str, int] = {}
    meminfo = Path(f"/sys/devices/system/node/node{node_id}/meminfo")
    for line in meminfo.read_text().splitlines():
        words = line.split()
        info[words[2].rstrip(":")] = int(words[3]) * 1024
    return info["MemTotal"] - info["MemFree"] - info["Active(file)"] - info["Inactive(file)"]


def test_the_nodemetric_numa_memory_is_the_numa_nodes_own_meminfo(
    cluster: Cluster, loop: HostProcs
) -> None:
    name = cluster.node_name(0)
    status = wait(
        "NodeMetric numaUsages",
        lambda: (s := _status(cluster, name).get("nodeMetric")) and s.get("numaUsages") and s,
        90,
    )
    zone = next(z for z in status["numaUsages"] if z["numaNodeID"] == 0)
    reported = int_value(zone["nodeUsage"]["resources"]["memory"])
    # an average over the aggregate window against a reading now: the same formula, not the
    # node's MemTotal - MemAvailable
    assert abs(reported - numa_usage_now(0)) <= 0.25 * numa_usage_now(0), (
        reported,
        numa_usage_now(0),
    )
