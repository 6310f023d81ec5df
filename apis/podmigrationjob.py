"""PodMigrationJob (``scheduling.koordinator.sh/v1alpha1``, cluster-scoped): the typed model.

The fields follow the CRD (``packaging/kubernetes/crds/scheduling.koordinator.sh_podmigrationjobs
.yaml``, upstream ``apis/scheduling/v1alpha1/pod_migration_job_types.go``); the phases, condition
types and reasons are upstream's constants. :func:`parse_job` reads an object and raises
:class:`~apis.slo.SchemaError` naming the field (``spec.ttl: not a Go duration: 'soon'``);
:func:`status_json` writes a status back as the Go controller marshals it (empty fields left out).
``spec.reservationOptions.template`` and ``spec.deleteOptions`` are kept as JSON: they are passed
through to the Reservation and the Eviction as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

from apis.duration import parse_duration
from apis.groups import SCHEDULING_API_VERSION
from apis.records import frozen
from apis.slo import SchemaError
from apis.timestamp import TimestampError, parse_time

KIND = "PodMigrationJob"
API_VERSION = SCHEDULING_API_VERSION

# Modes (PodMigrationJobMode)
MODE_RESERVATION_FIRST = "ReservationFirst"
MODE_EVICT_DIRECTLY = "EvictDirectly"
MODES = (MODE_RESERVATION_FIRST, MODE_EVICT_DIRECTLY)

# Phases (PodMigrationJobPhase)
PHASE_PENDING = "Pending"
PHASE_RUNNING = "Running"
PHASE_SUCCEEDED = "Succeeded"
PHASE_FAILED = "Failed"
PHASE_ABORTED = "Aborted"
PHASES = (PHASE_PENDING, PHASE_RUNNING, PHASE_SUCCEEDED, PHASE_FAILED, PHASE_ABORTED)

# Condition types (PodMigrationJobConditionType)
COND_RESERVATION_CREATED = "ReservationCreated"
COND_RESERVATION_SCHEDULED = "ReservationScheduled"
COND_PREEMPTION = "Preemption"
COND_EVICTION = "Eviction"
COND_POD_SCHEDULED = "PodScheduled"
COND_POD_BOUND_RESERVATION = "PodBoundReservation"
COND_RESERVATION_BOUND = "ReservationBound"
COND_BOUND_POD_READY = "BoundPodReady"

# Reasons
REASON_TIMEOUT = "Timeout"
REASON_FAILED_CREATE_RESERVATION = "FailedCreateReservation"
REASON_UNSCHEDULABLE = "Unschedulable"
REASON_MISSING_POD = "MissingPod"
REASON_MISSING_RESERVATION = "MissingReservation"
REASON_EVICTING = "Evicting"
REASON_FAILED_EVICT = "FailedEvict"
REASON_EVICT_COMPLETE = "EvictComplete"
REASON_WAIT_FOR_POD_BIND_RESERVATION = "WaitForPodBindReservation"
REASON_WAIT_FOR_BOUND_POD_READY = "WaitForBoundPodReady"
REASON_FORBIDDEN_MIGRATE_POD = "ForbiddenMigratePod"
REASON_RESERVATION_EXPIRED = "ReservationExpired"
REASON_INVALID_POD_REF = "InvalidPodRef"

STATUS_TRUE = "True"
STATUS_FALSE = "False"
STATUS_COMPLETE = "Complete"
"""``status.status`` of a job that succeeded."""


@frozen
class ObjectRef:
    """A ``corev1.ObjectReference`` (the fields a job uses)."""

    namespace: str = ""
    name: str = ""
    uid: str = ""
    kind: str = ""
    api_version: str = ""

    def as_json(self) -> dict[str, str]:
        """The reference as the Go type marshals it (empty fields left out)."""
        out = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
        }
        return {k: v for k, v in out.items() if v}


@frozen
class Condition:
    """One ``status.conditions`` entry."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""
    """RFC 3339, as written."""

    def as_json(self) -> dict[str, str]:
        out = {"type": self.type, "status": self.status}
        if self.reason:
            out["reason"] = self.reason
        if self.message:
            out["message"] = self.message
        if self.last_transition_time:
            out["lastTransitionTime"] = self.last_transition_time
        return out


@frozen
class JobSpec:
    """``spec``."""

    pod_ref: ObjectRef
    """``podRef`` (required)."""
    paused: bool = False
    """``paused``: the controller leaves the job alone while true."""
    ttl_seconds: float | None = None
    """``ttl`` in seconds; ``None`` when unset (no timeout of its own)."""
    mode: str = ""
    """``mode``; empty: the controller's ``defaultJobMode``."""
    reservation_ref: ObjectRef | None = None
    """``reservationOptions.reservationRef``: the Reservation in use, once created."""
    reservation_template: Mapping[str, Any] | None = None
    """``reservationOptions.template`` as written (a ``ReservationTemplateSpec``)."""
    delete_options: Mapping[str, Any] | None = None
    """``deleteOptions`` as written (``metav1.DeleteOptions``)."""


@frozen
class JobStatus:
    """``status``."""

    phase: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""
    conditions: tuple[Condition, ...] = ()
    node_name: str = ""
    """``nodeName``: where the Reservation was placed."""
    pod_ref: ObjectRef | None = None
    """``podRef``: the replacement pod once bound."""

    def condition(self, type_: str) -> Condition | None:
        """The condition of ``type_``, if any."""
        return next((c for c in self.conditions if c.type == type_), None)


@frozen
class PodMigrationJob:
    """A PodMigrationJob object."""

    name: str
    uid: str
    created: float
    """``metadata.creationTimestamp`` in epoch seconds (0 when absent)."""
    annotations: Mapping[str, str]
    labels: Mapping[str, str]
    spec: JobSpec
    status: JobStatus = field(default_factory=JobStatus)
    resource_version: str = ""

    @property
    def effective_phase(self) -> str:
        """``status.phase``, ``Pending`` when unset (as the arbitrator reads it)."""
        return self.status.phase or PHASE_PENDING


def _fail(source: str, path: str, message: str) -> SchemaError:
    return SchemaError(message, source=source, field=path)


def _map(value: object, source: str, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _fail(source, path, f"must be an object, got {type(value).__name__}")
    return value


def _str(value: object, source: str, path: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _fail(source, path, f"must be a string, got {value!r}")
    return value


def parse_ref(raw: object, source: str, path: str) -> ObjectRef:
    """An ObjectReference."""
    m = _map(raw, source, path)
    return ObjectRef(
        namespace=_str(m.get("namespace"), source, path + ".namespace"),
        name=_str(m.get("name"), source, path + ".name"),
        uid=_str(m.get("uid"), source, path + ".uid"),
        kind=_str(m.get("kind"), source, path + ".kind"),
        api_version=_str(m.get("apiVersion"), source, path + ".apiVersion"),
    )


def _time(raw: object, source: str, path: str) -> float:
    """A ``metav1.Time`` in epoch seconds (0 when absent)."""
    if raw is None or raw == "":
        return 0.0
    try:
        return parse_time(raw)
    except TimestampError as err:
        raise _fail(source, path, err.message) from err


def _parse_spec(raw: Mapping[str, Any], source: str) -> JobSpec:
    if "podRef" not in raw or raw["podRef"] is None:
        raise _fail(source, "spec.podRef", "required")
    paused = raw.get("paused", False)
    if not isinstance(paused, bool):
        raise _fail(source, "spec.paused", f"must be true or false, got {paused!r}")
    ttl: float | None = None
    if raw.get("ttl") not in (None, ""):
        try:
            ttl = parse_duration(str(raw["ttl"]))
        except ValueError as err:
            raise _fail(source, "spec.ttl", f"not a Go duration: {raw['ttl']!r}") from err
    mode = _str(raw.get("mode"), source, "spec.mode")
    if mode and mode not in MODES:
        raise _fail(source, "spec.mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
    options = _map(raw.get("reservationOptions"), source, "spec.reservationOptions")
    ref = options.get("reservationRef")
    template = options.get("template")
    delete_options = raw.get("deleteOptions")
    return JobSpec(
        pod_ref=parse_ref(raw["podRef"], source, "spec.podRef"),
        paused=paused,
        ttl_seconds=ttl,
        mode=mode,
        reservation_ref=None
        if ref is None
        else parse_ref(ref, source, "spec.reservationOptions.reservationRef"),
        reservation_template=None
        if template is None
        else _map(template, source, "spec.reservationOptions.template"),
        delete_options=None
        if delete_options is None
        else _map(delete_options, source, "spec.deleteOptions"),
    )


def _parse_status(raw: Mapping[str, Any], source: str) -> JobStatus:
    conditions = []
    items = raw.get("conditions") or []
    if not isinstance(items, list):
        raise _fail(source, "status.conditions", "must be a list")
    for i, c in enumerate(items):
        path = f"status.conditions[{i}]"
        cm = _map(c, source, path)
        conditions.append(
            Condition(
                type=_str(cm.get("type"), source, path + ".type"),
                status=_str(cm.get("status"), source, path + ".status"),
                reason=_str(cm.get("reason"), source, path + ".reason"),
                message=_str(cm.get("message"), source, path + ".message"),
                last_transition_time=str(cm.get("lastTransitionTime") or ""),
            )
        )
    pod_ref = raw.get("podRef")
    return JobStatus(
        phase=_str(raw.get("phase"), source, "status.phase"),
        status=_str(raw.get("status"), source, "status.status"),
        reason=_str(raw.get("reason"), source, "status.reason"),
        message=_str(raw.get("message"), source, "status.message"),
        conditions=tuple(conditions),
        node_name=_str(raw.get("nodeName"), source, "status.nodeName"),
        pod_ref=None if pod_ref is None else parse_ref(pod_ref, source, "status.podRef"),
    )


def parse_job(obj: Mapping[str, Any], source: str = "") -> PodMigrationJob:
    """A :class:`PodMigrationJob` from an object. Raises :class:`SchemaError` naming the field."""
    meta = _map(obj.get("metadata"), source, "metadata")
    name = _str(meta.get("name"), source, "metadata.name")
    source = source or f"podmigrationjob {name}"
    return PodMigrationJob(
        name=name,
        uid=_str(meta.get("uid"), source, "metadata.uid") or name,
        created=_time(meta.get("creationTimestamp"), source, "metadata.creationTimestamp"),
        annotations={
            str(k): str(v)
            for k, v in _map(meta.get("annotations"), source, "metadata.annotations").items()
        },
        labels={
            str(k): str(v) for k, v in _map(meta.get("labels"), source, "metadata.labels").items()
        },
        spec=_parse_spec(_map(obj.get("spec"), source, "spec"), source),
        status=_parse_status(_map(obj.get("status"), source, "status"), source),
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def status_json(status: JobStatus) -> dict[str, Any]:
    """``status`` as the Go type marshals it (``omitempty`` fields left out)."""
    fields = (
        ("phase", status.phase),
        ("status", status.status),
        ("reason", status.reason),
        ("message", status.message),
        ("nodeName", status.node_name),
    )
    out: dict[str, Any] = {key: value for key, value in fields if value}
    if status.conditions:
        out["conditions"] = [c.as_json() for c in status.conditions]
    if status.pod_ref is not None:
        out["podRef"] = status.pod_ref.as_json()
    return out


def with_condition(status: JobStatus, cond: Condition) -> tuple[JobStatus, bool]:
    """``util.UpdateCondition``: ``cond`` added or replacing the one of its type (its transition
    time kept while the status stays), and whether anything changed. The job's ``status``,
    ``reason`` and ``message`` follow the condition when it changed, as ``updateCondition``
    sets them."""
    old = status.condition(cond.type)
    if old is not None:
        if old.status == cond.status:
            cond = Condition(
                cond.type, cond.status, cond.reason, cond.message, old.last_transition_time
            )
        if (old.status, old.reason, old.message) == (cond.status, cond.reason, cond.message):
            return status, False
        conditions = tuple(cond if c.type == cond.type else c for c in status.conditions)
    else:
        conditions = (*status.conditions, cond)
    return (
        JobStatus(
            phase=status.phase,
            status=cond.type,
            reason=cond.reason,
            message=cond.message,
            conditions=conditions,
            node_name=status.node_name,
            pod_ref=status.pod_ref,
        ),
        True,
    )
