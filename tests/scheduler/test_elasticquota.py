"""ElasticQuota: runtime quota of a tree under contention, max, non-preemptible pods."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_plugins.config import SchedulerConfig, parse_feature_gates
from scheduler_plugins.errors import InputError
from scheduler_plugins.framework import Framework
from scheduler_plugins.plugins.elasticquota import ElasticQuota, build
from scheduler_plugins.plugins.quotaprofile import parse_profiles
from scheduler_plugins.plugins.quotatree import (
    QuotaNode,
    compute_runtime,
    parse_quotas,
    redistribute,
)
from scheduler_plugins.snapshot import parse_pod
from tests.scheduler.builders import node, pod
from tests.scheduler.helpers import evaluate, snapshot_of

QUOTA = "quota.scheduling.koordinator.sh/name"


def quota(name, cpu_min, cpu_max, *, parent=None, weight=None, lend=True, is_parent=False):
    labels = {}
    if parent:
        labels["quota.scheduling.koordinator.sh/parent"] = parent
    if is_parent:
        labels["quota.scheduling.koordinator.sh/is-parent"] = "true"
    if not lend:
        labels["quota.scheduling.koordinator.sh/allow-lent-resource"] = "false"
    annotations = {}
    if weight is not None:
        annotations["quota.scheduling.koordinator.sh/shared-weight"] = json.dumps(
            {"cpu": str(weight)}
        )
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "ElasticQuota",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {"min": {"cpu": str(cpu_min)}, "max": {"cpu": str(cpu_max)}},
    }


def member(name, q, cpu, *, node_name="", preemptible=True):
    labels = {QUOTA: q}
    if not preemptible:
        labels["quota.scheduling.koordinator.sh/preemptible"] = "false"
    return pod(name, node_name=node_name, requests={"cpu": str(cpu)}, labels=labels)


def runtimes(objects, incoming=None):
    snap = snapshot_of(*objects)
    quotas = parse_quotas(snap)
    compute_runtime(snap, quotas, parse_pod(incoming, "p") if incoming else None)
    return {n: q.runtime.get("cpu", 0) for n, q in quotas.items()}  # milli-cores


CLUSTER = [node("n1", cpu="6"), node("n2", cpu="4")]  # 10 cores


def test_an_idle_quota_lends_its_min_to_a_busy_one():
    objects = [
        *CLUSTER,
        quota("a", 4, 10),
        quota("b", 4, 10),
        member("a1", "a", 8),
        member("b1", "b", 2),
    ]
    assert runtimes(objects) == {"a": 8000, "b": 2000}


def test_contention_splits_what_is_left_by_shared_weight_exactly():
    objects = [
        *CLUSTER,
        quota("a", 4, 10, weight=3),
        quota("b", 4, 10, weight=1),
        member("a1", "a", 10),
        member("b1", "b", 10),
    ]
    got = runtimes(objects)
    assert got == {"a": 5500, "b": 4500}  # 4 + 4 guaranteed, the 2 cores left split 3 : 1
    assert sum(got.values()) == 10000


def test_a_quota_that_does_not_lend_keeps_its_min():
    objects = [*CLUSTER, quota("a", 4, 10, lend=False), quota("b", 2, 10), member("b1", "b", 10)]
    assert runtimes(objects) == {"a": 4000, "b": 6000}


def test_a_parent_shares_its_runtime_among_its_children():
    objects = [
        *CLUSTER,
        quota("parent", 6, 6, is_parent=True),
        quota("other", 4, 10),
        quota("c1", 2, 6, parent="parent"),
        quota("c2", 2, 6, parent="parent"),
        member("x", "c1", 6),
        member("y", "c2", 1),
        member("z", "other", 4),
    ]
    assert runtimes(objects) == {"parent": 6000, "other": 4000, "c1": 5000, "c2": 1000}


@pytest.mark.parametrize(
    ("incoming_cpu", "feasible"),
    [("500m", True), ("1", False)],
)
def test_a_pod_beyond_its_runtime_quota_is_rejected_on_every_node(incoming_cpu, feasible):
    # b asks for everything: a gets its min 2 plus, of the 2 cores left, 4/14 by weight
    # (the default weight is max): runtime 2.571 cores, of which it uses 2
    objects = [
        *CLUSTER,
        quota("a", 2, 4),
        quota("b", 6, 10),
        member("a1", "a", 2, node_name="n1"),
        member("b1", "b", 10),
    ]
    result = evaluate(objects, member("new", "a", incoming_cpu), plugins=[ElasticQuota()])
    verdicts = {n.feasible for n in result.nodes.values()}
    assert verdicts == {feasible}
    if not feasible:
        reason = result.nodes["n1"].reasons[0]
        assert reason.startswith("Insufficient quotas, quotaName: a, ")
        assert reason.endswith("exceedDimensions: [cpu]")


def test_max_caps_a_quota_even_on_an_idle_cluster():
    objects = [*CLUSTER, quota("a", 1, 2), member("a1", "a", 2, node_name="n1")]
    result = evaluate(objects, member("new", "a", 1), plugins=[ElasticQuota()])
    assert not result.nodes["n2"].feasible


def test_non_preemptible_pods_must_fit_within_min():
    objects = [*CLUSTER, quota("a", 2, 10), member("a1", "a", 2, node_name="n1", preemptible=False)]
    result = evaluate(objects, member("new", "a", 1, preemptible=False), plugins=[ElasticQuota()])
    assert (
        result.nodes["n1"]
        .reasons[0]
        .startswith("Insufficient non-preemptible quotas, quotaName: a")
    )
    assert evaluate(objects, member("new", "a", 1), plugins=[ElasticQuota()]).nodes["n1"].feasible


def test_pods_without_a_quota_pass_and_namespace_quotas_apply_without_labels():
    objects = [*CLUSTER, quota("a", 1, 1)]
    free = pod("free", requests={"cpu": "8"}, namespace="elsewhere")
    assert evaluate(objects, free, plugins=[ElasticQuota()]).nodes["n1"].feasible
    # a pod in the quota's namespace belongs to it without a label
    assert (
        not evaluate(objects, pod("ns", requests={"cpu": "8"}), plugins=[ElasticQuota()])
        .nodes["n1"]
        .feasible
    )


def test_shares_are_whole_and_sum_to_the_total_by_largest_remainder_as_upstream():
    # upstream's computeHamiltonDeltas (runtime_quota_calculator.go): 10 // 3 = 3 each, the one
    # unit left to the largest remainder, ties by quota name
    got = redistribute(10, [QuotaNode(n, 10, 1, 0) for n in "cab"])
    assert got == {"a": 4, "b": 3, "c": 3}


def test_81_gpus_over_13_equal_children_are_all_given_out():
    # rounded half up per child, 81 / 13 = 6.23 gave 6 each: 78, three GPUs lost
    names = [f"team-{i:02d}" for i in range(13)]
    got = redistribute(81, [QuotaNode(n, 81, 1, 0) for n in names])
    assert sum(got.values()) == 81
    assert [got[n] for n in names] == [7, 7, 7] + [6] * 10


def test_the_largest_remainders_get_the_units_left_over():
    # weights 1, 2, 4 over 10: 10/7 = 1.43, 2.86, 5.71: bases 1, 2, 5 (8); the two units left go
    # to the remainders 6 (w=2) and 5 (w=4), not to 3 (w=1)
    nodes = [QuotaNode("x", 100, 1, 0), QuotaNode("y", 100, 2, 0), QuotaNode("z", 100, 4, 0)]
    assert redistribute(10, nodes) == {"x": 1, "y": 3, "z": 6}


@given(
    total=st.integers(0, 10**15),
    asks=st.lists(st.tuples(st.integers(1, 1000), st.integers(0, 10**14)), min_size=1, max_size=12),
)
def test_what_is_shared_is_never_lost_nor_given_twice(total: int, asks: list[tuple[int, int]]):
    nodes = [QuotaNode(f"q{i}", request, weight, 0) for i, (weight, request) in enumerate(asks)]
    got = redistribute(total, nodes)
    assert sum(got.values()) == min(total, sum(n.request for n in nodes))
    assert all(got[n.name] <= n.request for n in nodes)


# Koordinator's runtime_quota_calculator_test.go, TestRuntimeQuotaCalculator_IterationAdjustQuota:
# a total of 100 over four children (name, shared weight, request, min, guarantee)
UPSTREAM_NODES = {
    "node1": QuotaNode("node1", 5, 40, 10),
    "node2": QuotaNode("node2", 20, 60, 15),
    "node3": QuotaNode("node3", 40, 50, 20),
    "node4": QuotaNode("node4", 70, 80, 15),
}


@pytest.mark.parametrize(
    ("node4", "want"),
    [
        (UPSTREAM_NODES["node4"], {"node1": 5, "node2": 20, "node3": 35, "node4": 40}),
        (QuotaNode("node4", 70, 0, 15), {"node1": 5, "node2": 20, "node3": 40, "node4": 15}),
        (QuotaNode("node4", 70, 0, 15, 45), {"node1": 5, "node2": 20, "node3": 30, "node4": 45}),
    ],
    ids=["no-guarantee", "node4-shared-weight-0", "node4-guarantee-over-min"],
)
def test_iteration_adjust_quota(node4, want):
    nodes = [UPSTREAM_NODES["node1"], UPSTREAM_NODES["node2"], UPSTREAM_NODES["node3"], node4]
    assert redistribute(100, nodes) == want


def test_requests_below_min_get_their_request_or_min_when_not_lending():
    # TestRuntimeQuotaCalculator_UpdateOneGroupRequest: request < min: runtime == request
    assert redistribute(50, [QuotaNode("a", 10, 100, 80)]) == {"a": 10}
    assert redistribute(50, [QuotaNode("a", 10, 100, 80, allow_lent=False)]) == {"a": 80}


def test_children_keep_their_min_when_the_mins_exceed_the_parents_total():
    # mins 6 + 6 over a total of 10: both keep 6, nothing is left to share
    got = redistribute(10, [QuotaNode("a", 8, 1, 6), QuotaNode("b", 9, 1, 6)])
    assert got == {"a": 6, "b": 6}
    objects = [
        *CLUSTER,
        quota("a", 6, 10),
        quota("b", 6, 10),
        member("a1", "a", 8),
        member("b1", "b", 9),
    ]
    assert runtimes(objects) == {"a": 6000, "b": 6000}


def test_guarantee_usage_keeps_what_a_quota_uses_and_stops_lending():
    # a uses 7 cores (above its min of 4) and asks for no more; b asks for 8 with a min of 4.
    # Normally both get their min and share the 2 cores left by weight: a's runtime (5) falls
    # below what it uses. With ElasticQuotaGuaranteeUsage a's 7 are guaranteed and b keeps its
    # min.
    objects = [
        *CLUSTER,
        quota("a", 4, 10),
        quota("b", 4, 10),
        member("a1", "a", 7, node_name="n1"),
        member("b1", "b", 8),
    ]
    snap = snapshot_of(*objects)
    quotas = parse_quotas(snap)
    compute_runtime(snap, quotas, None, guarantee_usage=True)
    assert {n: q.runtime["cpu"] for n, q in quotas.items()} == {"a": 7000, "b": 4000}
    assert quotas["a"].guarantee == {"cpu": 7000}
    assert runtimes(objects) == {"a": 5000, "b": 5000}


POOL = "node-pool"


def profile(name, root, pool, *, ratio=None, tree=None):
    spec = {"quotaName": root, "nodeSelector": {"matchLabels": {POOL: pool}}}
    if ratio is not None:
        spec["resourceRatio"] = ratio
    labels = {"quota.scheduling.koordinator.sh/tree-id": tree} if tree else {}
    return {
        "apiVersion": "quota.koordinator.sh/v1alpha1",
        "kind": "ElasticQuotaProfile",
        "metadata": {"name": name, "namespace": "kube-system", "labels": labels},
        "spec": spec,
    }


POOLS = [
    node("a1", cpu="4", labels={POOL: "a"}),
    node("a2", cpu="4", labels={POOL: "a"}),
    node("b1", cpu="2", labels={POOL: "b"}),
]
PROFILES = [profile("pa", "root-a", "a"), profile("pb", "root-b", "b")]


def pooled(objects, incoming, *, profiles=PROFILES, check_parent=False):
    plugin = ElasticQuota(check_parent=check_parent, profiles=profiles)
    return evaluate(objects, incoming, plugins=[plugin])


def test_each_profile_tree_gets_its_own_pools_allocatable_times_the_ratio():
    objects = [*POOLS, quota("ta", 1, 100, parent="root-a"), member("x", "ta", 100)]
    snap = snapshot_of(*objects)
    profiles = parse_profiles([profile("pa", "root-a", "a", ratio="0.75"), PROFILES[1]])
    quotas = parse_quotas(snap, profiles)
    compute_runtime(snap, quotas, None)
    assert quotas["root-a"].total == {"cpu": 6000, "memory": 96 * 2**30, "pods": 165}
    assert quotas["ta"].runtime["cpu"] == 6000  # 8 cores x 0.75, not the cluster's 10
    assert quotas["ta"].profile == "kube-system/pa"


def test_a_pod_of_a_profile_tree_runs_only_on_its_pools_nodes():
    objects = [*POOLS, quota("tb", 1, 2, parent="root-b")]
    result = pooled(objects, member("p", "tb", 1))
    assert result.nodes["b1"].feasible
    assert result.nodes["a1"].reasons == ["node(s) didn't match Pod's node affinity/selector"]
    assert not result.nodes["a2"].feasible
    free = pod("free", requests={"cpu": "1"}, namespace="elsewhere")
    assert all(r.feasible for r in pooled(objects, free).nodes.values())


def test_two_profiles_over_disjoint_pools_under_contention_do_not_lend_to_each_other():
    # pool b has 2 cores, fully used by tb; pool a is idle with 8 cores, but its tree's
    # runtime cannot flow to tree b
    objects = [
        *POOLS,
        quota("ta", 1, 100, parent="root-a"),
        quota("tb", 1, 100, parent="root-b"),
        member("b-used", "tb", 2, node_name="b1"),
        member("a-used", "ta", 1, node_name="a1"),
    ]
    rejected = pooled(objects, member("b-more", "tb", 1))
    assert not any(r.feasible for r in rejected.nodes.values())
    assert (
        rejected.nodes["b1"]
        .reasons[0]
        .startswith("Insufficient quotas, quotaName: tb, runtime: {cpu: 2000}, used: {cpu: 2000}")
    )
    admitted = pooled(objects, member("a-more", "ta", 7))
    assert [n for n, r in admitted.nodes.items() if r.feasible] == ["a1", "a2"]
    assert not pooled(objects, member("a-too-much", "ta", 8)).nodes["a1"].feasible


def test_siblings_in_one_profile_tree_share_the_pool_by_weight_exactly():
    objects = [
        *POOLS,
        quota("x", 2, 8, parent="root-a", weight=2),
        quota("y", 2, 8, parent="root-a", weight=1),
        member("x1", "x", 8),
        member("y1", "y", 8),
    ]
    snap = snapshot_of(*objects)
    quotas = parse_quotas(snap, parse_profiles(PROFILES))
    compute_runtime(snap, quotas, None)
    got = {n: quotas[n].runtime["cpu"] for n in ("x", "y")}
    assert got == {"x": 4667, "y": 3333}  # 2 + 2 guaranteed, the 4 left split 2 : 1
    assert sum(got.values()) == 8000


def test_the_parent_check_rejects_a_pod_its_own_quota_admits_but_an_ancestor_cannot():
    # parent max 3 cores; child max 10, with the parent's 3 cores used by a sibling
    objects = [
        *CLUSTER,
        quota("parent", 0, 3, is_parent=True),
        quota("c1", 0, 10, parent="parent"),
        quota("c2", 0, 10, parent="parent"),
        member("s", "c2", 3, node_name="n1"),
    ]
    incoming = member("new", "c1", 1)
    plain = evaluate(objects, incoming, plugins=[ElasticQuota()])
    checked = evaluate(objects, incoming, plugins=[ElasticQuota(check_parent=True)])
    reason = checked.nodes["n1"].reasons[0]
    assert reason.startswith("Insufficient quotas, quotaName: parent, ")
    assert plain.nodes["n1"].feasible  # c1's own runtime (1 core) admits it
    assert reason.endswith("exceedDimensions: [cpu]")


def test_used_is_recounted_when_pods_are_assumed_forgotten_and_removed():
    fw = Framework([ElasticQuota()])
    snap = snapshot_of(*CLUSTER, quota("a", 2, 2))
    first = parse_pod(member("a1", "a", 2), "p")
    cycle = fw.new_cycle(snap, 0)
    assert fw.evaluate(snap, first, cycle=cycle).nodes["n1"].feasible
    fw.reserve(cycle, first, "n1")
    second = parse_pod(member("a2", "a", 1), "p")
    assert not fw.evaluate(snap, second).nodes["n1"].feasible  # 2 of 2 used now
    fw.unreserve(cycle, first, "n1")
    assert fw.evaluate(snap, second).nodes["n1"].feasible
    snap.upsert_pod(parse_pod(member("a3", "a", 2, node_name="n2"), "p"))
    assert not fw.evaluate(snap, second).nodes["n1"].feasible
    snap.remove_pod("uid-default-a3")
    assert fw.evaluate(snap, second).nodes["n1"].feasible


def test_enable_check_parent_quota_is_read_from_the_args():
    assert build(None, "x").check_parent is False
    assert build({"enableCheckParentQuota": True}, "x").check_parent is True


def test_profiles_in_the_snapshot_itself_make_their_trees():
    objects = [*POOLS, *PROFILES, quota("tb", 1, 2, parent="root-b")]
    result = evaluate(objects, member("p", "tb", 1), plugins=[ElasticQuota()])
    assert result.nodes["b1"].feasible
    assert result.nodes["a1"].reasons == ["node(s) didn't match Pod's node affinity/selector"]


def test_the_guarantee_usage_feature_gate_switches_the_plugin():
    gates = parse_feature_gates("ElasticQuotaGuaranteeUsage=true")
    plugin = SchedulerConfig(feature_gates=gates).framework().plugin("ElasticQuota")
    assert isinstance(plugin, ElasticQuota)
    assert plugin.guarantee_usage
    default = SchedulerConfig().framework().plugin("ElasticQuota")
    assert isinstance(default, ElasticQuota)
    assert not default.guarantee_usage
    with pytest.raises(InputError, match=r"NoSuchGate.*unknown feature gate"):
        parse_feature_gates("NoSuchGate=true")
    with pytest.raises(InputError, match="must be true or false"):
        parse_feature_gates("ElasticQuotaGuaranteeUsage=maybe")
