"""``CPUSetAllocator``: containers' cpusets from the scheduler's allocation, and the LS share pool.

Upstream: ``pkg/koordlet/runtimehooks/hooks/cpuset/cpuset.go`` and ``rule.go``
(``getContainerCPUSet``), ``pkg/util`` ``IsPodCfsQuotaNeedUnset``. For a container
(``PreCreateContainer``, ``PreUpdateContainerResources``, the reconciler):

1. a pod whose ``scheduling.koordinator.sh/resource-status`` has a ``cpuset`` (LSE, LSR: the
   scheduler bound it to those CPUs) gets that cpuset, and its CFS quota unset (-1): its CPUs are
   its own, a quota would only throttle it (koordinator#489);
2. a pod whose ``resource-status`` names ``numaNodeResources`` gets the share pools of those NUMA
   nodes;
3. an LS pod gets every share pool;
4. anything else is left alone: BE pods (their cpusets are CPU suppress's, through the besteffort
   cgroup), SYSTEM pods (upstream reads a ``system-qos-resource`` the NRT of this koordlet does not
   carry), and pods without a Koordinator class unless the kubelet's CPU manager policy is known
   to be ``none`` (upstream gives them the share pools under ``none``; under ``static`` the
   kubelet's own exclusive CPUs must stay, and a policy nobody told us is treated as ``static``).

For the pod (``PreRunPodSandbox``, the reconciler) only rule 1's quota: -1 on the pod's cgroup.

The share pools are the node's (:mod:`koordlet.runtimehooks.sharepool`: every NUMA node's CPUs
less the kubelet's reserved ones and those of LSE/LSR pods); while they are unknown (no node-info
yet) rules 2 and 3 change nothing. A malformed ``resource-status`` leaves the pod unchanged with a
Warning Event (:class:`~koordlet.runtimehooks.errors.BadPodInput`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from apis.cpulist import format_cpulist
from apis.extension import LABEL_POD_QOS, KubeQOS, QoSClass
from koordlet.runtimehooks.cgroupparent import kube_qos_of
from koordlet.runtimehooks.model import Change, ContainerRequest, PodRequest, Resources
from koordlet.runtimehooks.sharepool import CPUSetRule, parse_resource_status

if TYPE_CHECKING:
    from koordlet.runtimehooks.table import HookContext

NAME = "CPUSetAllocator"
"""Upstream's plugin name."""
UNLIMITED = -1
POLICY_NONE = "none"
POLICY_STATIC = "static"
"""The kubelet's CPU manager policies (upstream ``KubeletCPUManagerPolicyNone``/``Static``)."""


class CPUSetAllocator:
    """The hook; ``rule`` gives the node's share pools and kubelet policy, read at each call."""

    def __init__(self, rule: Callable[[], CPUSetRule]) -> None:
        self._rule = rule

    def node_inputs(self) -> object:
        """What :meth:`container` reads besides the request: the share pools and the kubelet's
        policy (:meth:`pod` reads the request only)."""
        return self._rule()

    def pod(self, req: PodRequest) -> Change | None:
        status = parse_resource_status(req.annotations)
        if not status.cpus:
            return None
        return Change(
            resources=Resources(cfs_quota=UNLIMITED),
            reason=f"pod bound to CPUs {format_cpulist(status.cpus)}: quota unset",
        )

    def container(self, req: ContainerRequest) -> Change | None:
        status = parse_resource_status(req.pod_annotations)
        if status.cpus:
            return Change(
                resources=Resources(cpuset_cpus=format_cpulist(status.cpus), cfs_quota=UNLIMITED),
                reason=f"resource-status cpuset {format_cpulist(status.cpus)}; quota unset",
            )
        qos = req.pod_labels.get(LABEL_POD_QOS, "")
        unclassed = qos == "" and kube_qos_of(req.pod_cgroup_parent) is not KubeQOS.BESTEFFORT
        if not (status.numa_nodes or qos == QoSClass.LS or unclassed):
            return None
        rule = self._rule()
        pools = rule.share_pools
        if pools is None:
            return None
        if status.numa_nodes:
            cpus = _union(p.cpus for p in pools if p.node in status.numa_nodes)
            return _pool_change(cpus, f"share pools of NUMA nodes {list(status.numa_nodes)}")
        if qos == QoSClass.LS:
            return _pool_change(_union(p.cpus for p in pools), "LS: every share pool")
        if rule.kubelet_policy == POLICY_NONE:
            return _pool_change(
                _union(p.cpus for p in pools), "no QoS class, kubelet policy none: share pools"
            )
        return None


def _union(sets: Iterable[frozenset[int]]) -> frozenset[int]:
    out: set[int] = set()
    for s in sets:
        out |= s
    return frozenset(out)


def _pool_change(cpus: frozenset[int], why: str) -> Change | None:
    if not cpus:
        return None  # an empty cpuset would refuse every task: leave the container as it is
    return Change(resources=Resources(cpuset_cpus=format_cpulist(cpus)), reason=why)


def build(ctx: HookContext) -> CPUSetAllocator:
    """The table's factory (row ``CPUSetAllocator``)."""
    return CPUSetAllocator(ctx.cpuset_rule)
