"""A snapshot kept current by informers (list-then-watch through ``kubeclient``).

:class:`InformedSnapshot` runs one :class:`~kubeclient.informer.Informer` per kind a decision
reads: Nodes, Pods, NodeMetrics, NodeResourceTopologies, ElasticQuotas, ElasticQuotaProfiles,
PodGroups, Reservations, Devices, PriorityClasses, and for kube-scheduler's in-tree plugins and
preemption Namespaces, PersistentVolumeClaims, PersistentVolumes and PodDisruptionBudgets, and
applies every event to one
:class:`~scheduler_plugins.snapshot.Snapshot` on the event loop (where the extender's handlers
run too, so there is no lock). A pod the scheduler assumed is replaced by the API server's
version once its binding is seen; an unbound copy arriving before that leaves it assumed
(``snapshot.py``). ``managedFields`` are dropped as objects arrive
(:func:`~kubeclient.informer.strip_managed_fields`), and the first lists come from the API
server's watch cache (``kubeclient/informer.py``).

**Readiness.** No decision (a term's scheduling loop, an extender verb) is made until every kind
has been listed once: an ElasticQuota not listed yet is a quota without a max, and pods bound
against it overrun it. :meth:`InformedSnapshot.not_ready` names the kinds still missing, with
the last error (``403 Forbidden``...); a kind whose watch fell behind (410 Gone) holds every
decision again until its relist is applied. A kind the cluster does not serve (404 on the list:
a CRD not installed) counts as listed and empty, with a warning; its list is retried on the
informer's backoff, so installing the CRD later brings its objects in.

An ElasticQuotaProfile (``quota.koordinator.sh/v1alpha1``, namespaced) is checked as it arrives
(a profile the ElasticQuota plugin could not read is logged, counted in ``rejected`` and left
out, the previous version staying in force) and kept raw in ``Snapshot.quota_profiles`` by
``namespace/name``; every change bumps the snapshot's generation, so the plugin re-reads its
trees, pools and pool totals at the next cycle.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kubeclient.client import KubeClient, Obj
from kubeclient.informer import Informer, strip_managed_fields, waiting_for
from kubeclient.resources import (
    DEVICES,
    ELASTIC_QUOTA_PROFILES,
    ELASTIC_QUOTAS,
    NAMESPACES,
    NODE_METRICS,
    NODE_RESOURCE_TOPOLOGIES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    POD_DISRUPTION_BUDGETS,
    POD_GROUPS,
    PODS,
    PRIORITY_CLASSES,
    RESERVATIONS,
    Resource,
)
from scheduler_plugins.clusterobjects import (
    parse_budget,
    parse_claim,
    parse_namespace_labels,
    parse_volume,
)
from scheduler_plugins.errors import InputError
from scheduler_plugins.nodeviews import parse_node_metric, parse_nrt
from scheduler_plugins.plugins.quotaprofile import parse_profile
from scheduler_plugins.snapshot import ALL, PodInfo, Snapshot, parse_node, parse_pod

if TYPE_CHECKING:
    from scheduler_plugins.reservationstatus import OwnerSync

logger = logging.getLogger(__name__)

Apply = Callable[[Obj, bool], None]
"""Applies one object to the snapshot (``True``: it was deleted)."""

KINDS: tuple[Resource, ...] = (
    NODES,
    PODS,
    NODE_METRICS,
    NODE_RESOURCE_TOPOLOGIES,
    ELASTIC_QUOTAS,
    ELASTIC_QUOTA_PROFILES,
    POD_GROUPS,
    RESERVATIONS,
    DEVICES,
    PRIORITY_CLASSES,
    NAMESPACES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    POD_DISRUPTION_BUDGETS,
)
"""What a decision reads, in the order the informers start; every one is waited for."""


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _ns_name(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def _checked_profile(obj: Obj) -> dict[str, Any]:
    """The profile as the snapshot keeps it (raw), once the plugin's parser has accepted it."""
    parse_profile(obj)
    return dict(obj)


class InformedSnapshot:
    """A :class:`Snapshot` fed by informers."""

    def __init__(self, client: KubeClient, kinds: Sequence[Resource] = KINDS) -> None:
        self.snapshot = Snapshot()
        self.informers = [Informer(client, res, transform=strip_managed_fields) for res in kinds]
        self.rejected = 0
        """Objects that could not be read (logged and skipped)."""
        self.on_pending: Callable[[PodInfo], None] | None = None
        """Called with every pending pod added or changed (the standalone scheduler's queue)."""
        for informer in self.informers:
            self._subscribe(informer)

    def _subscribe(self, informer: Informer) -> None:
        apply = self._handler(informer.resource)

        def guarded(obj: Obj, deleted: bool) -> None:
            try:
                apply(obj, deleted)
            except InputError as err:
                self.rejected += 1
                logger.warning("%s skipped: %s", informer.resource.kind, err)

        def on_add(obj: Obj) -> None:
            guarded(obj, False)

        def on_update(_old: Obj, new: Obj) -> None:
            guarded(new, False)

        def on_delete(obj: Obj) -> None:
            guarded(obj, True)

        informer.add_handler(on_add=on_add, on_update=on_update, on_delete=on_delete)

    def _handler(self, res: Resource) -> Apply:
        snap = self.snapshot

        def node(obj: Obj, deleted: bool) -> None:
            if deleted:
                snap.remove_node(_name(obj))
            else:
                snap.upsert_node(parse_node(obj, "Node", _name(obj)))

        def pod(obj: Obj, deleted: bool) -> None:
            info = parse_pod(obj, "Pod", _ns_name(obj))
            phase = (obj.get("status") or {}).get("phase")
            if deleted or phase in ("Succeeded", "Failed"):
                snap.remove_pod(info.uid, hint=info.node_name)
            else:
                snap.upsert_pod(info)
                if not info.node_name and self.on_pending is not None:
                    self.on_pending(info)

        def keyed(
            store: dict[str, Any],
            key: Callable[[Obj], str],
            parse: Callable[[Obj], Any],
            per_node: bool = False,
        ) -> Apply:
            def apply(obj: Obj, deleted: bool) -> None:
                k = key(obj)
                if deleted:
                    store.pop(k, None)
                else:
                    store[k] = parse(obj)
                snap.touch(k if per_node else ALL)

            return apply

        if res is NODES:
            return node
        if res is PODS:
            return pod
        # NodeMetrics, NRTs and Devices are one node's each (named after it): their changes
        # re-index that node only, as a pod bound there does (koordlets report every minute: a
        # change not one node's would rebuild every plugin's indexes several times a second)
        if res is NODE_METRICS:
            return keyed(
                snap.node_metrics,
                _name,
                lambda o: parse_node_metric(o, "NodeMetric", _name(o)),
                per_node=True,
            )
        if res is NODE_RESOURCE_TOPOLOGIES:
            return keyed(
                snap.topologies,
                _name,
                lambda o: parse_nrt(o, "NodeResourceTopology", _name(o)),
                per_node=True,
            )
        if res is ELASTIC_QUOTAS:
            return keyed(snap.quotas, _name, dict)
        if res is ELASTIC_QUOTA_PROFILES:
            return keyed(snap.quota_profiles, _ns_name, _checked_profile)
        if res is POD_GROUPS:
            return keyed(snap.pod_groups, _ns_name, dict)
        if res is RESERVATIONS:
            return keyed(snap.reservations, _name, dict)
        if res is PRIORITY_CLASSES:
            return keyed(snap.priority_classes, _name, dict)
        if res is NAMESPACES:
            return keyed(
                snap.namespaces, _name, lambda o: parse_namespace_labels(o, "Namespace", _name(o))
            )
        if res is PERSISTENT_VOLUME_CLAIMS:
            return keyed(
                snap.claims, _ns_name, lambda o: parse_claim(o, "PersistentVolumeClaim", _name(o))
            )
        if res is PERSISTENT_VOLUMES:
            return keyed(
                snap.volumes, _name, lambda o: parse_volume(o, "PersistentVolume", _name(o))
            )
        if res is POD_DISRUPTION_BUDGETS:
            return keyed(
                snap.budgets, _ns_name, lambda o: parse_budget(o, "PodDisruptionBudget", _name(o))
            )
        return keyed(snap.devices, _name, dict, per_node=True)

    async def run(self) -> None:
        """Run every informer until cancelled."""
        async with asyncio.TaskGroup() as group:
            for informer in self.informers:
                group.create_task(informer.run(), name=f"scheduler-informer-{informer.name}")

    def watch_owners(self, sync: OwnerSync) -> None:
        """Tell ``sync`` of every pod and Reservation added, changed or deleted."""
        for informer in self.informers:
            if informer.resource is RESERVATIONS:
                informer.add_handler(
                    on_add=sync.reservation_changed,
                    on_update=lambda _old, new: sync.reservation_changed(new),
                )
            elif informer.resource is PODS:
                informer.add_handler(
                    on_add=sync.pod_changed,
                    on_update=lambda _old, new: sync.pod_changed(new),
                    on_delete=sync.pod_changed,
                )

    def not_ready(self) -> list[str]:
        """What a decision waits for: each kind not listed yet (with its last error) or
        relisting after a 410; empty when every kind is current (see the module docstring)."""
        return waiting_for(self.informers)

    async def wait_synced(self, timeout: float) -> bool:  # noqa: ASYNC109 - a bounded wait is the API
        """Wait up to ``timeout`` seconds for every kind's first list (or its 404: not
        served); whether all came. :meth:`not_ready` then says what is missing."""
        results = await asyncio.gather(*(i.wait_settled(timeout) for i in self.informers))
        return all(results) and not self.not_ready()
