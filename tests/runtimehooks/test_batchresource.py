"""The BatchResource hook's formulas, against upstream's (batch_resource.go, rule.go) and
Kubernetes' MilliCPUToShares."""

from __future__ import annotations

import pytest

from apis.extension import ANNOTATION_EXTENDED_RESOURCE_SPEC, LABEL_POD_QOS
from apis.manager_keys import BATCH_CPU, MID_CPU, MID_MEMORY
from apis.slo_inforce import NodeSLOInForce, node_slo_in_force
from koordlet.runtimehooks.batchresource import (
    BatchResource,
    milli_cpu_to_quota,
    milli_cpu_to_shares,
)
from koordlet.runtimehooks.errors import BadPodInput
from koordlet.runtimehooks.extresources import milli_cpu
from koordlet.runtimehooks.model import (
    ContainerRequest,
    HookPoint,
    PodMeta,
    PodRequest,
    Resources,
)
from tests.runtimehooks.helpers import BE_LABELS, batch, spec_annotation

POD = PodMeta("be-1", "default", "11111111-2222-3333-4444-555555555555")
GI = 1 << 30


def threshold(section: dict[str, object]) -> NodeSLOInForce:
    """The NodeSLO in force for a spec holding only ``resourceUsedThresholdWithBE``."""
    doc = {"resourceUsedThresholdWithBE": section}
    return node_slo_in_force(doc, source="test", strict=True, now=0.0)


def hook(slo: NodeSLOInForce | None = None) -> BatchResource:
    return BatchResource(lambda: slo or NodeSLOInForce())


def pod_req(annotations: dict[str, str], labels: dict[str, str] = BE_LABELS) -> PodRequest:
    return PodRequest(
        HookPoint.PRE_RUN_POD_SANDBOX, POD, labels, annotations, "/kubepods/besteffort/pod1"
    )


def container_req(
    name: str, annotations: dict[str, str], resources: Resources | None = None
) -> ContainerRequest:
    return ContainerRequest(
        HookPoint.PRE_CREATE_CONTAINER,
        POD,
        name,
        pod_labels=BE_LABELS,
        pod_annotations=annotations,
        resources=resources or Resources(),
    )


@pytest.mark.parametrize(
    ("milli", "shares"),
    [(0, 2), (1, 2), (2, 2), (10, 10), (1000, 1024), (250, 256), (500_000, 262144)],
)
def test_shares_are_kubernetes_milli_cpu_to_shares(milli: int, shares: int) -> None:
    assert milli_cpu_to_shares(milli) == shares


def test_quota_is_the_limit_times_the_period_with_a_floor_and_minus_one_without_a_limit() -> None:
    assert milli_cpu_to_quota(1000, 100_000) == 100_000
    assert milli_cpu_to_quota(2500, 100_000) == 250_000
    assert milli_cpu_to_quota(5, 100_000) == 1000  # cfs_quota_us is at least 1000
    assert milli_cpu_to_quota(0, 100_000) == -1
    assert milli_cpu_to_quota(-1, 100_000) == -1


@pytest.mark.parametrize(
    ("text", "milli"),
    [("1000", 1000), ("2", 2), ("1k", 1000), ("0.5", 500), ("500m", 500), ("1.5", 1500)],
)
def test_batch_cpu_is_milli_cores_when_whole_and_cores_if_fractional(text: str, milli: int) -> None:
    # upstream GetBatchMilliCPUFromResourceList: Value() unless Value()*1000 != MilliValue()
    from apis.quantity import parse_quantity

    assert milli_cpu(parse_quantity(text)) == milli


def test_a_be_pod_gets_the_sum_of_its_containers_at_pod_level() -> None:
    ann = spec_annotation({"a": batch("1000", "2000", "1Gi"), "b": batch("500", "1000", "2Gi")})
    change = hook().pod(pod_req(ann))
    assert change is not None
    assert change.resources == Resources(
        cpu_shares=1536, cfs_quota=300_000, cfs_period=100_000, memory_limit=3 * GI
    )


def test_one_container_without_limits_makes_the_pod_unlimited() -> None:
    no_limits = {"requests": {BATCH_CPU: "1000"}}
    ann = spec_annotation({"a": batch("1000", "2000", "1Gi"), "b": no_limits})
    change = hook().pod(pod_req(ann))
    assert change is not None
    assert change.resources.cfs_quota == -1
    assert change.resources.memory_limit == -1
    assert change.resources.cpu_shares == 2048


def test_container_level_uses_its_own_entry_of_the_spec() -> None:
    ann = spec_annotation({"main": batch("1000", "2000", "1Gi"), "side": batch("250", None, None)})
    main = hook().container(container_req("main", ann))
    side = hook().container(container_req("side", ann))
    assert main is not None
    assert side is not None
    assert main.resources == Resources(
        cpu_shares=1024, cfs_quota=200_000, cfs_period=100_000, memory_limit=GI
    )
    assert side.resources == Resources(cpu_shares=256, cfs_quota=-1, memory_limit=-1)
    assert hook().container(container_req("not-in-spec", ann)) is None


def test_the_requests_period_is_used_for_the_quota() -> None:
    ann = spec_annotation({"main": batch("1000", "1000", "1Gi")})
    change = hook().container(container_req("main", ann, Resources(cfs_period=50_000)))
    assert change is not None
    assert change.resources.cfs_quota == 50_000
    assert change.resources.cfs_period == 50_000


def test_cfs_quota_suppression_of_be_unsets_the_quota() -> None:
    # rule.go: resourceUsedThresholdWithBE.enable and cpuSuppressPolicy cfsQuota -> quota -1
    slo = threshold({"enable": True, "cpuSuppressPolicy": "cfsQuota"})
    ann = spec_annotation({"main": batch("1000", "2000", "1Gi")})
    assert hook(slo).container(container_req("main", ann)).resources.cfs_quota == -1  # type: ignore[union-attr]
    assert hook(slo).pod(pod_req(ann)).resources.cfs_quota == -1  # type: ignore[union-attr]
    cpuset = threshold({"enable": True})
    assert hook(cpuset).pod(pod_req(ann)).resources.cfs_quota == 200_000  # type: ignore[union-attr]


def test_pods_that_are_neither_batch_nor_mid_are_left_alone() -> None:
    ann = spec_annotation({"main": batch("1000", "2000", "1Gi")})
    assert hook().pod(pod_req(ann, labels={LABEL_POD_QOS: "LS"})) is None
    assert hook().pod(pod_req({}, labels=BE_LABELS)) is None


def test_a_mid_pod_is_sized_by_its_mid_resources() -> None:
    ann = spec_annotation(
        {"m": {"requests": {MID_CPU: "2000"}, "limits": {MID_CPU: "4000", MID_MEMORY: "2Gi"}}}
    )
    change = hook().pod(pod_req(ann, labels={LABEL_POD_QOS: "LS"}))
    assert change is not None
    assert change.resources == Resources(
        cpu_shares=2048, cfs_quota=400_000, cfs_period=100_000, memory_limit=2 * GI
    )


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("{not json", ANNOTATION_EXTENDED_RESOURCE_SPEC),
        ('{"containers": {"a": {"limits": {"kubernetes.io/batch-cpu": "lots"}}}}', "batch-cpu"),
        ('{"containers": {"a": {"requests": {"kubernetes.io/batch-memory": "-1"}}}}', "memory"),
        ('{"containers": ["a"]}', "containers"),
    ],
)
def test_malformed_quantities_are_bad_input_naming_the_field(value: str, field: str) -> None:
    with pytest.raises(BadPodInput, match=field) as err:
        hook().pod(pod_req({ANNOTATION_EXTENDED_RESOURCE_SPEC: value}))
    assert err.value.reason == "InvalidExtendedResourceSpec"
