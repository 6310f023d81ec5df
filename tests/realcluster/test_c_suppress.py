"""CPU suppress on the real node (2 CPUs): an LS pod's load lowers the CFS quota of the
BestEffort QoS cgroup under the cfsQuota policy, and switching between the cpuset and cfsQuota
policies while a BE pod carries its own quota never meets a write the kernel refuses."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from apis.manager_keys import BATCH_CPU
from envtest.cgroupwatch import read_int
from envtest.cluster import Cluster
from envtest.koordinator import HostProcs, Koordlet, wait
from envtest.workloads import (
    COLOCATION_LABEL,
    COLOCATION_NS,
    colocation_profile,
    delete_pods,
    patch_slo_config,
    pod,
    wait_running,
)

pytestmark = pytest.mark.timeout(300)
BURN = "while :; do :; done"


def threshold_config(policy: str) -> dict[str, object]:
    return {
        "clusterStrategy": {
            "enable": True,
            "cpuSuppressThresholdPercent": 65,
            "cpuSuppressPolicy": policy,
            "memoryEvictThresholdPercent": 99,
        }
    }


def step_errors(koordlet: Koordlet, name: str) -> float:
    text = koordlet.get("/metrics")
    pattern = rf'^koordlet_step_errors_total\{{[^}}]*name="{name}"[^}}]*\}} (\S+)$'
    return sum(float(m) for m in re.findall(pattern, text, re.M))


def refused(koordlet: Koordlet, since: int) -> list[str]:
    lines = koordlet.proc.log.read_text(errors="replace").splitlines()[since:]
    return [ln for ln in lines if "Invalid argument" in ln or "EINVAL" in ln]


@pytest.fixture
def suppress(cluster: Cluster, hostprocs: HostProcs) -> Iterator[None]:
    cluster.kubectl("create", "namespace", COLOCATION_NS, check=False)
    cluster.kubectl("label", "namespace", COLOCATION_NS, f"{COLOCATION_LABEL}=true", "--overwrite")
    cluster.apply(json.dumps(colocation_profile("be-koord", "koord-scheduler")))
    yield
    delete_pods(cluster, "be-burn", "ls-burn")
    patch_slo_config(cluster, {"resource-threshold-config": threshold_config("cpuset")})


def test_cfs_quota_suppress_lowers_be_under_ls_load_and_the_policy_switch_meets_no_refused_write(
    cluster: Cluster, hostprocs: HostProcs, suppress: None
) -> None:
    node = cluster.node_list[0]
    koordlet = hostprocs.koordlet(node)
    patch_slo_config(cluster, {"resource-threshold-config": threshold_config("cpuset")})

    def policy() -> str:
        spec = cluster.get("nodeslo", node.name)["spec"]
        return str(spec["resourceUsedThresholdWithBE"].get("cpuSuppressPolicy"))

    wait("NodeSLO policy cpuset", lambda: policy() == "cpuset", 30)
    labels = {COLOCATION_LABEL: "true", "profile": "be-koord"}
    be = pod("be-burn", node=node.name, labels=labels, command=BURN,
             resources={"requests": {"cpu": "0"}, "limits": {"cpu": "2"}})  # fmt: skip
    cluster.apply(json.dumps(be))
    p = wait_running(cluster, "be-burn")
    assert p["spec"]["containers"][0]["resources"]["limits"][BATCH_CPU] == "2k"
    be_dir = node.cgroup("cpu", "kubepods", "besteffort", f"pod{p['metadata']['uid']}")
    qos_dir = node.cgroup("cpu", "kubepods", "besteffort")
    # under the cpuset policy the BE pod keeps its own quota (its batch-cpu limit)
    assert read_int(be_dir / "cpu.cfs_quota_us") == 200_000
    ls = pod("ls-burn", node=node.name, namespace=COLOCATION_NS, command=BURN,
             resources={"requests": {"cpu": "500m", "memory": "32Mi"},
                        "limits": {"cpu": "1", "memory": "64Mi"}})  # fmt: skip
    cluster.apply(json.dumps(ls))
    wait_running(cluster, "ls-burn")
    errors = step_errors(koordlet, "cpusuppress")
    log_mark = len(koordlet.proc.log.read_text(errors="replace").splitlines())

    patch_slo_config(cluster, {"resource-threshold-config": threshold_config("cfsQuota")})
    wait("NodeSLO policy cfsQuota", lambda: policy() == "cfsQuota", 30)
    # the LS pod burns a core of two: BE gets at most 65 % of the node less what LS and the
    # host use, well under the 2 cores its own quota allowed
    lowered = wait(
        "BestEffort quota lowered",
        lambda: 0 < (q := read_int(qos_dir / "cpu.cfs_quota_us")) < 200_000 and q,
        30,
    )
    assert lowered <= 130_000
    # a child's quota may not exceed its parent's on cgroup v1: the BE pod's own quota went
    # first (upstream's rule: -1 under cfsQuota), so the parent's write was accepted
    child = read_int(be_dir / "cpu.cfs_quota_us")
    assert child == -1 or child <= lowered
    assert refused(koordlet, log_mark) == []
    assert step_errors(koordlet, "cpusuppress") == errors

    patch_slo_config(cluster, {"resource-threshold-config": threshold_config("cpuset")})
    wait("NodeSLO policy cpuset", lambda: policy() == "cpuset", 30)
    wait(
        "BestEffort quota unlimited again", lambda: read_int(qos_dir / "cpu.cfs_quota_us") == -1, 30
    )
    assert refused(koordlet, log_mark) == []
    assert step_errors(koordlet, "cpusuppress") == errors
