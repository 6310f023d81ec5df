"""Cgroup QoS reconcile's plan: every write one round wants, from NodeSLO
``spec.resourceQOSStrategy``, the pods and host applications, and the node's CPUs and memory
(pure: :mod:`koordlet.qos.cgreconcile` builds it each round and applies it; its docstring and
docs/qos-reconcile.md have the rules).

- which class section a pod or a Kubernetes QoS cgroup follows;
- memory QoS: ``memory.min``/``memory.low``/``memory.high`` arithmetic and the static knobs;
- CPU QoS: group identity values, ``cpu.idle``, the mechanism this kernel allows;
- cpusets: the online CPUs and the LS share pool;
- :func:`build_plan`: all of it as one list of writes, less the parts a runtime hook owns;
  :class:`PlanMemo` keeps each pod's memory entries for the next round while their inputs hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from apis.extension import KubeQOS, QoSClass
from apis.group_identity import kube_qos_group_identity, pod_group_identity
from apis.pod_overrides import ANNOTATION_POD_CPU_QOS, PodCPUQoS
from apis.records import frozen
from apis.slo_qos import CPUQOSPolicy, MemoryQOSConfig, ResourceQOS
from apis.slo_strategies import ResourceQOSStrategy
from koordlet.executor.batch import BatchWrite
from koordlet.qos.shared import cpus_of_annotation, pod_class
from koordlet.statesinformer.model import PodInfo, WorkloadSnapshot
from koordlet.statesinformer.podmemo import PodMemo
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

_V = TypeVar("_V")

NAME = "cgreconcile"
"""Table name (the strategy the plan's writes are audited under)."""
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


def memory_static(cfg: MemoryQOSConfig) -> tuple[tuple[Knob[int], int], ...]:
    """The memory knobs that take a configured value as it is (pods and containers), as
    (knob, value) pairs: a tuple, not a dict, as a knob's hash walks its codec and validator."""
    return (
        (MEMORY_WMARK_RATIO, cfg.wmark_ratio),
        (MEMORY_WMARK_SCALE_FACTOR, cfg.wmark_scale_permill),
        (MEMORY_WMARK_MIN_ADJ, cfg.wmark_min_adj),
        (MEMORY_PRIORITY, cfg.priority),
        (MEMORY_USE_PRIORITY_OOM, cfg.priority_enable),
        (MEMORY_OOM_GROUP, cfg.oom_kill_group),
    )


def total_memory(info: object) -> int | None:
    """The node's memory from the node-info collector's value: the sum of its NUMA nodes'
    ``memory_total_bytes``; None when unknown."""
    if not isinstance(info, Mapping):
        return None
    numa = info.get("numa")
    if not isinstance(numa, Mapping) or not numa:
        return None
    values = [n.get("memory_total_bytes") for n in numa.values() if isinstance(n, Mapping)]
    if not values or not all(isinstance(v, int) for v in values):
        return None
    return sum(v for v in values if isinstance(v, int)) or None


# CPU QoS ----------------------------------------------------------------------------------------


def pod_bvt(strategy: ResourceQOSStrategy, pod: PodInfo) -> int:
    """``cpu.bvt_warp_ns`` of a pod by upstream's group identity rule."""
    return pod_group_identity(strategy, pod.qos, pod.kube_qos)


def kube_dir_bvt(strategy: ResourceQOSStrategy, kube_qos: KubeQOS) -> int:
    """``cpu.bvt_warp_ns`` of a Kubernetes QoS cgroup (the kubepods root stays 0)."""
    return kube_qos_group_identity(strategy, kube_qos)


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


@frozen
class _PodMemory:
    """One pod's memory QoS entries."""

    writes: tuple[BatchWrite[Any], ...]
    skipped: tuple[tuple[str, str], ...]
    minimum: int
    """The pod's ``memory.min``, for its QoS cgroup's sum."""
    low: int
    """The pod's ``memory.low``, for its QoS cgroup's sum."""


class PlanMemo(PodMemo[_PodMemory]):
    """Each pod's memory QoS entries kept from one round to the next
    (:class:`~koordlet.statesinformer.podmemo.PodMemo`), so that a round at 200 pods does not
    build its ~7,000 writes again when nothing changed.

    An entry is reused only while its key, every input it was computed from (the class's
    ``memoryQOS`` section, the pod's class, name, cgroup, memory request and containers, the
    node's memory), equals the round's; a pod gone from the snapshot is dropped. The QoS
    cgroups' sums are added up again each round.
    A reused entry is the same value :func:`build_plan` would compute, so a plan built with a
    memo equals one built without.
    """

    __slots__ = ()


def _pod_memory_key(
    cfg: MemoryQOSConfig, cls: QoSClass, pod: PodInfo, node_memory: int | None
) -> tuple[object, ...]:
    return (
        cfg,
        cls,
        pod.name,
        pod.cgroup_dir,
        pod.memory_request_bytes,
        pod.containers,
        node_memory,
    )


def _pod_memory(
    cfg: MemoryQOSConfig,
    cls: QoSClass,
    pod: PodInfo,
    node_memory: int | None,
) -> _PodMemory:
    writes: list[BatchWrite[Any]] = []
    skipped: list[tuple[str, str]] = []
    why = f"memoryQOS of {cls} ({'on' if cfg.enable else 'off'})"

    def add(knob: Knob[_V], rel_dir: str, value: _V) -> None:
        writes.append(BatchWrite(knob, rel_dir, value, NAME, why))

    minimum, low = memory_protection(cfg, pod.memory_request_bytes)
    add(MEMORY_MIN, pod.cgroup_dir, minimum)
    add(MEMORY_LOW, pod.cgroup_dir, low)
    for c in pod.containers:
        c_min, c_low = memory_protection(cfg, c.memory_request_bytes)
        add(MEMORY_MIN, c.cgroup_dir, c_min)
        add(MEMORY_LOW, c.cgroup_dir, c_low)
        high = memory_high(cfg, c.memory_request_bytes, c.memory_limit_bytes, node_memory)
        if isinstance(high, str):
            skipped.append((f"pod/{pod.name}/{c.name}: memory_high", high))
        else:
            add(MEMORY_HIGH, c.cgroup_dir, high)
    static = memory_static(cfg)
    for rel in (pod.cgroup_dir, *(c.cgroup_dir for c in pod.containers)):
        for knob, value in static:
            add(knob, rel, value)
    return _PodMemory(tuple(writes), tuple(skipped), minimum, low)


def _memory_plan(
    plan: Plan,
    strategy: ResourceQOSStrategy,
    layout: CgroupLayout,
    pods: Iterable[PodInfo],
    node_memory: int | None,
    memo: PlanMemo | None,
) -> None:
    sums: dict[KubeQOS, list[int]] = {q: [0, 0] for q in KubeQOS}
    for pod in pods:
        cls = pod_class(pod)
        section = class_qos(strategy, cls)
        if section is None:
            continue
        cfg = section.memory_qos
        if memo is None:
            entry = _pod_memory(cfg, cls, pod, node_memory)
        else:
            key = _pod_memory_key(cfg, cls, pod, node_memory)
            found = memo.get(pod.uid, key)
            if found is None:
                found = memo.put(pod.uid, key, _pod_memory(cfg, cls, pod, node_memory))
            entry = found
        sums[pod.kube_qos][0] += entry.minimum
        sums[pod.kube_qos][1] += entry.low
        plan.writes.extend(entry.writes)
        plan.skipped.update(entry.skipped)
    if memo is not None:
        memo.commit()
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
    overrides: Mapping[str, PodCPUQoS],
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
            own = overrides.get(pod.uid)
            if own is not None:
                value = own.identity(value)
                plan.add(CPU_BVT_WARP_NS, pod.cgroup_dir, value, ANNOTATION_POD_CPU_QOS)
                continue
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
        for uid, own in overrides.items():
            pod = snapshot.pods[uid]
            plan.add(CPU_IDLE, pod.cgroup_dir, int(own.idle(False)), ANNOTATION_POD_CPU_QOS)
        return
    for uid in overrides:
        pod = snapshot.pods[uid]
        plan.skipped[f"pod/{pod.name}"] = (
            f"{ANNOTATION_POD_CPU_QOS} not applied: no group identity and no cpu.idle here"
        )
    if strategy.be_class.cpu_qos.enable:
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
    cpu_qos_overrides: Mapping[str, PodCPUQoS] | None = None,
    hooks_own: frozenset[str] = frozenset(),
    memo: PlanMemo | None = None,
) -> Plan:
    """Every write of one round (pure: tests call it directly); ``cpu_qos_overrides`` holds the
    parsed ``koordinator.sh/cpuQOS`` of the LS pods that carry one, by UID (ignored while the
    pods' CPU QoS is a hook's); ``hooks_own``: the parts of :data:`HOOK_OWNED` left out;
    ``memo``: pods' memory entries kept from the last round (:class:`PlanMemo`), updated."""
    plan = Plan()
    pods_cpu_owned = POD_CPU_QOS in hooks_own
    overrides = {} if pods_cpu_owned else (cpu_qos_overrides or {})
    _memory_plan(plan, strategy, layout, snapshot.pods.values(), node_memory, memo)
    _cpu_plan(plan, strategy, mechanism, layout, snapshot, overrides, pods_owned=pods_cpu_owned)
    _cpuset_plan(plan, snapshot, online, pods_owned=POD_CPUSETS in hooks_own)
    for part in sorted(hooks_own):
        plan.skipped[part] = f"owned by the runtime hook {HOOK_OWNED[part]} (its gate is on)"
    return plan
