"""``oom_score_adj`` hot update (Koordinator HEAD's ``oomscoreadj`` hook reconciler, gate
``OOMScoreAdj``): the processes of a pod's containers get the ``oom_score_adj`` its annotations
ask for, every round, without restarting them.

For each pod and each of its containers (the sandbox is not one: the runtime owns its value),
the target is the container's entry in ``koordinator.sh/oom-score-adj-spec`` (JSON, container
name → value), else ``koordinator.sh/oom-score-adj``, else nothing is done
(``apis.pod_overrides.oom_score_adj_for``). Every process of the container's cgroup whose
``/proc/<pid>/oom_score_adj`` differs is written, through the executor's writer thread
(:class:`~koordlet.executor.procfiles.ProcessFileWriter`: audited, dry-run); a process that
exits meanwhile is not an error. Removing the annotation leaves the values as they are, as
upstream does. A malformed value (not an integer, outside -1000..1000, a spec that is not a JSON
object of integers) leaves the pod alone and is reported once (``ctx.pod_warnings``).

Where the start-up probe found ``/proc/<pid>/oom_score_adj`` unusable (``oom_score_adj`` in
``/debug/capabilities``) the round does nothing and says why. At container creation the runtime
hook side sets the CRI ``oom_score_adj`` from the same annotations (docs/qos-overrides.md).
"""

from __future__ import annotations

import logging
from typing import Any

from apis.pod_overrides import (
    ANNOTATION_OOM_SCORE_ADJ,
    ANNOTATION_OOM_SCORE_ADJ_SPEC,
    AnnotationError,
    oom_score_adj_for,
)
from apis.records import frozen
from koordlet.executor.procfiles import OOM_SCORE_ADJ, ProcessFileWriter, ProcessResult
from koordlet.executor.sysctl import call_on_writer, executor_hooks
from koordlet.qos.framework import StrategyContext, StrategyReport
from koordlet.statesinformer.model import PodInfo
from koordlet.system.cgroups import CgroupLayout

logger = logging.getLogger(__name__)

NAME = "oomscoreadj"
"""Table name."""
FEATURE_GATE = "OOMScoreAdj"
"""Koordinator's gate (HEAD, PR #3139)."""
DEFAULT_INTERVAL = 1.0
"""Seconds between rounds (``--reconcile-interval-seconds``)."""


@frozen
class Job:
    """One container's processes to set."""

    pod: str
    """``namespace/name``."""
    container: str
    cgroup_dir: str
    value: int


def plan(pods: list[PodInfo], report_error: Any) -> list[Job]:
    """The containers with a target; ``report_error(pod, annotation, error)`` for a malformed
    annotation (the pod is then left alone)."""
    jobs: list[Job] = []
    for pod in pods:
        ann = pod.annotations
        if not ann.get(ANNOTATION_OOM_SCORE_ADJ) and not ann.get(ANNOTATION_OOM_SCORE_ADJ_SPEC):
            continue
        try:
            targets = [(c, oom_score_adj_for(ann, c.name)) for c in pod.containers]
        except AnnotationError as err:
            report_error(pod, err.annotation, err.why)
            continue
        report_error(pod, None, "")
        for c, value in targets:
            if value is not None:
                jobs.append(Job(f"{pod.namespace}/{pod.name}", c.name, c.cgroup_dir, value))
    return jobs


class OOMScoreAdj:
    """See the module docstring."""

    def __init__(self, ctx: StrategyContext, *, interval: float = DEFAULT_INTERVAL) -> None:
        self.name = NAME
        self.interval = interval
        self._ctx = ctx
        self._writer = ProcessFileWriter(ctx.host().paths, **executor_hooks(ctx.executor))

    def _report_error(self, pod: PodInfo, annotation: str | None, why: str) -> None:
        warnings = self._ctx.pod_warnings
        if annotation is None:
            warnings.valid(pod, ANNOTATION_OOM_SCORE_ADJ)
            warnings.valid(pod, ANNOTATION_OOM_SCORE_ADJ_SPEC)
        else:
            warnings.report(NAME, pod, annotation, why)

    async def reconcile(self) -> None:
        ctx = self._ctx
        caps = ctx.capabilities
        cap = OOM_SCORE_ADJ.name
        if caps is not None and cap in caps and not caps.supported(cap):
            ctx.report(NAME, StrategyReport({}, f"unsupported: {caps[cap].reason}"))
            return
        snapshot = ctx.workloads()
        ctx.pod_warnings.prune(snapshot.pods.keys())
        jobs = plan(list(snapshot.pods.values()), self._report_error)
        if not jobs:
            ctx.report(NAME, StrategyReport({"containers": 0}, "nothing to do"))
            return
        layout = ctx.host().layout
        results = await call_on_writer(ctx.executor, lambda: self._apply(jobs, layout))
        detail: dict[str, Any] = {}
        totals = {"updated": 0, "unchanged": 0, "gone": 0, "failed": 0}
        for job, res in zip(jobs, results, strict=True):
            totals["updated"] += res.updated
            totals["unchanged"] += res.unchanged
            totals["gone"] += res.gone
            totals["failed"] += len(res.failed)
            detail[f"{job.pod}/{job.container}"] = {
                "value": job.value,
                "updated": res.updated,
                "unchanged": res.unchanged,
                **({"failed": res.failed[:5]} if res.failed else {}),
                **({"cgroup_gone": True} if res.cgroup_gone else {}),
            }
        result = ", ".join(f"{n} {k}" for k, n in totals.items() if n)
        if self._writer.is_dry_run(NAME) and totals["updated"]:
            result = "dry run: " + result
        ctx.report(
            NAME,
            StrategyReport({"containers": len(jobs)}, "set oom_score_adj", result, detail=detail),
        )

    def _apply(self, jobs: list[Job], layout: CgroupLayout) -> list[ProcessResult]:
        """On the writer thread."""
        out = []
        for job in jobs:
            reason = f"pod {job.pod} container {job.container}: oom_score_adj {job.value}"
            out.append(
                self._writer.apply(
                    OOM_SCORE_ADJ, layout, job.cgroup_dir, job.value, strategy=NAME, reason=reason
                )
            )
        return out


def build(ctx: StrategyContext, interval: float) -> OOMScoreAdj:
    """Table factory."""
    return OOMScoreAdj(ctx, interval=interval)
