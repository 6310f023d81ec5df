"""Coscheduling: gangs by PodGroup or annotations, minMember, timeout."""

from __future__ import annotations

from scheduler_plugins.plugins.coscheduling import Coscheduling
from tests.scheduler.builders import NOW, node, pod, ts
from tests.scheduler.helpers import evaluate

PG = "pod-group.scheduling.sigs.k8s.io"


def pod_group(name, min_member, timeout=None):
    spec = {"minMember": min_member}
    if timeout is not None:
        spec["scheduleTimeoutSeconds"] = timeout
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def gang_pod(name, *, group="job", node_name="", created=NOW - 10, annotations=None):
    p = pod(name, node_name=node_name, labels={PG: group}, annotations=annotations)
    p["metadata"]["creationTimestamp"] = ts(created)
    return p


def verdict(objects, p):
    result = evaluate([node("n1"), *objects], p, plugins=[Coscheduling()])
    return result.nodes["n1"].reasons


def test_a_gang_that_cannot_fit_its_min_member_is_rejected():
    objects = [pod_group("job", 3), gang_pod("w1")]
    assert verdict(objects, gang_pod("w0")) == [
        "gang child pod not collect enough, gangName: default/job, podName: default/w0"
    ]


def test_a_complete_gang_passes_and_a_satisfied_gang_admits_later_members():
    assert verdict([pod_group("job", 3), gang_pod("w1"), gang_pod("w2")], gang_pod("w0")) == []
    satisfied = [
        pod_group("job", 2),
        gang_pod("w1", node_name="n1"),
        gang_pod("w2", node_name="n1"),
    ]
    assert verdict(satisfied, gang_pod("w9")) == []


def test_an_unknown_pod_group_is_reported():
    assert verdict([], gang_pod("w0", group="ghost")) == [
        "can't find gang, gangName: default/ghost, podName: default/w0"
    ]


def test_strict_gangs_time_out_non_strict_ones_do_not():
    old = NOW - 700
    objects = [pod_group("job", 2), gang_pod("w1", created=old)]
    assert verdict(objects, gang_pod("w0", created=old)) == [
        "gang has timeout, gangName: default/job, podName: default/w0"
    ]
    ann = {
        "gang.scheduling.koordinator.sh/name": "g",
        "gang.scheduling.koordinator.sh/min-available": "2",
        "gang.scheduling.koordinator.sh/mode": "NonStrict",
    }
    loose = [pod("a", annotations=ann)]
    loose[0]["metadata"]["creationTimestamp"] = ts(old)
    assert verdict(loose, pod("b", annotations=ann)) == []


def test_gang_annotations_define_a_gang_without_a_pod_group():
    ann = {
        "gang.scheduling.koordinator.sh/name": "g",
        "gang.scheduling.koordinator.sh/min-available": "3",
    }
    assert verdict([pod("a", annotations=ann)], pod("b", annotations=ann)) == [
        "gang child pod not collect enough, gangName: default/g, podName: default/b"
    ]


def test_pods_outside_gangs_pass():
    assert verdict([pod_group("job", 5)], pod("solo")) == []
