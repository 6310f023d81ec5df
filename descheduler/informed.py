"""A :class:`~descheduler.cluster.Cluster` kept current by informers.

The scheduler's :class:`~scheduler_plugins.informed.InformedSnapshot` keeps Nodes, Pods,
Reservations and PriorityClasses in its snapshot (the one the scheduler's filters read for
``nodeFit``); beside it we inform NodeMetrics (with their system usage), PodDisruptionBudgets,
PodMigrationJobs and the workloads (ReplicaSets, Deployments, StatefulSets,
ReplicationControllers), and keep the pods by name and the nodes' readiness current. Every event
is applied on the event loop; an object that cannot be read is logged and skipped (its previous
version stays). Decisions wait until every kind has listed (:meth:`not_ready`, as the scheduler
gates its own): a descheduler that has not seen the PodMigrationJobs would over-commit its
limits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from apis import nodemetric
from apis.podmigrationjob import PodMigrationJob, parse_job
from apis.slo import SchemaError
from descheduler.cluster import (
    Cluster,
    node_ready,
    parse_pdb,
    parse_workload,
    usage_report,
)
from descheduler.errors import InputError
from kubeclient.client import KubeClient, Obj
from kubeclient.informer import Informer, name_of, namespaced_name, waiting_for
from kubeclient.resources import (
    DEPLOYMENTS,
    NODE_METRICS,
    NODES,
    POD_DISRUPTION_BUDGETS,
    POD_MIGRATION_JOBS,
    PODS,
    PRIORITY_CLASSES,
    REPLICA_SETS,
    REPLICATION_CONTROLLERS,
    RESERVATIONS,
    STATEFUL_SETS,
    Resource,
)
from scheduler_plugins.errors import InputError as SchedulerInputError
from scheduler_plugins.informed import InformedSnapshot

logger = logging.getLogger(__name__)

SCHEDULER_KINDS = (NODES, PODS, RESERVATIONS, PRIORITY_CLASSES)
"""What the scheduler's informed snapshot keeps for us."""
OWN_KINDS = (
    NODE_METRICS,
    POD_DISRUPTION_BUDGETS,
    POD_MIGRATION_JOBS,
    REPLICA_SETS,
    DEPLOYMENTS,
    STATEFUL_SETS,
    REPLICATION_CONTROLLERS,
)


class InformedCluster:
    """See the module docstring."""

    def __init__(self, client: KubeClient) -> None:
        self.sched_view = InformedSnapshot(client, SCHEDULER_KINDS)
        self.cluster = Cluster(sched=self.sched_view.snapshot, live=True)
        self.informers = [Informer(client, res) for res in OWN_KINDS]
        self.rejected = 0
        """Objects that could not be read."""
        self.on_job: (
            Callable[[str, PodMigrationJob | None, PodMigrationJob | None], None] | None
        ) = None
        """Called with (event, old, new) for every PodMigrationJob change (the controller's
        queue): ``added``, ``updated``, ``deleted``."""
        self.on_change: Callable[[], None] | None = None
        """Called after any pod or Reservation change (wakes the controller)."""
        for informer in self.sched_view.informers:
            if informer.resource is NODES:
                informer.add_handler(
                    on_add=self._node,
                    on_update=lambda _o, n: self._node(n),
                    on_delete=self._node_gone,
                )
            elif informer.resource is PODS:
                informer.add_handler(
                    on_add=self._pod, on_update=lambda _o, n: self._pod(n), on_delete=self._pod_gone
                )
            elif informer.resource is RESERVATIONS:
                informer.add_handler(
                    on_add=lambda _o: self._changed(),
                    on_update=lambda _o, _n: self._changed(),
                    on_delete=lambda _o: self._changed(),
                )
        for informer in self.informers:
            self._subscribe(informer)

    # -- handlers --------------------------------------------------------------------------------
    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _node(self, obj: Obj) -> None:
        name = name_of(obj)
        if node_ready(obj):
            self.cluster.not_ready.discard(name)
        else:
            self.cluster.not_ready.add(name)

    def _node_gone(self, obj: Obj) -> None:
        self.cluster.not_ready.discard(name_of(obj))

    def _pod(self, obj: Obj) -> None:
        key = namespaced_name(obj)
        uid = str((obj.get("metadata") or {}).get("uid") or key)
        found = next((p for p in self._candidates(obj) if p.uid == uid), None)
        if found is None:
            self.cluster.unindex_pod(key)
        else:
            self.cluster.index_pod(found)
        self._changed()

    def _candidates(self, obj: Obj) -> list[Any]:
        snap = self.cluster.sched
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        if node and node in snap.nodes:
            pod = snap.nodes[node].pods.get(uid)
            return [pod] if pod is not None else []
        pod = snap.pending_pods.get(uid)
        if pod is not None:
            return [pod]
        return [p for waiting in snap.orphans.values() for p in waiting.values() if p.uid == uid]

    def _pod_gone(self, obj: Obj) -> None:
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        self.cluster.unindex_pod(namespaced_name(obj), uid)
        self._changed()

    def _subscribe(self, informer: Informer) -> None:
        apply = self._apply(informer.resource)

        def guarded(old: Obj | None, obj: Obj, deleted: bool) -> None:
            try:
                apply(old, obj, deleted)
            except (InputError, SchedulerInputError, SchemaError) as err:
                self.rejected += 1
                logger.warning("%s skipped: %s", informer.resource.kind, err)

        informer.add_handler(
            on_add=lambda o: guarded(None, o, False),
            on_update=lambda old, new: guarded(old, new, False),
            on_delete=lambda o: guarded(None, o, True),
        )

    def _apply(self, res: Resource) -> Callable[[Obj | None, Obj, bool], None]:
        c = self.cluster

        def metric(_old: Obj | None, obj: Obj, deleted: bool) -> None:
            if deleted:
                c.usage.pop(name_of(obj), None)
            else:
                name = name_of(obj)
                c.usage[name] = usage_report(nodemetric.parse_node_metric(obj, name))

        def pdb(_old: Obj | None, obj: Obj, deleted: bool) -> None:
            if deleted:
                c.pdbs.pop(namespaced_name(obj), None)
            else:
                b = parse_pdb(obj, "PodDisruptionBudget", namespaced_name(obj))
                c.pdbs[b.key] = b
            c.pdbs_version += 1

        def job(old: Obj | None, obj: Obj, deleted: bool) -> None:
            if deleted:
                gone = c.jobs.remove(name_of(obj))
                if self.on_job is not None:
                    self.on_job("deleted", gone, None)
                return
            new = parse_job(obj, f"podmigrationjob {name_of(obj)}")
            before = c.jobs.get(new.name)
            c.jobs.put(new)
            if self.on_job is not None:
                self.on_job("updated" if before is not None else "added", before, new)

        def workload(_old: Obj | None, obj: Obj, deleted: bool) -> None:
            meta = obj.get("metadata") or {}
            key = (res.kind, str(meta.get("namespace") or "default"), name_of(obj))
            if deleted:
                c.workloads.pop(key, None)
            else:
                w = parse_workload({**obj, "kind": res.kind}, res.kind, namespaced_name(obj))
                c.workloads[key] = w
            c.workloads_version += 1
            c.sched.touch("*")

        if res is NODE_METRICS:
            return metric
        if res is POD_DISRUPTION_BUDGETS:
            return pdb
        if res is POD_MIGRATION_JOBS:
            return job
        return workload

    # -- running ------------------------------------------------------------------------------
    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self.sched_view.run(), name="descheduler-informers-scheduler")
            for informer in self.informers:
                group.create_task(informer.run(), name=f"descheduler-informer-{informer.name}")

    def not_ready(self) -> list[str]:
        return self.sched_view.not_ready() + waiting_for(self.informers)

    async def wait_synced(self, timeout: float) -> bool:  # noqa: ASYNC109 - a bounded wait is the API
        results = await asyncio.gather(
            self.sched_view.wait_synced(timeout),
            *(i.wait_settled(timeout) for i in self.informers),
        )
        return all(results) and not self.not_ready()
