"""NodeNUMAResource against Koordinator's documented CPU orchestration and NUMA behaviour.

The test node (``builders.nrt``): one socket, NUMA nodes 0 and 1, four cores each, two threads
per core. CPUs 0-7 are the first threads of cores 0-7, CPUs 8-15 their siblings: NUMA 0 holds
0-3 and 8-11, NUMA 1 holds 4-7 and 12-15.
"""

from __future__ import annotations

import json

import pytest

from scheduler_plugins.framework import Framework
from scheduler_plugins.plugins.nodenumaresource import NodeNUMAResource
from scheduler_plugins.plugins.numaplacement import parse_args
from scheduler_plugins.snapshot import parse_pod
from tests.scheduler.builders import NOW, node, nrt, pod
from tests.scheduler.helpers import evaluate, snapshot_of

NUMA = "NodeNUMAResource"
STATUS = "scheduling.koordinator.sh/resource-status"
LSR = {"koordinator.sh/qosClass": "LSR"}


def lsr_pod(name, cpus, *, spec=None, node_name="", status=None, memory="1Gi"):
    annotations = {}
    if spec:
        annotations["scheduling.koordinator.sh/resource-spec"] = json.dumps(spec)
    if status:
        annotations[STATUS] = json.dumps(status)
    return pod(
        name,
        node_name=node_name,
        requests={"cpu": str(cpus), "memory": memory},
        limits={"cpu": str(cpus), "memory": memory},
        labels=dict(LSR),
        annotations=annotations,
        priority=9500,
    )


def place(objects, p, args=None):
    """(reasons, resource-status) of ``p`` on node n1."""
    fw = Framework([NodeNUMAResource(parse_args(args, "test"))])
    snap = snapshot_of(*objects)
    pi = parse_pod(p, "pod")
    cycle = fw.new_cycle(snap, NOW)
    result = fw.evaluate(snap, pi, cycle=cycle, all_verdicts=True)
    n1 = result.nodes["n1"]
    if not n1.feasible:
        return n1.reasons, None
    ann = fw.reserve(cycle, pi, "n1")
    return [], json.loads(ann[STATUS]) if STATUS in ann else None


@pytest.mark.parametrize(
    ("spec", "cpus", "cpuset"),
    [
        (None, 4, "0-1,8-9"),  # default FullPCPUs: two whole cores on NUMA 0
        ({"preferredCPUBindPolicy": "FullPCPUs"}, 2, "0,8"),
        ({"preferredCPUBindPolicy": "SpreadByPCPUs"}, 4, "0-3"),  # one thread of four cores
        ({"requiredCPUBindPolicy": "SpreadByPCPUs"}, 6, "0-3,8-9"),  # spills to second threads
        (None, 8, "0-3,8-11"),  # a whole NUMA node
    ],
)
def test_bind_policies_choose_cpus_as_documented(spec, cpus, cpuset):
    reasons, status = place([node("n1", cpu="16"), nrt("n1")], lsr_pod("p", cpus, spec=spec))
    assert reasons == []
    assert (status or {}).get("cpuset") == cpuset


def test_cpus_held_by_other_pods_are_not_given_again_and_numa_nodes_are_packed():
    other = lsr_pod("other", 4, node_name="n1", status={"cpuset": "0-1,8-9"})
    _, status = place([node("n1", cpu="16"), nrt("n1"), other], lsr_pod("p", 4))
    assert (status or {}).get("cpuset") == "2-3,10-11"  # MostAllocated NUMA 0 first


def test_kubelet_reserved_cpus_are_not_allocated():
    _, status = place([node("n1", cpu="16"), nrt("n1", reserved="0,8")], lsr_pod("p", 2))
    assert (status or {}).get("cpuset") == "1,9"


@pytest.mark.parametrize(
    ("labels", "p", "reason"),
    [
        ({}, lsr_pod("p", "1500m"), "the requested CPUs must be integer"),
        (
            {"node.koordinator.sh/cpu-bind-policy": "FullPCPUsOnly"},
            lsr_pod("p", 3),
            "node(s) requested cpus not multiple cpus per core",
        ),
        (
            {"node.koordinator.sh/cpu-bind-policy": "FullPCPUsOnly"},
            lsr_pod("p", 4, spec={"requiredCPUBindPolicy": "SpreadByPCPUs"}),
            "node(s) cpu bind policy conflicts with pod's required cpu bind policy",
        ),
        ({}, lsr_pod("p", 20), "not enough cpus available to satisfy request"),
        (
            {"node.koordinator.sh/numa-topology-policy": "SingleNUMANode"},
            lsr_pod("p", 10),
            "node(s) NUMA Topology policy not match",
        ),
    ],
    ids=["non-integer", "smt-alignment", "bind-conflict", "not-enough", "single-numa"],
)
def test_unsatisfiable_requests_are_rejected_with_koordinators_reasons(labels, p, reason):
    reasons, _ = place([node("n1", cpu="16", labels=labels), nrt("n1")], p)
    assert reasons == [reason]


def test_a_pod_that_needs_a_cpuset_cannot_use_a_node_without_cpu_topology_and_is_told_why():
    reasons, _ = place([node("n1", cpu="16")], lsr_pod("p", 2))
    assert reasons == [
        "node(s) invalid CPU Topology "
        "(the node has no NodeResourceTopology: is the koordlet running there?)"
    ]
    topology = nrt("n1")
    del topology["metadata"]["annotations"]["node.koordinator.sh/cpu-topology"]
    reasons, _ = place([node("n1", cpu="16"), topology], lsr_pod("p", 2))
    assert reasons == [
        "node(s) invalid CPU Topology "
        "(its NodeResourceTopology has no node.koordinator.sh/cpu-topology annotation)"
    ]


def test_single_numa_node_policy_records_the_numa_node_resources():
    labels = {"node.koordinator.sh/numa-topology-policy": "SingleNUMANode"}
    _, status = place(
        [node("n1", cpu="16", labels=labels), nrt("n1")], lsr_pod("p", 8, memory="4Gi")
    )
    assert status == {
        "cpuset": "0-3,8-11",
        "numaNodeResources": [{"node": 0, "resources": {"cpu": "8", "memory": "4Gi"}}],
    }


@pytest.mark.parametrize(
    ("policy", "feasible"), [("Restricted", False), ("BestEffort", True), ("None", True)]
)
def test_restricted_needs_the_narrowest_numa_set_best_effort_does_not(policy, feasible):
    # 4 CPUs left on each NUMA node: 6 CPUs fit on one NUMA node by capacity, only on two now
    held = [
        lsr_pod("a", 4, node_name="n1", status={"cpuset": "0-1,8-9"}),
        lsr_pod("b", 4, node_name="n1", status={"cpuset": "4-5,12-13"}),
    ]
    reasons, status = place(
        [node("n1", cpu="16"), nrt("n1", policies=[policy]), *held], lsr_pod("p", 6)
    )
    assert (reasons == []) is feasible
    if not feasible:
        assert reasons == ["node(s) NUMA Topology policy not match"]
    else:
        assert len((status or {}).get("cpuset", "").split(",")) >= 2


def test_the_nrt_topology_policy_applies_when_the_node_has_no_label():
    reasons, _ = place(
        [node("n1", cpu="16"), nrt("n1", policies=["SingleNUMANodePodLevel"])], lsr_pod("p", 10)
    )
    assert reasons == ["node(s) NUMA Topology policy not match"]


def test_numa_node_level_exclusive_pods_avoid_each_others_numa_nodes():
    spec = {"preferredCPUExclusivePolicy": "NUMANodeLevel"}
    other = lsr_pod("other", 2, node_name="n1", spec=spec, status={"cpuset": "0,8"})
    _, status = place([node("n1", cpu="16"), nrt("n1"), other], lsr_pod("p", 2, spec=spec))
    assert (status or {}).get("cpuset") == "4,12"


def test_pcpu_level_exclusive_spread_pods_take_one_thread_of_unshared_cores():
    spec = {"preferredCPUBindPolicy": "SpreadByPCPUs", "preferredCPUExclusivePolicy": "PCPULevel"}
    other = lsr_pod("other", 4, node_name="n1", spec=spec, status={"cpuset": "0-3"})
    _, status = place([node("n1", cpu="16"), nrt("n1"), other], lsr_pod("p", 4, spec=spec))
    assert (status or {}).get("cpuset") == "4-7"
    # PCPULevel is a preference: with no fifth unshared core the pod shares one, spread
    reasons, status = place([node("n1", cpu="16"), nrt("n1"), other], lsr_pod("p", 5, spec=spec))
    assert reasons == []
    assert (status or {}).get("cpuset") == "4-7,12"


def test_ls_pods_on_nodes_without_numa_policy_are_not_scored():
    result = evaluate(
        [node("n1"), nrt("n1")], pod("p", requests={"cpu": "1"}), plugins=[NodeNUMAResource()]
    )
    assert result.nodes["n1"].feasible
    assert NUMA not in result.nodes["n1"].scores


@pytest.mark.parametrize(
    ("strategy", "winner"), [("LeastAllocated", "empty"), ("MostAllocated", "busy")]
)
def test_scoring_strategy_prefers_the_emptier_or_the_fuller_node(strategy, winner):
    held = lsr_pod("h", 8, node_name="busy", status={"cpuset": "0-3,8-11"}, memory="8Gi")
    objects = [
        node("busy", cpu="16", memory="64Gi"),
        nrt("busy"),
        node("empty", cpu="16", memory="64Gi"),
        nrt("empty"),
        held,
    ]
    args = {"scoringStrategy": {"type": strategy}}
    result = evaluate(objects, lsr_pod("p", 2), plugins=[NodeNUMAResource(parse_args(args, "t"))])
    assert result.best() == winner


def test_reserve_assumes_the_pod_so_the_next_pod_gets_other_cpus():
    fw = Framework([NodeNUMAResource()])
    snap = snapshot_of(node("n1", cpu="16"), nrt("n1"))
    first, second = parse_pod(lsr_pod("a", 2), "a"), parse_pod(lsr_pod("b", 2), "b")
    cycle = fw.new_cycle(snap, NOW)
    fw.evaluate(snap, first, cycle=cycle)
    one = json.loads(fw.reserve(cycle, first, "n1")[STATUS])["cpuset"]
    cycle = fw.new_cycle(snap, NOW)
    fw.evaluate(snap, second, cycle=cycle)
    two = json.loads(fw.reserve(cycle, second, "n1")[STATUS])["cpuset"]
    assert (one, two) == ("0,8", "1,9")
