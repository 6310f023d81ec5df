"""The ``node.koordinator.sh/extended-resource-spec`` annotation: Go's bytes, Go's decoding of an
existing one, and what the koordlet's BatchResource hook makes of what we write.

Upstream: ``pkg/webhook/pod/mutating/extended_resource_spec.go`` (what is written and when),
``apis/extension/resource.go`` (``ExtendedResourceSpec``, ``Get``/``SetExtendedResourceSpec``),
``pkg/koordlet/runtimehooks/hooks/batchresource/batch_resource_test.go`` (the limits the hook
applies for a spec: ``Test_plugin_SetPodResources``, ``Test_plugin_SetContainerResources``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from apis.extension import ANNOTATION_EXTENDED_RESOURCE_SPEC as SPEC
from apis.slo_inforce import NodeSLOInForce
from koordlet.runtimehooks.batchresource import BatchResource
from koordlet.runtimehooks.model import (
    ContainerRequest,
    HookPoint,
    PodMeta,
    PodRequest,
    Resources,
)
from manager.webhook import extendedspec
from manager.webhook.extendedspec import SpecError, parse_existing
from manager.webhook.profiles import PriorityClassRef, Profile, parse_profiles
from manager.webhook.server import mutate_pod

GI = 1 << 30
BATCH_CPU, BATCH_MEMORY = "kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"
BE = {"koordinator.sh/qosClass": "BE"}

UPSTREAM_TEST_SPEC_1 = (
    '{"containers":{"container-0":{"limits":{"kubernetes.io/batch-cpu":"500",'
    '"kubernetes.io/batch-memory":"2Gi"},"requests":{"kubernetes.io/batch-cpu":"500",'
    '"kubernetes.io/batch-memory":"2Gi"}},"container-1":{"limits":{"kubernetes.io/batch-cpu":'
    '"1k","kubernetes.io/batch-memory":"2Gi"}}}}'
)
"""``json.Marshal(testSpec1)`` of upstream's ``Test_plugin_SetPodResources`` ("a Batch pod with
cpu memory requests 1"): container-0 asks for and is limited to ``MustParse("500")`` batch-cpu
and ``MustParse("2Gi")`` batch-memory, container-1 only limited to ``MustParse("1000")`` and
``2Gi``. Upstream's test builds these bytes with ``json.Marshal``; spelt out, Go's rules give
``"1k"`` for ``"1000"`` and leave out container-1's nil requests (``omitempty``)."""


class FixedLookups:
    def __init__(self, profiles: list[Profile], classes: Mapping[str, int]) -> None:
        self._profiles = profiles
        self._classes = classes

    def profiles(self) -> list[Profile]:
        return self._profiles

    async def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        return {}

    async def priority_class(self, name: str) -> PriorityClassRef | None:
        value = self._classes.get(name)
        return None if value is None else PriorityClassRef(value, "PreemptLowerPriority")


def container(name: str, requests: dict[str, str] | None, limits: dict[str, str] | None) -> Any:
    resources = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": name, "image": "busybox", "resources": resources}


def be_pod(*containers: Any, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "be-1", "namespace": "default", "labels": dict(labels or BE)},
        "spec": {"containers": list(containers)},
    }


async def webhook(pod: dict[str, Any], profiles: list[Profile] | None = None) -> dict[str, Any]:
    lookups = FixedLookups(profiles or [], {"koord-batch": 5500})
    mutated, _ = await mutate_pod(pod, "default", lookups, roll=lambda: 0)
    return mutated


def hook() -> BatchResource:
    return BatchResource(lambda: NodeSLOInForce())  # cfsQuota suppression off: quotas apply


POD_META = PodMeta("be-1", "default", "11111111-2222-3333-4444-555555555555")


def pod_level(annotations: Mapping[str, str]) -> Resources:
    req = PodRequest(HookPoint.PRE_RUN_POD_SANDBOX, POD_META, BE, dict(annotations), "/kubepods")
    change = hook().pod(req)
    assert change is not None
    return change.resources


def container_level(annotations: Mapping[str, str], name: str) -> Resources:
    req = ContainerRequest(
        HookPoint.PRE_CREATE_CONTAINER,
        POD_META,
        name,
        pod_labels=BE,
        pod_annotations=dict(annotations),
        resources=Resources(),
    )
    change = hook().container(req)
    assert change is not None
    return change.resources


# What we write is what upstream writes, and what the hook makes of it -----------------------
async def test_our_annotation_for_upstreams_test_spec_is_upstreams_bytes() -> None:
    mutated = await webhook(
        be_pod(
            container(
                "container-0",
                {BATCH_CPU: "500", BATCH_MEMORY: "2Gi"},
                {BATCH_CPU: "500", BATCH_MEMORY: "2Gi"},
            ),
            container("container-1", None, {BATCH_CPU: "1000", BATCH_MEMORY: "2Gi"}),
        )
    )
    assert mutated["metadata"]["annotations"][SPEC] == UPSTREAM_TEST_SPEC_1


def test_upstreams_bytes_give_the_limits_upstreams_hook_applies() -> None:
    # "a Batch pod with cpu memory requests 1": CPUShares 1024*500/1000,
    # CFSQuota 100000*1500/1000, MemoryLimit 4Gi (container-1 has no requests to share)
    assert pod_level({SPEC: UPSTREAM_TEST_SPEC_1}) == Resources(
        cpu_shares=512, cfs_quota=150_000, cfs_period=100_000, memory_limit=4 * GI
    )
    # Test_plugin_SetContainerResources, "a Batch container with cpu memory requests"
    assert container_level({SPEC: UPSTREAM_TEST_SPEC_1}, "container-0") == Resources(
        cpu_shares=512, cfs_quota=50_000, cfs_period=100_000, memory_limit=2 * GI
    )


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        # 1 core and 1.5 cores moved by a BE profile: "1k" and "1500" batch-cpu
        (
            ({"cpu": "1", "memory": "3Gi"}, {"cpu": "1500m", "memory": "3Gi"}),
            Resources(cpu_shares=1024, cfs_quota=150_000, cfs_period=100_000, memory_limit=3 * GI),
        ),
        # a request only: no limit (upstream's "keep limit unset"), so no quota and no limit
        (
            ({"cpu": "250m", "memory": "512Mi"}, None),
            Resources(cpu_shares=256, cfs_quota=-1, memory_limit=-1),
        ),
        # a limit only: the request follows it
        (
            (None, {"cpu": "2", "memory": "1Gi"}),
            Resources(cpu_shares=2048, cfs_quota=200_000, cfs_period=100_000, memory_limit=GI),
        ),
    ],
)
async def test_a_pod_a_profile_made_batch_is_limited_at_creation_as_upstream_limits_it(
    resources: tuple[dict[str, str] | None, dict[str, str] | None], expected: Resources
) -> None:
    profile = parse_profiles(
        [
            {
                "metadata": {"name": "be"},
                "spec": {
                    "selector": {"matchLabels": {"app": "spark"}},
                    "qosClass": "BE",
                    "priorityClassName": "koord-batch",
                },
            }
        ]
    )
    mutated = await webhook(be_pod(container("main", *resources), labels={"app": "spark"}), profile)
    annotations = mutated["metadata"]["annotations"]
    # upstream's formulas: shares = milli * 1024 / 1000, quota = milli * 100000 / 1000, bytes
    assert container_level(annotations, "main") == expected
    assert pod_level(annotations) == expected


# When the annotation is written ---------------------------------------------------------------
async def test_init_containers_are_left_out_as_upstream_leaves_them() -> None:
    pod = be_pod(container("main", {BATCH_CPU: "500"}, None))
    pod["spec"]["initContainers"] = [container("init", {BATCH_CPU: "100"}, None)]
    mutated = await webhook(pod)
    assert mutated["metadata"]["annotations"][SPEC] == (
        '{"containers":{"main":{"requests":{"kubernetes.io/batch-cpu":"500"}}}}'
    )


async def test_mid_resources_are_carried_beside_batch_ones() -> None:
    pod = be_pod(
        container("main", {"kubernetes.io/mid-cpu": "2000"}, {"kubernetes.io/mid-memory": "1Gi"})
    )
    mutated = await webhook(pod)
    assert mutated["metadata"]["annotations"][SPEC] == (
        '{"containers":{"main":{"limits":{"kubernetes.io/mid-memory":"1Gi"},'
        '"requests":{"kubernetes.io/mid-cpu":"2k"}}}}'
    )


async def test_a_pod_without_extended_resources_gets_no_annotation() -> None:
    mutated = await webhook(be_pod(container("main", {"cpu": "1"}, None)))
    assert "annotations" not in mutated["metadata"]


def with_annotation(pod: dict[str, Any], text: str) -> dict[str, Any]:
    pod["metadata"]["annotations"] = {SPEC: text}
    return pod


@pytest.mark.parametrize(
    ("existing", "kept"),
    [
        ('{"containers":{"main":{"limits":{"kubernetes.io/batch-cpu":"1k"},"requests":{}}}}', True),
        # Go's parse leaves the absent requests nil where the webhook built an empty map
        ('{"containers":{"main":{"limits":{"kubernetes.io/batch-cpu":"1k"}}}}', False),
        # field names match case-insensitively, as encoding/json matches them
        ('{"Containers":{"main":{"LIMITS":{"kubernetes.io/batch-cpu":"1k"},"Requests":{}}}}', True),
        # "1000" and "1k" are one value but not DeepEqual
        (
            '{"containers":{"main":{"limits":{"kubernetes.io/batch-cpu":"1000"},"requests":{}}}}',
            False,
        ),
        # a resource the webhook does not carry makes it differ
        (
            '{"containers":{"main":{"limits":{"kubernetes.io/batch-cpu":"1k","x":"1"},"requests":{}}}}',
            False,
        ),
    ],
)
def test_an_existing_annotation_is_kept_only_when_deep_equal(existing: str, kept: bool) -> None:
    pod = with_annotation(be_pod(container("main", {}, {BATCH_CPU: "1k"})), existing)
    written = extendedspec.mutate(pod)
    assert written is not kept
    expected = (
        existing if kept else '{"containers":{"main":{"limits":{"kubernetes.io/batch-cpu":"1k"}}}}'
    )
    assert pod["metadata"]["annotations"][SPEC] == expected


async def test_a_translated_core_equals_an_existing_1000_but_not_a_1500() -> None:
    """``NewQuantity(1000, DecimalSI)`` is DeepEqual to ``MustParse("1000")`` (neither keeps its
    text) but ``NewQuantity(1500, DecimalSI)`` is not to ``MustParse("1500")`` (which does)."""
    profile = parse_profiles(
        [
            {
                "metadata": {"name": "be"},
                "spec": {"priorityClassName": "koord-batch", "qosClass": "BE"},
            }
        ]
    )
    for cpu, existing, kept in (("1", "1000", True), ("1500m", "1500", False)):
        side = f'{{"{BATCH_CPU}":"{existing}"}}'
        text = f'{{"containers": {{"main": {{"limits": {side}, "requests": {side}}}}}}}'
        pod = with_annotation(be_pod(container("main", {"cpu": cpu}, {"cpu": cpu})), text)
        mutated = await webhook(pod, profile)
        written = mutated["metadata"]["annotations"][SPEC]
        assert (written == text) is kept, (cpu, written)  # a rewrite is compact


# Go's decoding of what is there -----------------------------------------------------------------
def test_go_decodes_nulls_repeats_and_numbers_as_encoding_json_does() -> None:
    assert parse_existing("null") is None
    assert parse_existing("{}") is None
    assert parse_existing('{"containers":null}') is None
    assert parse_existing('{"containers":{}}') == {}
    spec = parse_existing(
        '{"containers":{"a":{"limits":{"kubernetes.io/batch-cpu":1000}}},'
        '"containers":{"b":null},"unknown":1}'
    )
    assert spec is not None
    assert set(spec) == {"a", "b"}  # a repeated key decodes into the same map
    assert spec["b"] == (None, None)
    assert spec["a"][0] == {BATCH_CPU: ("i", 1000, 0, "DecimalSI", None)}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("{not json", ""),
        ("[]", ""),
        ('{"containers":[]}', "containers"),
        ('{"containers":{"a":[]}}', "containers.a"),
        ('{"containers":{"a":{"requests":[]}}}', "containers.a.requests"),
        ('{"containers":{"a":{"requests":{"kubernetes.io/batch-cpu":true}}}}', "batch-cpu"),
        ('{"containers":{"a":{"requests":{"kubernetes.io/batch-cpu":"1x"}}}}', "batch-cpu"),
    ],
)
def test_what_go_cannot_decode_is_an_error_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_existing(text)
    assert err.value.source == f"annotation {SPEC}"
    assert field in err.value.field
