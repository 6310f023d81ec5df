"""What several QoS strategies share; strategies import this, never each other.

- :func:`pod_class`: the Koordinator class a pod is treated as (cgreconcile, resctrl);
- :func:`cpus_of_annotation`: a pod's CPUs from its ``resource-status`` (cpusuppress,
  cgreconcile);
- :func:`eviction_policy_allowed` and :class:`InvalidThreshold`: the eviction strategies' opt-out
  annotation and their refused threshold combinations (memoryevict, cpuevict);
- :func:`node_resources`: the Node's capacity or allocatable as upstream reads the quantities
  (memoryevict, cpuevict).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from apis.cpulist import parse_cpulist
from apis.extension import ANNOTATION_RESOURCE_STATUS, KUBE_QOS_TO_QOS, QoSClass
from apis.quantity import int_value, milli_value
from koordlet.qos.evictor import ANNOTATION_EVICTION_POLICY
from koordlet.statesinformer.model import PodInfo


class InvalidThreshold(ValueError):
    """A NodeSLO threshold combination upstream refuses (the task is skipped, not failed)."""


def pod_class(pod: PodInfo) -> QoSClass:
    """The Koordinator class a pod is treated as: its label, else its Kubernetes QoS's."""
    if pod.qos is not QoSClass.NONE:
        return pod.qos
    return KUBE_QOS_TO_QOS.get(pod.kube_qos, QoSClass.LS)


def cpus_of_annotation(annotations: Mapping[str, str]) -> frozenset[int]:
    """CPUs of a pod's ``scheduling.koordinator.sh/resource-status`` cpuset; empty when none or
    malformed."""
    raw = annotations.get(ANNOTATION_RESOURCE_STATUS)
    if not raw:
        return frozenset()
    try:
        status = json.loads(raw)
        text = status.get("cpuset", "") if isinstance(status, dict) else ""
        return parse_cpulist(text) if isinstance(text, str) else frozenset()
    except ValueError:
        return frozenset()


def eviction_policy_allowed(pod: PodInfo, feature: str) -> bool:
    """``koordinator.sh/eviction-policy`` (a JSON list of features) allows ``feature``; absent:
    allowed; unparsable: refused, as upstream."""
    text = pod.annotations.get(ANNOTATION_EVICTION_POLICY)
    if text is None:
        return True
    try:
        policies = json.loads(text)
    except ValueError:
        return False
    return isinstance(policies, list) and feature in policies


def node_resources(node: Mapping[str, Any] | None, field: str) -> dict[str, int] | None:
    """``status.<field>`` (``capacity`` or ``allocatable``) of a Node object as upstream's
    ``ConvertQuantityToInt64`` reads each quantity: ``cpu`` in milli-cores, anything else by its
    integer value (bytes; ``kubernetes.io/batch-cpu`` is already milli-cores). None without a Node
    or that field; a quantity that does not parse is left out (logged by the caller's report)."""
    status = (node or {}).get("status")
    values = status.get(field) if isinstance(status, Mapping) else None
    if not isinstance(values, Mapping):
        return None
    out: dict[str, int] = {}
    for name, raw in values.items():
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            continue
        try:
            out[str(name)] = milli_value(raw) if name == "cpu" else int_value(raw)
        except ValueError:
            continue
    return out
