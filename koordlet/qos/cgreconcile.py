"""Cgroup QoS reconcile (gate ``CgroupReconcile``): memory QoS, CPU QoS by class, cpusets and
CFS quota of the latency-sensitive pods, from NodeSLO ``spec.resourceQOSStrategy``.

It gathers what Koordinator spreads over its ``cgreconcile`` QoS plugin and the ``groupidentity``
and ``cpuset`` runtime hooks' reconcilers, and re-applies it every round, so a value changed
behind our back (or by a kubelet sync) is put back. The section in force is read over
Koordinator's defaults, and a class whose ``cpuQOS`` or ``memoryQOS`` has ``enable: false`` takes
the disabled values (``apis.slo_inforce``): switching a class off writes the kernel defaults back,
as upstream does. A pod's class is its ``koordinator.sh/qosClass``; without one, its
Kubernetes QoS decides (Guaranteed LSR, Burstable LS, BestEffort BE); LSE pods use the LSR class.

**Memory QoS** (per pod and container, from the class's ``memoryQOS``; Anolis knobs only where
the kernel has them):

- ``memory.min = request * minLimitPercent / 100``, ``memory.low = request * lowLimitPercent /
  100``, raised to ``memory.min`` when lower but not zero (upstream's correction), on the pod
  (pod request) and on each container (its own request; unknown counts as 0);
- ``memory.high`` on each container: unlimited when ``throttlingPercent`` is 0; else ``request +
  (limit - request) * throttlingPercent / 100`` rounded down to a page, with the node's memory as
  the limit of a container without one, and never below ``memory.min``;
- ``memory.wmark_ratio``, ``memory.wmark_scale_factor`` (``wmarkScalePermill``),
  ``memory.wmark_min_adj``, ``memory.priority``, ``memory.use_priority_oom``
  (``priorityEnable``) and ``memory.oom.group`` (``oomKillGroup``) on the pod and its containers;
- the Kubernetes QoS cgroups: ``besteffort`` and ``burstable`` get the sums of their pods'
  ``memory.min``/``memory.low``, the kubepods root the sum of all (it is their parent), and the
  ``priorityEnable``/``priority``/``oomKillGroup`` of the class their Kubernetes QoS maps to.

**CPU QoS**, by the best mechanism the kernel has, reported as ``cpu_mechanism``:

- ``group identity`` where ``cpu.bvt_warp_ns`` exists (Anolis): the besteffort QoS cgroup gets
  BE's ``groupIdentity``, burstable LS's, the kubepods root 0 (upstream: "until the kernel
  supports it"); each pod its class's value (LSR, LS, BE), other pods their Kubernetes QoS's
  (a Guaranteed pod LSR's when LSR CPU QoS is on, else LS's when that is on, else 0);
- ``cpu.idle`` on mainline kernels (Linux >= 5.15): the besteffort QoS cgroup, and BE pods outside
  it, get ``cpu.idle = 1`` while BE CPU QoS is on (``schedIdle`` 1, or ``groupIdentity`` -1, the
  best-effort identity), 0 when it is off;
- ``cpu.shares`` where neither exists: BE cgroups get the minimum shares (2) while BE CPU QoS is
  on, and are left to the kubelet when it is off.

While the gate ``GroupIdentity`` is off (with it on, pods' CPU QoS is the runtime hook's, which
applies the same rule), an LS pod's ``koordinator.sh/cpuQOS`` annotation (``{"enable": true,
"groupIdentity": -1}``) overrides its class's CPU QoS, as upstream's ``groupidentity`` hook does
for LS pods only: with ``enable`` its ``groupIdentity`` (else the class's), without it 0; on
``cpu.idle`` kernels the pod is made idle for the best-effort identity (-1) or ``schedIdle: 1``,
and not idle otherwise. A malformed value keeps the class's and is reported once
(``ctx.pod_warnings``); the shares fallback has no per-pod identity (reported in the round's
detail).

**Cpusets** (``cpuset.cpus``) for LSR and LSE pods and their containers from the CPUs of their
``scheduling.koordinator.sh/resource-status`` annotation; for LS pods, and LS/LSR/LSE host
applications, the LS share pool: every online CPU minus those LSR and LSE pods hold. BE cpusets
belong to CPU suppress. **CFS quota** is unset (unlimited) on LSR and LSE pods and their
containers that have such a cpuset: their CPUs are theirs (a pod without one, such as an
unlabelled Guaranteed pod, keeps the quota the kubelet gave it). Host applications also get
their class's CPU QoS.

**Who writes what.** The runtime hooks' reconciler (``koordlet.runtimehooks.reconciler``) owns
the pod-level knobs of its enabled hooks, as upstream's runtime-hook reconciler does: while the
gate ``GroupIdentity`` is on, the group identity of the Kubernetes QoS cgroups and of pods, and
pods' ``cpu.idle``, are the hook's (:data:`~koordlet.qos.cgplan.HOOK_OWNED`); while
``CPUSetAllocator`` is on, pods' and containers' cpusets and the unset quota of LSE/LSR pods
are. This strategy then leaves those out and keeps the rest (memory QoS, the QoS cgroups'
``cpu.idle`` and shares fallback, host applications), so each knob of each cgroup has exactly
one writer (docs/runtimehooks.md).

Every write of a round goes to the executor as one leveled batch (parents grow before children,
children shrink before parents; ``koordlet.executor.batch``). A knob the kernel lacks is reported
once with the probe's reason and left out of later rounds, never silently skipped. Inputs are
declarative (NodeSLO, pod specs, the node's CPUs), not measured series, so no staleness rule
applies; a value this strategy applied is not resubmitted until the executor's cache would expire
(``CgroupWriter.cache_ttl``), and each pod's memory entries are kept from one round to the next
while their inputs are equal (:class:`~koordlet.qos.cgplan.PlanMemo`), which keeps a round at 200
pods cheap.

The round's writes are planned, purely, by :func:`koordlet.qos.cgplan.build_plan`; this module
applies them and keeps what the kernel lacks and what it applied.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from apis.extension import QoSClass
from apis.pod_overrides import ANNOTATION_POD_CPU_QOS, AnnotationError, PodCPUQoS, parse_pod_cpu_qos
from koordlet.executor.batch import BatchResult, BatchWrite
from koordlet.qos.cgplan import (
    HOOK_OWNED,
    POD_CPU_QOS,
    PlanMemo,
    build_plan,
    cpu_mechanism,
    online_cpus,
    total_memory,
)
from koordlet.qos.cgplan import (
    NAME as NAME,
)
from koordlet.qos.framework import StrategyContext, StrategyReport
from koordlet.qos.shared import WriteFailures, write_key
from koordlet.statesinformer.model import HostAppInfo, WorkloadSnapshot

logger = logging.getLogger(__name__)

FEATURE_GATE = "CgroupReconcile"
"""Koordinator's feature gate."""
DEFAULT_INTERVAL = 1.0
"""Seconds between rounds (Koordinator's ``--reconcile-interval-seconds``, 1)."""
NODE_INFO_KEY = "node_info"
"""Metric-cache info key of the node-info collector (online CPUs, NUMA memory)."""

MEMORY_KNOBS = (
    "memory_min",
    "memory_low",
    "memory_high",
    "memory_wmark_ratio",
    "memory_wmark_scale_factor",
    "memory_wmark_min_adj",
    "memory_priority",
    "memory_use_priority_oom",
    "memory_oom_group",
)


def _host_app_names(apps: Iterable[HostAppInfo]) -> list[str]:
    return [a.name for a in apps if a.present]


# The strategy -----------------------------------------------------------------------------------


class CgroupReconcile:
    """See the module docstring."""

    def __init__(self, ctx: StrategyContext, *, interval: float = DEFAULT_INTERVAL) -> None:
        self.name = NAME
        self.interval = interval
        self._ctx = ctx
        self._unsupported: dict[str, str] = {}
        self._failures = WriteFailures(NAME, logger, clock=ctx.now)
        self._applied: dict[tuple[str, str], tuple[object, float]] = {}
        self._memo = PlanMemo()
        caps = ctx.capabilities
        if caps is not None:
            for name in (*MEMORY_KNOBS, "cpu_bvt_warp_ns", "cpu_idle", "cpu_shares"):
                if name in caps and not caps.supported(name):
                    self._mark_unsupported(name, caps[name].reason)
            for name in ("cpuset_cpus", "cpu_cfs_quota"):
                if name in caps and not caps.supported(name):
                    self._mark_unsupported(name, caps[name].reason)

    @property
    def unsupported(self) -> dict[str, str]:
        """Knob → why this host lacks it (each reported once, then left out)."""
        return dict(self._unsupported)

    def _mark_unsupported(self, knob_name: str, why: str) -> None:
        if knob_name not in self._unsupported:
            self._unsupported[knob_name] = why
            logger.info("cgroup reconcile: %s unsupported, not reconciled: %s", knob_name, why)

    def _supported(self) -> dict[str, bool]:
        return {k: k not in self._unsupported for k in ("cpu_bvt_warp_ns", "cpu_idle")}

    async def reconcile(self) -> None:
        ctx = self._ctx
        strategy = ctx.node_slo().resource_qos_strategy
        layout = ctx.host().layout
        snapshot = ctx.workloads()
        info = ctx.cache.get_info(NODE_INFO_KEY)
        mechanism = cpu_mechanism(self._supported(), strategy.policies.cpu_policy)
        gates = ctx.config.feature_gates
        hooks_own = frozenset(part for part, gate in HOOK_OWNED.items() if gates.enabled(gate))
        # While GroupIdentity owns pods' CPU QoS its hook applies (and reports) the override.
        overrides = {} if POD_CPU_QOS in hooks_own else self._cpu_qos_overrides(snapshot)
        plan = build_plan(
            strategy,
            layout,
            snapshot,
            mechanism=mechanism,
            online=online_cpus(info),
            node_memory=total_memory(info),
            cpu_qos_overrides=overrides,
            hooks_own=hooks_own,
            memo=self._memo,
        )
        writes = self._select(plan.writes)
        inputs: dict[str, Any] = {
            "pods": len(snapshot.pods),
            "host_apps": _host_app_names(snapshot.host_apps),
            "cpu_policy": str(strategy.policies.cpu_policy),
            "cpu_mechanism": mechanism,
            "enabled": {
                cls: {
                    "cpuQOS": getattr(strategy, attr).cpu_qos.enable,
                    "memoryQOS": getattr(strategy, attr).memory_qos.enable,
                }
                for cls, attr in (("LSR", "lsr_class"), ("LS", "ls_class"), ("BE", "be_class"))
            },
        }
        decision = f"{len(plan.writes)} targets, {len(writes)} to apply"
        if not writes:
            ctx.report(
                NAME,
                StrategyReport(
                    inputs,
                    decision,
                    "nothing to apply",
                    detail={"unsupported": self.unsupported, "skipped": plan.skipped},
                ),
            )
            return
        result: BatchResult = await asyncio.wrap_future(ctx.executor.submit_batch(writes))
        self._learn(writes, result, ctx.now())
        ctx.report(
            NAME,
            StrategyReport(
                inputs,
                decision,
                f"{result.changed} changed, {len(result.gone)} cgroups gone, "
                f"{len(result.errors)} errors" + (" (dry run)" if ctx.dry_run(NAME) else ""),
                detail={
                    "unsupported": self.unsupported,
                    "skipped": plan.skipped,
                    "errors": [f"{w.knob_name} {w.rel_dir}: {e}" for w, e in result.errors[:20]],
                },
            ),
        )

    def _cpu_qos_overrides(self, snapshot: WorkloadSnapshot) -> dict[str, PodCPUQoS]:
        """The ``koordinator.sh/cpuQOS`` of LS pods (upstream overrides LS pods only); a
        malformed one is reported once and the pod keeps its class's."""
        warnings = self._ctx.pod_warnings
        out: dict[str, PodCPUQoS] = {}
        for pod in snapshot.pods.values():
            text = pod.annotations.get(ANNOTATION_POD_CPU_QOS)
            labelled = pod.qos if pod.qos_label is None else pod.qos_label
            if text is None or labelled is not QoSClass.LS:  # upstream: the label's class
                warnings.valid(pod, ANNOTATION_POD_CPU_QOS)
                continue
            try:
                out[pod.uid] = parse_pod_cpu_qos(text)
            except AnnotationError as err:
                warnings.report(NAME, pod, err.annotation, err.why)
                continue
            warnings.valid(pod, ANNOTATION_POD_CPU_QOS)
        return out

    def _select(self, writes: list[BatchWrite[Any]]) -> list[BatchWrite[Any]]:
        """Drop unsupported knobs and values applied within the executor's cache lifetime."""
        now = self._ctx.now()
        ttl = self._ctx.executor.cache_ttl
        unsupported, applied = self._unsupported, self._applied
        out = []
        for w in writes:  # ~7,000 a round at 200 pods: no property, no method lookups
            name = w.knob.name
            if name in unsupported:
                continue
            hit = applied.get((name, w.rel_dir))
            if hit is not None and hit[0] == w.value and now - hit[1] < ttl:
                continue
            out.append(w)
        return out

    def _learn(self, writes: list[BatchWrite[Any]], result: BatchResult, now: float) -> None:
        failed: set[tuple[str, str]] = set()
        refused: dict[str, str] = {}
        for w, err in result.errors:
            failed.add((w.knob_name, w.rel_dir))
            if " unsupported: " in err:
                self._mark_unsupported(w.knob_name, err.split(" unsupported: ", 1)[1])
            else:
                refused[write_key(w.knob_name, w.rel_dir)] = err
        if refused or len(self._failures):  # each refusal logged once per change, with a count
            self._failures.settle((write_key(w.knob_name, w.rel_dir) for w in writes), refused)
        gone = set(result.gone)
        # A dry-run value counts as applied too: its decision is audited once per cache lifetime,
        # not every second.
        for w in writes:
            key = (w.knob_name, w.rel_dir)
            rel = w.rel_dir.strip("/")
            if key in failed or any(rel == g or rel.startswith(g + "/") for g in gone):
                self._applied.pop(key, None)
            else:
                self._applied[key] = (w.value, now)
        live = {(w.knob_name, w.rel_dir) for w in writes}
        if len(self._applied) > 4 * max(len(live), 1024):
            self._applied = {k: v for k, v in self._applied.items() if k in live}


def build(ctx: StrategyContext, interval: float) -> CgroupReconcile:
    """Table factory."""
    return CgroupReconcile(ctx, interval=interval)
