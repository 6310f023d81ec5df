"""The hook dispatcher: runs the enabled hooks of a point, merges their changes, fails open.

Every mode calls :meth:`HookDispatcher.pod` or :meth:`HookDispatcher.container` with a request
of the model (:mod:`koordlet.runtimehooks.model`) and gets an
:class:`~koordlet.runtimehooks.model.Outcome` back; its ``change`` is what the mode applies. The
rules, the same for every mode (docs/runtimehooks.md):

- hooks run in table order; a later hook wins on a field both set;
- a hook that raises is left out (fail open), timed and counted as ``failed`` in
  ``koordlet_runtime_hook_invoked_duration_milliseconds`` and audited; the others still apply
  (the family times hook calls at hook points only, as upstream's: not the reconciler's);
- a hook that raises :class:`~koordlet.runtimehooks.errors.BadPodInput` leaves the pod unchanged
  by it (or applies the error's ``fallback``), records a Warning Event on the pod and counts
  ``koordlet_runtime_hook_bad_input_total``;
- the whole request, pod-level cgroup writes included, is bounded by ``timeout``; past it, or on
  any error of the framework itself, the request goes on unchanged and
  ``koordlet_runtime_hook_fail_open_total`` counts why;
- pod-level resources (``PreRunPodSandbox``) are written to the pod's cgroup through the
  executor (the runtime has no pod-level resources to adjust), which audits them and honours
  ``--dry-run``; container-level changes are applied by the runtime, and each changed value is
  audited here as a ``decision`` (``dry_run`` when the change was withheld);
- with ``dry_run`` the outcome's ``change`` is empty: the request goes on as it came.
- a container's change keeps only what a runtime applies at creation: the koordlet-written
  resources (``cpu.bvt_warp_ns``, ``cpu.idle``, ``net_cls.classid``) are left to the pod's cgroup
  and the reconciler; at ``PostStartContainer`` a resctrl group or core scheduling target goes to
  the :class:`~koordlet.runtimehooks.effects.ContainerEffects`.

The reconciler (:mod:`koordlet.runtimehooks.reconciler`) runs the same hooks through
:meth:`HookDispatcher.compute` with the hooks of a cgroup level (:attr:`HookDispatcher.by_level`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from apis.records import frozen
from koordlet.errors import HostError
from koordlet.runtimehooks import cgroupparent
from koordlet.runtimehooks.errors import BadPodInput
from koordlet.runtimehooks.events import EventSink, LogEventSink
from koordlet.runtimehooks.metrics import HookMetrics
from koordlet.runtimehooks.model import (
    KOORDLET_FIELDS,
    NO_CHANGE,
    Change,
    ContainerRequest,
    HookPoint,
    HookWarning,
    Outcome,
    PodMeta,
    PodRequest,
    Resources,
)
from koordlet.runtimehooks.table import Hook, HookContext, HookSpec, Level
from koordlet.system.knobs import (
    CPU_BVT_WARP_NS,
    CPU_CFS_PERIOD,
    CPU_CFS_QUOTA,
    CPU_IDLE,
    CPU_SHARES,
    CPUSET_CPUS,
    CPUSET_MEMS,
    MEMORY_LIMIT,
    NET_CLS_CLASSID,
    Knob,
)

if TYPE_CHECKING:
    from koordlet.executor.audit import AuditLog
    from koordlet.executor.writer import CgroupWriter, WriteResult
    from koordlet.runtimehooks.effects import ContainerEffects

logger = logging.getLogger(__name__)

AUDIT_PREFIX = "runtimehooks/"
"""Audit entries' ``strategy`` is this plus the hook names (``runtimehooks/BatchResource``)."""

_KNOBS: dict[str, Knob[Any]] = {
    "cpu_shares": CPU_SHARES,
    "cfs_period": CPU_CFS_PERIOD,
    "cfs_quota": CPU_CFS_QUOTA,
    "cpuset_cpus": CPUSET_CPUS,
    "cpuset_mems": CPUSET_MEMS,
    "memory_limit": MEMORY_LIMIT,
    "cpu_bvt_warp_ns": CPU_BVT_WARP_NS,
    "cpu_idle": CPU_IDLE,
    "net_cls_classid": NET_CLS_CLASSID,
}
"""Resources field -> knob (:mod:`koordlet.system.knobs`), in write order (the period before
the quota that depends on it, cpu.shares before cpu.idle, which makes the kernel refuse it)."""


@frozen
class DispatcherOptions:
    """How the dispatcher behaves; built from the koordlet's flags."""

    timeout: float = 1.0
    """Seconds one request (hooks and pod-level writes) may take before it goes on unchanged;
    ``--runtime-hooks-timeout``, ours."""
    dry_run: bool = False
    """Compute and audit, change nothing (``--dry-run``)."""
    disabled_points: frozenset[HookPoint] = frozenset()
    """Points where no hook runs; Koordinator's ``--runtime-hooks-disable-stages``."""


class HookDispatcher:
    """The enabled hooks of a table, by point; see the module docstring for the rules."""

    def __init__(
        self,
        table: Mapping[str, HookSpec],
        ctx: HookContext,
        *,
        enabled: Callable[[str], bool],
        metrics: HookMetrics,
        options: DispatcherOptions = DispatcherOptions(),
        writer: CgroupWriter | None = None,
        audit: AuditLog | None = None,
        events: EventSink | None = None,
        effects: ContainerEffects | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.options = options
        self.metrics = metrics
        self.effects = effects
        """Applies resctrl groups and core scheduling to started containers; None: not done."""
        self._writer = writer
        self._audit = audit
        self._events: EventSink = events if events is not None else LogEventSink()
        self._clock = clock
        self._by_point: dict[HookPoint, list[tuple[str, Hook]]] = {}
        self.by_level: dict[Level, list[tuple[str, Hook]]] = {}
        """The enabled hooks the reconciler applies, by cgroup level, in table order."""
        self.enabled_hooks: tuple[str, ...] = ()
        names = []
        for spec in table.values():
            if not enabled(spec.gate):
                logger.info("runtime hook %s disabled (feature gate %s)", spec.name, spec.gate)
                continue
            hook = spec.build(ctx)
            names.append(spec.name)
            for level in sorted(spec.reconcile):
                self.by_level.setdefault(level, []).append((spec.name, hook))
            for point in sorted(spec.points - options.disabled_points):
                self._by_point.setdefault(point, []).append((spec.name, hook))
        self.enabled_hooks = tuple(names)

    def points(self) -> tuple[HookPoint, ...]:
        """The points where at least one hook runs (what the hook server registers)."""
        return tuple(p for p in HookPoint if self._by_point.get(p))

    def describe(self) -> dict[str, Any]:
        """JSON-ready: hooks by point, and the options."""
        return {
            "hooks": {p.value: [n for n, _ in hooks] for p, hooks in self._by_point.items()},
            "timeout_seconds": self.options.timeout,
            "dry_run": self.options.dry_run,
            "disabled_points": sorted(p.value for p in self.options.disabled_points),
        }

    # Running ----------------------------------------------------------------------------------

    def compute(
        self,
        req: PodRequest | ContainerRequest,
        hooks: Sequence[tuple[str, Hook]] | None = None,
        *,
        record: bool = True,
    ) -> Outcome:
        """Run the point's hooks (or ``hooks``: the reconciler's of a level) on ``req`` and
        merge their changes (no I/O but the metrics). ``record``: time each hook call into
        ``koordlet_runtime_hook_invoked_duration_milliseconds`` and count bad input; the
        reconciler passes False (upstream observes the family at hook points only; the
        reconciler counts a pod's bad input once, with its Event)."""
        merged = NO_CHANGE
        applied: list[str] = []
        failed: list[str] = []
        warnings: list[HookWarning] = []
        point = req.point
        clock = self._clock
        for name, hook in self._by_point.get(point, ()) if hooks is None else hooks:
            t0 = clock() if record else 0.0
            error = False
            change: Change | None = None
            try:
                change = hook.pod(req) if isinstance(req, PodRequest) else hook.container(req)
            except BadPodInput as err:
                warnings.append(HookWarning(name, err.reason, str(err)))
                if record:
                    self.metrics.bad_input.labels(name, point.value, err.reason).inc()
                change = err.fallback
            except Exception:
                error = True
                failed.append(name)
                logger.exception("runtime hook %s failed at %s for %s", name, point, req.pod)
            if record:
                self.metrics.observe(name, point.value, clock() - t0, failed=error)
            if change:
                merged = merged.merged(change)
                applied.append(name)
        dry = self.options.dry_run
        return Outcome(
            change=NO_CHANGE if dry else merged,
            proposed=merged,
            applied=tuple(applied),
            failed=tuple(failed),
            warnings=tuple(warnings),
            dry_run=dry,
        )

    async def pod(self, req: PodRequest, *, mode: str) -> Outcome:
        """Handle a pod sandbox event; never raises (fails open)."""
        return await self._guarded(req, mode, self._pod)

    async def container(self, req: ContainerRequest, *, mode: str) -> Outcome:
        """Handle a container event; never raises (fails open)."""
        return await self._guarded(req, mode, self._container)

    async def _guarded(self, req: Any, mode: str, step: Callable[..., Any]) -> Outcome:
        point = req.point.value
        self.metrics.requests.labels(mode, point).inc()
        try:
            async with asyncio.timeout(self.options.timeout):
                outcome: Outcome = await step(req, mode)
                return outcome
        except TimeoutError:
            self._fail_open(req, mode, "timeout", f"hooks took over {self.options.timeout:g}s")
        except Exception as err:
            logger.exception("runtime hooks at %s for %s failed; unchanged", point, req.pod)
            self._fail_open(req, mode, "error", f"{type(err).__name__}: {err}")
        return Outcome(change=NO_CHANGE, proposed=NO_CHANGE, failed=("framework",))

    async def _pod(self, req: PodRequest, mode: str) -> Outcome:
        outcome = self.compute(req)
        self._report(req.pod, req.point, outcome, mode)
        self._audit_failures(req.pod, req.point, outcome, mode)
        resources = outcome.proposed.resources
        if req.point is HookPoint.PRE_RUN_POD_SANDBOX and resources:
            await self._write_pod(req, outcome, mode)
        return outcome

    async def _container(self, req: ContainerRequest, mode: str) -> Outcome:
        outcome = _runtime_only(self.compute(req), req)
        self._report(req.pod, req.point, outcome, mode)
        self._audit_failures(req.pod, req.point, outcome, mode)
        proposed = outcome.proposed
        if proposed.resources:
            where = f"{req.pod_cgroup_parent.rstrip('/')}/{req.container_id or req.container_name}"
            self._audit_container(req, outcome, mode, where)
        threads = proposed.resctrl_group is not None or proposed.core_sched is not None
        if threads and req.point is HookPoint.POST_START_CONTAINER and self.effects is not None:
            strategy = AUDIT_PREFIX + ",".join(outcome.applied)
            await self.effects.for_request(req, proposed, strategy=strategy)
        return outcome

    # Side effects -----------------------------------------------------------------------------

    async def _write_pod(self, req: PodRequest, outcome: Outcome, mode: str) -> None:
        strategy = AUDIT_PREFIX + ",".join(outcome.applied)
        try:
            rel = cgroupparent.rel_dir(req.cgroup_parent)
        except BadPodInput as err:
            self._warn(req.pod, HookWarning("framework", err.reason, str(err)), req.point, mode)
            return
        values = knob_values(outcome.proposed.resources)
        writer = self._writer
        if outcome.dry_run or writer is None:
            for knob, value in values:
                self._record(
                    strategy,
                    outcome.proposed.reason,
                    path=rel,
                    knob=knob.name,
                    new=_text(value),
                    dry_run=True,
                    detail={"mode": mode, "stage": req.point.value},
                )
            return
        reason = outcome.proposed.reason
        futures = [
            (knob, writer.submit(knob, rel, value, strategy=strategy, reason=reason))
            for knob, value in values
        ]
        for knob, future in futures:
            try:
                result: WriteResult = await asyncio.wrap_future(future)
            except HostError as err:
                self.metrics.fail_open.labels(mode, req.point.value, "write_error").inc()
                logger.warning("pod %s: %s of %s not written: %s", req.pod, knob.name, rel, err)
                self._record(
                    strategy,
                    f"write failed: {err}",
                    path=rel,
                    knob=knob.name,
                    detail={"mode": mode, "stage": req.point.value, "error": str(err)},
                )
            else:
                logger.debug("pod %s: %s %s -> %s", req.pod, knob.name, result.old, result.new)

    def _audit_container(
        self, req: ContainerRequest, outcome: Outcome, mode: str, where: str
    ) -> None:
        strategy = AUDIT_PREFIX + ",".join(outcome.applied)
        before = req.resources.set_fields()
        for attr, value in outcome.proposed.resources.set_fields().items():
            if before.get(attr) == value:
                continue
            self._record(
                strategy,
                outcome.proposed.reason,
                path=where,
                knob=_KNOBS[attr].name if attr in _KNOBS else attr,  # oom_score_adj: no knob
                old=_text(before.get(attr)),
                new=_text(value),
                dry_run=outcome.dry_run,
                detail={"mode": mode, "stage": req.point.value, "applied_by": "runtime"},
            )

    def _report(self, pod: PodMeta, point: HookPoint, outcome: Outcome, mode: str) -> None:
        for warning in outcome.warnings:
            self._warn(pod, warning, point, mode)

    def warn(self, pod: PodMeta, warning: HookWarning, mode: str) -> None:
        """Record ``warning`` on the pod (an Event, the audit log): the reconciler's way."""
        self._warn(pod, warning, None, mode)

    def _warn(self, pod: PodMeta, warning: HookWarning, point: HookPoint | None, mode: str) -> None:
        try:
            self._events.warn(pod, warning.reason, warning.message)
        except Exception:  # a broken event sink must not fail the request
            logger.exception("event sink failed for pod %s", pod)
        self._record(
            AUDIT_PREFIX + warning.hook,
            f"{warning.reason}: {warning.message}",
            path=str(pod),
            detail={"mode": mode, "stage": point.value if point else "", "left": "unchanged"},
        )

    def _audit_failures(self, pod: PodMeta, point: HookPoint, outcome: Outcome, mode: str) -> None:
        for name in outcome.failed:
            self._record(
                AUDIT_PREFIX + name,
                "hook failed; left out (fail open)",
                path=str(pod),
                detail={"mode": mode, "stage": point.value},
            )

    def _fail_open(self, req: Any, mode: str, reason: str, message: str) -> None:
        point = req.point.value
        self.metrics.fail_open.labels(mode, point, reason).inc()
        logger.warning("runtime hooks at %s for %s: %s; unchanged", point, req.pod, message)
        self._record(
            AUDIT_PREFIX + "framework",
            f"fail open ({reason}): {message}",
            path=str(req.pod),
            detail={"mode": mode, "stage": point},
        )

    def _record(
        self,
        strategy: str,
        reason: str,
        *,
        path: str,
        detail: Mapping[str, Any],
        knob: str = "",
        old: str = "",
        new: str = "",
        dry_run: bool = False,
    ) -> None:
        if self._audit is not None:
            self._audit.record(
                "decision",
                strategy=strategy,
                reason=reason,
                path=path,
                knob=knob,
                old=old,
                new=new,
                dry_run=dry_run,
                detail=detail,
            )


def knob_values(resources: Resources) -> list[tuple[Knob[Any], object]]:
    """(knob, value) pairs to write, in write order; -1 becomes the knobs' None (unlimited).
    cpu.shares is left out where cpu.idle is 1: the kernel refuses it on an idle group (an idle
    group's weight is fixed) and would refuse it again at every reconcile."""
    out: list[tuple[Knob[Any], object]] = []
    set_fields = resources.set_fields()
    for attr, knob in _KNOBS.items():
        if attr not in set_fields:
            continue
        if attr == "cpu_shares" and set_fields.get("cpu_idle") == 1:
            continue
        value = set_fields[attr]
        if attr in ("cfs_quota", "memory_limit") and value == -1:
            value = None
        out.append((knob, value))
    return out


def _runtime_only(outcome: Outcome, req: ContainerRequest) -> Outcome:
    """``outcome`` without the resources no runtime applies to a container being created
    (:data:`~koordlet.runtimehooks.model.KOORDLET_FIELDS`: its cgroup does not exist yet; the
    reconciler writes them)."""
    dropped = KOORDLET_FIELDS & outcome.proposed.resources.set_fields().keys()
    if not dropped:
        return outcome
    logger.debug("pod %s container %s: %s left to the reconciler", req.pod, req.container_name,
                 sorted(dropped))  # fmt: skip
    blank = dict.fromkeys(dropped)
    return replace(
        outcome,
        change=replace(outcome.change, resources=replace(outcome.change.resources, **blank)),
        proposed=replace(outcome.proposed, resources=replace(outcome.proposed.resources, **blank)),
    )


def _text(value: object) -> str:
    return "" if value is None else str(value)
