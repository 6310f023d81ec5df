"""The PodMigrationJobs the descheduler knows, indexed for the arbitrator's counting.

One :class:`JobStore` per process term: the informer's jobs (``put``/``remove``), plus the jobs a
descheduling round has just decided to create (``assume``: counted at once by the next pod's
limits, as upstream counts a job created a moment earlier; ``forget`` if the create fails).

"Migrating" means what upstream's ``forEachAvailableMigrationJobs`` counts: jobs in phase
``Running`` or ``Pending`` (an unset phase is ``Pending``). While arbitrating, a ``Pending`` job
counts only once it passed arbitration (:meth:`JobStore.passed`: the
``descheduler.koordinator.sh/passed-arbitration`` annotation, or this process's own record).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from apis.descheduler_keys import ANNOTATION_PASSED_ARBITRATION
from apis.podmigrationjob import PHASE_PENDING, PHASE_RUNNING, PodMigrationJob

LOG_LIMIT = 4096
"""Changes kept for incremental readers; one further behind rebuilds from :attr:`JobStore.jobs`."""

ADDED = "added"
PASSED = "passed"
CHANGED = "changed"
"""Kinds of change in :attr:`JobStore.log`: a new job, a job that passed arbitration, anything
else (an update, a removal)."""


@dataclass(slots=True)
class JobStore:
    """See the module docstring."""

    jobs: dict[str, PodMigrationJob] = field(default_factory=dict)
    """By name."""
    assumed: set[str] = field(default_factory=set)
    """Names of jobs decided this round and not yet seen from the API server."""
    passed_uids: set[str] = field(default_factory=set)
    """Jobs this process let through arbitration (upstream's ``arbitratedPodMigrationJobs``)."""
    log: list[tuple[str, str]] = field(default_factory=list)
    """The latest changes, ``(kind, job name)``, oldest first (see :meth:`changes_since`)."""
    _base: int = 0

    @property
    def version(self) -> int:
        """Bumped on every change (caches key on it)."""
        return self._base + len(self.log)

    def _record(self, kind: str, name: str) -> None:
        if len(self.log) >= LOG_LIMIT:
            self._base += len(self.log)
            self.log.clear()
        self.log.append((kind, name))

    def changes_since(self, version: int) -> list[tuple[str, str]] | None:
        """The changes after ``version``, or ``None`` when they are no longer kept."""
        if version < self._base or version > self.version:
            return None
        return self.log[version - self._base :]

    def put(self, job: PodMigrationJob) -> None:
        known = job.name in self.jobs
        self.jobs[job.name] = job
        self.assumed.discard(job.name)
        self._record(CHANGED if known else ADDED, job.name)

    def assume(self, job: PodMigrationJob) -> None:
        """A job decided now, counted until :meth:`put` (the API's copy) or :meth:`forget`."""
        known = job.name in self.jobs
        self.jobs[job.name] = job
        self.assumed.add(job.name)
        self._record(CHANGED if known else ADDED, job.name)

    def forget(self, name: str) -> None:
        """Drop an assumed job whose create failed."""
        if name in self.assumed:
            self.assumed.discard(name)
            self.jobs.pop(name, None)
            self._record(CHANGED, name)

    def remove(self, name: str) -> PodMigrationJob | None:
        job = self.jobs.pop(name, None)
        self.assumed.discard(name)
        if job is not None:
            self.passed_uids.discard(job.uid)
            self._record(CHANGED, name)
        return job

    def mark_passed(self, job: PodMigrationJob) -> None:
        """This process let ``job`` through arbitration."""
        self.passed_uids.add(job.uid)
        self._record(PASSED, job.name)

    def get(self, name: str) -> PodMigrationJob | None:
        return self.jobs.get(name)

    def passed(self, job: PodMigrationJob) -> bool:
        """Whether the job passed arbitration."""
        return job.annotations.get(ANNOTATION_PASSED_ARBITRATION) == "true" or (
            job.uid in self.passed_uids
        )

    def counts(self, job: PodMigrationJob, arbitrating: bool) -> bool:
        """Whether ``job`` counts as migrating (see the module docstring)."""
        phase = job.effective_phase
        return phase == PHASE_RUNNING or (
            phase == PHASE_PENDING and (not arbitrating or self.passed(job))
        )

    def migrating(self, *, arbitrating: bool = False) -> Iterator[PodMigrationJob]:
        """Jobs that count as migrating (see the module docstring)."""
        for job in self.jobs.values():
            if self.counts(job, arbitrating):
                yield job

    def migrating_for(
        self, uid: str, namespace: str, name: str, *, arbitrating: bool = False
    ) -> bool:
        """``existingPodMigrationJob``: a migrating job names this pod (by uid, else by name)."""
        for job in self.migrating(arbitrating=arbitrating):
            ref = job.spec.pod_ref
            if (uid and ref.uid == uid) or (ref.namespace == namespace and ref.name == name):
                return True
        return False
