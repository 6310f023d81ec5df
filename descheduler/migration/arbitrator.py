"""Arbitration: which waiting PodMigrationJobs may start now, in which order, and why not.

Upstream's arbitrator (``controllers/migration/arbitrator``, the v1.4 release's "arbitration
mechanism"): new jobs wait in a collection; every ``arbitrationArgs.interval`` they are

1. **sorted** by four stable sorts applied in turn, so the last one dominates
   (``arbitrator.go``'s ``sorts``): newest first (``SortJobsByCreationTime``); by their pods with
   the pod order without usage (``SortJobsByPod``: lower priority class, priority, QoS, costs
   first; jobs whose pod is gone first of all); jobs of one batch ``Job`` grouped at the place of
   its first (``SortJobsByController``); jobs of the ``Job`` with the most migrating jobs first
   (``SortJobsByMigratingNum``);
2. **filtered** in that order (``filters.py``): a job whose pod fails a non-retryable check fails
   (``ForbiddenMigratePod``, "Pod %q is forbidden to migrate because it does not meet the
   requirements"); one held by a retryable check waits for the next arbitration; one that passes
   is annotated ``descheduler.koordinator.sh/passed-arbitration: "true"`` and counts at once for
   the jobs after it. A job whose pod cannot be found passes (the controller then fails it with
   ``MissingPod``).

:meth:`Arbitrator.arbitrate` returns the three lists with every reason; the controller writes
them. ``bench.descheduler_scale`` times it over 1,000 jobs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apis.descheduler_keys import KIND_JOB
from apis.podmigrationjob import PHASE_RUNNING, PodMigrationJob
from descheduler.cluster import Cluster
from descheduler.migration.filters import MigrationFilter
from descheduler.podfacts import OwnerRef
from descheduler.sorter import pod_sort_key
from scheduler_plugins.snapshot import PodInfo


@dataclass(slots=True)
class Outcome:
    """One arbitration's decisions, in the sorted order."""

    order: list[str] = field(default_factory=list)
    """Job names in the order they were considered."""
    passed: list[PodMigrationJob] = field(default_factory=list)
    failed: list[tuple[PodMigrationJob, str]] = field(default_factory=list)
    held: list[tuple[PodMigrationJob, str]] = field(default_factory=list)


def _job_owner(cluster: Cluster, pod: PodInfo | None) -> OwnerRef | None:
    """``getJobControllerOfPod``: the pod's controller when it is a batch ``Job``."""
    if pod is None:
        return None
    owner = cluster.facts(pod).controller
    return owner if owner is not None and owner.kind == KIND_JOB else None


def by_creation_time(jobs: Sequence[PodMigrationJob]) -> list[PodMigrationJob]:
    """``SortJobsByCreationTime``: newest first (whole seconds), stable."""
    return sorted(jobs, key=lambda j: -int(j.created))


def by_pod(
    jobs: Sequence[PodMigrationJob], pod_rank: Callable[[PodMigrationJob], Any]
) -> list[PodMigrationJob]:
    """``SortJobsByPod``: by the rank of each job's pod (``None``: no pod, first of all)."""
    ranks = {j.name: pod_rank(j) for j in jobs}
    return sorted(jobs, key=lambda j: (0, ()) if ranks[j.name] is None else (1, ranks[j.name]))


def by_controller(
    jobs: Sequence[PodMigrationJob], owner: Mapping[str, str | None]
) -> list[PodMigrationJob]:
    """``SortJobsByController``: jobs of one batch Job take the place of the first of them."""
    first: dict[str, int] = {}
    rank: dict[str, int] = {}
    for i, j in enumerate(jobs):
        uid = owner.get(j.name)
        rank[j.name] = i if uid is None else first.setdefault(uid, i)
    return sorted(jobs, key=lambda j: rank[j.name])


def by_migrating_num(
    jobs: Sequence[PodMigrationJob],
    owner: Mapping[str, str | None],
    migrating_of_owner: Callable[[str], int],
) -> list[PodMigrationJob]:
    """``SortJobsByMigratingNum``: jobs of the batch Job with the most migrating jobs first."""
    counts: dict[str, int] = {}
    for j in jobs:
        uid = owner.get(j.name)
        if uid is not None and uid not in counts:
            counts[uid] = migrating_of_owner(uid)
    return sorted(jobs, key=lambda j: -counts.get(owner.get(j.name) or "", 0))


def sort_jobs(
    cluster: Cluster,
    jobs: Sequence[PodMigrationJob],
    pod_of: Callable[[PodMigrationJob], PodInfo | None],
    migrating_of_owner: Callable[[str], int],
) -> list[PodMigrationJob]:
    """The four stable sorts in upstream's order (see the module docstring)."""
    pods = {j.name: pod_of(j) for j in jobs}
    owner: dict[str, str | None] = {}
    for j in jobs:
        o = _job_owner(cluster, pods[j.name])
        owner[j.name] = None if o is None else o.uid

    def pod_rank(j: PodMigrationJob) -> Any:
        pod = pods[j.name]
        return None if pod is None else pod_sort_key(cluster.facts(pod), 0.0)

    out = by_creation_time(jobs)
    out = by_pod(out, pod_rank)
    out = by_controller(out, owner)
    return by_migrating_num(out, owner, migrating_of_owner)


class Arbitrator:
    """See the module docstring."""

    def __init__(self, cluster: Cluster, mfilter: MigrationFilter) -> None:
        self.cluster = cluster
        self.filter = mfilter
        self.waiting: dict[str, PodMigrationJob] = {}
        """Jobs waiting for arbitration, by name."""

    def add(self, job: PodMigrationJob) -> None:
        self.waiting[job.name] = job

    def remove(self, name: str) -> None:
        self.waiting.pop(name, None)

    def pod_of(self, job: PodMigrationJob) -> PodInfo | None:
        ref = job.spec.pod_ref
        return self.cluster.pod(ref.namespace, ref.name)

    def migrating_of_owner(self, uid: str) -> int:
        """``getMigratingJobNum``: jobs passed or Running for pods of the owner ``uid``."""
        keys = {p.key for p in self.cluster.pods_of_owner(uid)}
        store = self.cluster.jobs
        return sum(
            1
            for j in store.jobs.values()
            if f"{j.spec.pod_ref.namespace}/{j.spec.pod_ref.name}" in keys
            and (store.passed(j) or j.status.phase == PHASE_RUNNING)
        )

    def arbitrate(self) -> Outcome:
        """One arbitration over the waiting jobs (marks the passed ones in the store)."""
        out = Outcome()
        jobs = sort_jobs(
            self.cluster, list(self.waiting.values()), self.pod_of, self.migrating_of_owner
        )
        store = self.cluster.jobs
        for job in jobs:
            out.order.append(job.name)
            pod = self.pod_of(job)
            if pod is not None:
                reason = self.filter.non_retryable(pod)
                if reason is not None:
                    out.failed.append((job, reason))
                    self.waiting.pop(job.name, None)
                    continue
                reason = self.filter.retryable(pod, arbitrating=True)
                if reason is not None:
                    out.held.append((job, reason))
                    continue
            store.mark_passed(job)
            out.passed.append(job)
            self.waiting.pop(job.name, None)
        return out
