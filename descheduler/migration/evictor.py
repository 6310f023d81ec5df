"""The MigrationController as the descheduling framework's evictor: a move is a new job.

``Reconciler.Evict`` and ``CreatePodMigrationJob`` (``controllers/migration/evict.go``): a pod
that passes the controller's filter (``filters.py``) and its object limiters becomes a
PodMigrationJob: named by a fresh UUID, annotated ``koordinator.sh/evict-reason`` and
``koordinator.sh/evict-trigger``, ``spec.podRef`` the pod (namespace, name, uid), ``mode``
``defaultJobMode``, ``ttl`` ``defaultJobTTL``, ``deleteOptions`` the plugin's or
``defaultDeleteOptions``, phase ``Pending``. The job is counted in the store at once (the next
pod's limits see it) and handed to whoever creates it (the daemon, through the API; ``explain``,
nobody). With ``dryRun`` the controller accepts every move and makes none.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from apis.descheduler_keys import ANNOTATION_EVICT_REASON, ANNOTATION_EVICT_TRIGGER
from apis.duration import format_duration
from apis.podmigrationjob import API_VERSION, KIND, PHASE_PENDING, PodMigrationJob, parse_job
from descheduler.cluster import Cluster
from descheduler.framework import EvictOptions, RoundLimits
from descheduler.migration.args import MigrationControllerArgs
from descheduler.migration.filters import MigrationFilter
from scheduler_plugins.snapshot import PodInfo

logger = logging.getLogger(__name__)


def job_object(
    pod: PodInfo, options: EvictOptions, args: MigrationControllerArgs, name: str, now: str = ""
) -> dict[str, Any]:
    """The PodMigrationJob ``CreatePodMigrationJob`` creates."""
    spec: dict[str, Any] = {
        "podRef": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid},
        "mode": args.default_job_mode,
    }
    if args.default_job_ttl_s:
        spec["ttl"] = format_duration(args.default_job_ttl_s)
    delete_options = options.delete_options or args.default_delete_options
    if delete_options is not None:
        spec["deleteOptions"] = dict(delete_options)
    meta: dict[str, Any] = {
        "name": name,
        "annotations": {
            ANNOTATION_EVICT_REASON: options.reason,
            ANNOTATION_EVICT_TRIGGER: options.plugin,
        },
    }
    if now:
        meta["creationTimestamp"] = now
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": meta,
        "spec": spec,
        "status": {"phase": PHASE_PENDING},
    }


class MigrationEvictor:
    """See the module docstring."""

    def __init__(
        self,
        cluster: Cluster,
        args: MigrationControllerArgs,
        mfilter: MigrationFilter,
        *,
        limits: RoundLimits | None = None,
        new_name: Callable[[], str] = lambda: str(uuid.uuid4()),
        now: Callable[[], str] = lambda: "",
    ) -> None:
        self.cluster = cluster
        self.args = args
        self.filter_ = mfilter
        self.limits = limits or RoundLimits()
        self.new_name = new_name
        self.now = now
        self.created: list[tuple[PodMigrationJob, dict[str, Any]]] = []
        """Jobs decided (and assumed in the store) for the caller to create."""

    def filter(self, pod: PodInfo) -> str | None:
        return self.filter_.filter(pod)

    def evict(self, pod: PodInfo, options: EvictOptions) -> str | None:
        refused = self.limits.check(pod)
        if refused is not None:
            return refused
        if self.args.dry_run:
            logger.info(
                "%s would migrate %s (MigrationController dryRun): %s",
                options.plugin,
                pod.key,
                options.reason,
            )
            self.limits.count(pod)
            return None
        refused = self.filter_.filter(pod)
        if refused is not None:
            return refused
        if self.filter_.exceeds_object_limiter(pod):
            return "the pod's workload or namespace exceeds its object limiter"
        obj = job_object(pod, options, self.args, self.new_name(), self.now())
        job = parse_job(obj)
        self.cluster.jobs.assume(job)
        self.created.append((job, obj))
        self.limits.count(pod)
        return None
