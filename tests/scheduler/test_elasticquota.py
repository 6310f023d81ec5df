"""ElasticQuota: runtime quota of a tree under contention, max, non-preemptible pods."""

from __future__ import annotations

import json

import pytest

from scheduler_plugins.plugins.elasticquota import (
    ElasticQuota,
    compute_runtime,
    distribute,
    parse_quotas,
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


def test_distribution_is_exact_for_awkward_weights():
    got = distribute(10, {"a": 10, "b": 10, "c": 10}, {}, {"a": 1, "b": 1, "c": 1})
    assert sum(got.values()) == 10
    assert sorted(got.values()) == [3, 3, 4]
