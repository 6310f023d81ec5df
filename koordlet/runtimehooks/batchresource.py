"""``BatchResource``: the cgroup settings of batch (and mid) pods from their extended resources.

The kubelet treats ``kubernetes.io/batch-cpu`` and ``batch-memory`` as opaque, so a BE pod runs
in the BestEffort cgroup with the minimum cpu.shares, no CFS quota and no memory limit. This hook
gives it the ones its extended resources ask for, at pod level (``PreRunPodSandbox``: the
framework writes the pod's cgroup) and container level (``PreCreateContainer``,
``PreUpdateContainerResources``: the runtime applies the adjustment). Upstream:
``pkg/koordlet/runtimehooks/hooks/batchresource/batch_resource.go``:

- cpu.shares from the CPU request in milli-cores, as Kubernetes' ``MilliCPUToShares``
  (``milli * 1024 / 1000``, at least 2, at most 262144); at pod level the sum of the containers'
  requests;
- cpu.cfs_quota_us from the CPU limit: ``milli * period / 1000`` (the request's period, else
  100000 µs), at least 1000; -1 (unlimited) without a limit, and at pod level as soon as one
  container has none; -1 too when the NodeSLO suppresses BE by CFS quota
  (``resourceUsedThresholdWithBE.enable`` and ``cpuSuppressPolicy: cfsQuota``: the BestEffort
  QoS cgroup's quota must stay above its children's; upstream ``rule.go``);
- memory.limit_in_bytes from the memory limit; -1 without one, and at pod level as soon as one
  container has none.

BE pods (label ``koordinator.sh/qosClass: BE``) use ``batch-cpu``/``batch-memory``, as upstream.
Mid pods (any other QoS whose spec names ``mid-cpu`` or ``mid-memory``) get the same settings
from ``mid-cpu``/``mid-memory``: ours, with upstream's quantity rules
(``GetMidMilliCPUFromResourceList``). A pod without the annotation is left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from apis.extension import LABEL_POD_QOS, QoSClass
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY
from apis.quantity import Quantity
from apis.slo_inforce import NodeSLOInForce
from apis.slo_strategies import CPUSuppressPolicy
from koordlet.runtimehooks.extresources import (
    ContainerResources,
    ExtendedResourceSpec,
    memory_bytes,
    milli_cpu,
    parse_spec,
)
from koordlet.runtimehooks.model import Change, ContainerRequest, PodRequest, Resources
from koordlet.system.knobs import CFS_QUOTA_MIN_US, CPU_SHARES_MAX, CPU_SHARES_MIN

if TYPE_CHECKING:
    from koordlet.runtimehooks.table import HookContext

logger = logging.getLogger(__name__)

NAME = "BatchResource"
"""Upstream's plugin name."""
SHARES_PER_CPU = 1024
"""Kubernetes' ``SharesPerCPU``."""
CFS_BASE_PERIOD_US = 100_000
"""Upstream's ``CFSBasePeriodValue``: the period when the request carries none."""
UNLIMITED = -1


def milli_cpu_to_shares(milli: int) -> int:
    """Kubernetes' ``MilliCPUToShares``: 2 for nothing, else ``milli * 1024 / 1000`` clamped to
    2..262144."""
    if milli <= 0:
        return CPU_SHARES_MIN
    return max(CPU_SHARES_MIN, min(CPU_SHARES_MAX, milli * SHARES_PER_CPU // 1000))


def milli_cpu_to_quota(milli: int, period: int) -> int:
    """The CFS quota of a CPU limit: -1 without one, else ``milli * period / 1000``, at least
    1000 µs (upstream ``CFSQuotaMinValue``)."""
    if milli <= 0:
        return UNLIMITED
    quota = milli * period // 1000
    if quota <= 0:
        return UNLIMITED
    return max(quota, CFS_QUOTA_MIN_US)


class _Tier:
    """Which extended resources a pod is sized by."""

    def __init__(self, name: str, cpu: str, memory: str, *, quota_rule: bool) -> None:
        self.name, self.cpu, self.memory, self.quota_rule = name, cpu, memory, quota_rule


BATCH = _Tier("batch", BATCH_CPU, BATCH_MEMORY, quota_rule=True)
MID = _Tier("mid", MID_CPU, MID_MEMORY, quota_rule=False)


def _tier(labels: Mapping[str, str], spec: ExtendedResourceSpec) -> _Tier | None:
    if labels.get(LABEL_POD_QOS) == QoSClass.BE:
        return BATCH
    for c in spec.containers.values():
        if any(r in (MID_CPU, MID_MEMORY) for r in (*c.requests, *c.limits)):
            return MID
    return None


class BatchResource:
    """The hook; ``node_slo`` gives the NodeSLO in force (read at each call; the states source
    parsed it once, each section over its last good value)."""

    def __init__(self, node_slo: Callable[[], NodeSLOInForce]) -> None:
        self._node_slo = node_slo

    # The rule -------------------------------------------------------------------------------

    def cfs_quota_enabled(self) -> bool:
        """False while the NodeSLO suppresses BE by CFS quota (upstream ``parseRule``)."""
        strategy = self._node_slo().strategies.resource_used_threshold_with_be
        return not (strategy.enable and strategy.cpu_suppress_policy is CPUSuppressPolicy.CFS_QUOTA)

    def node_inputs(self) -> object:
        """What :meth:`pod` and :meth:`container` read besides the request: the quota rule."""
        return self.cfs_quota_enabled()

    # Pod level ------------------------------------------------------------------------------

    def pod(self, req: PodRequest) -> Change | None:
        spec = parse_spec(req.annotations)
        if spec is None:
            return None
        tier = _tier(req.labels, spec)
        if tier is None:
            return None
        containers = list(spec.containers.values())
        return self._change(
            tier,
            "pod",
            period=req.resources.cfs_period or CFS_BASE_PERIOD_US,
            request=sum(max(milli_cpu(c.requests.get(tier.cpu)), 0) for c in containers),
            cpu_limit=_pod_limit(containers, tier.cpu, milli_cpu),
            memory=_pod_limit(containers, tier.memory, memory_bytes),
            quota_is="limit quota",
        )

    # Container level ------------------------------------------------------------------------

    def container(self, req: ContainerRequest) -> Change | None:
        spec = parse_spec(req.pod_annotations)
        if spec is None:
            return None
        tier = _tier(req.pod_labels, spec)
        own = spec.containers.get(req.container_name)
        if tier is None or own is None:
            return None
        return self._change(
            tier,
            f"container {req.container_name}",
            period=req.resources.cfs_period or CFS_BASE_PERIOD_US,
            request=max(milli_cpu(own.requests.get(tier.cpu)), 0),
            cpu_limit=milli_cpu(own.limits.get(tier.cpu)),
            memory=memory_bytes(own.limits.get(tier.memory)),
            quota_is="quota",
        )

    # Both levels ----------------------------------------------------------------------------

    def _change(
        self,
        tier: _Tier,
        what: str,
        *,
        period: int,
        request: int,
        cpu_limit: int,
        memory: int,
        quota_is: str,
    ) -> Change:
        """The settings of ``what`` (the pod or one container): shares from the ``request``
        (milli-CPU), the quota from ``cpu_limit`` (milli-CPU) unless the quota rule holds it
        at -1, and the memory limit from ``memory`` (bytes); -1 where there is none.
        ``quota_is`` names the quota in the audited reason."""
        quota = UNLIMITED
        if not tier.quota_rule or self.cfs_quota_enabled():
            quota = milli_cpu_to_quota(cpu_limit, period)
        return Change(
            resources=Resources(
                cpu_shares=milli_cpu_to_shares(request),
                cfs_quota=quota,
                cfs_period=period if quota > 0 else None,
                memory_limit=memory if memory > 0 else UNLIMITED,
            ),
            reason=f"{tier.name} {what}: cpu request {request}m, {quota_is} {quota}, "
            f"memory limit {memory}",
        )


def _pod_limit(
    containers: list[ContainerResources], resource: str, value: Callable[[Quantity | None], int]
) -> int:
    """Sum of the containers' limits; -1 as soon as one container has none (upstream: "pod
    unlimited once a container is unlimited")."""
    total = 0
    for c in containers:
        if not c.has_limits:
            return UNLIMITED
        limit = value(c.limits.get(resource))
        if limit <= 0:
            return UNLIMITED
        total += limit
    return total


def build(ctx: HookContext) -> BatchResource:
    """The table's factory (row ``BatchResource``)."""
    return BatchResource(ctx.node_slo)
