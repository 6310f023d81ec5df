"""The validating rules upstream's pod webhook enforces for co-location.

On CREATE and UPDATE:

- a pod requesting ``kubernetes.io/batch-cpu`` or ``kubernetes.io/batch-memory`` must be QoS
  ``BE``;
- ``BE`` may not be combined with a prod priority or with no Koordinator priority at all;
- ``LSR`` may be combined only with a prod priority;
- ``LSR`` and ``LSE`` pods must request CPU, in whole cores.

On UPDATE also: the ``koordinator.sh/qosClass`` label, the priority class and the
``koordinator.sh/priority`` label are immutable.

The priority class in these rules is upstream's ``GetPodPriorityClassRaw``
(``apis.priority.pod_priority_class_raw``: the ``koordinator.sh/priority-class`` label, else the
band of ``spec.priority``), as in ``pkg/webhook/pod/validating/cluster_colocation_profile.go``.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from apis.extension import LABEL_POD_PRIORITY, LABEL_POD_QOS
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY
from apis.priority import (
    PRIORITY_BATCH,
    PRIORITY_FREE,
    PRIORITY_MID,
    PRIORITY_PROD,
    pod_priority_class_raw,
)
from apis.quantity import parse_quantity

FORBIDDEN: Mapping[str, frozenset[str]] = {
    "BE": frozenset({"", PRIORITY_PROD}),
    "LSR": frozenset({"", PRIORITY_MID, PRIORITY_BATCH, PRIORITY_FREE}),
}
"""QoS class → the priority classes it may not be combined with ("" is no Koordinator class)."""


def _labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def _qos(pod: Mapping[str, Any]) -> str:
    return str(_labels(pod).get(LABEL_POD_QOS) or "")


def _priority_class(pod: Mapping[str, Any]) -> str:
    """``GetPodPriorityClassRaw``, what upstream's rules compare: the priority-class label, else
    the band of ``spec.priority``."""
    return pod_priority_class_raw(_labels(pod), (pod.get("spec") or {}).get("priority"))


def pod_request(pod: Mapping[str, Any], resource: str) -> Fraction:
    """The pod's effective request of ``resource``: the larger of the containers' sum and the
    largest init container's, plus the overhead (as the scheduler counts it)."""
    spec = pod.get("spec") or {}

    def req(container: Mapping[str, Any]) -> Fraction:
        raw = ((container.get("resources") or {}).get("requests") or {}).get(resource)
        return Fraction(0) if raw is None else parse_quantity(raw).amount

    total = sum((req(c) for c in spec.get("containers") or ()), Fraction(0))
    init = max((req(c) for c in spec.get("initContainers") or ()), default=Fraction(0))
    overhead = (spec.get("overhead") or {}).get(resource)
    return max(total, init) + (
        parse_quantity(overhead).amount if overhead is not None else Fraction(0)
    )


def validate_pod(pod: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[str]:
    """Every rule ``pod`` breaks (``old``: the pod before an UPDATE), as ``field: message``."""
    errors: list[str] = []
    qos = _qos(pod)
    prio = _priority_class(pod)
    if old is not None:
        if _qos(old) != qos:
            errors.append(f"labels.{LABEL_POD_QOS}: field is immutable")
        if _priority_class(old) != prio:
            errors.append("spec.priority: field is immutable (its priority class changed)")
        if _labels(old).get(LABEL_POD_PRIORITY) != _labels(pod).get(LABEL_POD_PRIORITY):
            errors.append(f"labels.{LABEL_POD_PRIORITY}: field is immutable")
    try:
        batch = pod_request(pod, BATCH_CPU) + pod_request(pod, BATCH_MEMORY)
        cpu = pod_request(pod, "cpu")
    except ValueError as err:
        return [*errors, f"spec.containers[*].resources: {err}"]
    if batch and qos != "BE":
        errors.append(
            f"labels.{LABEL_POD_QOS}: must specify koordinator QoS BE with koordinator "
            "colocation resources"
        )
    if prio in FORBIDDEN.get(qos, frozenset()):
        errors.append(
            f"Pod: {LABEL_POD_QOS}={qos} and priorityClass={prio or 'none'} cannot be used in "
            "combination"
        )
    if qos in ("LSR", "LSE"):
        if cpu == 0:
            errors.append(
                f"spec.containers[*].resources.requests: {qos} Pod must declare the requested CPUs"
            )
        elif cpu.denominator != 1:
            errors.append(
                f"spec.containers[*].resources.requests: the requested CPUs of {qos} Pod must be "
                f"integer, got {float(cpu):g}"
            )
    return errors
