"""A pod's Koordinator priority class: one rule, upstream's, and every component applies it.

The tables are upstream's ``apis/extension/priority_utils_test.go`` (``TestGetPriorityClass`` for
``GetPodPriorityClassRaw``, ``TestGetPodPriorityClassWithDefault``), with cases added for what
those functions say but the tests leave out (an empty label, a value outside every band, each
QoS class's default).
"""

from __future__ import annotations

from typing import Any

import pytest

from apis.extension import LABEL_POD_PRIORITY_CLASS, LABEL_POD_QOS, QoSClass
from apis.priority import (
    PRIORITY_BATCH,
    PRIORITY_FREE,
    PRIORITY_MID,
    PRIORITY_PROD,
    PRIORITY_PROD_VALUE_MAX,
    PRIORITY_PROD_VALUE_MIN,
    pod_priority_class_raw,
    pod_priority_class_with_default,
    priority_class_by_name,
    priority_class_with_qos,
)
from descheduler.podfacts import pod_facts
from koordlet.statesinformer.kube import kube_qos_of, pod_info, qos_of
from koordlet.system.cgroups import CgroupDriver, CgroupLayout, CgroupVersion
from koordlet.system.paths import HostPaths
from manager.noderesource.inputs import _fast_pod
from manager.noderesource.inputs import parse_pod as manager_parse_pod
from scheduler_plugins.snapshot import parse_pod as scheduler_parse_pod

PROD_MID = (PRIORITY_PROD_VALUE_MIN + PRIORITY_PROD_VALUE_MAX) // 2  # 9499
BATCH_MID = (5000 + 5999) // 2  # 5499, (PriorityBatchValueMin + Max) / 2
UID = "6f1f0b2a-0000-4000-8000-000000000001"


def _pod(
    labels: dict[str, str] | None = None,
    priority: int | None = None,
    resources: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": "node-1",
        "containers": [{"name": "abc", "resources": resources or {}}],
    }
    if priority is not None:
        spec["priority"] = priority
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": UID}
    if labels is not None:
        meta["labels"] = labels
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running"}}


LABEL = LABEL_POD_PRIORITY_CLASS
QOS = LABEL_POD_QOS

# TestGetPriorityClass: (labels, spec.priority, GetPodPriorityClassRaw)
RAW_CASES = [
    ({}, PROD_MID, PRIORITY_PROD),
    ({}, BATCH_MID, PRIORITY_BATCH),
    ({LABEL: PRIORITY_PROD}, BATCH_MID, PRIORITY_PROD),
    ({LABEL: "unknown"}, BATCH_MID, ""),
    # beyond upstream's table: what the function says
    ({LABEL: ""}, BATCH_MID, ""),  # present but empty: still the label's (no class)
    ({LABEL: PRIORITY_MID}, None, PRIORITY_MID),
    ({}, 7999, PRIORITY_MID),
    ({}, 3000, PRIORITY_FREE),
    ({}, 4000, ""),  # between bands
    ({}, None, ""),
    (None, PROD_MID, PRIORITY_PROD),  # no labels at all
]


@pytest.mark.parametrize(("labels", "priority", "expected"), RAW_CASES)
def test_the_raw_class_is_the_label_when_present_else_the_band(
    labels: dict[str, str] | None, priority: int | None, expected: str
) -> None:
    assert pod_priority_class_raw(labels, priority) == expected


@pytest.mark.parametrize(
    ("qos", "expected"),
    [
        (QoSClass.SYSTEM, PRIORITY_PROD),
        (QoSClass.LSE, PRIORITY_PROD),
        (QoSClass.LSR, PRIORITY_PROD),
        (QoSClass.LS, PRIORITY_PROD),
        (QoSClass.BE, PRIORITY_BATCH),
        (QoSClass.NONE, ""),
        ("LS", PRIORITY_PROD),  # a plain string compares as the enum does
        ("bogus", ""),
    ],
)
def test_each_qos_class_has_upstreams_default_priority_class(qos: str, expected: str) -> None:
    assert priority_class_with_qos(qos) == expected


def test_only_the_four_class_names_are_classes() -> None:
    for name in (PRIORITY_PROD, PRIORITY_MID, PRIORITY_BATCH, PRIORITY_FREE):
        assert priority_class_by_name(name) == name
    for name in ("", "koord-PROD", "prod", 9500, None):
        assert priority_class_by_name(name) == ""


# TestGetPodPriorityClassWithDefault: (labels, spec.priority, resources, expected); the QoS
# with its default is derived from the pod as GetPodQoSClassWithDefault does.
GUARANTEED = {"requests": {"cpu": "100"}, "limits": {"cpu": "100", "memory": "1Gi"}}
WITH_DEFAULT_CASES = [
    pytest.param({}, PROD_MID, None, PRIORITY_PROD, id="band"),
    pytest.param({LABEL: PRIORITY_PROD}, BATCH_MID, None, PRIORITY_PROD, id="label-over-band"),
    pytest.param({QOS: "LSR"}, BATCH_MID, None, PRIORITY_BATCH, id="band-over-qos"),
    pytest.param({QOS: "LSR"}, None, None, PRIORITY_PROD, id="lsr-default"),
    pytest.param({QOS: "BE"}, None, None, PRIORITY_BATCH, id="be-default"),
    pytest.param(
        {},
        None,
        {"requests": {"cpu": "100"}, "limits": {"cpu": "200"}},
        PRIORITY_PROD,
        id="burstable",
    ),
    pytest.param({}, None, GUARANTEED, PRIORITY_PROD, id="guaranteed"),
    pytest.param({}, None, None, PRIORITY_BATCH, id="besteffort"),
    # beyond upstream's table
    pytest.param(
        {LABEL: "unknown", QOS: "BE"}, PROD_MID, None, PRIORITY_BATCH, id="unknown-label-qos"
    ),
    pytest.param({QOS: "LS"}, 4000, None, PRIORITY_PROD, id="out-of-band-qos"),
    pytest.param({LABEL: PRIORITY_MID, QOS: "BE"}, None, None, PRIORITY_MID, id="mid-label-be"),
]


@pytest.mark.parametrize(("labels", "priority", "resources", "expected"), WITH_DEFAULT_CASES)
def test_the_class_with_default_falls_back_to_the_qos_default(
    labels: dict[str, str], priority: int | None, resources: dict[str, Any] | None, expected: str
) -> None:
    pod = _pod(labels, priority, resources)
    qos = qos_of(labels, kube_qos_of(pod))
    assert pod_priority_class_with_default(labels, priority, qos) == expected


@pytest.mark.parametrize(("labels", "priority", "resources", "expected"), WITH_DEFAULT_CASES)
def test_every_component_gives_a_pod_the_same_class(
    labels: dict[str, str], priority: int | None, resources: dict[str, Any] | None, expected: str
) -> None:
    """The koordlet's states informer, the manager's calculation (fast and checked paths), the
    scheduler's snapshot and the descheduler's pod facts all apply
    GetPodPriorityClassWithDefault."""
    pod = _pod(labels, priority, resources)
    paths = HostPaths("/nonexistent/cgroup", "/nonexistent/proc", "/nonexistent/sys")
    layout = CgroupLayout(paths, CgroupVersion.V1, CgroupDriver.CGROUPFS, "kubepods")
    scheduled = scheduler_parse_pod(pod, "test")
    assert {
        "koordlet": pod_info(pod, layout).priority_class,
        "manager (fast)": _fast_pod(pod).priority_class,
        "manager (checked)": manager_parse_pod(
            {**pod, "spec": {**pod["spec"], "overhead": {"cpu": "0"}}}, "test", "pod"
        ).priority_class,
        "scheduler": scheduled.priority_class,
        "descheduler": pod_facts(scheduled).priority_class,
    } == dict.fromkeys(
        ("koordlet", "manager (fast)", "manager (checked)", "scheduler", "descheduler"), expected
    )
