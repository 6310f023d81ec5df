"""Koordinator's orders: which pod goes first, which node is hottest.

:func:`pod_sort_key` is upstream's ``PodSorter`` (``pkg/descheduler/utils/sorter/pod.go``), its
comparators in order, each ascending (the first pod is the first to move):

1. Koordinator priority class: koord-free, koord-batch, koord-mid, koord-prod, then none;
2. ``spec.priority``, lower first;
3. Kubernetes QoS: BestEffort, Burstable, Guaranteed;
4. Koordinator QoS: BE, LS, LSR, then LSE and SYSTEM, then none;
5. ``controller.kubernetes.io/pod-deletion-cost``, lower first;
6. ``scheduling.koordinator.sh/eviction-cost``, lower first;
7. (LowNodeLoad only) usage, higher score first, pods without a metric last;
8. creation time, newest first.

The usage score (``ResourceUsageScorerPod``, v1.6's piecewise scorer) weighs, per resource the
node exceeds its high threshold on, the pod's usage ``u`` against the excess ``e``: ``u/e`` below
1, ``e/u + 1`` from 1 on (a pod just big enough to clear the excess scores highest), averaged by
the resources' weights. Ties keep the input order (Python's sort is stable; Go's is not, so a
snapshot that depends on a full tie has no upstream answer either).

:func:`node_usage_score` is ``ResourceUsageScorer``: per resource of the usage with a weight,
``min(used, allocatable) * 1000 // allocatable``, weighted integer mean; the hottest node first.
"""

from __future__ import annotations

from collections.abc import Mapping

from apis.extension import KubeQOS, QoSClass
from apis.priority import PRIORITY_BATCH, PRIORITY_FREE, PRIORITY_MID, PRIORITY_PROD
from descheduler.podfacts import PodFacts

PRIORITY_CLASS_ORDER = {
    "": 5,
    PRIORITY_PROD: 4,
    PRIORITY_MID: 3,
    PRIORITY_BATCH: 2,
    PRIORITY_FREE: 1,
}
KOORD_QOS_ORDER = {
    QoSClass.NONE.value: 5,
    QoSClass.SYSTEM.value: 4,
    QoSClass.LSE.value: 4,
    QoSClass.LSR.value: 3,
    QoSClass.LS.value: 2,
    QoSClass.BE.value: 1,
}
KUBE_QOS_ORDER = {
    KubeQOS.GUARANTEED.value: 3,
    KubeQOS.BURSTABLE.value: 2,
    KubeQOS.BESTEFFORT.value: 1,
}

PodKey = tuple[int, int, int, int, int, int, int, float, float]


def usage_score(
    usage: Mapping[str, int] | None, excess: Mapping[str, int], weights: Mapping[str, int]
) -> float:
    """``ResourceUsageScorerPod`` (see the module docstring)."""
    if usage is None:
        return 0.0
    total = 0.0
    weight_sum = 0
    for name, used in usage.items():
        weight = weights.get(name, 0)
        cap = excess.get(name, 0)
        score = 0.0
        if cap != 0:
            ratio = used / cap
            score = 1 / ratio + 1 if ratio >= 1 else ratio
        total += score * weight
        weight_sum += weight
    return total / weight_sum if weight_sum else 0.0


def pod_sort_key(facts: PodFacts, usage: float | None = None) -> PodKey:
    """The ascending sort key (see the module docstring); ``usage`` the pod's usage score
    (``None``: the pod has no metric; leave the usage comparator out by passing 0.0 for all)."""
    return (
        PRIORITY_CLASS_ORDER.get(facts.priority_class, 5),
        facts.priority,
        KUBE_QOS_ORDER.get(facts.kube_qos, 0),
        KOORD_QOS_ORDER.get(facts.koord_qos, 5),
        facts.deletion_cost,
        facts.eviction_cost,
        0 if usage is not None else 1,
        -(usage if usage is not None else 0.0),
        -facts.created,
    )


def most_requested(requested: int, capacity: int) -> int:
    if capacity == 0:
        return 0
    return min(requested, capacity) * 1000 // capacity


def node_usage_score(
    usage: Mapping[str, int], allocatable: Mapping[str, int], weights: Mapping[str, int]
) -> int:
    """``ResourceUsageScorer`` (see the module docstring)."""
    score = 0
    weight_sum = 0
    for name, used in usage.items():
        weight = weights.get(name, 0)
        score += most_requested(used, allocatable.get(name, 0)) * weight
        weight_sum += weight
    return score // weight_sum if weight_sum else 0
