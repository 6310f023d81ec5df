"""Eviction tasks and the one round that serves them all (Koordinator's ``qosmanager/plugins/util``
``EvictTaskInfo`` and ``KillAndEvictPods``), shared by memory and CPU eviction.

A strategy builds one :class:`EvictTask` per enabled feature (``BEMemoryEvict``,
``MemoryAllocatableEvict``, ``MemoryEvict``; ``BECPUEvict``, ``CPUAllocatableEvict``,
``CPUEvict``), each with what it must release (a resource list, per resource name: ``memory``,
``kubernetes.io/batch-memory``, ``kubernetes.io/mid-cpu``...), its *release target* (what the
release counts: the pods' usage, their requests, their batch requests), its candidates in
eviction order and what evicting a candidate releases. :func:`plan` then walks the tasks in
order, as upstream's ``KillAndEvictPods`` does:

- the released amounts accumulate per target across tasks: a task whose target is already
  covered by the tasks before it (its release minus what was released, per resource, is nowhere
  positive) evicts nobody, so two usage tasks (``BEMemoryEvict`` then ``MemoryEvict``) never both
  evict for the same pressure;
- what one victim releases is counted for every target of the round's tasks, each target taking
  the largest value the tasks of that target give (``mergeResourceListByMax``);
- a candidate evicted in an earlier round and still present (the evictor's dedupe window,
  upstream's ``IsPodEvicted``) is a *pending release*: it counts as released and is not evicted
  again, so a round never picks extra victims for pressure already being relieved;
- a victim is taken once, by the first task that reaches it.

Requests follow upstream's ``GetRequestTypeAndValueFromPod``: a pod of the ``koord-batch``
priority class (``GetPodPriorityClassWithDefault``: the ``koordinator.sh/priority-class``
label, else ``spec.priority``'s band, else by QoS: BE is batch) requests ``batch-cpu`` and
``batch-memory``, a ``koord-mid`` pod ``mid-cpu`` and ``mid-memory``, any other pod ``cpu``
(milli-cores) and ``memory`` (bytes). The allocatable tasks compare the requests of each
resource with the Node's allocatable of that resource (:func:`allocatable_release`), in float32 as
upstream does, so the numbers match to the byte.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from apis.extension import LABEL_EVICTION_ENABLED, QoSClass
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY
from apis.priority import (
    PRIORITY_BATCH,
    PRIORITY_DEFAULT_VALUES,
    PRIORITY_MID,
    pod_priority_class_raw,
    pod_priority_class_with_default,
)
from apis.records import frozen
from koordlet.qos.evictor import Outcome, eviction_priority, label_priority
from koordlet.qos.shared import eviction_policy_allowed, pod_class
from koordlet.statesinformer.model import PodInfo

ResourceList = Mapping[str, int]
"""Resource name → amount: ``cpu`` and ``*-cpu`` in milli-cores, memory in bytes."""

TARGET_USED = "podUsed"
"""``ReleaseTargetTypeResourceUsed``: victims release their usage."""
TARGET_REQUEST = "podResourceRequest"
"""``ReleaseTargetTypeResourceRequest``: victims release their (priority class) requests."""
TARGET_BATCH_REQUEST = "podBatchResourceRequest"
"""``ReleaseTargetTypeBatchResourceRequest``: victims release their batch requests."""

_CLASS_OF_RESOURCE = {
    BATCH_CPU: PRIORITY_BATCH,
    BATCH_MEMORY: PRIORITY_BATCH,
    MID_CPU: PRIORITY_MID,
    MID_MEMORY: PRIORITY_MID,
}
"""``ReverseResourceNameMap``: which priority class a released resource belongs to."""


def qos_raw(pod: PodInfo) -> QoSClass:
    """``GetPodQoSClassRaw``: the ``koordinator.sh/qosClass`` label's class; a source without
    labels (kubelet-free discovery) gives the class it derived."""
    return pod.qos if pod.qos_label is None else pod.qos_label


# Priority ----------------------------------------------------------------------------------------


def priority_class_with_default(pod: PodInfo) -> str:
    """Upstream's ``GetPodPriorityClassWithDefault``, which its eviction's
    ``GetRequestTypeAndValueFromPod`` and ``GetPodPriorityValueWithDefault`` use: the
    ``koordinator.sh/priority-class`` label, else the band of ``spec.priority``, else by the
    pod's QoS class with its default (:func:`apis.priority.pod_priority_class_with_default`)."""
    return pod_priority_class_with_default(pod.labels, pod.priority, pod_class(pod))


def priority_value_with_default(pod: PodInfo) -> int:
    """``GetPodPriorityValueWithDefault``: ``spec.priority`` when set and not 0, else the default
    value of the pod's class (``koord-prod`` 9500, ``koord-batch`` 5500..., none 0)."""
    if pod.priority is not None and pod.priority != 0:
        return pod.priority
    return PRIORITY_DEFAULT_VALUES[priority_class_with_default(pod)]


def request_of(pod: PodInfo, kind: str) -> tuple[str, int]:
    """``GetRequestTypeAndValueFromPod`` for ``kind`` ``cpu`` or ``memory``: ``(resource name,
    value)`` by the pod's priority class (see the module docstring); unknown requests are 0."""
    cls = priority_class_with_default(pod)
    if cls == PRIORITY_MID:
        name = MID_CPU if kind == "cpu" else MID_MEMORY
        return name, pod.extended_requests.get(name, 0)
    if cls == PRIORITY_BATCH:
        name = BATCH_CPU if kind == "cpu" else BATCH_MEMORY
        return name, pod.extended_requests.get(name, 0)
    if kind == "cpu":
        return "cpu", pod.cpu_request_milli or 0
    return "memory", pod.memory_request_bytes or 0


# Candidates --------------------------------------------------------------------------------------


@frozen
class Candidate:
    """A pod that may be evicted (upstream's ``PodEvictInfo``), in one unit per strategy."""

    pod: PodInfo
    used: int = 0
    """Usage: milli-cores or bytes; 0 when unknown."""
    request: int = 0
    """The request of the task's resource (``request_of``), milli-cores or bytes."""
    request_name: str = ""
    """Which resource ``request`` is (``kubernetes.io/batch-cpu``...)."""

    @property
    def key(self) -> str:
        """The evictor's dedupe key."""
        return f"pod/{self.pod.uid}"

    @property
    def usage_ratio(self) -> float:
        """used / request; 0 without a request (``CpuUsage``)."""
        return self.used / self.request if self.request > 0 else 0.0


def opted_in(pod: PodInfo) -> bool:
    """``PodEvictEnabled``: the label ``koordinator.sh/eviction-enabled`` is exactly ``"true"``."""
    return pod.labels.get(LABEL_EVICTION_ENABLED) == "true"


def by_priority(
    pods: Iterable[PodInfo],
    feature: str,
    priority_threshold: int,
    make: Callable[[PodInfo], Candidate | None],
    by: str,
) -> list[Candidate]:
    """``getPodEvictInfoAndSortByPriority``: pods the eviction policy allows, whose priority
    (with default) is at most ``priority_threshold``, opted in, for which ``make`` gives a
    candidate (None: no usage sample, upstream skips the pod); ordered by
    ``koordinator.sh/eviction-priority``, priority, ``koordinator.sh/priority`` (default: the
    priority), all ascending, then ``by`` (``used`` or ``request``) descending."""
    out: list[tuple[tuple[int, int, int, int], Candidate]] = []
    for pod in pods:
        if not eviction_policy_allowed(pod, feature):
            continue
        prio = priority_value_with_default(pod)
        if prio > priority_threshold or not opted_in(pod):
            continue
        cand = make(pod)
        if cand is None:
            continue
        sub = cand.used if by == "used" else cand.request
        key = (eviction_priority(pod), prio, label_priority(pod, prio), -sub)
        out.append((key, cand))
    out.sort(key=lambda item: item[0])
    return [c for _, c in out]


# Allocatable ------------------------------------------------------------------------------------


def _f32(value: float) -> float:
    """``value`` rounded to a Go ``float32``."""
    result: float = struct.unpack("f", struct.pack("f", value))[0]
    return result


def allocatable_release(
    requested: ResourceList, allocatable: ResourceList, threshold: int, lower: int
) -> dict[str, int]:
    """What the allocatable tasks release, per resource (upstream's
    ``calculateReleaseByAllocatableThresholdPercent``, in float32): all that is requested when
    the Node has no (or zero) allocatable of it; else ``(requested/allocatable - lower/100) x
    allocatable`` when ``requested/allocatable`` exceeds ``threshold/100``."""
    if threshold < 0:
        return {}
    out: dict[str, int] = {}
    for name, rq in requested.items():
        alloc = allocatable.get(name, 0)
        if alloc <= 0:
            if rq > 0:
                out[name] = rq
            continue
        ratio = _f32(_f32(rq) / _f32(alloc))
        if ratio > _f32(_f32(threshold) / 100):
            amount = int(_f32(_f32(ratio - _f32(_f32(lower) / 100)) * _f32(alloc)))
            if amount > 0:
                out[name] = amount
    return out


def released_classes(release: ResourceList) -> frozenset[str]:
    """The priority classes whose pods' requests count against ``release`` (batch, mid)."""
    return frozenset(_CLASS_OF_RESOURCE[n] for n in release if n in _CLASS_OF_RESOURCE)


# Tasks and the plan -----------------------------------------------------------------------------


@frozen
class EvictTask:
    """Upstream's ``EvictTaskInfo``."""

    feature: str
    """The feature that built it (``BEMemoryEvict``...); its reason is ``trigger by koordlet
    feature <feature>``."""
    reason: str
    """The metric and audit reason (``EvictPodByNodeMemoryUsage``...)."""
    target: str
    """What a victim's release counts against (:data:`TARGET_USED`...)."""
    to_release: ResourceList
    """What the task must release, per resource."""
    candidates: Sequence[Candidate]
    """In eviction order."""
    release_of: Callable[[Candidate], ResourceList]
    """What evicting a candidate releases for this task (``GetPodResourceFunc``)."""


def used_candidates(
    kind: str, used_of: Callable[[PodInfo], int | None]
) -> Callable[[PodInfo], Candidate | None]:
    """The ``make`` of :func:`by_priority` for ``kind`` (``cpu`` or ``memory``): the pod's
    usage from ``used_of`` (None: no fresh sample, upstream skips the pod) and its request
    (:func:`request_of`)."""

    def make(pod: PodInfo) -> Candidate | None:
        used = used_of(pod)
        if used is None:
            return None
        name, value = request_of(pod, kind)
        return Candidate(pod, used, value, name)

    return make


def allocatable_task(
    feature: str,
    reason: str,
    kind: str,
    pods: Sequence[PodInfo],
    thresholds: tuple[int, int, int],
    allocatable: ResourceList | None,
    used_of: Callable[[PodInfo], int | None],
    inputs: dict[str, object],
) -> EvictTask | None:
    """The ``CPUAllocatableEvict`` / ``MemoryAllocatableEvict`` task (upstream's
    ``allocatableEvict`` of each plugin): the requests of ``kind`` of the pods at or under the
    priority threshold, per resource, against the Node's ``allocatable``
    (:func:`allocatable_release`); the candidates by priority and request, a victim releasing
    its request when its priority class is one the release names. ``thresholds`` is ``(threshold,
    lower, priority threshold)`` as each strategy's rules validate them; what the task saw goes
    into ``inputs`` under ``feature``. None: nothing to release, or the allocatable unknown (said
    in ``inputs``)."""
    threshold, lower, prio_max = thresholds
    requested: dict[str, int] = {}
    for p in pods:
        if priority_value_with_default(p) > prio_max:
            continue
        name, value = request_of(p, kind)
        requested[name] = requested.get(name, 0) + value
    if allocatable is None:
        inputs[f"{feature}_skipped"] = "the Node's allocatable is unknown"
        return None
    release = allocatable_release(requested, allocatable, threshold, lower)
    inputs[feature] = {"requested": requested, "allocatable": dict(allocatable)}
    if not release:
        return None
    classes = released_classes(release)

    def by_request(c: Candidate) -> ResourceList:
        if pod_priority_class_raw(c.pod.labels, c.pod.priority) not in classes:
            return {}
        return {c.request_name: c.request}

    ordered = by_priority(pods, feature, prio_max, used_candidates(kind, used_of), "request")
    return EvictTask(feature, reason, TARGET_REQUEST, release, ordered, by_request)


@frozen
class Pick:
    """One candidate of the plan."""

    task: EvictTask
    candidate: Candidate
    pending: bool
    """Evicted in an earlier round and still present: counted, not evicted again."""


@dataclass(slots=True)
class Plan:
    """What :func:`plan` decided."""

    picks: list[Pick] = field(default_factory=list)
    """Victims to evict and pending releases, in order."""
    released: dict[str, dict[str, int]] = field(default_factory=dict)
    """Target → resource → amount released (victims and pending) across the round."""

    @property
    def victims(self) -> list[Pick]:
        """The picks to evict now (not pending)."""
        return [p for p in self.picks if not p.pending]

    def unmet(self, task: EvictTask) -> dict[str, int]:
        """What ``task`` still lacks after the plan (``EvictTaskCheck``)."""
        return _lacking(task.to_release, self.released.get(task.target, {}))


def _lacking(need: ResourceList, released: ResourceList) -> dict[str, int]:
    """``subReleaseListNoNegative``: the positive part of ``need - released``."""
    return {n: v - released.get(n, 0) for n, v in need.items() if v > released.get(n, 0)}


def plan(tasks: Sequence[EvictTask], pending: frozenset[str]) -> Plan:
    """The victims of one round for ``tasks`` (see the module docstring); ``pending`` holds the
    keys of candidates evicted in an earlier round (the evictor's dedupe window)."""
    result = Plan()
    live = [t for t in tasks if any(v > 0 for v in t.to_release.values())]
    by_target: dict[str, list[EvictTask]] = {}
    for t in live:
        by_target.setdefault(t.target, []).append(t)
        result.released.setdefault(t.target, {})

    def aggregate(c: Candidate) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for target, group in by_target.items():
            merged: dict[str, int] = {}
            for t in group:
                for name, value in t.release_of(c).items():
                    merged[name] = max(merged.get(name, 0), value)
            out[target] = merged
        return out

    def add(c: Candidate) -> None:
        for target, amounts in aggregate(c).items():
            acc = result.released[target]
            for name, value in amounts.items():
                acc[name] = acc.get(name, 0) + value

    taken: set[str] = set()
    for task in live:
        if not _lacking(task.to_release, result.released[task.target]):
            continue
        for cand in task.candidates:
            if cand.key in taken:
                continue
            taken.add(cand.key)
            result.picks.append(Pick(task, cand, cand.key in pending))
            add(cand)
            if not _lacking(task.to_release, result.released[task.target]):
                break
    return result


def plan_detail(tasks: Sequence[EvictTask], the_plan: Plan) -> dict[str, dict[str, object]]:
    """Per task, what ``/debug/qos`` shows of the round: its need and target, what stays unmet,
    its victims and which of them are pending releases."""
    return {
        t.feature: {
            "need": dict(t.to_release),
            "target": t.target,
            "unmet": the_plan.unmet(t),
            "victims": [p.candidate.key for p in the_plan.picks if p.task is t],
            "pending": [p.candidate.key for p in the_plan.picks if p.task is t and p.pending],
        }
        for t in tasks
    }


def outcome_summary(outcomes: Iterable[Outcome]) -> str:
    """``"2 evicted, 1 failed"``: the outcomes counted by status, in the order first seen."""
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in counts.items())
