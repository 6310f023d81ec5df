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
from collections.abc import Callable
from dataclasses import dataclass, field

from apis.podmigrationjob import MODE_RESERVATION_FIRST
from descheduler.cluster import Cluster
from descheduler.evictor import EvictorFilter, has_evict_annotation
from descheduler.migration.args import LIMIT_NAMESPACE, LIMIT_WORKLOAD, MigrationControllerArgs
from descheduler.migration.workloads import (
    RateLimiter,
    expected_scale,
    max_unavailable,
    pods_for_ref,
)
from descheduler.podfacts import INT32_MAX
from scheduler_plugins.snapshot import PodInfo


@dataclass(slots=True)
class _Counts:
    """Migrating jobs, indexed (see the module docstring)."""

    by_node: dict[str, set[str]] = field(default_factory=dict)
    """Node → uids of its pods with a migrating job."""
    by_namespace: dict[str, list[str]] = field(default_factory=dict)
    """Namespace → the pod uid of each migrating job there."""
    by_owner: dict[str, set[str]] = field(default_factory=dict)
    """Controller uid → ``namespace/name`` of its pods with a migrating job."""
    pod_uids: list[str] = field(default_factory=list)
    """The pod uid of every migrating job."""
    pods: set[str] = field(default_factory=set)
    """uids and ``namespace/name`` of pods with a migrating job."""


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

    # -- the counting index ---------------------------------------------------------------------
    def counts(self, *, arbitrating: bool) -> _Counts:
        token = (self.cluster.jobs.version, self.cluster.sched.generation)
        cached = self._counts.get(arbitrating)
        if cached is not None and cached[0] == token:
            return cached[1]
        c = _Counts()
        by_uid = {}
        by_name = {}
        for job in self.cluster.jobs.migrating(arbitrating=arbitrating):
            ref = job.spec.pod_ref
            c.pod_uids.append(ref.uid)
            c.by_namespace.setdefault(ref.namespace, []).append(ref.uid)
            if ref.uid:
                by_uid[ref.uid] = job
            by_name[f"{ref.namespace}/{ref.name}"] = job
        if by_uid or by_name:
            for pod in self.cluster.sched.all_pods():
                if pod.uid in by_uid or pod.key in by_name:
                    c.pods.update((pod.uid, pod.key))
                    if pod.node_name:
                        c.by_node.setdefault(pod.node_name, set()).add(pod.uid)
                    owner = self.cluster.facts(pod).controller
                    if owner is not None:
                        c.by_owner.setdefault(owner.uid, set()).add(pod.key)
        self._counts[arbitrating] = (token, c)
        return c

    # -- single rules -----------------------------------------------------------------------------
    def existing_job(self, pod: PodInfo) -> str | None:
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
        _, replicas = pods_for_ref(self.cluster, owner, pod.namespace)
        max_migrating = max_unavailable(replicas, self.args.max_migrating_per_workload)
        max_unavail = max_unavailable(replicas, self.args.max_unavailable_per_workload)
        if self.args.skip_check_expected_replicas:
            return None
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
        count = len(c.by_node.get(pod.node_name, set()) - {pod.uid})
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
        count = sum(1 for uid in c.by_namespace.get(pod.namespace, ()) if uid != pod.uid)
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
        count = sum(1 for uid in c.pod_uids if uid != pod.uid)
        if count >= limit:
            return f"maxMigratingGlobally: {count} pod(s) are migrating, the limit is {limit}"
        return None

    def per_workload(self, pod: PodInfo, c: _Counts) -> str | None:
        owner = self.cluster.facts(pod).controller
        if owner is None:
            return None
        pods, replicas = pods_for_ref(self.cluster, owner, pod.namespace)
        if replicas == 0:
            return f"workload {owner.kind}/{owner.name} is unknown or has no replicas"
        max_migrating = max_unavailable(replicas, self.args.max_migrating_per_workload)
        max_unavail = max_unavailable(replicas, self.args.max_unavailable_per_workload)
        migrating = c.by_owner.get(owner.uid, set()) - {pod.key}
        if migrating and len(migrating) >= max_migrating:
            return (
                f"maxMigratingPerWorkload: workload {owner.kind}/{owner.name} has "
                f"{len(migrating)} migrating pod(s), the limit is {max_migrating}"
            )
        unavailable = {
            p.key
            for p in pods
            if self.cluster.facts(p).terminating or not self.cluster.facts(p).ready
        }
        unavailable |= migrating
        if len(unavailable) >= max_unavail:
            return (
                f"maxUnavailablePerWorkload: workload {owner.kind}/{owner.name} has "
                f"{len(unavailable)} unavailable pod(s), the limit is {max_unavail}"
            )
        return None

    def retryable(self, pod: PodInfo, *, arbitrating: bool) -> str | None:
        """The first reason a job for this pod must wait, or ``None``."""
        if has_evict_annotation(pod):
            return None
        c = self.counts(arbitrating=arbitrating)
        return (
            self.limited_object(pod)
            or self.per_node(pod, c)
            or self.per_namespace(pod, c)
            or self.per_workload(pod, c)
            or self.globally(pod, c)
        )

    def filter(self, pod: PodInfo) -> str | None:
        """``arbitratorImpl.Filter``: whether a descheduling plugin may ask to move the pod."""
        return (
            self.existing_job(pod)
            or self.reservation(pod)
            or self.non_retryable(pod)
            or self.retryable(pod, arbitrating=False)
        )

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
