"""The workload of a pod: its expected replicas, its pods, how many of them may move at once.

:func:`pods_for_ref` is upstream's ``ControllerFinder.GetPodsForRef``
(``controllerfinder/pods_finder.go``): for a ReplicaSet its own ``spec.replicas`` and the pods it
owns; for a StatefulSet or ReplicationController the same; for a Deployment (any other kind) its
replicas and the pods of the ReplicaSets it controls (its own pods when it has none). A workload
the cluster does not have gives no pods and 0 replicas, so its pods never move.

:func:`max_unavailable` is ``util.GetMaxUnavailable`` as of v1.6: the configured integer or
percentage of the replicas (rounded down); unset (or 0): 10 % above 10 replicas, 2 from 4 to 10,
else 1; a share rounded down to 0 is 1 (v1.6); never more than the replicas.

:class:`RateLimiter` is ``golang.org/x/time/rate.Limiter`` with a burst of 1, as the object
limiters use it: ``maxMigrating`` tokens per ``duration``, one taken per eviction.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from apis.descheduler_keys import (
    KIND_DEPLOYMENT,
    KIND_REPLICA_SET,
    KIND_REPLICATION_CONTROLLER,
    KIND_STATEFUL_SET,
)
from descheduler.cluster import Cluster, Workload
from descheduler.podfacts import OwnerRef
from scheduler_plugins.snapshot import PodInfo


def scaled(value: int | str, total: int) -> int:
    """``intstr.GetScaledValueFromIntOrPercent(value, total, roundUp=false)``."""
    if isinstance(value, int):
        return value
    return math.floor(int(value.rstrip("%")) * total / 100)


@functools.lru_cache(maxsize=4096)
def max_unavailable(replicas: int, value: int | str | None) -> int:
    """See the module docstring."""
    if value is None or value == 0:
        value = "10%" if replicas > 10 else 2 if 4 <= replicas <= 10 else 1
    result = scaled(value, replicas)
    if result < 1:  # v1.6: a share rounded down to nothing is one pod
        result = 1
    return min(result, replicas)


def workload_of(cluster: Cluster, kind: str, namespace: str, name: str) -> Workload | None:
    return cluster.workloads.get((kind, namespace, name))


def owner_uids_for_ref(cluster: Cluster, ref: OwnerRef, namespace: str) -> tuple[list[str], int]:
    """The uids whose pods are the workload's, and its replicas (see the module docstring)."""
    w = workload_of(cluster, ref.kind, namespace, ref.name)
    if w is None:
        return [], 0
    if ref.kind in (KIND_REPLICA_SET, KIND_STATEFUL_SET, KIND_REPLICATION_CONTROLLER):
        return [w.uid], w.replicas
    sets = [rs for rs in cluster.replica_sets_of(w.uid) if rs.namespace == namespace]
    if not sets:
        return [w.uid], w.replicas
    return [rs.uid for rs in sets], w.replicas


def pods_for_ref(cluster: Cluster, ref: OwnerRef, namespace: str) -> tuple[list[PodInfo], int]:
    """See the module docstring."""
    uids, replicas = owner_uids_for_ref(cluster, ref, namespace)
    pods: list[PodInfo] = []
    for uid in uids:
        pods.extend(cluster.pods_of_owner(uid))
    return pods, replicas


def replicas_for_ref(cluster: Cluster, ref: OwnerRef, namespace: str) -> int:
    """The replicas :func:`pods_for_ref` gives, without listing the pods."""
    return owner_uids_for_ref(cluster, ref, namespace)[1]


def unavailable_for_ref(cluster: Cluster, ref: OwnerRef, namespace: str) -> tuple[set[str], int]:
    """``namespace/name`` of the workload's pods that are terminating or not Ready, and its
    replicas."""
    uids, replicas = owner_uids_for_ref(cluster, ref, namespace)
    if len(uids) == 1:
        return cluster.unavailable_of_owner(uids[0]), replicas
    out: set[str] = set()
    for uid in uids:
        out |= cluster.unavailable_of_owner(uid)
    return out, replicas


def expected_scale(cluster: Cluster, ref: OwnerRef, namespace: str) -> int:
    """``GetExpectedScaleForPod``: the replicas of the pod's controller, a ReplicaSet's
    Deployment's when it has one; 0 when unknown or being deleted."""
    w = workload_of(cluster, ref.kind, namespace, ref.name)
    if w is not None and w.kind == KIND_REPLICA_SET and w.controller_kind == KIND_DEPLOYMENT:
        w = workload_of(cluster, KIND_DEPLOYMENT, namespace, w.controller_name) or w
    if w is None or w.deleting:
        return 0
    return w.replicas


class RateLimiter:
    """A token bucket of burst 1 refilled at ``rate`` tokens a second (see the docstring)."""

    def __init__(self, rate: float, clock: Callable[[], float]) -> None:
        self.rate = rate
        self.clock = clock
        self._tokens = 1.0
        self._at = clock()

    def tokens(self) -> float:
        now = self.clock()
        return min(1.0, self._tokens + max(now - self._at, 0.0) * self.rate)

    def allow(self) -> bool:
        """``AllowN(now, 1)``: take a token if one is there."""
        tokens = self.tokens()
        self._at = self.clock()
        if tokens >= 1.0:
            self._tokens = tokens - 1.0
            return True
        self._tokens = tokens
        return False

    def set_rate(self, rate: float) -> None:
        self._tokens = self.tokens()
        self._at = self.clock()
        self.rate = rate
