"""The MigrationController's pod filters: may this pod move now, and if not, why.

Upstream's ``arbitrator/filter.go`` and ``evict.go``, one method a rule, each refusal a reason:

- **not retryable** (a job whose pod fails one ends ``Failed``): an eviction cost of ``MaxInt32``
  (``FilterPodWithMaxEvictionCost``), the default evictor filter (``evictor.py``), the workload's
  expected replicas (1, or all of them allowed to be migrating or unavailable at once, unless
  ``skipCheckExpectedReplicas``), ``namespaces.include``/``exclude``;
- **retryable** (the job waits for the next arbitration): the object limiters (a workload, or a
  namespace, evicted too often within the window), ``maxMigratingPerNode``,
  ``maxMigratingPerNamespace``, ``maxMigratingPerWorkload`` and ``maxUnavailablePerWorkload``
  (the workload's unready pods and its migrating pods together), ``maxMigratingGlobally``. A
  pod annotated ``descheduler.alpha.kubernetes.io/evict`` skips them.

The counts are of migrating jobs (:mod:`descheduler.migration.store`); while arbitrating, a
pending job counts only once it passed. They are indexed once per change of the jobs or the
cluster, so a descheduling round's thousands of checks stay cheap.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from apis.podmigrationjob import MODE_RESERVATION_FIRST, PodMigrationJob
from apis.records import frozen
from descheduler.cluster import Cluster
from descheduler.evictor import EvictorFilter, has_evict_annotation
from descheduler.migration.args import LIMIT_NAMESPACE, LIMIT_WORKLOAD, MigrationControllerArgs
from descheduler.migration.store import CHANGED
from descheduler.migration.workloads import (
    RateLimiter,
    expected_scale,
    max_unavailable,
    owner_uids_for_ref,
)
from descheduler.podfacts import INT32_MAX, OwnerRef
from scheduler_plugins.snapshot import PodInfo


@dataclass(slots=True)
class _Counts:
    """Migrating jobs, indexed (see the module docstring)."""

    names: set[str] = field(default_factory=set)
    """The jobs counted."""
    by_node: dict[str, set[str]] = field(default_factory=dict)
    """Node → uids of its pods with a migrating job."""
    by_namespace: dict[str, Counter[str]] = field(default_factory=dict)
    """Namespace → the pod uid of each migrating job there, counted."""
    namespace_total: Counter[str] = field(default_factory=Counter)
    by_owner: dict[str, set[str]] = field(default_factory=dict)
    """Controller uid → ``namespace/name`` of its pods with a migrating job."""
    pod_uids: Counter[str] = field(default_factory=Counter)
    """The pod uid of every migrating job, counted."""
    total: int = 0
    pods: set[str] = field(default_factory=set)
    """uids and ``namespace/name`` of pods with a migrating job."""


@frozen
class _WorkloadLimits:
    uids: tuple[str, ...]
    """Owners whose pods are the workload's (a Deployment's ReplicaSets)."""
    replicas: int
    max_migrating: int
    max_unavailable: int


class MigrationFilter:
    """See the module docstring."""

    def __init__(
        self,
        cluster: Cluster,
        args: MigrationControllerArgs,
        evictor: EvictorFilter,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = cluster
        self.args = args
        self.evictor = evictor
        self.clock = clock
        self.limiters: dict[str, dict[str, RateLimiter]] = {LIMIT_WORKLOAD: {}, LIMIT_NAMESPACE: {}}
        """Object type → object (owner uid, namespace) → its limiter, once it evicted."""
        self._counts: dict[bool, tuple[tuple[int, int], _Counts]] = {}
        self._workloads: dict[tuple[str, str, str], _WorkloadLimits] = {}
        self._workloads_version = -1
        self._lasting_cache: dict[str, tuple[PodInfo, str | None]] = {}
        self._lasting_token: tuple[int, ...] = ()

    def workload(self, owner: OwnerRef, namespace: str) -> _WorkloadLimits:
        """The owner's replicas and limits (cached until the workloads change)."""
        if self._workloads_version != self.cluster.workloads_version:
            self._workloads.clear()
            self._workloads_version = self.cluster.workloads_version
        key = (owner.kind, namespace, owner.name)
        hit = self._workloads.get(key)
        if hit is None:
            uids, replicas = owner_uids_for_ref(self.cluster, owner, namespace)
            hit = _WorkloadLimits(
                tuple(uids),
                replicas,
                max_unavailable(replicas, self.args.max_migrating_per_workload),
                max_unavailable(replicas, self.args.max_unavailable_per_workload),
            )
            self._workloads[key] = hit
        return hit

    # -- the counting index ---------------------------------------------------------------------
    def counts(self, *, arbitrating: bool) -> _Counts:
        """The index, brought up to date: new jobs and passed ones are added as they come; any
        other change (or a change of the cluster) rebuilds it from the jobs."""
        store = self.cluster.jobs
        generation = self.cluster.sched.generation
        cached = self._counts.get(arbitrating)
        if cached is not None and cached[0] == (store.version, generation):
            return cached[1]
        changes = None
        if cached is not None and cached[0][1] == generation:
            changes = store.changes_since(cached[0][0])
        if changes is not None and all(kind != CHANGED for kind, _ in changes):
            assert cached is not None
            c = cached[1]
            for _, name in changes:
                job = store.jobs.get(name)
                if job is not None and name not in c.names and store.counts(job, arbitrating):
                    self._add(c, job)
        else:
            c = _Counts()
            for job in store.migrating(arbitrating=arbitrating):
                self._add(c, job)
        self._counts[arbitrating] = ((store.version, generation), c)
        return c

    def _add(self, c: _Counts, job: PodMigrationJob) -> None:
        ref = job.spec.pod_ref
        c.names.add(job.name)
        c.total += 1
        c.pod_uids[ref.uid] += 1
        c.by_namespace.setdefault(ref.namespace, Counter())[ref.uid] += 1
        c.namespace_total[ref.namespace] += 1
        found = {
            p.uid: p
            for p in (
                self.cluster.pod_by_uid(ref.uid) if ref.uid else None,
                self.cluster.pod(ref.namespace, ref.name),
            )
            if p is not None
        }
        for pod in found.values():
            c.pods.update((pod.uid, pod.key))
            if pod.node_name:
                c.by_node.setdefault(pod.node_name, set()).add(pod.uid)
            owner = self.cluster.facts(pod).controller
            if owner is not None:
                c.by_owner.setdefault(owner.uid, set()).add(pod.key)

    # -- single rules -----------------------------------------------------------------------------
    def existing_job(self, pod: PodInfo, c: _Counts | None = None) -> str | None:
        if c is None:
            c = self.counts(arbitrating=False)
        if pod.uid in c.pods or pod.key in c.pods:
            return "pod already has a migrating PodMigrationJob"
        return None

    def reservation(self, pod: PodInfo) -> str | None:
        """``reservationFilter``: in ReservationFirst mode the pod's scheduler must be one that
        places Reservations (``schedulerNames``)."""
        if self.args.default_job_mode != MODE_RESERVATION_FIRST:
            return None
        name = self.cluster.facts(pod).scheduler_name
        if name in self.args.scheduler_names:
            return None
        return (
            f"pod's schedulerName {name} cannot place a Reservation (ReservationFirst mode, "
            f"schedulerNames {', '.join(self.args.scheduler_names)})"
        )

    def expected_replicas(self, pod: PodInfo) -> str | None:
        owner = self.cluster.facts(pod).controller
        if owner is None:
            return None
        if self.args.skip_check_expected_replicas:
            return None
        w = self.workload(owner, pod.namespace)
        replicas, max_migrating, max_unavail = w.replicas, w.max_migrating, w.max_unavailable
        if replicas in (1, max_migrating, max_unavail):
            return (
                f"workload {owner.kind}/{owner.name} has {replicas} expected replica(s): "
                f"1, or as many as maxMigrating ({max_migrating}) or maxUnavailable "
                f"({max_unavail})"
            )
        return None

    def non_retryable(self, pod: PodInfo) -> str | None:
        """The first reason a job for this pod can never run, or ``None``."""
        if self.cluster.facts(pod).eviction_cost == INT32_MAX:
            return "pod's eviction cost is MaxInt32"
        reason = self.evictor.filter(pod) or self.expected_replicas(pod)
        if reason:
            return reason
        a = self.args
        if a.namespaces_include and pod.namespace not in a.namespaces_include:
            return f"namespace {pod.namespace} is not in namespaces.include"
        if pod.namespace in a.namespaces_exclude:
            return f"namespace {pod.namespace} is in namespaces.exclude"
        return None

    def limited_object(self, pod: PodInfo) -> str | None:
        owner = self.cluster.facts(pod).controller
        if owner is not None and LIMIT_WORKLOAD in self.args.object_limiters:
            lim = self.limiters[LIMIT_WORKLOAD].get(owner.uid)
            if lim is not None and lim.tokens() - 1 < 0:
                return (
                    f"objectLimiters.workload: workload {owner.kind}/{owner.name} was "
                    "descheduled recently"
                )
        if LIMIT_NAMESPACE in self.args.object_limiters:
            lim = self.limiters[LIMIT_NAMESPACE].get(pod.namespace)
            if lim is not None and lim.tokens() - 1 < 0:
                return (
                    f"objectLimiters.namespace: namespace {pod.namespace} was descheduled recently"
                )
        return None

    def per_node(self, pod: PodInfo, c: _Counts) -> str | None:
        limit = self.args.max_migrating_per_node
        if not pod.node_name or limit <= 0:
            return None
        on_node = c.by_node.get(pod.node_name)
        count = len(on_node) - (pod.uid in on_node) if on_node else 0
        if count >= limit:
            return (
                f"maxMigratingPerNode: node {pod.node_name} has {count} migrating pod(s), "
                f"the limit is {limit}"
            )
        return None

    def per_namespace(self, pod: PodInfo, c: _Counts) -> str | None:
        limit = self.args.max_migrating_per_namespace
        if limit <= 0:
            return None
        own = c.by_namespace.get(pod.namespace)
        count = c.namespace_total[pod.namespace] - (own[pod.uid] if own else 0)
        if count >= limit:
            return (
                f"maxMigratingPerNamespace: namespace {pod.namespace} has {count} migrating "
                f"pod(s), the limit is {limit}"
            )
        return None

    def globally(self, pod: PodInfo, c: _Counts) -> str | None:
        limit = self.args.max_migrating_globally
        if limit <= 0:
            return None
        count = c.total - c.pod_uids[pod.uid]
        if count >= limit:
            return f"maxMigratingGlobally: {count} pod(s) are migrating, the limit is {limit}"
        return None

    def per_workload(self, pod: PodInfo, c: _Counts) -> str | None:
        owner = self.cluster.facts(pod).controller
        if owner is None:
            return None
        w = self.workload(owner, pod.namespace)
        if w.replicas == 0:
            return f"workload {owner.kind}/{owner.name} is unknown or has no replicas"
        max_migrating, max_unavail = w.max_migrating, w.max_unavailable
        if len(w.uids) == 1:
            down = self.cluster.unavailable_of_owner(w.uids[0])
        else:
            down = set().union(*(self.cluster.unavailable_of_owner(u) for u in w.uids))
        of_owner = c.by_owner.get(owner.uid)
        migrating = of_owner - {pod.key} if of_owner else set()
        if migrating and len(migrating) >= max_migrating:
            return (
                f"maxMigratingPerWorkload: workload {owner.kind}/{owner.name} has "
                f"{len(migrating)} migrating pod(s), the limit is {max_migrating}"
            )
        unavailable = down | migrating if migrating else down
        if len(unavailable) >= max_unavail:
            return (
                f"maxUnavailablePerWorkload: workload {owner.kind}/{owner.name} has "
                f"{len(unavailable)} unavailable pod(s), the limit is {max_unavail}"
            )
        return None

    def retryable(
        self, pod: PodInfo, *, arbitrating: bool, counts: _Counts | None = None
    ) -> str | None:
        """The first reason a job for this pod must wait, or ``None``."""
        if has_evict_annotation(pod):
            return None
        c = self.counts(arbitrating=arbitrating) if counts is None else counts
        return (
            self.limited_object(pod)
            or self.per_node(pod, c)
            or self.per_namespace(pod, c)
            or self.per_workload(pod, c)
            or self.globally(pod, c)
        )

    def filter(self, pod: PodInfo) -> str | None:
        """``arbitratorImpl.Filter``: whether a descheduling plugin may ask to move the pod."""
        c = self.counts(arbitrating=False)
        return (
            self.existing_job(pod, c)
            or self._lasting(pod)
            or self.retryable(pod, arbitrating=False, counts=c)
        )

    def _lasting(self, pod: PodInfo) -> str | None:
        """:meth:`reservation` then :meth:`non_retryable`, remembered per pod until the cluster,
        the workloads, the budgets or (when there are budgets) the jobs change: a round asks
        again for every pod of a source after each move."""
        c = self.cluster
        token = (
            c.sched.generation,
            c.workloads_version,
            c.pdbs_version,
            c.jobs.version if c.pdbs else -1,
        )
        if token != self._lasting_token:
            self._lasting_cache.clear()
            self._lasting_token = token
        hit = self._lasting_cache.get(pod.uid)
        if hit is not None and hit[0] is pod:
            return hit[1]
        reason = self.reservation(pod) or self.non_retryable(pod)
        self._lasting_cache[pod.uid] = (pod, reason)
        return reason

    # -- object limiters --------------------------------------------------------------------------
    def exceeds_object_limiter(self, pod: PodInfo) -> bool:
        """``checkPodExceedObjectLimiter`` (v1.6: inside the controller): no token left."""
        return self.limited_object(pod) is not None

    def track_evicted(self, pod: PodInfo) -> None:
        """``trackEvictedPod``: an eviction takes a token of its workload's and namespace's
        limiters (created at the rate ``maxMigrating / duration``)."""
        owner = self.cluster.facts(pod).controller
        spec = self.args.object_limiters.get(LIMIT_WORKLOAD)
        if owner is not None and spec is not None and spec.duration_s > 0:
            scale = expected_scale(self.cluster, owner, pod.namespace)
            value = (
                spec.max_migrating
                if spec.max_migrating is not None
                else (self.args.max_migrating_per_workload)
            )
            allowed = max_unavailable(scale, value) if scale > 0 else 0
            if allowed > 0:
                self._take(LIMIT_WORKLOAD, owner.uid, allowed / spec.duration_s)
        spec = self.args.object_limiters.get(LIMIT_NAMESPACE)
        if spec is not None and spec.duration_s > 0:
            value = spec.max_migrating
            allowed = value if isinstance(value, int) else self.args.max_migrating_per_namespace
            if allowed > 0:
                self._take(LIMIT_NAMESPACE, pod.namespace, allowed / spec.duration_s)

    def _take(self, kind: str, key: str, rate: float) -> None:
        lim = self.limiters[kind].get(key)
        if lim is None:
            lim = self.limiters[kind][key] = RateLimiter(rate, self.clock)
        elif lim.rate != rate:
            lim.set_rate(rate)
        lim.allow()
