"""NodeResourcesFit: requests, batch and mid resources included, against allocatable."""

from __future__ import annotations

import pytest

from scheduler_plugins.plugins.noderesourcesfit import NodeResourcesFit
from tests.scheduler.builders import node, pod
from tests.scheduler.helpers import evaluate

BATCH = {"kubernetes.io/batch-cpu": "8000", "kubernetes.io/batch-memory": "16Gi"}
MID = {"kubernetes.io/mid-cpu": "2000", "kubernetes.io/mid-memory": "4Gi"}


@pytest.mark.parametrize(
    ("requests", "reason"),
    [
        ({"kubernetes.io/batch-cpu": "6000"}, "Insufficient kubernetes.io/batch-cpu"),  # 3000 left
        ({"kubernetes.io/batch-cpu": "3000", "kubernetes.io/batch-memory": "4Gi"}, None),
        (
            {"kubernetes.io/batch-memory": "9Gi"},
            "Insufficient kubernetes.io/batch-memory",
        ),  # 8Gi left
        ({"kubernetes.io/mid-cpu": "2001"}, "Insufficient kubernetes.io/mid-cpu"),
        ({"kubernetes.io/mid-memory": "4Gi"}, None),
        ({"cpu": "27"}, "Insufficient cpu"),  # 6 cores requested of 32
        ({"memory": "60Gi"}, "Insufficient memory"),
    ],
)
def test_batch_and_mid_requests_fit_what_the_node_has_left(requests, reason):
    running = pod(
        "running",
        node_name="n1",
        requests={
            "cpu": "6",
            "kubernetes.io/batch-cpu": "5000",
            "kubernetes.io/batch-memory": "8Gi",
            "memory": "8Gi",
        },
    )
    objects = [node("n1", extra=BATCH | MID), running]
    result = evaluate(objects, pod("p", requests=requests), plugins=[NodeResourcesFit()])
    assert result.nodes["n1"].reasons == ([reason] if reason else [])


def test_a_node_without_batch_resources_rejects_batch_pods():
    result = evaluate(
        [node("n1")],
        pod("p", requests={"kubernetes.io/batch-cpu": "1000"}),
        plugins=[NodeResourcesFit()],
    )
    assert result.nodes["n1"].reasons == ["Insufficient kubernetes.io/batch-cpu"]


def test_a_full_node_by_pod_count_is_rejected_in_kube_schedulers_words():
    full = [node("n1", pods="1"), pod("x", node_name="n1")]
    assert evaluate(full, pod("p"), plugins=[NodeResourcesFit()]).nodes["n1"].reasons == [
        "Too many pods"
    ]


def test_requests_default_to_limits_and_init_containers_count_by_their_maximum():
    p = pod("p", limits={"kubernetes.io/batch-cpu": "4000"})
    p["spec"]["initContainers"] = [
        {"name": "init", "resources": {"requests": {"kubernetes.io/batch-cpu": "9000"}}}
    ]
    result = evaluate([node("n1", extra=BATCH)], p, plugins=[NodeResourcesFit()])
    assert result.nodes["n1"].reasons == ["Insufficient kubernetes.io/batch-cpu"]
