"""The Reservation a ReservationFirst job creates for its pod's replacement.

Upstream's ``reservation.CreateOrUpdateReservationOptions`` (``controllers/migration/reservation/
util.go``): the job's ``reservationOptions.template`` when it has one, else a template named after
the job's uid holding the pod's metadata and spec; ``nodeName`` cleared, a required node affinity
term ``metadata.name NotIn [the pod's node]`` added to every term (so the replacement goes
elsewhere); owners the pod's controller (``{controller: {apiVersion, kind, name, uid, namespace}}``)
or, for a pod still pending, the pod itself; ``allocateOnce: true`` (a migration's Reservation is
not reused); labels ``app.kubernetes.io/created-by: koord-descheduler`` and
``scheduling.koordinator.sh/reservation-order`` (Unix milliseconds); ``ttl`` the job's when the
template sets neither ``ttl`` nor ``expires``.
"""

from __future__ import annotations

import copy
from typing import Any

from apis.descheduler_keys import CREATOR, LABEL_CREATED_BY, LABEL_RESERVATION_ORDER
from apis.duration import format_duration
from apis.groups import SCHEDULING_API_VERSION
from apis.podmigrationjob import PodMigrationJob
from descheduler.podfacts import PodFacts
from scheduler_plugins.snapshot import PodInfo

_KEEP_META = ("name", "namespace", "labels", "annotations", "ownerReferences")


def owners(pod: PodInfo, facts: PodFacts) -> list[dict[str, Any]]:
    """``GenerateReserveResourceOwners``."""
    conditions = (pod.raw.get("status") or {}).get("conditions") or []
    unscheduled = any(
        c.get("type") == "PodScheduled" and c.get("status") == "False"
        for c in conditions
        if isinstance(c, dict)
    )
    if facts.phase == "Pending" and unscheduled:
        return [
            {
                "object": {
                    "uid": pod.uid,
                    "kind": "Pod",
                    "name": pod.name,
                    "namespace": pod.namespace,
                }
            }
        ]
    c = facts.controller
    if c is None:
        return []
    return [
        {
            "controller": {
                "apiVersion": c.api_version,
                "kind": c.kind,
                "name": c.name,
                "uid": c.uid,
                "controller": True,
                "namespace": pod.namespace,
            }
        }
    ]


def _skip_node(spec: dict[str, Any], node: str) -> None:
    """``appendSkipNodeAffinity``."""
    if not node:
        return
    req = {"key": "metadata.name", "operator": "NotIn", "values": [node]}
    affinity = spec.setdefault("affinity", {})
    na = affinity.setdefault("nodeAffinity", {})
    required = na.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    for term in terms:
        term.setdefault("matchFields", []).append(dict(req))
    if not terms:
        terms.append({"matchFields": [dict(req)]})


def reservation_object(
    job: PodMigrationJob, pod: PodInfo, facts: PodFacts, now_ms: int
) -> dict[str, Any]:
    """The Reservation to create (see the module docstring)."""
    template = copy.deepcopy(dict(job.spec.reservation_template or {}))
    meta = dict(template.get("metadata") or {})
    spec = dict(template.get("spec") or {})
    meta["name"] = meta.get("name") or job.uid
    if not spec.get("template"):
        pod_meta = pod.raw.get("metadata") or {}
        spec["template"] = {
            "metadata": {k: copy.deepcopy(pod_meta[k]) for k in _KEEP_META if k in pod_meta},
            "spec": copy.deepcopy(pod.raw.get("spec") or {}),
        }
    if not spec.get("owners"):
        spec["owners"] = owners(pod, facts)
    spec["allocateOnce"] = True
    tspec = spec["template"].setdefault("spec", {})
    tspec.pop("nodeName", None)
    labels = dict(meta.get("labels") or {})
    labels[LABEL_CREATED_BY] = CREATOR
    labels[LABEL_RESERVATION_ORDER] = str(now_ms)
    meta["labels"] = labels
    if "ttl" not in spec and "expires" not in spec and job.spec.ttl_seconds:
        spec["ttl"] = format_duration(job.spec.ttl_seconds)
    _skip_node(tspec, pod.node_name)
    return {
        "apiVersion": SCHEDULING_API_VERSION,
        "kind": "Reservation",
        "metadata": meta,
        "spec": spec,
    }
