"""Mid-tier resources (``kubernetes.io/mid-cpu``, ``kubernetes.io/mid-memory``) of one node.

Koordinator's formula (``plugins/midresource`` upstream), per resource::

    metrics mode (default):
      mid = max(min(prodReclaimable, capacity * midThresholdPercent / 100, nodeUnused), 0)
            + unallocated * midUnallocatedPercent / 100
      nodeUnused  = capacity - NodeMetric nodeUsage (zero when the NodeMetric has no node usage)
      unallocated = max(capacity - max(systemUsed, nodeReserved) - prod requests, 0)
      systemUsed  = NodeMetric systemUsage + usage of prod host applications
    static mode (midReclaimMode "static"):
      mid = min(capacity * midStatic{CPU,Memory}ReservedPercent / 100,
                capacity * midThresholdPercent / 100)

prodReclaimable is the NodeMetric's ``prodReclaimableMetric`` (zero when absent). Prod pods are
the Running or Pending pods whose class is neither mid, batch nor free.
"""

from __future__ import annotations

from collections.abc import Sequence

from apis.configuration import ColocationStrategy
from apis.priority import PRIORITY_BATCH, PRIORITY_FREE, PRIORITY_MID
from apis.records import frozen
from manager.noderesource.batch import host_app_usage, node_reserved
from manager.noderesource.inputs import ZERO, NodeMetricView, NodeView, PodView, Resources

_NOT_PROD = frozenset({PRIORITY_MID, PRIORITY_BATCH, PRIORITY_FREE})
_ACTIVE_PHASES = frozenset({"Running", "Pending"})


@frozen
class MidTerms:
    """Every term of the mid formula, as computed."""

    mode: str
    """``metrics`` or ``static``."""
    capacity: Resources
    threshold: Resources
    """capacity x midThresholdPercent / 100."""
    prod_reclaimable: Resources
    """From the NodeMetric (zero when absent)."""
    prod_reclaimable_reported: bool
    """Whether the NodeMetric had a prodReclaimableMetric."""
    node_unused: Resources
    """capacity - node usage (zero when the node usage is missing)."""
    node_usage_valid: bool
    """Whether the NodeMetric had both CPU and memory node usage."""
    system_used: Resources
    """systemUsage plus usage of prod host applications."""
    node_reserved: Resources
    """max(kubelet reservation, reservation annotation)."""
    prod_requests: Resources
    """Requests of the prod pods."""
    prod_pods: tuple[str, ...]
    """The prod pods counted (empty unless recorded)."""
    unallocated: Resources
    """max(capacity - max(systemUsed, nodeReserved) - prod requests, 0)."""
    reclaimable_part: Resources
    """max(min(prodReclaimable, threshold, nodeUnused), 0)."""
    unallocated_part: Resources
    """unallocated x midUnallocatedPercent / 100."""
    static_reserved: Resources
    """capacity x midStatic…ReservedPercent / 100 (static mode)."""
    result: Resources


def _ratio_of(value: int, percent: int) -> int:
    return int(float(value) * (float(percent) / 100.0))


def calculate_mid(
    strategy: ColocationStrategy,
    node: NodeView,
    metric: NodeMetricView,
    pods: Sequence[PodView],
    *,
    record: bool = True,
) -> MidTerms:
    """Mid CPU (milli-cores) and memory (bytes)."""
    cap = node.capacity
    threshold = Resources(
        _ratio_of(cap.cpu, strategy.mid_cpu_threshold_percent),
        _ratio_of(cap.memory, strategy.mid_memory_threshold_percent),
    )
    _, _, reserved, _ = node_reserved(node)
    host_used, _ = host_app_usage(metric, PRIORITY_MID, record=False)
    system_used = metric.system_usage + host_used
    if strategy.mid_reclaim_mode == "static":
        static = Resources(
            _ratio_of(cap.cpu, strategy.mid_static_cpu_reserved_percent),
            _ratio_of(cap.memory, strategy.mid_static_memory_reserved_percent),
        )
        return MidTerms(
            "static", cap, threshold, ZERO, metric.prod_reclaimable is not None, ZERO,
            metric.node_usage is not None, system_used, reserved, ZERO, (), ZERO, ZERO, ZERO,
            static, Resources(min(static.cpu, threshold.cpu), min(static.memory, threshold.memory)),
        )  # fmt: skip
    req_cpu = req_mem = 0
    names: list[str] = []
    for pod in pods:
        if pod.priority_class in _NOT_PROD or pod.phase not in _ACTIVE_PHASES:
            continue
        if pod.node_name and pod.node_name != node.name:
            continue
        req_cpu += pod.request.cpu
        req_mem += pod.request.memory
        if record:
            names.append(pod.key)
    prod_requests = Resources(req_cpu, req_mem)
    unallocated = (cap - system_used.max(reserved) - prod_requests).floor0()
    reclaim = metric.prod_reclaimable or ZERO
    unused = cap - metric.node_usage if metric.node_usage is not None else ZERO
    part = Resources(
        max(min(reclaim.cpu, threshold.cpu, unused.cpu), 0),
        max(min(reclaim.memory, threshold.memory, unused.memory), 0),
    )
    share = Resources(
        _ratio_of(unallocated.cpu, strategy.mid_unallocated_percent),
        _ratio_of(unallocated.memory, strategy.mid_unallocated_percent),
    )
    return MidTerms(
        mode="metrics",
        capacity=cap,
        threshold=threshold,
        prod_reclaimable=reclaim,
        prod_reclaimable_reported=metric.prod_reclaimable is not None,
        node_unused=unused,
        node_usage_valid=metric.node_usage is not None,
        system_used=system_used,
        node_reserved=reserved,
        prod_requests=prod_requests,
        prod_pods=tuple(names),
        unallocated=unallocated,
        reclaimable_part=part,
        unallocated_part=share,
        static_reserved=ZERO,
        result=part + share,
    )
