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
pods' ``cpu.idle``, are the hook's (:data:`HOOK_OWNED`); while ``CPUSetAllocator`` is on, pods'
and containers' cpusets and the unset quota of LSE/LSR pods are. This strategy then leaves those
out and keeps the rest (memory QoS, the QoS cgroups' ``cpu.idle`` and shares fallback, host
applications), so each knob of each cgroup has exactly one writer (docs/runtimehooks.md).

Every write of a round goes to the executor as one leveled batch (parents grow before children,
children shrink before parents; ``koordlet.executor.batch``). A knob the kernel lacks is reported
once with the probe's reason and left out of later rounds, never silently skipped. Inputs are
declarative (NodeSLO, pod specs, the node's CPUs), not measured series, so no staleness rule
applies; a value this strategy applied is not resubmitted until the executor's cache would expire
(``CgroupWriter.cache_ttl``), which keeps a round at 200 pods cheap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from apis.extension import KubeQOS, QoSClass
from apis.slo_qos import CPUQOSConfig, CPUQOSPolicy, MemoryQOSConfig, ResourceQOS
from apis.slo_strategies import ResourceQOSStrategy
from koordlet.executor.batch import BatchResult, BatchWrite
from koordlet.qos.framework import StrategyContext, StrategyReport
from koordlet.qos.shared import cpus_of_annotation, pod_class
from koordlet.statesinformer.model import HostAppInfo, PodInfo, WorkloadSnapshot
from koordlet.system.cgroups import CgroupLayout
from koordlet.system.knobs import (
    CPU_BVT_WARP_NS,
    CPU_CFS_QUOTA,
    CPU_IDLE,
    CPU_SHARES,
    CPUSET_CPUS,
    MEMORY_HIGH,
    MEMORY_LOW,
    MEMORY_MIN,
    MEMORY_OOM_GROUP,
    MEMORY_PRIORITY,
    MEMORY_USE_PRIORITY_OOM,
    MEMORY_WMARK_MIN_ADJ,
    MEMORY_WMARK_RATIO,
    MEMORY_WMARK_SCALE_FACTOR,
    Knob,
)

logger = logging.getLogger(__name__)
_V = TypeVar("_V")

NAME = "cgreconcile"
"""Table name."""
FEATURE_GATE = "CgroupReconcile"
"""Koordinator's feature gate."""
DEFAULT_INTERVAL = 1.0
"""Seconds between rounds (Koordinator's ``--reconcile-interval-seconds``, 1)."""
NODE_INFO_KEY = "node_info"
"""Metric-cache info key of the node-info collector (online CPUs, NUMA memory)."""
PAGE_SIZE = 4096
"""``memory.high`` is rounded down to a page, as upstream rounds it."""
BE_MIN_SHARES = 2
"""The kernel's minimum ``cpu.shares``, what the kubelet gives BestEffort."""

MECH_GROUP_IDENTITY = "group identity (cpu.bvt_warp_ns)"
MECH_CPU_IDLE = "cpu.idle (mainline SCHED_IDLE) for BE"
MECH_SHARES = "cpu.shares for BE (no cpu.bvt_warp_ns, no cpu.idle)"

POD_CPU_QOS = "pod_cpu_qos"
POD_CPUSETS = "pod_cpusets"
HOOK_OWNED: Mapping[str, str] = {POD_CPU_QOS: "GroupIdentity", POD_CPUSETS: "CPUSetAllocator"}
"""Parts of the plan a runtime hook owns while its gate is on (the module docstring)."""

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


# Which class ------------------------------------------------------------------------------------


def class_qos(strategy: ResourceQOSStrategy, qos: QoSClass) -> ResourceQOS | None:
    """The class section for ``qos`` (LSE uses LSR's, as upstream); None for NONE."""
    return {
        QoSClass.LSE: strategy.lsr_class,
        QoSClass.LSR: strategy.lsr_class,
        QoSClass.LS: strategy.ls_class,
        QoSClass.BE: strategy.be_class,
        QoSClass.SYSTEM: strategy.system_class,
    }.get(qos)


def kube_qos_class(strategy: ResourceQOSStrategy, kube_qos: KubeQOS) -> ResourceQOS:
    """The class section a Kubernetes QoS cgroup follows (Guaranteed LSR, Burstable LS,
    BestEffort BE: upstream's ``GetKubeQoSResourceQoSByQoSClass``)."""
    return {
        KubeQOS.GUARANTEED: strategy.lsr_class,
        KubeQOS.BURSTABLE: strategy.ls_class,
        KubeQOS.BESTEFFORT: strategy.be_class,
    }[kube_qos]


# Memory QoS -------------------------------------------------------------------------------------


def memory_protection(cfg: MemoryQOSConfig, request: int | None) -> tuple[int, int]:
    """``(memory.min, memory.low)`` of a pod: request * percent / 100; low raised to min when it
    is lower but not zero. An unknown request counts as 0 (no protection)."""
    req = max(request or 0, 0)
    low = req * cfg.low_limit_percent // 100
    minimum = req * cfg.min_limit_percent // 100
    if 0 < low < minimum:
        low = minimum
    return minimum, low


def memory_high(
    cfg: MemoryQOSConfig, request: int | None, limit: int | None, node_memory: int | None
) -> int | str | None:
    """``memory.high``: None (unlimited) when throttlingPercent is 0; bytes; or a str saying why
    it cannot be computed (no limit and no node memory known)."""
    if cfg.throttling_percent == 0:
        return None
    req = max(request or 0, 0)
    ceiling = limit if limit is not None and limit > 0 else node_memory
    if ceiling is None or ceiling <= 0:
        return "pod without a memory limit and node memory unknown"
    high = (req + (ceiling - req) * cfg.throttling_percent // 100) // PAGE_SIZE * PAGE_SIZE
    minimum = memory_protection(cfg, request)[0]
    return max(high, minimum) if minimum > 0 else high


def memory_static(cfg: MemoryQOSConfig) -> dict[Knob[int], int]:
    """The memory knobs that take a configured value as it is (pods and containers)."""
    return {
        MEMORY_WMARK_RATIO: cfg.wmark_ratio,
        MEMORY_WMARK_SCALE_FACTOR: cfg.wmark_scale_permill,
        MEMORY_WMARK_MIN_ADJ: cfg.wmark_min_adj,
        MEMORY_PRIORITY: cfg.priority,
        MEMORY_USE_PRIORITY_OOM: cfg.priority_enable,
        MEMORY_OOM_GROUP: cfg.oom_kill_group,
    }


# CPU QoS ----------------------------------------------------------------------------------------


def pod_bvt(strategy: ResourceQOSStrategy, pod: PodInfo) -> int:
    """``cpu.bvt_warp_ns`` of a pod by upstream's group identity rule."""
    by_class = {
        QoSClass.LSR: strategy.lsr_class.cpu_qos.group_identity,
        QoSClass.LS: strategy.ls_class.cpu_qos.group_identity,
        QoSClass.BE: strategy.be_class.cpu_qos.group_identity,
    }
    if pod.qos in by_class:
        return by_class[pod.qos]
    return kube_pod_bvt(strategy, pod.kube_qos)


def kube_pod_bvt(strategy: ResourceQOSStrategy, kube_qos: KubeQOS) -> int:
    """The value for a pod whose class is not LSR, LS or BE, by its Kubernetes QoS."""
    if kube_qos is KubeQOS.BESTEFFORT:
        return strategy.be_class.cpu_qos.group_identity
    if kube_qos is KubeQOS.BURSTABLE:
        return strategy.ls_class.cpu_qos.group_identity
    if strategy.lsr_class.cpu_qos.enable:
        return strategy.lsr_class.cpu_qos.group_identity
    if strategy.ls_class.cpu_qos.enable:
        return strategy.ls_class.cpu_qos.group_identity
    return CPUQOSConfig().group_identity


def kube_dir_bvt(strategy: ResourceQOSStrategy, kube_qos: KubeQOS) -> int:
    """``cpu.bvt_warp_ns`` of a Kubernetes QoS cgroup (the kubepods root stays 0)."""
    if kube_qos is KubeQOS.BESTEFFORT:
        return strategy.be_class.cpu_qos.group_identity
    if kube_qos is KubeQOS.BURSTABLE:
        return strategy.ls_class.cpu_qos.group_identity
    return CPUQOSConfig().group_identity


def be_idle(strategy: ResourceQOSStrategy) -> int:
    """``cpu.idle`` for BE cgroups on a mainline kernel: 1 while BE CPU QoS is on and asks for
    it (``schedIdle`` 1 or the best-effort group identity -1), else 0."""
    cpu = strategy.be_class.cpu_qos
    return int(cpu.enable and (cpu.sched_idle == 1 or cpu.group_identity == -1))


def cpu_mechanism(supported: Mapping[str, bool], policy: CPUQOSPolicy) -> str:
    """Which CPU QoS mechanism this kernel allows (the module docstring's order)."""
    if policy is CPUQOSPolicy.GROUP_IDENTITY and supported.get("cpu_bvt_warp_ns", False):
        return MECH_GROUP_IDENTITY
    if supported.get("cpu_idle", False):
        return MECH_CPU_IDLE
    return MECH_SHARES


# Cpusets ----------------------------------------------------------------------------------------


def online_cpus(info: object) -> frozenset[int]:
    """Online CPUs from the node-info collector's value; empty when unknown."""
    if not isinstance(info, Mapping):
        return frozenset()
    cpus = info.get("cpus")
    if not isinstance(cpus, list):
        return frozenset()
    return frozenset(c["cpu_id"] for c in cpus if isinstance(c, Mapping) and "cpu_id" in c)


def share_pool(online: frozenset[int], pods: Iterable[PodInfo]) -> frozenset[int]:
    """The LS share pool: online CPUs minus every LSR and LSE pod's CPUs."""
    held: set[int] = set()
    for pod in pods:
        if pod.qos in (QoSClass.LSR, QoSClass.LSE):
            held |= cpus_of_annotation(pod.annotations)
    return online - held


# The plan ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class Plan:
    """Everything one round wants written, and what it could not decide."""

    writes: list[BatchWrite[Any]] = field(default_factory=list)
    """Target values, any order (the batch levels them)."""
    skipped: dict[str, str] = field(default_factory=dict)
    """What was not planned and why (``pod/<name>: no resource-status cpuset``)."""

    def add(self, knob: Knob[_V], rel_dir: str, value: _V, reason: str) -> None:
        self.writes.append(BatchWrite(knob, rel_dir, value, NAME, reason))


def _memory_plan(
    plan: Plan,
    strategy: ResourceQOSStrategy,
    layout: CgroupLayout,
    pods: Iterable[PodInfo],
    node_memory: int | None,
) -> None:
    sums: dict[KubeQOS, list[int]] = {q: [0, 0] for q in KubeQOS}
    for pod in pods:
        section = class_qos(strategy, pod_class(pod))
        if section is None:
            continue
        cfg = section.memory_qos
        why = f"memoryQOS of {pod_class(pod)} ({'on' if cfg.enable else 'off'})"
        minimum, low = memory_protection(cfg, pod.memory_request_bytes)
        sums[pod.kube_qos][0] += minimum
        sums[pod.kube_qos][1] += low
        plan.add(MEMORY_MIN, pod.cgroup_dir, minimum, why)
        plan.add(MEMORY_LOW, pod.cgroup_dir, low, why)
        for c in pod.containers:
            c_min, c_low = memory_protection(cfg, c.memory_request_bytes)
            plan.add(MEMORY_MIN, c.cgroup_dir, c_min, why)
            plan.add(MEMORY_LOW, c.cgroup_dir, c_low, why)
            high = memory_high(cfg, c.memory_request_bytes, c.memory_limit_bytes, node_memory)
            if isinstance(high, str):
                plan.skipped[f"pod/{pod.name}/{c.name}: memory_high"] = high
            else:
                plan.add(MEMORY_HIGH, c.cgroup_dir, high, why)
        static = memory_static(cfg)
        for rel in (pod.cgroup_dir, *(c.cgroup_dir for c in pod.containers)):
            for name, value in static.items():
                plan.add(name, rel, value, why)
    total_min = sum(s[0] for s in sums.values())
    total_low = sum(s[1] for s in sums.values())
    for kube_qos in KubeQOS:
        rel = layout.qos_dir(kube_qos)
        cfg = kube_qos_class(strategy, kube_qos).memory_qos
        why = f"{kube_qos} QoS cgroup: sum of its pods"
        if kube_qos is KubeQOS.GUARANTEED:
            plan.add(MEMORY_MIN, rel, total_min, "kubepods: sum of every pod")
            plan.add(MEMORY_LOW, rel, total_low, "kubepods: sum of every pod")
        else:
            plan.add(MEMORY_MIN, rel, sums[kube_qos][0], why)
            plan.add(MEMORY_LOW, rel, sums[kube_qos][1], why)
        plan.add(MEMORY_USE_PRIORITY_OOM, rel, cfg.priority_enable, f"{kube_qos} QoS cgroup")
        plan.add(MEMORY_PRIORITY, rel, cfg.priority, f"{kube_qos} QoS cgroup")
        plan.add(MEMORY_OOM_GROUP, rel, cfg.oom_kill_group, f"{kube_qos} QoS cgroup")


def _cpu_plan(
    plan: Plan,
    strategy: ResourceQOSStrategy,
    mechanism: str,
    layout: CgroupLayout,
    snapshot: WorkloadSnapshot,
    *,
    pods_owned: bool = False,
) -> None:
    pods = [] if pods_owned else list(snapshot.pods.values())
    apps = [a for a in snapshot.host_apps if a.present]
    be_dir = layout.qos_dir(KubeQOS.BESTEFFORT)
    if mechanism == MECH_GROUP_IDENTITY:
        for kube_qos in () if pods_owned else KubeQOS:
            value = kube_dir_bvt(strategy, kube_qos)
            plan.add(CPU_BVT_WARP_NS, layout.qos_dir(kube_qos), value, f"group identity {value}")
        for pod in pods:
            value = pod_bvt(strategy, pod)
            plan.add(CPU_BVT_WARP_NS, pod.cgroup_dir, value, f"group identity of {pod.qos}")
        for app in apps:
            section = class_qos(strategy, app.qos)
            value = section.cpu_qos.group_identity if section is not None else 0
            plan.add(CPU_BVT_WARP_NS, app.cgroup_dir, value, f"host app of {app.qos}")
        return
    be_dirs = [be_dir]
    be_dirs += [
        p.cgroup_dir
        for p in pods
        if pod_class(p) is QoSClass.BE and not p.cgroup_dir.startswith(be_dir + "/")
    ]
    be_dirs += [a.cgroup_dir for a in apps if a.qos is QoSClass.BE]
    if mechanism == MECH_CPU_IDLE:
        idle = be_idle(strategy)
        for rel in be_dirs:
            plan.add(CPU_IDLE, rel, idle, f"BE CPU QoS {'on' if idle else 'off'}: cpu.idle")
    elif strategy.be_class.cpu_qos.enable:
        for rel in be_dirs:
            plan.add(CPU_SHARES, rel, BE_MIN_SHARES, "BE CPU QoS on: minimum shares fallback")


def _cpuset_plan(
    plan: Plan, snapshot: WorkloadSnapshot, online: frozenset[int], *, pods_owned: bool = False
) -> None:
    pods = list(snapshot.pods.values())
    if not online:
        plan.skipped["cpusets"] = "online CPUs unknown (no node info yet)"
        return
    pool = share_pool(online, pods)
    for pod in () if pods_owned else pods:
        cls = pod_class(pod)
        rels = (pod.cgroup_dir, *(c.cgroup_dir for c in pod.containers))
        if cls in (QoSClass.LSR, QoSClass.LSE):
            cpus = cpus_of_annotation(pod.annotations)
            if not cpus:
                plan.skipped[f"pod/{pod.name}: cpuset"] = f"{cls} without a resource-status cpuset"
            elif not cpus <= online:
                plan.skipped[f"pod/{pod.name}: cpuset"] = (
                    f"resource-status CPUs {sorted(cpus - online)} are not online"
                )
            else:
                # Quota is lifted only for a pod bound to CPUs of its own: an unlabelled
                # Guaranteed pod (LSR by default) keeps the limit the kubelet gave it.
                for rel in rels:
                    plan.add(CPUSET_CPUS, rel, cpus, f"{cls}: resource-status cpuset")
                    plan.add(CPU_CFS_QUOTA, rel, None, f"{cls}: bound to its CPUs, quota unset")
        elif cls is QoSClass.LS:
            if not pool:
                plan.skipped[f"pod/{pod.name}: cpuset"] = "LS share pool is empty"
                continue
            for rel in rels:
                plan.add(CPUSET_CPUS, rel, pool, "LS share pool")
    for app in snapshot.host_apps:
        if app.present and app.qos in (QoSClass.LS, QoSClass.LSR, QoSClass.LSE) and pool:
            plan.add(CPUSET_CPUS, app.cgroup_dir, pool, f"host app of {app.qos}: LS share pool")


def build_plan(
    strategy: ResourceQOSStrategy,
    layout: CgroupLayout,
    snapshot: WorkloadSnapshot,
    *,
    mechanism: str,
    online: frozenset[int],
    node_memory: int | None,
    hooks_own: frozenset[str] = frozenset(),
) -> Plan:
    """Every write of one round (pure: tests call it directly); ``hooks_own``: the parts of
    :data:`HOOK_OWNED` left out."""
    plan = Plan()
    _memory_plan(plan, strategy, layout, snapshot.pods.values(), node_memory)
    _cpu_plan(plan, strategy, mechanism, layout, snapshot, pods_owned=POD_CPU_QOS in hooks_own)
    _cpuset_plan(plan, snapshot, online, pods_owned=POD_CPUSETS in hooks_own)
    for part in sorted(hooks_own):
        plan.skipped[part] = f"owned by the runtime hook {HOOK_OWNED[part]} (its gate is on)"
    return plan


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
        self._applied: dict[tuple[str, str], tuple[object, float]] = {}
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
        plan = build_plan(
            strategy,
            layout,
            snapshot,
            mechanism=mechanism,
            online=online_cpus(info),
            node_memory=_node_memory(info),
            hooks_own=frozenset(part for part, gate in HOOK_OWNED.items() if gates.enabled(gate)),
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

    def _select(self, writes: list[BatchWrite[Any]]) -> list[BatchWrite[Any]]:
        """Drop unsupported knobs and values applied within the executor's cache lifetime."""
        now = self._ctx.now()
        ttl = self._ctx.executor.cache_ttl
        out = []
        for w in writes:
            if w.knob_name in self._unsupported:
                continue
            hit = self._applied.get((w.knob_name, w.rel_dir))
            if hit is not None and hit[0] == w.value and now - hit[1] < ttl:
                continue
            out.append(w)
        return out

    def _learn(self, writes: list[BatchWrite[Any]], result: BatchResult, now: float) -> None:
        failed: set[tuple[str, str]] = set()
        for w, err in result.errors:
            failed.add((w.knob_name, w.rel_dir))
            if " unsupported: " in err:
                self._mark_unsupported(w.knob_name, err.split(" unsupported: ", 1)[1])
            else:
                logger.warning("cgroup reconcile: %s of %s: %s", w.knob_name, w.rel_dir, err)
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


def _node_memory(info: object) -> int | None:
    if not isinstance(info, Mapping):
        return None
    numa = info.get("numa")
    if not isinstance(numa, Mapping) or not numa:
        return None
    values = [n.get("memory_total_bytes") for n in numa.values() if isinstance(n, Mapping)]
    if not values or not all(isinstance(v, int) for v in values):
        return None
    return sum(v for v in values if isinstance(v, int)) or None


def build(ctx: StrategyContext, interval: float) -> CgroupReconcile:
    """Table factory."""
    return CgroupReconcile(ctx, interval=interval)
