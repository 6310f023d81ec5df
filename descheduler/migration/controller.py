"""The MigrationController: a PodMigrationJob's life, one step per reconcile.

Upstream's ``Reconciler.doMigrate`` (``controllers/migration/controller.go``), step by step; each
step writes the job's status through the ``status`` subresource (conflicts re-read and retried)
and an Event on the job (``events.k8s.io/v1``, action ``Migrating``):

1. paused, or already ``Succeeded``/``Failed``/``Aborted``: nothing.
2. older than its ``ttl``: its Reservation deleted, ``Failed`` (``Timeout``, "Abort job caused by
   timeout").
3. ``Pending`` (or no phase): the pod must exist (else ``Failed``, ``MissingPod``, "Abort job
   caused by missing Pod "ns/name""); ``spec.podRef.uid`` is filled; phase ``Running``.
4. ``EvictDirectly``: evict (step 8), then ``Succeeded`` ("Pod "ns/name" has been evicted").
5. ``ReservationFirst`` without a Reservation: create it (``reservation.py``) and record
   ``spec.reservationOptions.reservationRef``; condition ``ReservationCreated``.
6. The Reservation: gone → ``Failed`` (``MissingReservation``); its ``Scheduled`` condition
   ``Unschedulable`` is copied to the job's ``ReservationScheduled`` (False, ``Unschedulable``);
   still pending → wait; expired → ``Failed`` (``ReservationExpired``); not placed → ``Failed``
   (``Unschedulable``).
7. Placed: on the pod's own node → ``Failed`` (``ForbiddenMigratePod``); else ``status.nodeName``
   and ``ReservationScheduled`` True.
8. Evict through the configured policy (``evicting.py``): condition ``Eviction`` False
   ``Evicting`` ("Pod "ns/name" evicted from node "n" by the reason "..."") until the pod is gone,
   then ``Eviction`` True ``EvictComplete``. A Reservation already consumed by another pod fails
   the job (``ForbiddenMigratePod``). A 429 (the pod's disruption budget) or the controller's
   own rate is tried again later, with backoff; never a delete instead.
9. Wait for a replacement to bind the Reservation (``status.currentOwners``):
   ``PodBoundReservation`` False ``WaitForPodBindReservation``; then ``ReservationBound`` True
   and ``status.podRef``; then for it to be Ready (``BoundPodReady``).
10. ``Succeeded``, ``status: Complete``, "Bind Pod "ns/name" in Reservation "r"".

A job that fails after its Reservation was created has the Reservation deleted (nothing keeps
holding the room); a deleted job's Reservation is deleted too; jobs older than their ``ttl`` plus
5 minutes (30 minutes without one) are deleted with their Reservation (``doScavenge``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from apis.descheduler_keys import ANNOTATION_EVICT_REASON, ANNOTATION_PASSED_ARBITRATION
from apis.podmigrationjob import (
    COND_BOUND_POD_READY,
    COND_EVICTION,
    COND_POD_BOUND_RESERVATION,
    COND_RESERVATION_BOUND,
    COND_RESERVATION_CREATED,
    COND_RESERVATION_SCHEDULED,
    MODE_EVICT_DIRECTLY,
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_RUNNING,
    PHASE_SUCCEEDED,
    REASON_EVICT_COMPLETE,
    REASON_EVICTING,
    REASON_FAILED_CREATE_RESERVATION,
    REASON_FORBIDDEN_MIGRATE_POD,
    REASON_INVALID_POD_REF,
    REASON_MISSING_POD,
    REASON_MISSING_RESERVATION,
    REASON_RESERVATION_EXPIRED,
    REASON_TIMEOUT,
    REASON_UNSCHEDULABLE,
    REASON_WAIT_FOR_BOUND_POD_READY,
    REASON_WAIT_FOR_POD_BIND_RESERVATION,
    STATUS_COMPLETE,
    STATUS_FALSE,
    STATUS_TRUE,
    Condition,
    JobStatus,
    ObjectRef,
    PodMigrationJob,
    parse_job,
    status_json,
    with_condition,
)
from apis.timestamp import format_time
from descheduler.cluster import Cluster
from descheduler.migration.args import MigrationControllerArgs
from descheduler.migration.evicting import EvictionError, PodEvicter
from descheduler.migration.filters import MigrationFilter
from descheduler.migration.reservation import reservation_object
from kubeclient.client import KubeClient, PatchType
from kubeclient.errors import Conflict, KubeError, NotFound
from kubeclient.resources import POD_MIGRATION_JOBS, RESERVATIONS
from kubeclient.writes import update_status

logger = logging.getLogger(__name__)

REQUEUE_S = 3.0
"""``defaultRequeueAfter``."""
SCAVENGE_GRACE_S = 5 * 60.0
SCAVENGE_DEFAULT_S = 30 * 60.0
ACTION = "Migrating"

Record = Callable[[dict[str, str], str, str, str, str], None]
"""``record(regarding, type, reason, action, note)``: an Event (queued, never awaited)."""


class JobFinished(Exception):
    """The job reached a final phase in this reconcile."""


@dataclass(slots=True)
class Step:
    """When to look at a job again: ``None`` when only an event should wake it."""

    requeue_after: float | None = None


def job_ref(job: PodMigrationJob) -> dict[str, str]:
    return {
        "apiVersion": POD_MIGRATION_JOBS.api_version,
        "kind": POD_MIGRATION_JOBS.kind,
        "name": job.name,
        "uid": job.uid,
    }


def _phase(obj: dict[str, Any]) -> str:
    return str((obj.get("status") or {}).get("phase") or "")


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == kind:
            return c
    return None


class MigrationController:
    """See the module docstring."""

    def __init__(
        self,
        client: KubeClient,
        cluster: Cluster,
        args: MigrationControllerArgs,
        mfilter: MigrationFilter,
        record: Record,
        *,
        clock: Callable[[], float] = time.time,
        on_evicted: Callable[[PodMigrationJob, str, str], None] | None = None,
    ) -> None:
        self.client = client
        self.cluster = cluster
        self.args = args
        self.filter = mfilter
        self.record = record
        self.clock = clock
        self.evicter = PodEvicter(client, args)
        self.on_evicted = on_evicted
        """Called with (job, policy, node) after each eviction (metrics)."""
        self._backoff: dict[str, int] = {}

    # -- status writes ----------------------------------------------------------------------------
    async def _write_status(self, job: PodMigrationJob, status: JobStatus) -> PodMigrationJob:
        body = status_json(status)
        written = await update_status(
            self.client, POD_MIGRATION_JOBS, job.name, lambda _current: body
        )
        new = parse_job(written) if written is not None else job
        self.cluster.jobs.put(new)
        return new

    async def _event(self, job: PodMigrationJob, type_: str, reason: str, note: str) -> None:
        self.record(job_ref(job), type_, reason, ACTION, note)

    async def _condition(self, job: PodMigrationJob, cond: Condition) -> PodMigrationJob:
        """``updateCondition``: write only when it changed."""
        now = format_time(self.clock())
        cond = Condition(cond.type, cond.status, cond.reason, cond.message, now)
        status, changed = with_condition(job.status, cond)
        if not changed:
            return job
        return await self._write_status(job, status)

    async def _fail(
        self, job: PodMigrationJob, reason: str, message: str, *, event: bool = True
    ) -> None:
        s = job.status
        status = JobStatus(
            PHASE_FAILED, s.status, reason, message, s.conditions, s.node_name, s.pod_ref
        )
        await self._write_status(job, status)
        if event:
            await self._event(job, "Warning", reason, message)
        await self._delete_reservation(job)
        raise JobFinished

    async def _delete_reservation(self, job: PodMigrationJob) -> None:
        ref = job.spec.reservation_ref
        if ref is None or not ref.name:
            return
        try:
            await self.client.delete(RESERVATIONS, ref.name)
        except NotFound:
            return

    # -- the reconcile ----------------------------------------------------------------------------
    async def reconcile(self, job: PodMigrationJob) -> Step:
        """One pass over ``job`` (see the module docstring); when to look again."""
        try:
            return await self._migrate(job)
        except JobFinished:
            return Step()

    async def _migrate(self, job: PodMigrationJob) -> Step:
        if job.spec.paused:
            return Step()
        if job.status.phase not in ("", PHASE_PENDING, PHASE_RUNNING):
            return Step()
        ttl = job.spec.ttl_seconds
        if ttl and self.clock() - job.created >= ttl:
            await self._fail(job, REASON_TIMEOUT, "Abort job caused by timeout")
        ref = job.spec.pod_ref
        key = f"{ref.namespace}/{ref.name}"
        if job.status.phase in ("", PHASE_PENDING):
            if not ref.namespace or not ref.name:
                await self._fail(job, REASON_INVALID_POD_REF, "Abort job caused by invalid PodRef")
            pod = self.cluster.pod(ref.namespace, ref.name)
            if pod is None:
                await self._fail(
                    job, REASON_MISSING_POD, f'Abort job caused by missing Pod "{key}"'
                )
            assert pod is not None
            if ref.uid != pod.uid:
                patched = await self.client.patch(
                    POD_MIGRATION_JOBS, job.name, {"spec": {"podRef": {"uid": pod.uid}}}
                )
                job = parse_job(patched)
            s = job.status
            job = await self._write_status(
                job,
                JobStatus(
                    PHASE_RUNNING,
                    s.status,
                    s.reason,
                    s.message,
                    s.conditions,
                    s.node_name,
                    s.pod_ref,
                ),
            )
        mode = job.spec.mode or self.args.default_job_mode
        if mode == MODE_EVICT_DIRECTLY:
            done, step = await self._evict(job, None)
            if not done:
                return step
            job = self.cluster.jobs.get(job.name) or job
            s = job.status
            await self._write_status(
                job,
                JobStatus(
                    PHASE_SUCCEEDED,
                    STATUS_COMPLETE,
                    "",
                    f'Pod "{key}" has been evicted',
                    s.conditions,
                    s.node_name,
                    s.pod_ref,
                ),
            )
            return Step()
        if job.spec.reservation_ref is None:
            await self._create_reservation(job)
            return Step(0.0)
        rname = job.spec.reservation_ref.name
        job = await self._condition(job, Condition(COND_RESERVATION_CREATED, STATUS_TRUE))
        reservation = await self._reservation(rname)
        if reservation is None:
            await self._fail(
                job,
                REASON_MISSING_RESERVATION,
                f'Abort job caused by missing Reservation "{rname}"',
            )
        assert reservation is not None
        job = await self._sync_unschedulable(job, reservation)
        phase = _phase(reservation)
        if phase in ("", "Pending"):
            return Step(REQUEUE_S)
        ready = _condition(reservation, "Ready")
        if phase == "Failed" and ready is not None and ready.get("reason") == "Expired":
            await self._fail(job, REASON_RESERVATION_EXPIRED, "Reservation expired", event=False)
        node = str((reservation.get("status") or {}).get("nodeName") or "")
        if not node or phase not in ("Available", "Succeeded"):
            sched = _condition(reservation, "Scheduled") or {}
            await self._fail(
                job, REASON_UNSCHEDULABLE, str(sched.get("message") or ""), event=False
            )
        job = await self._placed(job, rname, node)
        done, step = await self._evict(job, reservation)
        if not done:
            return step
        job = self.cluster.jobs.get(job.name) or job
        return await self._bound(job, rname, reservation)

    async def _reservation(self, name: str) -> dict[str, Any] | None:
        try:
            return await self.client.get(RESERVATIONS, name)
        except NotFound:
            return None

    async def _create_reservation(self, job: PodMigrationJob) -> None:
        ref = job.spec.pod_ref
        key = f"{ref.namespace}/{ref.name}"
        pod = self.cluster.pod(ref.namespace, ref.name)
        if pod is None:
            await self._fail(job, REASON_MISSING_POD, f'Abort job caused by missing Pod "{key}"')
        assert pod is not None
        obj = reservation_object(job, pod, self.cluster.facts(pod), int(self.clock() * 1000))
        try:
            created = await self.client.create(RESERVATIONS, obj)
        except Conflict:
            created = await self.client.get(RESERVATIONS, obj["metadata"]["name"])
        except KubeError as err:
            await self._condition(
                job,
                Condition(
                    COND_RESERVATION_CREATED,
                    STATUS_FALSE,
                    REASON_FAILED_CREATE_RESERVATION,
                    f"Failed to create Reservation caused by {err}",
                ),
            )
            await self._event(job, "Warning", REASON_FAILED_CREATE_RESERVATION, str(err))
            raise
        meta = created.get("metadata") or {}
        ref_json = ObjectRef(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            kind="Reservation",
            api_version=RESERVATIONS.version,
        ).as_json()
        patch: dict[str, Any] = {"spec": {"reservationOptions": {"reservationRef": ref_json}}}
        if job.spec.reservation_template is None:
            tmeta = {"name": obj["metadata"]["name"], "labels": obj["metadata"]["labels"]}
            patch["spec"]["reservationOptions"]["template"] = {
                "metadata": tmeta,
                "spec": obj["spec"],
            }
        patched = await self.client.patch(POD_MIGRATION_JOBS, job.name, patch)
        self.cluster.jobs.put(parse_job(patched))
        await self._event(
            job,
            "Normal",
            COND_RESERVATION_CREATED,
            f'Successfully create Reservation "{ref_json["name"]}"',
        )

    async def _sync_unschedulable(
        self, job: PodMigrationJob, reservation: dict[str, Any]
    ) -> PodMigrationJob:
        """``syncReservationScheduleFailed``."""
        cond = job.status.condition(COND_RESERVATION_SCHEDULED)
        if cond is not None and cond.status == STATUS_TRUE:
            return job
        sched = _condition(reservation, "Scheduled")
        if sched is None or sched.get("reason") != REASON_UNSCHEDULABLE:
            return job
        message = str(sched.get("message") or "")
        new = await self._condition(
            job, Condition(COND_RESERVATION_SCHEDULED, STATUS_FALSE, REASON_UNSCHEDULABLE, message)
        )
        if new is not job:
            await self._event(job, "Warning", REASON_UNSCHEDULABLE, message)
        return new

    async def _placed(self, job: PodMigrationJob, rname: str, node: str) -> PodMigrationJob:
        """``prepareJobWithReservationScheduleSuccess``."""
        if job.status.node_name:
            return job
        cond = job.status.condition(COND_RESERVATION_SCHEDULED)
        if cond is not None and cond.status == STATUS_TRUE:
            return job
        ref = job.spec.pod_ref
        pod = self.cluster.pod(ref.namespace, ref.name)
        if pod is not None and pod.node_name == node:
            await self._fail(
                job,
                REASON_FORBIDDEN_MIGRATE_POD,
                f'Scheduler assignes the Reservation "{rname}" on the same node as the Pod',
            )
        s = job.status
        job = await self._write_status(
            job, JobStatus(s.phase, s.status, s.reason, s.message, s.conditions, node, s.pod_ref)
        )
        job = await self._condition(job, Condition(COND_RESERVATION_SCHEDULED, STATUS_TRUE))
        await self._event(
            job,
            "Normal",
            COND_RESERVATION_SCHEDULED,
            f'Assigned Reservation "{rname}" to node "{node}"',
        )
        return job

    async def _evict(
        self, job: PodMigrationJob, reservation: dict[str, Any] | None
    ) -> tuple[bool, Step]:
        """``evictPod``: whether the pod is gone, and when to look again if not."""
        cond = job.status.condition(COND_EVICTION)
        if cond is not None and cond.status == STATUS_TRUE:
            return True, Step()
        ref = job.spec.pod_ref
        key = f"{ref.namespace}/{ref.name}"
        pod = self.cluster.pod(ref.namespace, ref.name)
        if pod is None or (cond is not None and ref.uid and ref.uid != pod.uid):
            if job.status.status != COND_EVICTION:
                await self._fail(
                    job, REASON_MISSING_POD, f'Abort job caused by missing Pod "{key}"'
                )
            await self._condition(job, Condition(COND_EVICTION, STATUS_TRUE, REASON_EVICT_COMPLETE))
            await self._event(job, "Normal", REASON_EVICT_COMPLETE, f'Pod "{key}" has been evicted')
            self._backoff.pop(job.name, None)
            return True, Step()
        if cond is not None and cond.reason == REASON_EVICTING:
            return False, Step(REQUEUE_S)
        if reservation is not None and _phase(reservation) == "Succeeded":
            await self._fail(
                job, REASON_FORBIDDEN_MIGRATE_POD, "Reservation is already bound by another Pod"
            )
        options = job.spec.delete_options or self.args.default_delete_options
        try:
            policy = await self.evicter.evict(job, pod, options)
        except EvictionError as err:
            n = self._backoff.get(job.name, 0)
            self._backoff[job.name] = n + 1
            delay = min(REQUEUE_S * 2**n, 60.0)
            retry_after = getattr(err, "retry_after", None)
            if retry_after:
                delay = max(delay, retry_after)
            await self._event(
                job, "Warning", REASON_EVICTING, f'Failed evict Pod "{key}" caused by {err}'
            )
            logger.info(
                "job %s: evicting %s refused (%s); again in %.1fs", job.name, key, err, delay
            )
            return False, Step(delay)
        self._backoff.pop(job.name, None)
        self.filter.track_evicted(pod)
        reason = job.annotations.get(ANNOTATION_EVICT_REASON, "")
        message = f'Pod "{key}" evicted from node "{pod.node_name}" by the reason "{reason}"'
        await self._condition(job, Condition(COND_EVICTION, STATUS_FALSE, REASON_EVICTING, message))
        await self._event(job, "Normal", REASON_EVICTING, message)
        if self.on_evicted is not None:
            self.on_evicted(job, policy, pod.node_name)
        pod_ref = {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": pod.namespace,
            "name": pod.name,
            "uid": pod.uid,
        }
        self.record(pod_ref, "Normal", "Descheduled", "Evicting", f"pod evicted by {reason}")
        return False, Step(REQUEUE_S)

    async def _bound(self, job: PodMigrationJob, rname: str, reservation: dict[str, Any]) -> Step:
        """Steps 9 and 10."""
        cond = job.status.condition(COND_POD_BOUND_RESERVATION)
        reservation = await self._reservation(rname) or reservation
        owners = (reservation.get("status") or {}).get("currentOwners") or []
        if (cond is None or cond.status != STATUS_TRUE) and not owners:
            new = await self._condition(
                job,
                Condition(
                    COND_POD_BOUND_RESERVATION, STATUS_FALSE, REASON_WAIT_FOR_POD_BIND_RESERVATION
                ),
            )
            if new is not job:
                await self._event(
                    job,
                    "Normal",
                    REASON_WAIT_FOR_POD_BIND_RESERVATION,
                    "Waiting for Pod bind Reservation",
                )
            return Step(REQUEUE_S)
        owner = owners[0] if owners else {}
        bound = ObjectRef(
            namespace=str(owner.get("namespace", "")),
            name=str(owner.get("name", "")),
            uid=str(owner.get("uid", "")),
        )
        bkey = f"{bound.namespace}/{bound.name}"
        if job.status.condition(COND_RESERVATION_BOUND) is None or job.status.pod_ref is None:
            s = job.status
            job = await self._write_status(
                job,
                JobStatus(s.phase, s.status, s.reason, s.message, s.conditions, s.node_name, bound),
            )
            job = await self._condition(job, Condition(COND_RESERVATION_BOUND, STATUS_TRUE))
            await self._event(
                job, "Normal", "PodBoundReservation", f'Reservation bound by pod "{bkey}"'
            )
        ready_cond = job.status.condition(COND_BOUND_POD_READY)
        if ready_cond is None or ready_cond.status != STATUS_TRUE:
            new_pod = self.cluster.pod(bound.namespace, bound.name)
            if new_pod is not None and not self.cluster.facts(new_pod).ready:
                new = await self._condition(
                    job,
                    Condition(COND_BOUND_POD_READY, STATUS_FALSE, REASON_WAIT_FOR_BOUND_POD_READY),
                )
                if new is not job:
                    await self._event(
                        job,
                        "Normal",
                        REASON_WAIT_FOR_BOUND_POD_READY,
                        f"Waiting for Bound Pod {bkey} Ready",
                    )
                return Step(REQUEUE_S)
            await self._event(job, "Normal", COND_BOUND_POD_READY, f'Bind pod "{bkey}" is ready')
            job = await self._condition(job, Condition(COND_BOUND_POD_READY, STATUS_TRUE))
        message = f'Bind Pod "{bkey}" in Reservation "{rname}"'
        status, _ = with_condition(
            job.status,
            Condition(
                COND_POD_BOUND_RESERVATION, STATUS_TRUE, "", message, format_time(self.clock())
            ),
        )
        final = JobStatus(
            PHASE_SUCCEEDED,
            STATUS_COMPLETE,
            "",
            message,
            status.conditions,
            status.node_name,
            bound,
        )
        await self._write_status(job, final)
        await self._event(job, "Normal", STATUS_COMPLETE, message)
        return Step()

    # -- housekeeping ------------------------------------------------------------------------------
    async def job_deleted(self, job: PodMigrationJob) -> None:
        """A deleted job's Reservation goes too."""
        try:
            await self._delete_reservation(job)
        except KubeError as err:
            logger.warning("job %s: Reservation not deleted: %s", job.name, err)

    async def scavenge(self) -> int:
        """``doScavenge``: delete jobs past their ttl plus 5 minutes (30 without one), with their
        Reservations; how many."""
        now = self.clock()
        done = 0
        for job in list(self.cluster.jobs.jobs.values()):
            if job.name in self.cluster.jobs.assumed:
                continue
            ttl = job.spec.ttl_seconds
            limit = ttl + SCAVENGE_GRACE_S if ttl else SCAVENGE_DEFAULT_S
            if now - job.created < limit:
                continue
            try:
                await self._delete_reservation(job)
                await self.client.delete(POD_MIGRATION_JOBS, job.name)
                done += 1
            except NotFound:
                continue
            except KubeError as err:
                logger.warning("job %s not scavenged: %s", job.name, err)
        return done

    async def mark_passed(self, job: PodMigrationJob) -> None:
        """``updatePassedJob``: the annotation that tells every replica the job passed."""
        patched = await self.client.patch(
            POD_MIGRATION_JOBS,
            job.name,
            {"metadata": {"annotations": {ANNOTATION_PASSED_ARBITRATION: "true"}}},
            patch_type=PatchType.MERGE,
        )
        self.cluster.jobs.put(parse_job(patched))

    async def mark_failed(self, job: PodMigrationJob, reason: str) -> None:
        """``updateFailedJob``: a job whose pod may never move."""
        ref = job.spec.pod_ref
        message = (
            f'Pod "{ref.namespace}/{ref.name}" is forbidden to migrate because it does not meet '
            f"the requirements: {reason}"
        )
        s = job.status
        await self._write_status(
            job,
            JobStatus(
                PHASE_FAILED,
                s.status,
                REASON_FORBIDDEN_MIGRATE_POD,
                message,
                s.conditions,
                s.node_name,
                s.pod_ref,
            ),
        )
        await self._event(job, "Warning", REASON_FORBIDDEN_MIGRATE_POD, message)
