"""What the descheduler reads of a pod, derived once from the object as read.

Upstream's helpers, re-implemented on the raw object (``pkg/descheduler/utils``,
``apis/extension``): the Koordinator priority class with its QoS default
(``GetPodPriorityClassWithDefault`` of ``apis.priority``: the ``koordinator.sh/priority-class``
label, else the ``spec.priority`` band, else koord-prod for SYSTEM/LSE/LSR/LS and koord-batch for
BE), the Koordinator QoS class with its Kubernetes default
(``GetPodQoSClassWithDefault``: the ``koordinator.sh/qosClass`` label, else Guaranteed→LSR,
Burstable→LS, BestEffort→BE), the Kubernetes QoS class (``status.qosClass``, else computed as
``qos.GetPodQOS`` does), the deletion and eviction costs (int32 annotations; a malformed value is
0, as upstream's ``validFirstDigit`` makes it), the controlling owner, and the evictor's facts:
mirror, static, terminating, DaemonSet, local storage (``emptyDir`` or ``hostPath``), PVC.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from apis.descheduler_keys import (
    ANNOTATION_CONFIG_SOURCE,
    ANNOTATION_EVICTION_COST,
    ANNOTATION_MIRROR_POD,
    ANNOTATION_POD_DELETION_COST,
    CONFIG_SOURCE_API,
    KIND_DAEMON_SET,
)
from apis.extension import KUBE_QOS_TO_QOS, LABEL_POD_QOS, KubeQOS, QoSClass
from apis.priority import pod_priority_class_with_default
from apis.quantity import resource_value
from scheduler_plugins.objectfields import optional_time
from scheduler_plugins.snapshot import PodInfo

INT32_MAX = 2**31 - 1


class OwnerRef(NamedTuple):
    """One ``metadata.ownerReferences`` entry."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool


@dataclass(slots=True)
class PodFacts:
    """See the module docstring (read-only by convention: one is shared per pod version)."""

    priority_class: str
    priority: int
    """``spec.priority`` (0 when unset: ``PodPriority``)."""
    has_priority: bool
    """Whether ``spec.priority`` is set."""
    kube_qos: str
    koord_qos: str
    deletion_cost: int
    eviction_cost: int
    created: float
    """``metadata.creationTimestamp`` (epoch seconds, 0 when absent)."""
    owners: tuple[OwnerRef, ...]
    controller: OwnerRef | None
    mirror: bool
    static: bool
    terminating: bool
    daemonset: bool
    local_storage: bool
    pvc: bool
    phase: str
    ready: bool
    scheduler_name: str


_TIMES: dict[str, float | None] = {}
"""Parsed creation timestamps: pods created in the same second share one."""


def _created(text: Any, key: str) -> float | None:
    if type(text) is str:
        hit = _TIMES.get(text, -1.0)
        if hit != -1.0:
            return hit
        if len(_TIMES) > 100_000:
            _TIMES.clear()
        value = _TIMES[text] = optional_time(text, key, "metadata.creationTimestamp")
        return value
    return optional_time(text, key, "metadata.creationTimestamp")


def _text(value: Any) -> str:
    return value if type(value) is str else "" if value is None else str(value)


def _cost(annotations: Mapping[str, str], key: str) -> int:
    value = annotations.get(key)
    if value is None or not value:
        return 0
    first = value[0]
    if not (first == "-" or first.isdigit()) or (first == "0" and value != "0"):
        return 0
    try:
        cost = int(value)
    except ValueError:
        return 0
    return cost if -(2**31) <= cost <= INT32_MAX else 0


def kube_qos(spec: Mapping[str, Any], status: Mapping[str, Any]) -> str:
    """``GetKubeQosClass``: ``status.qosClass``, else ``qos.GetPodQOS`` over the init and app
    containers (cpu and memory only; a missing request taken from its limit, as the API server
    defaults it)."""
    if status.get("qosClass"):
        return str(status["qosClass"])
    containers: Sequence[Any] = [
        *(spec.get("initContainers") or []),
        *(spec.get("containers") or []),
    ]
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    for c in containers:
        res = (c or {}).get("resources") or {} if isinstance(c, Mapping) else {}
        lim = res.get("limits") or {}
        req = {**lim, **(res.get("requests") or {})}
        found = set()
        for name in ("cpu", "memory"):
            try:
                if name in req and (value := resource_value(name, req[name])) > 0:
                    requests[name] = requests.get(name, 0) + value
                if name in lim and (value := resource_value(name, lim[name])) > 0:
                    limits[name] = limits.get(name, 0) + value
                    found.add(name)
            except ValueError:
                continue
        if found != {"cpu", "memory"}:
            guaranteed = False
    if not requests and not limits:
        return KubeQOS.BESTEFFORT.value
    if (
        guaranteed
        and all(limits.get(n) == v for n, v in requests.items())
        and len(requests) == len(limits)
    ):
        return KubeQOS.GUARANTEED.value
    return KubeQOS.BURSTABLE.value


_KOORD_QOS = frozenset(q.value for q in QoSClass if q.value)
_KUBE_TO_KOORD = {k.value: v.value for k, v in KUBE_QOS_TO_QOS.items()}
_NONE = QoSClass.NONE.value


def koord_qos(labels: Mapping[str, str], kube: str) -> str:
    """``GetPodQoSClassWithDefault``: the label's class, else the Kubernetes class's default."""
    label = labels.get(LABEL_POD_QOS, "")
    if label in _KOORD_QOS:
        return label
    return _KUBE_TO_KOORD.get(kube, _NONE)


def _volume_facts(spec: Mapping[str, Any]) -> tuple[bool, bool]:
    local = pvc = False
    for v in spec.get("volumes") or []:
        if not isinstance(v, Mapping):
            continue
        if v.get("hostPath") is not None or v.get("emptyDir") is not None:
            local = True
        if v.get("persistentVolumeClaim") is not None:
            pvc = True
    return local, pvc


def pod_facts(pod: PodInfo) -> PodFacts:
    """The facts of ``pod`` (see the module docstring)."""
    raw = pod.raw
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    raw_owners = meta.get("ownerReferences")
    owners = (
        tuple(
            OwnerRef(
                _text(o.get("apiVersion")),
                _text(o.get("kind")),
                _text(o.get("name")),
                _text(o.get("uid")),
                bool(o.get("controller")),
            )
            for o in raw_owners
            if type(o) is dict or isinstance(o, Mapping)
        )
        if raw_owners
        else ()
    )
    controller = next((o for o in owners if o.controller), None)
    kqos = kube_qos(spec, status)
    kqos_koord = koord_qos(pod.labels, kqos)
    raw_priority = spec.get("priority")
    pclass = pod_priority_class_with_default(pod.labels, raw_priority, kqos_koord)
    local, pvc = _volume_facts(spec) if spec.get("volumes") else (False, False)
    annotations = pod.annotations
    source = annotations.get(ANNOTATION_CONFIG_SOURCE)
    ready = False
    for c in status.get("conditions") or ():
        if (type(c) is dict or isinstance(c, Mapping)) and c.get("type") == "Ready":
            ready = c.get("status") == "True"
            if ready:
                break
    created = _created(meta.get("creationTimestamp"), pod.key)
    return PodFacts(
        priority_class=pclass,
        priority=raw_priority if isinstance(raw_priority, int) else 0,
        has_priority=isinstance(raw_priority, int),
        kube_qos=kqos,
        koord_qos=kqos_koord,
        deletion_cost=_cost(annotations, ANNOTATION_POD_DELETION_COST) if annotations else 0,
        eviction_cost=_cost(annotations, ANNOTATION_EVICTION_COST) if annotations else 0,
        created=created or 0.0,
        owners=owners,
        controller=controller,
        mirror=ANNOTATION_MIRROR_POD in annotations,
        static=source is not None and source != CONFIG_SOURCE_API,
        terminating=bool(meta.get("deletionTimestamp")),
        daemonset=bool(owners) and any(o.kind == KIND_DAEMON_SET for o in owners),
        local_storage=local,
        pvc=pvc,
        phase=str(status.get("phase") or ""),
        ready=ready,
        scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
    )
