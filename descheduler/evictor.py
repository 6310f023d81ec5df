"""The default evictor filter: which pods may be moved at all, each refusal with its reason.

Upstream's ``EvictorFilter.Filter`` (``pkg/descheduler/evictions/evictions.go``), in its order:
a DaemonSet pod, a mirror pod (``kubernetes.io/config.mirror``), a static pod
(``kubernetes.io/config.source`` other than ``api``), a terminating pod; then the configured
constraints: a pod without ownerReferences (unless ``evictAllBarePods``, or
``evictFailedBarePods`` and the pod Failed), system-critical priority (>= 2,000,000,000, unless
``evictSystemCriticalPods``), priority at or above ``priorityThreshold``, local storage
(``emptyDir``/``hostPath``, unless ``evictLocalStoragePods``), a PVC with ``ignorePvcPods``, no
other node it fits (``nodeFit``), labels outside ``labelSelector``. Every failing check is
reported; a pod annotated ``descheduler.alpha.kubernetes.io/evict`` passes regardless.

One check is ours, because the Eviction API would refuse the move later anyway: the pod's
PodDisruptionBudget. A pod matched by more than one budget cannot be evicted (the API server
answers 500); a pod whose budget's ``status.disruptionsAllowed``, less the migrations already
decided for pods it covers and not evicted yet, is not positive would get a 429.
"""

from __future__ import annotations

from collections.abc import Callable

from apis.descheduler_keys import ANNOTATION_EVICT, SYSTEM_CRITICAL_PRIORITY
from descheduler.cluster import Cluster, DisruptionBudget
from descheduler.migration.args import MigrationControllerArgs
from scheduler_plugins.snapshot import PodInfo

FitsElsewhere = Callable[[PodInfo], bool]
"""Whether the pod fits some node other than its own (the evictor's ``nodeFit``)."""


def has_evict_annotation(pod: PodInfo) -> bool:
    """``HaveEvictAnnotation``."""
    return ANNOTATION_EVICT in pod.annotations


class EvictorFilter:
    """See the module docstring."""

    def __init__(
        self,
        cluster: Cluster,
        args: MigrationControllerArgs,
        *,
        fits_elsewhere: FitsElsewhere | None = None,
        priority_threshold: int | None = None,
    ) -> None:
        self.cluster = cluster
        self.args = args
        self.fits_elsewhere = fits_elsewhere
        self.priority_threshold = priority_threshold
        """Resolved ``priorityThreshold`` (its value, or its PriorityClass's)."""
        self._planned: tuple[int, int, dict[str, set[str]]] | None = None

    def reasons(self, pod: PodInfo) -> list[str]:
        """Every check the pod fails (empty: evictable)."""
        f = self.cluster.facts(pod)
        a = self.args
        out: list[str] = []
        if f.daemonset:
            out.append("pod is a DaemonSet pod")
        if f.mirror:
            out.append("pod is a mirror pod")
        if f.static:
            out.append("pod is a static pod")
        if f.terminating:
            out.append("pod is terminating")
        if not a.evict_all_bare_pods and not f.owners:
            if not a.evict_failed_bare_pods:
                out.append("pod does not have any ownerRefs")
            elif f.phase != "Failed":
                out.append("pod does not have any ownerRefs and is not in failed phase")
        if not a.evict_system_critical_pods:
            if f.has_priority and f.priority >= SYSTEM_CRITICAL_PRIORITY:
                out.append("pod has system critical priority")
            if (
                self.priority_threshold is not None
                and f.has_priority
                and f.priority >= self.priority_threshold
            ):
                out.append("pod has higher priority than specified priority class threshold")
        if not a.evict_local_storage_pods and f.local_storage:
            out.append(
                "pod has local storage and descheduler is not configured with evictLocalStoragePods"
            )
        if a.ignore_pvc_pods and f.pvc:
            out.append("pod has a PVC and descheduler is configured to ignore PVC pods")
        if a.node_fit and self.fits_elsewhere is not None and not self.fits_elsewhere(pod):
            out.append(
                "pod does not fit on any other node because of nodeSelector(s), Taint(s), or "
                "nodes marked as unschedulable"
            )
        if a.label_selector is not None and not a.label_selector.matches(pod.labels):
            out.append("pod labels do not match the labelSelector filter in the policy parameter")
        pdb = self.budget_reason(pod)
        if pdb:
            out.append(pdb)
        if out and has_evict_annotation(pod):
            return []
        return out

    def filter(self, pod: PodInfo) -> str | None:
        """The reasons joined (``errors.NewAggregate`` style), or ``None`` when evictable."""
        reasons = self.reasons(pod)
        return ", ".join(reasons) if reasons else None

    # -- disruption budgets -----------------------------------------------------------------------
    def budgets_of(self, pod: PodInfo) -> list[DisruptionBudget]:
        return [
            b
            for b in self.cluster.pdbs.values()
            if b.namespace == pod.namespace
            and b.selector is not None
            and b.selector.matches(pod.labels)
        ]

    def _planned_by_budget(self) -> dict[str, set[str]]:
        """Pods with a migrating job that still exist, per budget covering them (their eviction
        is still to come and will take one of the budget's disruptions)."""
        token = (self.cluster.jobs.version, self.cluster.sched.generation)
        if self._planned is not None and self._planned[:2] == token:
            return self._planned[2]
        planned: dict[str, set[str]] = {}
        if self.cluster.pdbs:
            for job in self.cluster.jobs.migrating():
                ref = job.spec.pod_ref
                target = self.cluster.pod(ref.namespace, ref.name)
                if target is None:
                    continue
                for b in self.budgets_of(target):
                    planned.setdefault(b.key, set()).add(target.key)
        self._planned = (token[0], token[1], planned)
        return planned

    def budget_reason(self, pod: PodInfo) -> str:
        if not self.cluster.pdbs:
            return ""
        budgets = self.budgets_of(pod)
        if not budgets:
            return ""
        if len(budgets) > 1:
            names = ", ".join(b.key for b in budgets)
            return f"pod is covered by more than one PodDisruptionBudget ({names})"
        b = budgets[0]
        planned = len(self._planned_by_budget().get(b.key, set()) - {pod.key})
        if b.disruptions_allowed - planned <= 0:
            return (
                f"pod's PodDisruptionBudget {b.key} allows no disruption "
                f"(disruptionsAllowed {b.disruptions_allowed}, {planned} migration(s) pending)"
            )
        return ""
