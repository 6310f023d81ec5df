"""kube-scheduler's in-tree scores and the default profile's weights
(``pkg/scheduler/framework/plugins``: noderesources, tainttoleration, nodeaffinity,
imagelocality; ``apis/config/v1/default_plugins.go``)."""

from __future__ import annotations

import pytest

from scheduler_plugins.framework import Framework
from scheduler_plugins.plugins.balancedallocation import BalancedAllocation
from scheduler_plugins.plugins.imagelocality import ImageLocality
from scheduler_plugins.plugins.nodeaffinity import NodeAffinity
from scheduler_plugins.plugins.noderesourcesfit import NodeResourcesFit, build
from scheduler_plugins.plugins.tainttoleration import TaintToleration
from scheduler_plugins.snapshot import parse_pod
from scheduler_plugins.table import DEFAULT_WEIGHTS, build_framework
from tests.scheduler.builders import node, pod
from tests.scheduler.helpers import evaluate, snapshot_of

MB = 1024 * 1024


def scores(objects, p, plugin):
    result = evaluate(objects, p, plugins=[plugin])
    return {name: r.scores.get(plugin.name) for name, r in result.nodes.items()}


def test_the_default_profile_weights_are_kube_schedulers():
    assert {
        k: DEFAULT_WEIGHTS[k]
        for k in (
            "TaintToleration",
            "NodeAffinity",
            "PodTopologySpread",
            "InterPodAffinity",
            "NodeResourcesFit",
            "NodeResourcesBalancedAllocation",
            "ImageLocality",
        )
    } == {
        "TaintToleration": 3,
        "NodeAffinity": 2,
        "PodTopologySpread": 2,
        "InterPodAffinity": 2,
        "NodeResourcesFit": 1,
        "NodeResourcesBalancedAllocation": 1,
        "ImageLocality": 1,
    }


def test_least_allocated_scores_what_is_left_after_the_pod_with_default_requests():
    objects = [
        node("n1", cpu="4", memory="8Gi"),
        pod("r", node_name="n1", requests={"cpu": "1", "memory": "2Gi"}),
        node("n2", cpu="4", memory="8Gi"),
    ]
    got = scores(objects, pod("p", requests={"cpu": "1", "memory": "2Gi"}), NodeResourcesFit())
    assert got == {"n1": 50, "n2": 75}  # (4-2)/4, (8-4)/8 -> 50; (4-1)/4, (8-2)/8 -> 75
    # a container without requests counts 100m and 200 MiB
    bare = scores([node("n1", cpu="1", memory="1000Mi")], pod("p"), NodeResourcesFit())
    assert bare == {"n1": (90 + 80) // 2}


def test_most_allocated_is_configurable_with_resource_weights():
    fit = build(
        {"scoringStrategy": {"type": "MostAllocated", "resources": [{"name": "cpu", "weight": 1}]}},
        "cfg",
    )
    objects = [node("n1", cpu="4"), pod("r", node_name="n1", requests={"cpu": "1"})]
    assert scores(objects, pod("p", requests={"cpu": "1"}), fit) == {"n1": 50}


@pytest.mark.parametrize(
    ("requests", "expected"),
    [
        ({"cpu": "2", "memory": "1Gi"}, 81),  # fractions 0.5 and 0.125: std 0.1875
        ({"cpu": "2", "memory": "4Gi"}, 100),  # 0.5 and 0.5
        ({"cpu": "8", "memory": "1Gi"}, 56),  # cpu capped at 1: (1 - 0.125) / 2 = 0.4375
    ],
)
def test_balanced_allocation_prefers_even_fractions(requests, expected):
    got = scores(
        [node("n1", cpu="4", memory="8Gi")], pod("p", requests=requests), BalancedAllocation()
    )
    assert got == {"n1": expected}


def test_balanced_allocation_skips_best_effort_pods():
    result = evaluate([node("n1")], pod("p"), plugins=[BalancedAllocation()])
    assert result.nodes["n1"].scores == {}


def test_prefer_no_schedule_taints_are_counted_and_normalized_in_reverse():
    soft = [{"key": k, "effect": "PreferNoSchedule"} for k in ("a", "b")]
    objects = [node("two", taints=soft), node("one", taints=soft[:1]), node("none")]
    assert scores(objects, pod("p"), TaintToleration()) == {"two": 0, "one": 50, "none": 100}
    # a toleration with effect NoSchedule does not count for PreferNoSchedule taints
    p = pod("q", spec={"tolerations": [{"key": "a", "operator": "Exists", "effect": "NoSchedule"}]})
    assert scores(objects, p, TaintToleration()) == {"two": 0, "one": 50, "none": 100}
    p = pod("q", spec={"tolerations": [{"key": "a", "operator": "Exists"}]})
    assert scores(objects, p, TaintToleration()) == {"two": 0, "one": 100, "none": 100}


def test_preferred_node_affinity_sums_matching_weights_normalized_to_the_best():
    def pref(weight, key, value):
        expr = {"key": key, "operator": "In", "values": [value]}
        return {"weight": weight, "preference": {"matchExpressions": [expr]}}

    spec = {
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    pref(80, "zone", "a"),
                    pref(20, "disk", "ssd"),
                ]
            }
        }
    }
    objects = [
        node("both", labels={"zone": "a", "disk": "ssd"}),
        node("zone", labels={"zone": "a"}),
        node("disk", labels={"disk": "ssd"}),
        node("none"),
    ]
    assert scores(objects, pod("p", spec=spec), NodeAffinity()) == {
        "both": 100,
        "zone": 80,
        "disk": 20,
        "none": 0,
    }
    # without preferred terms the plugin takes no part
    assert evaluate(objects, pod("q"), plugins=[NodeAffinity()]).scoring_plugins == []


def test_image_locality_scales_the_image_size_by_its_spread():
    image = [{"names": ["nginx:1.25"], "sizeBytes": 500 * MB}]
    redis = [{"names": ["redis:latest"], "sizeBytes": 600 * MB}]
    objects = [node("n1", images=image), node("n2", images=image), node("n3", images=redis)]
    p = pod("p")
    p["spec"]["containers"][0]["image"] = "nginx:1.25"
    got = scores(objects, p, ImageLocality())
    # 500 MiB * 2/3 = 333 MiB, (333 - 23) * 100 // (1000 - 23)
    assert got == {"n1": 31, "n2": 31, "n3": 0}
    p["spec"]["containers"][0]["image"] = "redis"  # untagged means :latest
    got = scores(objects, p, ImageLocality())
    assert got["n3"] == (int(600 * MB / 3) - 23 * MB) * 100 // (977 * MB)


def test_the_node_rank_is_the_weighted_sum_of_every_plugins_score():
    soft = [{"key": "a", "effect": "PreferNoSchedule"}]
    objects = [node("tainted", taints=soft), node("plain")]
    fw = build_framework()
    p = parse_pod(pod("p", requests={"cpu": "1"}), "pod")
    result = fw.evaluate(snapshot_of(*objects), p, now=0)
    for r in result.nodes.values():
        assert r.weighted == sum(fw.weights[k] * s for k, s in r.scores.items())
        assert r.score == r.weighted // sum(fw.weights[k] for k in r.scores)
    assert result.nodes["tainted"].scores["TaintToleration"] == 0
    assert result.best() == "plain"


def test_a_score_weight_from_the_config_changes_the_rank():
    fw = Framework([TaintToleration(), NodeAffinity()], {"TaintToleration": 0, "NodeAffinity": 2})
    assert fw.weights == {"TaintToleration": 0, "NodeAffinity": 2}
