"""CPU suppress's rules: the node's CPU reservation, how the node's CPU usage splits between LS,
system and BE, what BE may use, the cfsQuota policy's quota, the CPUs BE may get and the cgroups
the cpuset policy writes (:mod:`koordlet.qos.cpusuppress` runs them; docs/qos-cpu.md has the
formulas).

Upstream: ``qosmanager/plugins/cpusuppress`` (``calculateBESuppressCPU``, ``adjustByCfsQuota``,
``CalculateFilterPodsUsed``) and ``util.GetNodeResourceReserved``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from apis.cpulist import format_cpulist, parse_cpulist
from apis.extension import KubeQOS, QoSClass
from apis.manager_keys import ANNOTATION_NODE_RESERVATION
from apis.nodetopo import ANNOTATION_NODE_SYSTEM_QOS_RESOURCE, parse_node_reservation
from apis.quantity import milli_value
from apis.records import frozen
from koordlet.qos.cpupicker import BE_MAX_INCREASE_RATIO, Processor, processors_from_node_info
from koordlet.qos.shared import cpus_of_annotation
from koordlet.statesinformer.model import HostAppInfo, PodInfo, WorkloadSnapshot
from koordlet.statesinformer.nodetopo import (
    TopoCPU,
    node_annotations,
    reserved_cpus,
    system_qos_exclusive_cpus,
)

logger = logging.getLogger(__name__)

CFS_PERIOD_US = 100_000
"""Koordinator's ``DefaultCPUCFSPeriod``: quotas are computed against a 100 ms period."""
BE_MIN_QUOTA_US = 2000
"""Koordinator's ``beMinQuota``: the cfsQuota policy never sets a smaller quota."""
QUOTA_DEAD_BAND_RATIO = 0.01
"""Koordinator's ``suppressBypassQuotaDeltaRatio``: quota changes under 1 % of the node skip."""


# Node reservation -------------------------------------------------------------------------------


def _cpu_of(resources: object) -> int | None:
    if not isinstance(resources, Mapping):
        return None
    raw = resources.get("cpu")
    if not isinstance(raw, str | int | float) or isinstance(raw, bool):
        return None
    try:
        return milli_value(raw)
    except ValueError:
        return None


def annotation_reserved_milli(annotations: Mapping[str, str]) -> int:
    """CPU of the node's ``node.koordinator.sh/reservation`` annotation in milli-cores, read by
    :func:`apis.nodetopo.parse_node_reservation`: the number of ``reservedCPUs`` when given, else
    ``resources.cpu``; 0 when absent or malformed: upstream's ``GetNodeReservationFromAnnotation``
    (pkg/util/node.go) returns nothing for a value ``json.Unmarshal`` or ``cpuset.Parse`` refuses.
    """
    try:
        reservation = parse_node_reservation(annotations.get(ANNOTATION_NODE_RESERVATION))
    except ValueError as exc:
        logger.debug("node annotation %s ignored: %s", ANNOTATION_NODE_RESERVATION, exc)
        return 0
    if reservation.reserved_cpus:
        return len(parse_cpulist(reservation.reserved_cpus)) * 1000
    return max(reservation.cpu_milli, 0)


def kubelet_reserved_milli(node: Mapping[str, Any]) -> int:
    """``status.capacity.cpu - status.allocatable.cpu`` (the kubelet's ``--system-reserved``,
    ``--kube-reserved`` and ``--reserved-cpus``), never negative; 0 unless both are known."""
    status = node.get("status")
    if not isinstance(status, Mapping):
        return 0
    capacity = _cpu_of(status.get("capacity"))
    allocatable = _cpu_of(status.get("allocatable"))
    if capacity is None or allocatable is None:
        return 0
    return max(capacity - allocatable, 0)


def node_reserved_milli(node: Mapping[str, Any] | None) -> int:
    """Upstream's ``GetNodeResourceReserved`` for CPU: the larger of the kubelet's reservation
    and the node annotation's; 0 without a Node object."""
    if not node:
        return 0
    meta = node.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    anno = annotation_reserved_milli(annotations) if isinstance(annotations, Mapping) else 0
    return max(kubelet_reserved_milli(node), anno)


# Arithmetic -------------------------------------------------------------------------------------


def is_be_pod(pod: PodInfo) -> bool:
    """Koordinator ``BE`` or Kubernetes ``BestEffort`` (upstream's ``NonBEPodFilter``, negated)."""
    return pod.qos is QoSClass.BE or pod.kube_qos is KubeQOS.BESTEFFORT


def is_be_host_app(app: HostAppInfo, be_dir: str) -> bool:
    """A ``BE`` host application whose cgroup sits under the besteffort QoS cgroup; any other
    host application counts as LS (upstream's ``NonBEHostAppFilter``, negated)."""
    return app.qos is QoSClass.BE and app.cgroup_dir.startswith(be_dir.rstrip("/") + "/")


@frozen
class Usage:
    """Where the node's CPU goes, in cores."""

    ls_pods: float
    """Pods that are not BE, plus pods the inventory does not know."""
    ls_host_apps: float
    """Host applications that are not BE under the besteffort cgroup."""
    system: float
    """``max(node - all pods - all host apps, 0, reserved)``."""
    be: float
    """BE pods and BE host applications (for the record only)."""


def split_usage(
    node_used: float,
    pod_used: Mapping[str, float],
    be_pods: Iterable[str],
    host_app_used: Mapping[str, float],
    be_host_apps: Iterable[str],
    reserved: float = 0.0,
) -> Usage:
    """Split ``node_used`` into LS pods, LS host apps, system and BE (upstream's
    ``CalculateFilterPodsUsed`` with the non-BE filters). ``pod_used`` is by UID (pods missing
    from the inventory count as LS), ``host_app_used`` by name."""
    be_pod_set = set(be_pods)
    be_app_set = set(be_host_apps)
    all_pods = sum(pod_used.values())
    be_pod_sum = sum(v for uid, v in pod_used.items() if uid in be_pod_set)
    all_apps = sum(host_app_used.values())
    be_app_sum = sum(v for name, v in host_app_used.items() if name in be_app_set)
    system = max(node_used - all_pods - all_apps, 0.0, reserved)
    return Usage(all_pods - be_pod_sum, all_apps - be_app_sum, system, be_pod_sum + be_app_sum)


def be_suppress_milli(
    capacity_milli: int, threshold_percent: int, usage: Usage, min_percent: int | None = None
) -> int:
    """Milli-cores BE may use: ``capacity x threshold% - LS pods - LS host apps - system``,
    floored at ``capacity x min%`` when a minimum is set. Each usage term is truncated to whole
    milli-cores first and the capacity share uses integer division, as upstream; the result may
    be negative (the callers floor it)."""
    milli = capacity_milli * threshold_percent // 100
    milli -= int(usage.ls_pods * 1000) + int(usage.ls_host_apps * 1000) + int(usage.system * 1000)
    if min_percent is not None:
        milli = max(milli, capacity_milli * min_percent // 100)
    return milli


def cfs_quota_target(suppress_milli: int, current: int | None, capacity_cores: int) -> int | None:
    """The BE quota (µs a 100 ms period) to write, or None to leave it (dead band).

    ``max(suppress x period, 2000)``; skipped when it differs from ``current`` by less than
    1 % of the node's CPUs unless it is the floor; raised by at most 10 % of the node's CPUs a
    round when a quota is set (``current`` None: unlimited, no step limit).
    """
    target = max(suppress_milli * CFS_PERIOD_US // 1000, BE_MIN_QUOTA_US)
    cur = -1 if current is None else current
    dead_band = capacity_cores * CFS_PERIOD_US * QUOTA_DEAD_BAND_RATIO
    if abs(target - cur) < dead_band and target != BE_MIN_QUOTA_US:
        return None
    max_step = capacity_cores * CFS_PERIOD_US * BE_MAX_INCREASE_RATIO
    if target - cur > max_step and current is not None:
        target = cur + int(max_step)
    return target


def exclusive_cpus(pods: Iterable[PodInfo]) -> tuple[frozenset[int], frozenset[int]]:
    """``(LSR CPUs, LSE CPUs)`` from the pods' resource-status annotations."""
    lsr: set[int] = set()
    lse: set[int] = set()
    for pod in pods:
        if pod.qos is QoSClass.LSR:
            lsr |= cpus_of_annotation(pod.annotations)
        elif pod.qos is QoSClass.LSE:
            lse |= cpus_of_annotation(pod.annotations)
    return frozenset(lsr), frozenset(lse)


def be_cgroup_dirs(snapshot: WorkloadSnapshot, be_dir: str) -> list[str]:
    """The besteffort QoS cgroup and every BE pod, container and BE host-app cgroup below it,
    parents before children."""
    prefix = be_dir.rstrip("/") + "/"
    dirs = {be_dir}
    for pod in snapshot.pods.values():
        if not pod.cgroup_dir.startswith(prefix):
            continue
        dirs.add(pod.cgroup_dir)
        dirs.update(c.cgroup_dir for c in pod.containers)
    for app in snapshot.host_apps:
        if app.present and is_be_host_app(app, be_dir):
            dirs.add(app.cgroup_dir)
    return sorted(dirs, key=lambda d: (d.count("/"), d))


# The CPUs BE may get ----------------------------------------------------------------------------


@frozen
class BECpus:
    """The node's CPUs as one round of CPU suppress sees them, and the inputs they were computed
    from (:func:`be_cpus`)."""

    snapshot: WorkloadSnapshot
    info: object
    """The ``node_info`` value of the metric cache."""
    reservation: str | None
    """The Node's ``node.koordinator.sh/reservation``."""
    system_qos: str | None
    """The Node's ``node.koordinator.sh/system-qos-resource``."""
    processors: tuple[Processor, ...]
    lsr: frozenset[int]
    """CPUs of the LSR pods' resource-status cpusets."""
    excluded: frozenset[int]
    """CPUs BE never gets, the LSE pods' among them (:func:`never_be_cpus`)."""
    detail: Mapping[str, str]
    """Their cpulists, for the report."""


def be_cpus(
    kept: BECpus | None, snapshot: WorkloadSnapshot, info: object, node: Mapping[str, Any] | None
) -> BECpus:
    """The processors, the LSR and LSE pods' CPUs and the CPUs BE never gets; ``kept`` (the last
    round's) while the snapshot and the ``node_info`` value are the same objects (both are
    replaced, never changed) and the Node's two annotations are equal."""
    annotations = node_annotations(node)
    reservation = annotations.get(ANNOTATION_NODE_RESERVATION)
    system_qos = annotations.get(ANNOTATION_NODE_SYSTEM_QOS_RESOURCE)
    if (
        kept is not None
        and kept.snapshot is snapshot
        and kept.info is info
        and kept.reservation == reservation
        and kept.system_qos == system_qos
    ):
        return kept
    processors = processors_from_node_info(info)
    lsr, lse = exclusive_cpus(snapshot.pods.values())
    excluded, detail = never_be_cpus(annotations, processors, lse)
    return BECpus(snapshot, info, reservation, system_qos, processors, lsr, excluded, detail)


def never_be_cpus(
    annotations: Mapping[str, str], processors: Sequence[Processor], lse: frozenset[int]
) -> tuple[frozenset[int], dict[str, str]]:
    """CPUs BE never gets: LSE pods', the reservation's, exclusive SYSTEM QoS (upstream's
    ``adjustByCPUSet`` and ``calcBECPUSet``), and their cpulists for the report."""
    # the topology matters only to a reservation by CPU count: not built every round for none
    topo = (
        tuple(TopoCPU(p.cpu_id, p.core_id, p.socket_id, p.numa_node) for p in processors)
        if annotations.get(ANNOTATION_NODE_RESERVATION)
        else ()
    )
    reserved = reserved_cpus(annotations, topo)
    system = system_qos_exclusive_cpus(annotations)
    detail = {
        "lse": format_cpulist(lse),
        "reserved": format_cpulist(reserved),
        "system_qos": format_cpulist(system),
    }
    return lse | reserved | system, detail
