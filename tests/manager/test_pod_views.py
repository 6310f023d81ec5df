"""The pod views the calculation reads: the fast path (common shapes, slots filled directly) and
the checked path (any shape, errors naming the field) build the same records."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apis.extension import ANNOTATION_RESOURCE_STATUS
from manager.errors import InputError
from manager.noderesource.inputs import (
    PodView,
    Resources,
    _checked_pod,
    _fast_pod,
    parse_pod,
    parse_pod_list,
)
from tests.manager.builders import pod, pod_list


def _with(p: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``p`` with ``<part>.<key>`` set for each ``<part>__<key>`` (``spec__priority``)."""
    for dotted, value in changes.items():
        part, key = dotted.split("__")
        p.setdefault(part, {})[key] = value
    return p


_NUMA = json.dumps({"numaNodeResources": [{"node": 1}, {"node": 0}]})

COMMON_SHAPES = {
    "requests": pod("a", cpu="500m", memory="1Gi", priority=9500),
    "whole cores, binary memory": pod("a", cpu="2", memory="512Mi", priority=5500),
    "a qos label": pod("a", cpu="1", memory="1Gi", qos="LSE"),
    "no requests (BestEffort)": pod("a"),
    "limits only": _with(
        pod("a"),
        spec__containers=[{"name": "c", "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}],
    ),
    "a priority-class label": _with(
        pod("a", cpu="1"), metadata__labels={"koordinator.sh/priority-class": "koord-mid"}
    ),
    "a NUMA placement": _with(
        pod("a", cpu="1"), metadata__annotations={ANNOTATION_RESOURCE_STATUS: _NUMA}
    ),
    "empty annotations": _with(pod("a", cpu="1"), metadata__annotations={}),
    "no status": {k: v for k, v in pod("a", cpu="1").items() if k != "status"},
    "terminated, on another node": pod("a", cpu="1", phase="Succeeded", node_name="node-2"),
}


@pytest.mark.parametrize("raw", COMMON_SHAPES.values(), ids=COMMON_SHAPES.keys())
def test_the_fast_and_the_checked_path_build_equal_views(raw: dict[str, Any]) -> None:
    fast = _fast_pod(raw)
    assert fast == _checked_pod(raw, "pods", "items[0]")
    assert type(fast) is PodView
    assert type(fast.request) is Resources
    assert hash(fast) == hash(_checked_pod(raw, "pods", "items[0]"))


def test_a_fast_view_holds_what_the_pod_says() -> None:
    raw = _with(
        pod("web", cpu="1500m", memory="2Gi", priority=7100, namespace="shop"),
        metadata__annotations={ANNOTATION_RESOURCE_STATUS: _NUMA},
    )
    assert _fast_pod(raw) == PodView(
        key="shop/web",
        node_name="node-1",
        phase="Running",
        priority_class="koord-mid",
        qos="LS",
        request=Resources(1500, 2 << 30),
        numa_nodes=(1, 0),
    )


def test_a_view_is_frozen_whichever_path_built_it() -> None:
    view = parse_pod(pod("a", cpu="1"), "pods", "items[0]")
    with pytest.raises(AttributeError):
        view.phase = "Failed"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        view.request.cpu = 0  # type: ignore[misc]


def test_a_bad_pod_in_a_list_is_named_by_its_index() -> None:
    bad = _with(pod("b"), spec__containers=[{"resources": {"requests": {"cpu": "lots"}}}])
    with pytest.raises(InputError) as caught:
        parse_pod_list(pod_list(pod("a", cpu="1"), bad), "pods")
    assert "items[1].spec.containers[0].resources.requests.cpu" in str(caught.value)
