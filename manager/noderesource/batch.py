"""Batch resources (``kubernetes.io/batch-cpu``, ``kubernetes.io/batch-memory``) of one node.

Koordinator's formula (``plugins/batchresource`` upstream), per resource, floored at zero::

    usage:           capacity - safetyMargin - max(systemUsed, nodeReserved) - HP.used
    request:         capacity - safetyMargin - nodeReserved - HP.request          (memory only)
    maxUsageRequest: capacity - safetyMargin - max(systemUsed, nodeReserved) - HP.maxUsedRequest

    safetyMargin = capacity * (100 - reclaimThresholdPercent) / 100
    nodeReserved = max(kubelet reservation (capacity - allocatable), reservation annotation)
    systemUsed   = NodeMetric systemUsage + usage of host applications above batch priority

HP (high-priority) pods are the node's Running or Pending pods whose priority class is neither
``koord-batch`` nor ``koord-free``. A pod with a metric counts its usage (an LSE pod its CPU
request, since LSE CPUs are never reclaimed); a pod without one counts its request. Metrics of
pods no longer in the list ("dangling") count by the priority the koordlet reported. With
``batch{CPU,Memory}ThresholdPercent`` set, the result is capped at that share of capacity.
"""

from __future__ import annotations

from collections.abc import Sequence

from apis.configuration import CalculatePolicy, ColocationStrategy
from apis.priority import PRIORITY_BATCH, PRIORITY_DEFAULT_VALUES, PRIORITY_FREE
from apis.records import frozen
from manager.noderesource.inputs import (
    CPU,
    MEMORY,
    ZERO,
    NodeMetricView,
    NodeView,
    PodView,
    Resources,
    annotation_reserved,
    usage_of,
)

_LOW_PRIORITY = frozenset({PRIORITY_BATCH, PRIORITY_FREE})
_ACTIVE_PHASES = frozenset({"Running", "Pending"})


@frozen
class PodTerm:
    """How one pod of the list entered the calculation."""

    pod: str
    """``namespace/name``."""
    priority_class: str
    """Its Koordinator priority class."""
    qos: str
    """Its Koordinator QoS class."""
    counted: bool
    """Whether it is an HP pod counted against batch."""
    reason: str
    """Why it counts or not (``high priority``, ``terminated (Succeeded)`` …)."""
    request: Resources
    """Its request."""
    usage: Resources | None
    """Its usage from the NodeMetric; None when the NodeMetric has none."""
    as_used: Resources
    """What it adds to HP.used."""
    as_max_used_request: Resources
    """What it adds to HP.maxUsedRequest."""


@frozen
class MetricTerm:
    """A pod metric or host application that entered the calculation by its metric alone."""

    name: str
    """``namespace/name`` of the pod, or the host application's name."""
    priority_class: str
    """Priority class the koordlet reported."""
    usage: Resources
    """Its usage."""
    counted: bool
    """Whether it counts (above batch priority)."""


@frozen
class HPSums:
    """Sums over the node's pods, shared by batch and mid."""

    request: Resources
    """HP.request: requests of HP pods."""
    used: Resources
    """HP.used: usage of HP pods (request without a metric) plus dangling HP usage."""
    max_used_request: Resources
    """HP.maxUsedRequest: per pod max(usage, request), plus dangling HP usage."""
    dangling_used: Resources
    """Usage of HP pods reported in the NodeMetric but absent from the pod list."""
    pods: tuple[PodTerm, ...]
    """Per-pod terms (empty unless recorded)."""
    dangling: tuple[MetricTerm, ...]
    """Dangling pod metrics (empty unless recorded)."""


@frozen
class BatchTerms:
    """Every term of the batch formula, as computed."""

    capacity: Resources
    safety_margin: Resources
    kubelet_reserved: Resources
    annotation_reserved: Resources
    node_reserved: Resources
    system_usage: Resources
    host_app_used: Resources
    system_used: Resources
    system_used_or_reserved: Resources
    hp: HPSums
    host_apps: tuple[MetricTerm, ...]
    by_usage: Resources
    by_request: Resources
    by_max_usage_request: Resources
    cpu_policy: CalculatePolicy
    memory_policy: CalculatePolicy
    cpu_cap: int | None
    memory_cap: int | None
    result: Resources
    notes: tuple[str, ...]


def hp_sums(
    node: NodeView, metric: NodeMetricView, pods: Sequence[PodView], *, record: bool
) -> HPSums:
    """HP.request, HP.used and HP.maxUsedRequest over ``pods`` and the NodeMetric."""
    dangling = {f"{pm.namespace}/{pm.name}": pm for pm in metric.pods}  # popped as pods match
    req_cpu = req_mem = used_cpu = used_mem = mur_cpu = mur_mem = 0
    terms: list[PodTerm] = []
    for pod in pods:
        if pod.node_name and pod.node_name != node.name:
            if record:
                terms.append(_skip(pod, f"on another node ({pod.node_name})"))
            continue
        if pod.phase not in _ACTIVE_PHASES:
            if record:
                terms.append(_skip(pod, f"not running ({pod.phase})"))
            continue
        pm = dangling.pop(pod.key, None)
        if pod.priority_class in _LOW_PRIORITY:
            if record:
                usage = usage_of(pm.pod_usage) if pm else None
                terms.append(
                    PodTerm(
                        pod.key, pod.priority_class, pod.qos, False,
                        f"low priority ({pod.priority_class})", pod.request, usage, ZERO, ZERO,
                    )
                )  # fmt: skip
            continue
        # Integers rather than Resources records: this runs for every pod of every node on
        # each pass, and the records are needed only when the terms are recorded.
        r = pod.request
        req_cpu += r.cpu
        req_mem += r.memory
        if pm is None:  # counted by request
            used_cpu += r.cpu
            used_mem += r.memory
            mur_cpu += r.cpu
            mur_mem += r.memory
            if record:
                reason = "high priority, no metric: counted by request"
                terms.append(
                    PodTerm(pod.key, pod.priority_class, pod.qos, True, reason, r, None, r, r)
                )
            continue
        res = pm.pod_usage.resources
        u_cpu, u_mem = res.get(CPU, 0), res.get(MEMORY, 0)
        lse = pod.qos == "LSE"  # LSE CPUs are never reclaimed: CPU by request
        used_cpu += r.cpu if lse else u_cpu
        used_mem += u_mem
        mur_cpu += max(r.cpu, u_cpu)
        mur_mem += max(r.memory, u_mem)
        if record:
            u = Resources(u_cpu, u_mem)
            if lse:
                reason = "high priority LSE: CPU by request, memory by usage"
                as_used = Resources(r.cpu, u_mem)
            else:
                reason = "high priority: counted by usage"
                as_used = u
            as_mur = Resources(max(r.cpu, u_cpu), max(r.memory, u_mem))
            terms.append(
                PodTerm(
                    pod.key, pod.priority_class, pod.qos, True, reason, r, u, as_used, as_mur,
                )
            )  # fmt: skip
    dangling_used = ZERO
    dangling_terms: list[MetricTerm] = []
    for key, pm in dangling.items():
        counted = pm.priority not in _LOW_PRIORITY
        usage = usage_of(pm.pod_usage)
        if counted:
            dangling_used = dangling_used + usage
        if record:
            dangling_terms.append(MetricTerm(key, pm.priority, usage, counted))
    return HPSums(
        request=Resources(req_cpu, req_mem),
        used=Resources(used_cpu, used_mem) + dangling_used,
        max_used_request=Resources(mur_cpu, mur_mem) + dangling_used,
        dangling_used=dangling_used,
        pods=tuple(terms),
        dangling=tuple(dangling_terms),
    )


def _skip(pod: PodView, reason: str) -> PodTerm:
    return PodTerm(
        pod.key, pod.priority_class, pod.qos, False, reason, pod.request, None, ZERO, ZERO
    )


def host_app_usage(
    metric: NodeMetricView, above: str, *, record: bool
) -> tuple[Resources, tuple[MetricTerm, ...]]:
    """Usage of host applications whose priority ranks above ``above`` (a priority class)."""
    floor = PRIORITY_DEFAULT_VALUES[above]
    total = ZERO
    terms = []
    for app in metric.host_apps:
        counted = PRIORITY_DEFAULT_VALUES.get(app.priority, 0) > floor
        if counted:
            total = total + app.usage
        if record:
            terms.append(MetricTerm(app.name, app.priority, app.usage, counted))
    return total, tuple(terms)


def safety_margin(strategy: ColocationStrategy, capacity: Resources) -> Resources:
    """capacity x (100 - reclaimThresholdPercent) / 100, truncated as Go converts to int64."""
    cpu_ratio = float(100 - strategy.cpu_reclaim_threshold_percent) / 100.0
    mem_ratio = float(100 - strategy.memory_reclaim_threshold_percent) / 100.0
    return Resources(int(float(capacity.cpu) * cpu_ratio), int(float(capacity.memory) * mem_ratio))


def node_reserved(node: NodeView) -> tuple[Resources, Resources, Resources, str]:
    """(kubelet reservation, annotation reservation, their maximum, a note)."""
    kubelet = (node.capacity - node.allocatable).floor0()
    anno, note = annotation_reserved(node)
    return kubelet, anno, kubelet.max(anno), note


def _percent_of(value: int, percent: int) -> int:
    return int(float(value) * (float(percent) / 100.0))


def calculate_batch(
    strategy: ColocationStrategy,
    node: NodeView,
    metric: NodeMetricView,
    hp: HPSums,
    *,
    record: bool = True,
) -> BatchTerms:
    """Batch CPU (milli-cores) and memory (bytes) before CPU normalization."""
    notes: list[str] = []
    cap = node.capacity
    margin = safety_margin(strategy, cap)
    kubelet, anno, reserved, note = node_reserved(node)
    if note:
        notes.append(note)
    host_used, host_terms = host_app_usage(metric, PRIORITY_BATCH, record=record)
    system_used = metric.system_usage + host_used
    sys_or_res = system_used.max(reserved)
    base = cap - margin
    by_usage = (base - sys_or_res - hp.used).floor0()
    by_request = (base - reserved - hp.request).floor0()
    by_mur = (base - sys_or_res - hp.max_used_request).floor0()
    cpu_policy = strategy.cpu_calculate_policy
    if cpu_policy is CalculatePolicy.REQUEST:
        notes.append("cpuCalculatePolicy 'request' is not supported for CPU: 'usage' applies")
        cpu_policy = CalculatePolicy.USAGE
    cpu = by_mur.cpu if cpu_policy is CalculatePolicy.MAX_USAGE_REQUEST else by_usage.cpu
    mem_policy = strategy.memory_calculate_policy
    memory = {
        CalculatePolicy.USAGE: by_usage.memory,
        CalculatePolicy.REQUEST: by_request.memory,
        CalculatePolicy.MAX_USAGE_REQUEST: by_mur.memory,
    }[mem_policy]
    cpu_cap = memory_cap = None
    if strategy.batch_cpu_threshold_percent is not None:
        cpu_cap = _percent_of(cap.cpu, strategy.batch_cpu_threshold_percent)
        cpu = min(cpu, cpu_cap)
    if strategy.batch_memory_threshold_percent is not None:
        memory_cap = _percent_of(cap.memory, strategy.batch_memory_threshold_percent)
        memory = min(memory, memory_cap)
    return BatchTerms(
        capacity=cap,
        safety_margin=margin,
        kubelet_reserved=kubelet,
        annotation_reserved=anno,
        node_reserved=reserved,
        system_usage=metric.system_usage,
        host_app_used=host_used,
        system_used=system_used,
        system_used_or_reserved=sys_or_res,
        hp=hp,
        host_apps=host_terms,
        by_usage=by_usage,
        by_request=by_request,
        by_max_usage_request=by_mur,
        cpu_policy=cpu_policy,
        memory_policy=mem_policy,
        cpu_cap=cpu_cap,
        memory_cap=memory_cap,
        result=Resources(cpu, memory),
        notes=tuple(notes),
    )
