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
   cookie manager (:mod:`koordlet.runtimehooks.effects`);
4. **node files**: the rows with ``Level.NODE`` (``TerwayQoS``) say what their folder must hold
   (:class:`~koordlet.runtimehooks.model.NodeFiles`); only when that differs from what was last
   written (or :data:`RESYNC` seconds later, which reads the files and rewrites only what
   differs) the files go to the executor's writer thread through
   :class:`~koordlet.executor.ownedfile.OwnedFileWriter`: replaced atomically, removed, audited,
   dry-run, recorded for ``koordlet reset``. A write that fails is tried again the next round.

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

**Each pod's results kept** (:class:`PodResult` in a
:class:`~koordlet.statesinformer.podmemo.PodMemo`): steps 2 and 3 run again for a pod only when
its inputs (:func:`_pod_key`) or the hooks' node inputs
(:class:`~koordlet.runtimehooks.table.NodeInputsHook`) or the capabilities changed, and only when
every hook of those levels declares its node inputs; a result with a failed hook is not kept. The
batch goes to the executor every round all the same: the kernel is compared as before. The
reconciler does not observe ``koordlet_runtime_hook_invoked_duration_milliseconds`` (upstream's
``RunHooks`` times hook points only) and counts a pod's bad input once, with its Event.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from apis.extension import ANNOTATION_EXTENDED_RESOURCE_SPEC, KubeQOS
from apis.records import frozen
from koordlet.errors import HostError
from koordlet.executor.batch import BatchResult, BatchWrite
from koordlet.executor.ownedfile import KIND as OWNED_FILE
from koordlet.executor.ownedfile import OwnedFileWriter
from koordlet.executor.sysctl import call_on_writer, executor_hooks
from koordlet.runtimehooks.framework import AUDIT_PREFIX, HookDispatcher, knob_values
from koordlet.runtimehooks.model import (
    NO_CHANGE,
    Change,
    ContainerRequest,
    HookPoint,
    HookWarning,
    NodeFiles,
    Outcome,
    PodMeta,
    PodRequest,
)
from koordlet.runtimehooks.table import (
    Hook,
    HookSpec,
    KubeQOSHook,
    Level,
    NodeFilesHook,
    NodeInputsHook,
)
from koordlet.statesinformer.model import PodInfo, WorkloadSnapshot
from koordlet.statesinformer.podmemo import PodMemo

if TYPE_CHECKING:
    from koordlet.executor.originals import Original
    from koordlet.executor.writer import CgroupWriter
    from koordlet.system.host import Host
    from koordlet.system.probe import Capabilities

logger = logging.getLogger(__name__)

NAME = "reconciler"
DEFAULT_INTERVAL = 10.0
"""Seconds between rounds: upstream's ``--runtime-hooks-reconcile-interval`` default."""
MODE = "reconciler"
"""The ``mode`` label of the hooks' metrics and audit entries."""
RESYNC = 60.0
"""Seconds after which unchanged node files are read again and rewritten if they differ (the
cgroup writer's ``cache_ttl``, Koordinator's ``--resource-force-update-seconds``)."""
NODE_STAGE = "node"
"""The ``stage`` label of ``koordlet_runtime_hook_bad_input_total`` for the node level."""


@dataclass(slots=True)
class RoundReport:
    """What one round did (``/debug/runtimehooks``)."""

    at: float = 0.0
    """``time.time()`` at its start."""
    pods: int = 0
    containers: int = 0
    reused: int = 0
    """Pods whose results were kept from the last round (their inputs were equal)."""
    writes: int = 0
    """Writes planned (the executor skips those already in place)."""
    changed: int = 0
    files_changed: int = 0
    """Node files written or removed (in dry run: that would have been)."""
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(slots=True)
class NodeFilesState:
    """What the reconciler knows of one ``Level.NODE`` hook's folder."""

    want: NodeFiles | None = None
    """What the hook asked for last."""
    applied: Mapping[str, str | None] | None = None
    """What was last written without an error; None: write at the next round."""
    at: float = 0.0
    """When (the reconciler's clock)."""
    written: dict[str, str] = field(default_factory=dict)
    """File → what the last write did (``written``, ``removed``, ``unchanged``, ``dry run``...)."""
    error: str = ""
    """The last write's failure, empty when it went through."""


@frozen
class PodResult:
    """What the pod and container levels ask for one pod, ready for the round's batch."""

    writes: tuple[BatchWrite[Any], ...]
    """The pod's and its containers' writes, the unsupported knobs left out."""
    threads: tuple[tuple[str, str, Change, str], ...] = ()
    """``(key, container cgroup, change, strategy)`` of each container with a core scheduling
    target, for the cookie manager."""
    warnings: tuple[tuple[str, HookWarning], ...] = ()
    """``(stage, warning)`` for the pod's malformed data."""
    failed: bool = False
    """A hook raised: the result is not kept (the pod is run again next round)."""


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = NAME
        self.interval = interval
        self._dispatcher = dispatcher
        self._workloads = workloads
        self._host = host
        self._executor = executor
        self._capabilities = capabilities
        self._clock = clock
        self.unsupported: dict[str, str] = {}
        """Knob -> why the probe found it unusable; left out of every round."""
        self.last = RoundReport()
        self.node_files: dict[str, NodeFilesState] = {}
        """The ``Level.NODE`` hooks' folders, by hook."""
        self._files = OwnedFileWriter(**executor_hooks(executor))
        self._warned: set[tuple[str, str, str]] = set()
        self._memo: PodMemo[PodResult] = PodMemo()
        """Each pod's :class:`PodResult` while its inputs hold (module docstring)."""
        self._memo_inputs: object = None
        """The node inputs and capabilities the kept results were computed with."""

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
                "reused": last.reused,
                "writes": last.writes,
                "changed": last.changed,
                "files_changed": last.files_changed,
                "errors": last.errors[:20],
                "seconds": round(last.seconds, 4),
            },
            "unsupported": dict(self.unsupported),
            "node_files": {
                name: {
                    **(dict(st.want.detail) if st.want is not None else {}),
                    "files": dict(st.written),
                    "write_error": st.error,
                }
                for name, st in self.node_files.items()
            },
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
        snapshot = self._workloads()
        memoize = self._memo_holds()
        for pod in snapshot.pods.values():
            report.pods += 1
            report.containers += len(pod.containers)
            planned = self._memo.get(pod.uid, _pod_key(pod)) if memoize else None
            if planned is None:
                planned = self._pod_result(pod)
                if memoize and not planned.failed:
                    self._memo.put(pod.uid, _kept_key(pod), planned)
            else:
                report.reused += 1
            writes += planned.writes
            if planned.threads:
                threads += [(pod, *t) for t in planned.threads]
            if planned.warnings:
                self._warn(PodMeta(pod.name, pod.namespace, pod.uid), planned.warnings)
        if memoize:
            self._memo.commit()
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
        for name, hook in self._dispatcher.by_level.get(Level.NODE, ()):
            if isinstance(hook, NodeFilesHook):
                await self._node_level(name, hook, snapshot.pods.values(), report)
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

    def _memo_holds(self) -> bool:
        """Whether this round may reuse kept results: every pod- and container-level hook says
        what it reads besides the request (:class:`~koordlet.runtimehooks.table.NodeInputsHook`);
        the kept results are forgotten when that, or the probed capabilities (which knobs are
        left out), changed since they were computed."""
        by_level = self._dispatcher.by_level
        inputs: list[object] = []
        for name, hook in (*by_level.get(Level.POD, ()), *by_level.get(Level.CONTAINER, ())):
            if not isinstance(hook, NodeInputsHook):
                self._memo.clear()
                return False
            try:
                inputs.append(hook.node_inputs())
            except Exception:
                logger.exception("runtime hook %s failed giving its node inputs", name)
                self._memo.clear()
                return False
        now = (tuple(inputs), self._capabilities())
        if now != self._memo_inputs:
            self._memo.clear()
            self._memo_inputs = now
        return True

    def _pod_result(self, pod: PodInfo) -> PodResult:
        """Run the pod's and its containers' hooks (module docstring, steps 2 and 3)."""
        meta = PodMeta(pod.name, pod.namespace, pod.uid)
        annotations = pod_annotations(pod)
        writes: list[BatchWrite[Any]] = []
        threads: list[tuple[str, str, Change, str]] = []
        warnings: list[tuple[str, HookWarning]] = []
        req: PodRequest | ContainerRequest = PodRequest(
            HookPoint.PRE_RUN_POD_SANDBOX,
            meta,
            labels=pod.labels,
            annotations=annotations,
            cgroup_parent=pod.cgroup_dir,
        )
        outcome = self._compute(req, Level.POD)
        failed = bool(outcome.failed)
        warnings += ((req.point.value, w) for w in outcome.warnings)
        self._plan(writes, pod.cgroup_dir, outcome.proposed, _strategy(outcome), "pod")
        for container in pod.containers:
            req = ContainerRequest(
                HookPoint.PRE_CREATE_CONTAINER,
                meta,
                container.name,
                container_id=container.id,
                pod_labels=pod.labels,
                pod_annotations=annotations,
                pod_cgroup_parent=pod.cgroup_dir,
            )
            outcome = self._compute(req, Level.CONTAINER)
            failed = failed or bool(outcome.failed)
            warnings += ((req.point.value, w) for w in outcome.warnings)
            strategy = _strategy(outcome)
            self._plan(writes, container.cgroup_dir, outcome.proposed, strategy, "container")
            if outcome.proposed.core_sched is not None:
                key = f"{pod.uid}/{container.id}"
                threads.append((key, container.cgroup_dir, outcome.proposed, strategy))
        return PodResult(tuple(writes), tuple(threads), tuple(warnings), failed)

    def _compute(self, req: PodRequest | ContainerRequest, level: Level) -> Outcome:
        hooks: Sequence[tuple[str, Hook]] = self._dispatcher.by_level.get(level, ())
        return self._dispatcher.compute(req, hooks, record=False)

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

    def _warn(self, pod: PodMeta, warnings: Iterable[tuple[str, HookWarning]]) -> None:
        """Record each warning once a pod, hook and reason (an Event), and count it then in
        ``koordlet_runtime_hook_bad_input_total`` under the point's stage."""
        for stage, warning in warnings:
            if self._warn_once(pod, warning):
                self._dispatcher.metrics.bad_input.labels(warning.hook, stage, warning.reason).inc()

    def _warn_once(self, pod: PodMeta, warning: HookWarning) -> bool:
        """Record ``warning`` on ``pod`` unless it was, for the same hook and reason; whether it
        was recorded now."""
        key = (pod.uid, warning.hook, warning.reason)
        if key in self._warned:
            return False
        if len(self._warned) > 10_000:  # pods come and go: forget, and warn again at most once
            self._warned.clear()
        self._warned.add(key)
        self._dispatcher.warn(pod, warning, MODE)
        return True

    # The node level ----------------------------------------------------------------------------

    async def _node_level(
        self, name: str, hook: NodeFilesHook, pods: Iterable[PodInfo], report: RoundReport
    ) -> None:
        """Keep one ``Level.NODE`` hook's files (module docstring, step 4)."""
        state = self.node_files.setdefault(name, NodeFilesState())
        try:
            want = hook.node_files(pods)
        except Exception:
            logger.exception("runtime hook %s failed computing its files", name)
            report.errors.append(f"{name}: failed computing its files")
            return
        for meta, warning in want.warnings:
            if self._warn_once(meta, warning):
                self._dispatcher.metrics.bad_input.labels(name, NODE_STAGE, warning.reason).inc()
        state.want = want
        if want.error:
            report.errors.append(f"{name}: {want.error}")
        if not want.files:
            return
        now = self._clock()
        if state.applied == want.files and now - state.at < RESYNC:
            return
        strategy = AUDIT_PREFIX + name
        job = functools.partial(self._write_files, name, want, strategy)
        done, errors = await call_on_writer(self._executor, job)
        state.written = done
        report.files_changed += sum(1 for v in done.values() if v not in ("unchanged", "absent"))
        if errors:
            error = "; ".join(errors)
            if error != state.error:
                logger.warning("runtime hook %s: %s (tried again next round)", name, error)
            report.errors += errors
            state.error, state.applied = error, None
        else:
            state.error, state.applied, state.at = "", dict(want.files), now

    def _write_files(
        self, name: str, want: NodeFiles, strategy: str
    ) -> tuple[dict[str, str], list[str]]:
        """On the writer thread: make ``want.folder`` hold ``want.files``."""
        done: dict[str, str] = {}
        errors: list[str] = []
        for filename, content in want.files.items():
            path = os.path.join(want.folder, filename)
            knob = f"{name}:{filename}"
            try:
                if content is None:
                    result = self._files.remove(path, knob=knob, strategy=strategy,
                                                reason=want.reason)  # fmt: skip
                else:
                    result = self._files.write(path, content, knob=knob, strategy=strategy,
                                               reason=want.reason)  # fmt: skip
            except HostError as err:
                done[filename] = "failed"
                errors.append(str(err))
                continue
            if result is None:
                done[filename] = "absent"
            elif result.dry_run:
                done[filename] = "dry run: would " + ("remove" if content is None else "write")
            elif result.changed:
                done[filename] = "removed" if content is None else "written"
            else:
                done[filename] = "unchanged"
        return done, errors


async def remove_disabled_files(
    table: Mapping[str, HookSpec],
    enabled: Callable[[str], bool],
    originals: Sequence[Original],
    executor: CgroupWriter,
) -> list[str]:
    """Remove the files that ``Level.NODE`` hooks now off by their gate wrote in an earlier run
    (the originals journal knows them as ``owned_file`` entries named ``<hook>:<file>``), through
    the executor: audited, dry-run. Upstream removes them while the hook runs with another
    policy; a gate switched off is the same intent. The paths handled (removed, or would be)."""
    off = {s.name for s in table.values() if Level.NODE in s.reconcile and not enabled(s.gate)}
    left = [
        e for e in originals if e.kind == OWNED_FILE and e.knob.partition(":")[0] in off
    ]  # fmt: skip
    if not left:
        return []
    files = OwnedFileWriter(**executor_hooks(executor))

    def remove() -> list[str]:
        out = []
        for e in left:
            hook = e.knob.partition(":")[0]
            reason = f"feature gate {table[hook].gate} is off: the file it wrote goes"
            try:
                result = files.remove(e.path, knob=e.knob, strategy=AUDIT_PREFIX + hook,
                                      reason=reason)  # fmt: skip
            except HostError as err:
                logger.warning("cannot remove %s: %s", e.path, err)
                continue
            if result is not None:
                out.append(e.path)
        return out

    return await call_on_writer(executor, remove)


def _strategy(outcome: Outcome) -> str:
    return AUDIT_PREFIX + (",".join(outcome.applied) or "reconciler")


def _pod_key(pod: PodInfo) -> tuple[object, ...]:
    """Everything of the pod its requests are built from (:meth:`HookReconciler._pod_result`):
    its name, namespace and UID (the UID is the memo's own key), cgroup, containers (name, ID,
    cgroup), labels, annotations and the spec's extended resources."""
    return (
        pod.name,
        pod.namespace,
        pod.cgroup_dir,
        pod.containers,
        pod.labels,
        pod.annotations,
        pod.extended_resources,
    )


def _kept_key(pod: PodInfo) -> tuple[object, ...]:
    """:func:`_pod_key` with its mappings copied: a source that changed one in place must not
    change the key kept with a result (the containers are frozen, the strings immutable)."""
    extended = {
        c: {kind: dict(q) for kind, q in r.items()} for c, r in pod.extended_resources.items()
    }
    return (
        pod.name,
        pod.namespace,
        pod.cgroup_dir,
        pod.containers,
        dict(pod.labels),
        dict(pod.annotations),
        extended,
    )
