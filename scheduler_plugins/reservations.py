"""Scheduling Reservations: the reserve pod of a Pending Reservation and the status written.

Koordinator's koord-scheduler places a Reservation (``scheduling.koordinator.sh/v1alpha1``)
as a *reserve pod*: a pod made of ``spec.template`` that only the scheduler sees. This module
holds what the standalone scheduler (``standalone.py``) needs for that, re-implemented from
Koordinator's semantics (``pkg/util/reservation``):

- **Schedulable.** Phase unset or ``Pending``, no ``status.nodeName``, not past
  ``spec.expires`` nor ``creationTimestamp + spec.ttl`` (default 24 h; ``0s``: never). Phases
  ``Available``, ``Waiting``, ``Succeeded`` and ``Failed`` are left alone.
- **Scheduler name.** ``spec.template.spec.schedulerName``; ``default-scheduler`` when the
  template omits it, as upstream's ``GetReservationSchedulerName`` does.
- **Reserve pod.** The template's metadata and spec, namespace ``default`` when unset, the
  Reservation's labels and annotations over the template's, uid the Reservation's, annotated
  ``scheduling.koordinator.sh/reserve-pod: "true"`` and ``scheduling.koordinator.sh/
  reservation-name``. A ``spec.template.spec.nodeName`` pins it to that node (annotation
  ``scheduling.koordinator.sh/reservation-node``). The Reservation plugin never lets a reserve
  pod match or consume another reservation.
- **Available.** ``status.phase: Available``, ``status.nodeName``, ``status.allocatable`` (the
  template's requests), ``status.currentOwners: []``, no ``allocated``, and the two conditions
  ``Scheduled``/True/``Scheduled`` and ``Ready``/True/``Available``.
- **Unschedulable.** The phase is kept (the reservation is retried); a ``Scheduled`` condition
  False with reason ``Unschedulable`` and kube-scheduler's message is added, or its message
  updated; one already True is left True.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from apis.duration import parse_duration
from apis.quantity import format_bytes, format_cpu
from apis.scheduling_keys import (
    ANNOTATION_RESERVATION_NAME,
    ANNOTATION_RESERVATION_NODE,
    ANNOTATION_RESERVE_POD,
)
from apis.timestamp import format_time
from scheduler_plugins.errors import InputError
from scheduler_plugins.objectfields import ResourceList, optional_time
from scheduler_plugins.snapshot import PodInfo, parse_pod

DEFAULT_SCHEDULER_NAME = "default-scheduler"
"""``corev1.DefaultSchedulerName``: the template's scheduler when it names none."""
DEFAULT_TTL_S = 24 * 3600.0
"""``spec.ttl`` when unset (the CRD's default, 24 h)."""
PHASE_PENDING = "Pending"
PHASE_AVAILABLE = "Available"
CONDITION_SCHEDULED = "Scheduled"
CONDITION_READY = "Ready"
REASON_SCHEDULED = "Scheduled"
REASON_UNSCHEDULABLE = "Unschedulable"
REASON_AVAILABLE = "Available"


def scheduler_name_of_reservation(obj: Mapping[str, Any]) -> str:
    """``spec.template.spec.schedulerName``, ``default-scheduler`` when unset."""
    template = (obj.get("spec") or {}).get("template") or {}
    return str((template.get("spec") or {}).get("schedulerName") or DEFAULT_SCHEDULER_NAME)


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def uid_of_reservation(obj: Mapping[str, Any]) -> str:
    """``metadata.uid`` (``reservation/<name>`` without one, never a pod's uid)."""
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"reservation/{meta.get('name') or ''}")


def expired(obj: Mapping[str, Any], now: float) -> bool:
    """Past ``spec.expires``, else past ``creationTimestamp + spec.ttl`` (24 h; 0: never)."""
    where = f"Reservation {_name(obj)}"
    spec = obj.get("spec") or {}
    expires = optional_time(spec.get("expires"), where, "spec.expires")
    if expires is not None:
        return now >= expires
    created = optional_time(
        (obj.get("metadata") or {}).get("creationTimestamp"), where, "metadata.creationTimestamp"
    )
    try:
        ttl = parse_duration(str(spec["ttl"])) if spec.get("ttl") is not None else DEFAULT_TTL_S
    except ValueError:
        ttl = DEFAULT_TTL_S
    return ttl > 0 and created is not None and now >= created + ttl


def is_pending(obj: Mapping[str, Any], now: float) -> bool:
    """Whether the Reservation waits for a node (see the module docstring). Raises
    :class:`InputError` for a bad timestamp."""
    status = obj.get("status") or {}
    if status.get("nodeName") or status.get("phase") not in (None, "", PHASE_PENDING):
        return False
    return not expired(obj, now)


def is_reserve_pod(pod: PodInfo) -> bool:
    """Whether ``pod`` is a Reservation's reserve pod."""
    return pod.annotations.get(ANNOTATION_RESERVE_POD) == "true"


def reserve_pod(obj: Mapping[str, Any]) -> PodInfo:
    """The reserve pod of a Reservation. Raises :class:`InputError` naming the bad field."""
    name = _name(obj)
    source = f"Reservation {name}"
    meta = obj.get("metadata") or {}
    template = copy.deepcopy((obj.get("spec") or {}).get("template") or {})
    if not isinstance(template, dict):
        raise InputError(source, "spec.template", "must be a pod template")
    tmeta = dict(template.get("metadata") or {})
    tspec = dict(template.get("spec") or {})
    labels = dict(tmeta.get("labels") or {})
    labels.update(meta.get("labels") or {})
    annotations = dict(tmeta.get("annotations") or {})
    annotations.update(meta.get("annotations") or {})
    annotations[ANNOTATION_RESERVE_POD] = "true"
    annotations[ANNOTATION_RESERVATION_NAME] = name
    if tspec.get("nodeName"):
        annotations[ANNOTATION_RESERVATION_NODE] = str(tspec.pop("nodeName"))
    tspec["schedulerName"] = scheduler_name_of_reservation(obj)
    tspec.setdefault("containers", [])
    tmeta.update(
        {
            "name": name,
            "namespace": tmeta.get("namespace") or "default",
            "uid": uid_of_reservation(obj),
            "labels": labels,
            "annotations": annotations,
            "creationTimestamp": meta.get("creationTimestamp"),
        }
    )
    raw = {"apiVersion": "v1", "kind": "Pod", "metadata": tmeta, "spec": tspec, "status": {}}
    return parse_pod(raw, source, "spec.template")


def format_resources(requests: Mapping[str, int]) -> dict[str, str]:
    """A ``ResourceList`` of quantities from Koordinator's integer units (the inverse of
    ``parse_resource_list``): ``cpu`` from milli-cores, memory in binary units, the rest as
    integers."""
    out: dict[str, str] = {}
    for r, v in sorted(requests.items()):
        if r == "cpu":
            out[r] = format_cpu(v / 1000)
        elif r.endswith("memory") or r == "ephemeral-storage":
            out[r] = format_bytes(v)
        else:
            out[r] = str(v)
    return out


def available_status(
    obj: Mapping[str, Any], node: str, requests: ResourceList, now: float
) -> dict[str, Any]:
    """The status of a Reservation just placed on ``node`` (upstream
    ``SetReservationAvailable``); ``requests``: its reserve pod's."""
    status = dict(obj.get("status") or {})
    status.pop("allocated", None)
    stamp = format_time(now)
    status.update(
        {
            "phase": PHASE_AVAILABLE,
            "nodeName": node,
            "allocatable": format_resources(requests),
            "currentOwners": [],
            "conditions": [
                {
                    "type": CONDITION_SCHEDULED,
                    "status": "True",
                    "reason": REASON_SCHEDULED,
                    "lastProbeTime": stamp,
                    "lastTransitionTime": stamp,
                },
                {
                    "type": CONDITION_READY,
                    "status": "True",
                    "reason": REASON_AVAILABLE,
                    "lastProbeTime": stamp,
                    "lastTransitionTime": stamp,
                },
            ],
        }
    )
    return status


def unschedulable_status(obj: Mapping[str, Any], message: str, now: float) -> dict[str, Any]:
    """The status of a Reservation no node could take (upstream
    ``SetReservationUnschedulable``): the phase kept, the ``Scheduled`` condition set False
    with reason ``Unschedulable`` and ``message`` (kept True when it was True)."""
    status = dict(obj.get("status") or {})
    conditions = [dict(c) for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    stamp = format_time(now)
    found = next((c for c in conditions if c.get("type") == CONDITION_SCHEDULED), None)
    if found is None:
        conditions.append(
            {
                "type": CONDITION_SCHEDULED,
                "status": "False",
                "reason": REASON_UNSCHEDULABLE,
                "message": message,
                "lastProbeTime": stamp,
                "lastTransitionTime": stamp,
            }
        )
    elif found.get("status") == "True":
        found["lastProbeTime"] = stamp
    else:
        if found.get("reason") != REASON_UNSCHEDULABLE:
            found["lastTransitionTime"] = stamp
        found.update({"reason": REASON_UNSCHEDULABLE, "message": message, "lastProbeTime": stamp})
    status["conditions"] = conditions
    status.setdefault("phase", PHASE_PENDING)
    return status
