"""The reconciler mode: the enabled hooks applied to the cgroups of the pods already running.

Upstream: ``pkg/koordlet/runtimehooks/reconciler/reconciler.go``. A pod created before the
koordlet started, or through a runtime without hooks (no NRI, no koord-runtime-proxy), never went
through a hook; nor does a value the kubelet or anyone else wrote back later. Every
``--runtime-hooks-reconcile-interval`` (10 s, upstream's flag and default) one round:

1. **Kubernetes QoS cgroups**: the hooks of rows with :attr:`~koordlet.runtimehooks.table.Level
   .KUBE_QOS` (``GroupIdentity``'s bvt) for the guaranteed (kubepods root), burstable and
   besteffort cgroups;
2. **pods**: for each pod of the inventory, the rows with ``Level.POD`` (``GroupIdentity``,
   ``CPUSetAllocator``, ``BatchResource``) compute a pod request as at
   ``PreRunPodSandbox`` and the result goes into the pod's cgroup;
3. **containers**: for each of its running containers, the rows with ``Level.CONTAINER``
   (``CPUSetAllocator``, ``BatchResource``, ``CoreSched``) as at
   ``PreCreateContainer``, into the container's cgroup; a core scheduling target goes to the
   cookie manager (:mod:`koordlet.runtimehooks.effects`).

The request carries the pod's labels and annotations; its extended resources (batch, mid) come
from the pod's spec where the source knows it (the API server, the kubelet), else from the
``node.koordinator.sh/extended-resource-spec`` annotation (upstream prefers the spec too). Every
write of a round goes to the executor as one leveled batch (parents grow before children), which
skips a value already in place, audits each change (``strategy: runtimehooks/<hooks>``) and
honours ``--dry-run``. A knob the probe found unsupported is left out and reported once
(``/debug/runtimehooks``); a pod whose own data is malformed gets one Warning Event per reason,
not one per round. The reconciler owns what its hooks write for running pods; the cgroup
reconcile QoS strategy leaves those knobs alone while the hook's gate is on (docs/runtimehooks.md,
"Who writes what").
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from apis.extension import ANNOTATION_EXTENDED_RESOURCE_SPEC, KubeQOS
from koordlet.executor.batch import BatchResult, BatchWrite
from koordlet.runtimehooks.framework import AUDIT_PREFIX, HookDispatcher, knob_values
from koordlet.runtimehooks.model import (
    NO_CHANGE,
    Change,
    ContainerRequest,
    HookPoint,
    Outcome,
    PodMeta,
    PodRequest,
)
from koordlet.runtimehooks.table import KubeQOSHook, Level
from koordlet.statesinformer.model import PodInfo, WorkloadSnapshot

if TYPE_CHECKING:
    from koordlet.executor.writer import CgroupWriter
    from koordlet.system.host import Host
    from koordlet.system.probe import Capabilities

logger = logging.getLogger(__name__)

NAME = "reconciler"
DEFAULT_INTERVAL = 10.0
"""Seconds between rounds: upstream's ``--runtime-hooks-reconcile-interval`` default."""
MODE = "reconciler"
"""The ``mode`` label of the hooks' metrics and audit entries."""


@dataclass(slots=True)
class RoundReport:
    """What one round did (``/debug/runtimehooks``)."""

    at: float = 0.0
    """``time.time()`` at its start."""
    pods: int = 0
    containers: int = 0
    writes: int = 0
    """Writes planned (the executor skips those already in place)."""
    changed: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def pod_annotations(pod: PodInfo) -> Mapping[str, str]:
    """The pod's annotations, with its spec's extended resources as the
    ``extended-resource-spec`` annotation when the source knows the spec (upstream's
    ``PodRequest.FromReconciler`` prefers the spec)."""
    if not pod.extended_resources:
        return pod.annotations
    spec = {"containers": {n: dict(r) for n, r in pod.extended_resources.items()}}
    return {**pod.annotations, ANNOTATION_EXTENDED_RESOURCE_SPEC: json.dumps(spec)}


class HookReconciler:
    """See the module docstring; :meth:`reconcile` is one round (the stage loops it)."""

    def __init__(
        self,
        dispatcher: HookDispatcher,
        *,
        workloads: Callable[[], WorkloadSnapshot],
        host: Callable[[], Host | None],
        executor: CgroupWriter,
        capabilities: Callable[[], Capabilities | None] = lambda: None,
        interval: float = DEFAULT_INTERVAL,
    ) -> None:
        self.name = NAME
        self.interval = interval
        self._dispatcher = dispatcher
        self._workloads = workloads
        self._host = host
        self._executor = executor
        self._capabilities = capabilities
        self.unsupported: dict[str, str] = {}
        """Knob -> why the probe found it unusable; left out of every round."""
        self.last = RoundReport()
        self._warned: set[tuple[str, str, str]] = set()

    def describe(self) -> dict[str, Any]:
        """JSON-ready: the interval, the levels' hooks, the last round."""
        last = self.last
        return {
            "interval_seconds": self.interval,
            "hooks": {lv.value: [n for n, _ in hs] for lv, hs in self._dispatcher.by_level.items()},
            "last_round": {
                "at": last.at,
                "pods": last.pods,
                "containers": last.containers,
                "writes": last.writes,
                "changed": last.changed,
                "errors": last.errors[:20],
                "seconds": round(last.seconds, 4),
            },
            "unsupported": dict(self.unsupported),
        }

    async def reconcile(self) -> RoundReport:
        """One round (module docstring)."""
        host = self._host()
        report = RoundReport(at=time.time())
        if host is None or not self._dispatcher.by_level:
            self.last = report
            return report
        t0 = time.perf_counter()
        writes: list[BatchWrite[Any]] = []
        for kube_qos in KubeQOS:
            change, names = self._kube_qos(kube_qos)
            strategy = AUDIT_PREFIX + ",".join(names)
            self._plan(writes, host.layout.qos_dir(kube_qos), change, strategy, "kubeqos")
        threads: list[tuple[PodInfo, str, str, Change, str]] = []
        for pod in self._workloads().pods.values():
            report.pods += 1
            outcome = self._pod(pod)
            self._plan(writes, pod.cgroup_dir, outcome.proposed, _strategy(outcome), "pod")
            for container in pod.containers:
                report.containers += 1
                outcome = self._container(pod, container.name, container.id)
                self._plan(
                    writes, container.cgroup_dir, outcome.proposed, _strategy(outcome), "container"
                )
                if outcome.proposed.core_sched is not None:
                    key = f"{pod.uid}/{container.id}"
                    threads.append(
                        (pod, key, container.cgroup_dir, outcome.proposed, _strategy(outcome))
                    )
        report.writes = len(writes)
        if writes:
            result: BatchResult = await asyncio.wrap_future(self._executor.submit_batch(writes))
            report.changed = result.changed
            report.errors = [f"{w.knob_name} {w.rel_dir}: {e}" for w, e in result.errors]
            for w, err in result.errors[:5]:
                logger.warning(
                    "runtime hooks reconciler: %s of %s: %s", w.knob_name, w.rel_dir, err
                )
        effects = self._dispatcher.effects
        if effects is not None:
            for pod, key, rel, change, strategy in threads:
                meta = PodMeta(pod.name, pod.namespace, pod.uid)
                await effects.apply(meta, key, rel, change, strategy=strategy)
        report.seconds = time.perf_counter() - t0
        self.last = report
        return report

    # One level ---------------------------------------------------------------------------------

    def _kube_qos(self, kube_qos: KubeQOS) -> tuple[Change, list[str]]:
        merged = NO_CHANGE
        names = []
        for name, hook in self._dispatcher.by_level.get(Level.KUBE_QOS, ()):
            if not isinstance(hook, KubeQOSHook):
                continue
            try:
                change = hook.kube_qos(kube_qos)
            except Exception:
                logger.exception("runtime hook %s failed for the %s QoS cgroup", name, kube_qos)
                continue
            if change:
                merged = merged.merged(Change(change.resources, reason=change.reason))
                names.append(name)
        return merged, names

    def _pod(self, pod: PodInfo) -> Outcome:
        req = PodRequest(
            HookPoint.PRE_RUN_POD_SANDBOX,
            PodMeta(pod.name, pod.namespace, pod.uid),
            labels=pod.labels,
            annotations=pod_annotations(pod),
            cgroup_parent=pod.cgroup_dir,
        )
        outcome = self._dispatcher.compute(req, self._dispatcher.by_level.get(Level.POD, []))
        self._warn(req.pod, outcome)
        return outcome

    def _container(self, pod: PodInfo, name: str, cid: str) -> Outcome:
        req = ContainerRequest(
            HookPoint.PRE_CREATE_CONTAINER,
            PodMeta(pod.name, pod.namespace, pod.uid),
            name,
            container_id=cid,
            pod_labels=pod.labels,
            pod_annotations=pod_annotations(pod),
            pod_cgroup_parent=pod.cgroup_dir,
        )
        hooks = self._dispatcher.by_level.get(Level.CONTAINER, [])
        outcome = self._dispatcher.compute(req, hooks)
        self._warn(req.pod, outcome)
        return outcome

    def _plan(
        self, writes: list[BatchWrite[Any]], rel: str, change: Change, strategy: str, level: str
    ) -> None:
        if not change.resources:
            return
        for knob, value in knob_values(change.resources):
            if not self._usable(knob.name):
                continue
            why = f"{level}: {change.reason}" if change.reason else level
            writes.append(BatchWrite(knob, rel, value, strategy, why))

    def _usable(self, knob: str) -> bool:
        if knob in self.unsupported:
            return False
        caps = self._capabilities()
        if caps is not None and knob in caps and not caps.supported(knob):
            self.unsupported[knob] = caps[knob].reason
            logger.info("runtime hooks reconciler: %s unsupported, left out: %s", knob,
                        caps[knob].reason)  # fmt: skip
            return False
        return True

    def _warn(self, pod: PodMeta, outcome: Outcome) -> None:
        for warning in outcome.warnings:
            key = (pod.uid, warning.hook, warning.reason)
            if key in self._warned:
                continue
            self._warned.add(key)
            self._dispatcher.warn(pod, warning, MODE)
        if len(self._warned) > 10_000:  # pods come and go: forget, and warn again at most once
            self._warned.clear()


def _strategy(outcome: Outcome) -> str:
    return AUDIT_PREFIX + (",".join(outcome.applied) or "reconciler")
