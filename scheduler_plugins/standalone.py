"""The standalone scheduler: pods with ``schedulerName: koord-scheduler``, bound by us.

A scheduling loop and binding cycles beside it, as kube-scheduler's ``scheduleOne`` runs them,
fed by the informer snapshot (``informed.py``):

1. **Queue** (``podqueue.py``). Pending pods for our scheduler name, highest ``spec.priority``
   first, then oldest. A pod that failed is retried when its backoff ends (1 s doubling to 10 s,
   kube-scheduler's ``podInitialBackoffSeconds``/``podMaxBackoffSeconds``). New pods from the
   watch are queued as the informer applies them, between two cycles.
2. **Scheduling cycle** (synchronous: nothing in it waits on the API server). The framework
   filters nodes until it has found ``percentageOfNodesToScore`` of them feasible, as
   kube-scheduler does on large clusters (0, the default: adaptive, 50 % less one point per 125
   nodes, at least 5 % and at least 100 nodes, so 10 % of 5,000 nodes; 100: every node),
   starting where the previous pod's search stopped so that every node gets its turn; then
   scores those. The best one (ties: the first examined) is reserved in the plugins and the pod
   *assumed* in the snapshot (its resources, quota, reservation and gang accounting), so the
   next pod's cycle sees it at once. A pod no node fits was filtered against every node.
3. **Permit (gangs).** A pod of a gang (Coscheduling) waits, assumed, until minMember members
   are assumed or bound; then every member's binding cycle starts. A gang that does not complete
   within its waiting time is unreserved, every waiting member requeued.
4. **Binding cycle** (``binding.py``: one task a pod, at most ``max_bindings_in_flight`` at
   once; the loop waits for a slot only when that many are in flight). The reserve annotations
   (NodeNUMAResource's ``scheduling.koordinator.sh/resource-status``, Reservation's and
   DeviceShare's) are patched on the pod, then its ``binding`` subresource is created, while the
   loop goes on with the next pods. The assumed pod stays on its node until the informers bring
   it bound (``snapshot.py``: an unbound copy arriving meanwhile does not take it off). A failed
   binding *forgets* it (kube-scheduler's ``ForgetPod``: off its node, pending again unless it
   was deleted meanwhile), unreserves it and requeues it with backoff, so a decision never sees
   the cluster without the pods assumed before it.
5. **Events and conditions** (``reporting.py``), as kube-scheduler writes them, queued and
   written off the loop's path (``writequeue.py``): an unschedulable pod gets a
   ``FailedScheduling`` Warning Event in kube-scheduler's form,
   ``0/3 nodes are available: 1 Insufficient cpu, 2 node(s) cpu usage exceed threshold.``
   (reasons counted over nodes, sorted; a reason with per-node numbers counted under its
   wording with an example, ``2 node(s) cpu usage exceed threshold (e.g. cpu usage 91% >
   threshold 65%)``), aggregated over attempts into one ``events.k8s.io/v1`` series with a
   count, and its ``PodScheduled`` condition set False with reason ``Unschedulable``
   (``SchedulerError`` when reserve or bind failed; a binding waits for the pod's last such
   write); a bound pod gets a ``Scheduled`` Event.
   Before any decision the informers must be current (``gate``).
6. **Preemption** (``preemption.py``, with an :class:`~scheduler_plugins.preemption.Evictor`):
   a pod that fits nowhere may evict lower-priority pods (kube-scheduler's DefaultPreemption with
   Koordinator's ElasticQuota rules); the victims are evicted through the API (each gets a
   ``Preempted`` Event through the same recorder), the pod's ``nominatedNodeName`` set, and the
   node held for it (lower-priority pods see it there) until it is bound; its next attempt tries
   that node first. The FailedScheduling Event and condition then say ``preemption: ...`` when
   preemption did not help. Preemption follows the gate too: no dry run, eviction or
   nomination while an informer is not current.
7. **Reservations.** A Pending Reservation whose ``spec.template.spec.schedulerName`` is ours
   (``reservations.py``) is queued with the pods (priority: the template's ``spec.priority``)
   and scheduled as its reserve pod through the same plugins. On the chosen node the plugins
   reserve it and the snapshot takes the Reservation as placed (so the next pod sees what it
   holds); its status is then written through the ``status`` subresource (phase
   ``Available``, ``nodeName``, ``allocatable``, conditions ``Scheduled`` and ``Ready``), a
   write that fails undoing the placement. A Reservation no node takes gets a
   ``FailedScheduling`` Event, its ``Scheduled`` condition False with reason
   ``Unschedulable`` and the same message, and is retried with the pods' backoff. Owners
   landing on an Available Reservation are written to its ``status.currentOwners``
   (``reservationstatus.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from apis.groups import SCHEDULING_API_VERSION as RESERVATION_API_VERSION
from apis.scheduling_keys import (
    ANNOTATION_GANG_NAME,
    ANNOTATION_RESERVATION_NAME,
    ANNOTATION_RESERVATION_NODE,
    LABEL_POD_GROUP,
)
from kubeclient.errors import KubeError
from kubeclient.resources import RESERVATIONS
from scheduler_plugins.binding import MAX_IN_FLIGHT, Binder, BindingCycles
from scheduler_plugins.config import GC_GEN0_THRESHOLD
from scheduler_plugins.errors import InputError
from scheduler_plugins.framework import Cycle, Framework, ReserveError
from scheduler_plugins.plugins.coscheduling import DEFAULT_WAIT_S, gang_of
from scheduler_plugins.podqueue import PodQueue
from scheduler_plugins.preemption import Evictor, Nominations, Preemption
from scheduler_plugins.reporting import (
    FAILED_SCHEDULING,
    NAMESPACE_CLUSTER_SCOPED,
    REASON_SCHEDULER_ERROR,
    REASON_UNSCHEDULABLE,
    EventRecorder,
    PodConditions,
    failure_message,
)
from scheduler_plugins.reservations import (
    available_status,
    is_pending,
    reserve_pod,
    scheduler_name_of_reservation,
    uid_of_reservation,
)
from scheduler_plugins.reservationstatus import OwnerSync, ReservationWriter
from scheduler_plugins.snapshot import NodeInfo, PodInfo, Snapshot

if TYPE_CHECKING:
    from scheduler_plugins.informed import InformedSnapshot

logger = logging.getLogger(__name__)

SCHEDULER_NAME = "koord-scheduler"
SUMMARY_EVERY_S = 10.0
"""How often the loop logs one line of what it did (pods bound, failed, queued)."""
ERR_NODE_NAME = "node(s) didn't match the requested node name"
"""kube-scheduler's NodeName reason (a reservation pinned by ``spec.template.spec.nodeName``)."""
GATE_POLL_S = 0.1
"""How often a held loop checks whether the informers are current again."""

__all__ = ["EventRecorder", "PodConditions", "ReservationWriter", "Scheduler", "build_scheduler"]


def scheduler_name_of(pod: PodInfo) -> str:
    """``spec.schedulerName`` (``default-scheduler`` when unset)."""
    return str((pod.raw.get("spec") or {}).get("schedulerName") or "default-scheduler")


@dataclass(slots=True)
class _Waiting:
    """An assumed gang member waiting for the rest of its gang."""

    pod: PodInfo
    node: str
    cycle: Cycle
    annotations: dict[str, str]
    deadline: float


class Scheduler:
    """The loop; :meth:`enqueue` is the informer's hook for pending pods."""

    def __init__(
        self,
        framework: Framework,
        snapshot: Snapshot,
        binder: Binder,
        events: EventRecorder,
        *,
        scheduler_name: str = SCHEDULER_NAME,
        clock: Callable[[], float] = time.time,
        percentage_of_nodes_to_score: int = 0,
        reservations: ReservationWriter | None = None,
        evictor: Evictor | None = None,
        gate: Callable[[], list[str]] | None = None,
        conditions: PodConditions | None = None,
        owner_sync: OwnerSync | None = None,
        max_bindings_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        if not 0 <= percentage_of_nodes_to_score <= 100:
            raise ValueError(
                f"percentageOfNodesToScore must be 0..100, got {percentage_of_nodes_to_score}"
            )
        self.percentage_of_nodes_to_score = percentage_of_nodes_to_score
        """kube-scheduler's ``percentageOfNodesToScore`` (0: adaptive; 100: every node)."""
        self.next_start = 0
        """Index in the snapshot's node order where the next pod's search begins."""
        self.framework = framework
        self.snapshot = snapshot
        self.events = events
        self.scheduler_name = scheduler_name
        self.clock = clock
        self.queue = PodQueue()
        """Pending pods and reserve pods of ours, by priority, with their backoff."""
        self._waiting: dict[str, dict[str, _Waiting]] = {}
        self.bound = 0
        """Pods bound so far."""
        self.reservations = reservations
        """Where placed Reservations' status goes; ``None``: Reservations are not scheduled."""
        self._reservation_names: dict[str, str] = {}
        """Queued Reservations: uid → name (their reserve pods are built when popped)."""
        self.placed = 0
        """Reservations placed so far."""
        self.evictor = evictor
        """Carries out preemptions; ``None``: pods never preempt."""
        self.preemption = Preemption(framework, snapshot) if evictor is not None else None
        self.nominations = Nominations()
        """Pods that preempted and the nodes held for them."""
        self.gate = gate
        """What decisions wait for (:meth:`InformedSnapshot.not_ready`): while it names
        anything, :meth:`run` schedules nothing."""
        self._held: list[str] = []
        self.conditions = conditions
        """Writes ``PodScheduled`` False after a failed attempt; ``None``: nothing."""
        self.owner_sync = owner_sync
        """Writes Reservations' ``currentOwners``; ``None``: nothing."""
        self.bindings = BindingCycles(
            binder,
            on_bound=self._bound,
            on_failed=self._binding_failed,
            before=self._before_binding,
            max_in_flight=max_bindings_in_flight,
        )
        """The binding cycles in flight (``binding.py``)."""
        self.binding_failures = 0
        """Bindings the API server refused (each pod forgotten and requeued)."""
        self.failures = 0
        """Failed scheduling attempts (no node fits, reserve, binding)."""
        self._summary: tuple[float, int, int] = (time.monotonic(), 0, 0)

    # -- queue --------------------------------------------------------------------------------

    def enqueue(self, pod: PodInfo) -> None:
        """Queue a pending pod of ours (idempotent)."""
        if (
            pod.node_name
            or pod.uid in self.queue
            or scheduler_name_of(pod) != self.scheduler_name
            or self.snapshot.is_assumed(pod.uid)  # binding or waiting for its gang
        ):
            return
        self.queue.push(pod)

    def enqueue_reservation(self, obj: dict[str, Any]) -> None:
        """Queue a Pending Reservation of ours (idempotent; the informer's hook)."""
        if self.reservations is None:
            return
        name = str((obj.get("metadata") or {}).get("name") or "")
        current = self.snapshot.reservations.get(name, obj)
        uid = uid_of_reservation(current)
        if uid in self.queue or scheduler_name_of_reservation(current) != self.scheduler_name:
            return
        try:
            if not is_pending(current, self.clock()):
                return
            pod = reserve_pod(current)
        except InputError as err:
            logger.warning("Reservation %s not scheduled: %s", name, err)
            return
        self._reservation_names[uid] = name
        self.enqueue(pod)

    def enqueue_all(self) -> None:
        """Queue every pending pod and Pending Reservation of the snapshot that is ours."""
        for pod in list(self.snapshot.pending_pods.values()):
            self.enqueue(pod)
        for obj in list(self.snapshot.reservations.values()):
            self.enqueue_reservation(obj)

    def _pending_reservation(self, uid: str) -> PodInfo | None:
        """The reserve pod of queued Reservation ``uid`` as the snapshot has it now; ``None``
        (and forgotten) once it is deleted, placed or expired."""
        name = self._reservation_names.get(uid)
        if name is None:
            return None
        obj = self.snapshot.reservations.get(name)
        try:
            if obj is not None and uid_of_reservation(obj) == uid and is_pending(obj, self.clock()):
                return reserve_pod(obj)
        except InputError as err:
            logger.warning("Reservation %s not scheduled: %s", name, err)
        self._forget(uid)
        return None

    def _forget(self, uid: str) -> None:
        self._reservation_names.pop(uid, None)
        self.queue.forget(uid)

    def _queued_pod(self, uid: str) -> PodInfo | None:
        """A queued uid's pod as the snapshot has it now (a Reservation's reserve pod)."""
        pod = self.snapshot.pending_pods.get(uid)
        if pod is None and uid in self._reservation_names:
            pod = self._pending_reservation(uid)
        return pod

    def _pop_ready(self) -> tuple[PodInfo | None, float | None]:
        """The next pod whose backoff is over, else ``None`` and how long until one is."""
        return self.queue.pop_ready(self._queued_pod, self.clock())

    def _backoff(self, pod: PodInfo) -> None:
        self.queue.back_off(pod.uid, self.clock())
        self.enqueue(pod)

    # -- one pod ------------------------------------------------------------------------------

    async def schedule_one(self, pod: PodInfo) -> str | None:
        """Schedule ``pod``: the node it was bound (or assumed, for a waiting gang member) to,
        or ``None`` (requeued with backoff)."""
        if not self.nominations.pods:
            return await self._schedule(pod)
        with self.nominations.held(self.snapshot, pod):
            return await self._schedule(pod)

    def _nominated_fits(self, cycle: Cycle, pod: PodInfo) -> NodeInfo | None:
        """The node this pod was nominated for, when it now passes every filter there."""
        name = self.nominations.node_of(pod.uid) or pod.constraints.nominated_node
        node = self.snapshot.nodes.get(name) if name else None
        if node is None or self.framework.pre_filter(cycle, pod) is not None:
            return None
        feasible, _ = self.framework.filter_nodes(cycle, pod, [node])
        return node if feasible else None

    async def _schedule(self, pod: PodInfo) -> str | None:
        cycle = self.framework.new_cycle(self.snapshot, self.clock())
        nodes = list(self.snapshot.nodes.values())
        nominated = self._nominated_fits(cycle, pod)
        failures: dict[str, list[tuple[str, str]]] = {}
        if nominated is not None:
            feasible: list[NodeInfo] = [nominated]
        else:
            found = self.framework.find_feasible(
                cycle,
                pod,
                nodes,
                percentage=self.percentage_of_nodes_to_score,
                start=self.next_start,
            )
            feasible, failures = found.feasible, found.failures
            if nodes:
                self.next_start = (self.next_start + found.processed) % len(nodes)
        if not feasible:
            reasons = {n: [r for _, r in f] for n, f in failures.items()}
            message = failure_message(len(nodes), reasons)
            if self.preemption is not None:
                message = await self._preempt(cycle, pod, failures, message)
            self._failed(pod, message, REASON_UNSCHEDULABLE)
            return None
        best = self.framework.best_node(cycle, pod, feasible)
        try:
            annotations = self.framework.reserve(cycle, pod, best)
        except ReserveError as err:
            self._failed(pod, str(err), REASON_SCHEDULER_ERROR)
            return None
        gang = gang_of(pod, cycle, DEFAULT_WAIT_S)
        if gang is not None and not isinstance(gang, str) and gang.min_member > 1:
            waiting = self._waiting.setdefault(gang.key, {})
            waiting[pod.uid] = _Waiting(pod, best, cycle, annotations, self.clock() + gang.wait_s)
            bound = sum(
                1
                for p in self.snapshot.all_pods()
                if p.node_name and p.uid not in waiting and _same_gang(p, gang.key)
            )
            if bound + len(waiting) < gang.min_member:
                logger.info(
                    "%s assumed on %s, waiting for gang %s (%d/%d)",
                    pod.key,
                    best,
                    gang.key,
                    bound + len(waiting),
                    gang.min_member,
                )
                return best
            members = list(self._waiting.pop(gang.key).values())
            for m in members:
                await self._start_binding(m.pod, m.node, m.cycle, m.annotations)
            return best
        await self._start_binding(pod, best, cycle, annotations)
        return best

    async def _preempt(
        self,
        cycle: Cycle,
        pod: PodInfo,
        failures: dict[str, list[tuple[str, str]]],
        message: str,
    ) -> str:
        """Try preemption for ``pod``; the FailedScheduling message (with kube-scheduler's
        ``preemption: ...`` when it did not help)."""
        assert self.preemption is not None
        assert self.evictor is not None
        waiting = self.gate() if self.gate is not None else []
        if waiting:  # an informer fell behind since the loop looked: no dry run on stale state
            return f"{message} preemption: held: waiting for {', '.join(waiting)}"
        outcome = self.preemption.find(
            cycle, pod, failures, self.nominations.victims.get(pod.uid, ())
        )
        if outcome.candidate is None:
            return f"{message} preemption: {outcome.message}"
        refused = await self.evictor.preempt(
            pod, outcome.candidate, events=self.events, gate=self.gate
        )
        if refused is not None:
            return f"{message} preemption: {refused}"
        self.nominations.add(pod, outcome.candidate.node, outcome.candidate.victims)
        logger.info(
            "%s nominated to %s, %d victim(s) evicted",
            pod.key,
            outcome.candidate.node,
            len(outcome.candidate.victims),
        )
        return message

    # -- binding cycles -------------------------------------------------------------------

    async def _start_binding(
        self, pod: PodInfo, node: str, cycle: Cycle, annotations: dict[str, str]
    ) -> None:
        await self.bindings.start(pod, node, cycle, annotations)

    async def _before_binding(self, pod: PodInfo) -> None:
        if self.conditions is not None:  # no late PodScheduled False on a pod being bound
            await self.conditions.settle(pod.uid)

    def _bound(self, pod: PodInfo, node: str) -> None:
        self.bound += 1
        self.nominations.drop(pod.uid)
        self.queue.forget(pod.uid)
        logger.debug("bound %s to %s", pod.key, node)
        self.events.scheduled(pod, node)

    def _binding_failed(
        self, pod: PodInfo, node: str, cycle: Cycle, err: BaseException | str
    ) -> None:
        """kube-scheduler's ``ForgetPod`` and failure handling: the assumption undone, the pod
        (as the informers last saw it) reported and requeued with backoff; a pod deleted or seen
        bound meanwhile is left alone."""
        self.binding_failures += 1
        retry = self.framework.unreserve(cycle, pod, node)
        if retry is None:
            logger.debug(
                "binding of %s to %s failed (%s); gone or bound meanwhile", pod.key, node, err
            )
            return
        self._failed(retry, f"binding rejected: {err}", REASON_SCHEDULER_ERROR)

    @property
    def binder(self) -> Binder:
        """What writes a placement to the cluster (the binding cycles')."""
        return self.bindings.binder

    @binder.setter
    def binder(self, binder: Binder) -> None:
        self.bindings.binder = binder

    @property
    def binding(self) -> int:
        """Binding cycles running now."""
        return len(self.bindings)

    async def wait_bindings(self) -> None:
        """Wait until every binding cycle started so far (and since) has ended."""
        await self.bindings.wait()

    async def drain(self) -> None:
        """Wait until every binding cycle and every queued Event and condition write is done
        (tests; benchmarks)."""
        await self.wait_bindings()
        await self.events.flush()
        if self.conditions is not None:
            await self.conditions.flush()

    async def close(self) -> None:
        """Cancel the binding cycles in flight and drop the queued writes (a term that
        ends: the next one starts from the API server's state)."""
        await self.bindings.close()
        await self.events.close()
        if self.conditions is not None:
            await self.conditions.close()

    def _failed(self, pod: PodInfo, message: str, reason: str) -> None:
        """A failed attempt, reported as kube-scheduler reports it (``reporting.py``, queued),
        then the backoff."""
        self.failures += 1
        self.events.warn(pod, FAILED_SCHEDULING, message)
        if self.conditions is not None:
            self.conditions.unschedulable(pod, reason, message)
        self._backoff(pod)

    # -- one reservation ----------------------------------------------------------------------

    async def schedule_reservation(self, pod: PodInfo) -> str | None:
        """Place the reserve pod of a Pending Reservation and write its status; the node, or
        ``None`` (requeued with backoff)."""
        assert self.reservations is not None  # only queued with a writer
        name = pod.annotations[ANNOTATION_RESERVATION_NAME]
        now = self.clock()
        cycle = self.framework.new_cycle(self.snapshot, now)
        nodes = list(self.snapshot.nodes.values())
        pinned = pod.annotations.get(ANNOTATION_RESERVATION_NODE)
        candidates: list[NodeInfo] = nodes
        failures: dict[str, list[tuple[str, str]]] = {}
        if pinned:
            candidates = [n for n in nodes if n.name == pinned]
            failures = {n.name: [("NodeName", ERR_NODE_NAME)] for n in nodes if n.name != pinned}
        found = self.framework.find_feasible(cycle, pod, candidates, percentage=100)
        failures.update(found.failures)
        if not found.feasible:
            reasons = {n: [r for _, r in f] for n, f in failures.items()}
            await self._reservation_failed(pod, name, failure_message(len(nodes), reasons), now)
            return None
        _, totals = self.framework.score_nodes(cycle, pod, found.feasible)
        best = found.feasible[0].name
        top = totals.get(best, 0)
        for n in found.feasible:
            if totals.get(n.name, 0) > top:
                best, top = n.name, totals[n.name]
        try:
            self.framework.reserve(cycle, pod, best)
        except ReserveError as err:
            await self._reservation_failed(pod, name, str(err), now)
            return None
        # the Reservation plugin accounts what an Available reservation holds: swap the
        # assumed reserve pod for the reservation as placed
        self.snapshot.forget(pod, pending=False)
        current = self.snapshot.reservations.get(name) or {"metadata": {"name": name}}
        assumed = dict(current)
        assumed["status"] = available_status(current, best, pod.requests, now)
        previous = self.snapshot.assume_reservation(assumed)
        try:
            written = await self.reservations.placed(name, best, pod.requests, now)
        except (KubeError, OSError, InputError) as err:
            self._undo_placement(name, assumed, previous)
            await self._reservation_failed(pod, name, f"status write rejected: {err}", now)
            return None
        if written is None:  # placed or expired by someone else meanwhile: the informer tells
            self._undo_placement(name, assumed, previous)
            self._forget(pod.uid)
            return None
        if self.snapshot.reservations.get(name) is assumed and written.get("status"):
            self.snapshot.assume_reservation(written)
        self.placed += 1
        self._forget(pod.uid)
        logger.info("placed Reservation %s on %s", name, best)
        return best

    def _undo_placement(
        self, name: str, assumed: dict[str, Any], previous: dict[str, Any] | None
    ) -> None:
        if self.snapshot.reservations.get(name) is not assumed:
            return  # the informer brought a newer copy meanwhile
        if previous is not None:
            self.snapshot.assume_reservation(previous)
        else:
            self.snapshot.reservations.pop(name, None)

    async def _reservation_failed(self, pod: PodInfo, name: str, message: str, now: float) -> None:
        assert self.reservations is not None
        involved = {
            "apiVersion": RESERVATION_API_VERSION,
            "kind": "Reservation",
            "name": name,
            "uid": pod.uid,
        }
        self.events.warn_about(involved, NAMESPACE_CLUSTER_SCOPED, FAILED_SCHEDULING, message)
        await self.reservations.unschedulable(name, message, now)
        self._backoff(pod)

    def expire_gangs(self) -> None:
        """Unreserve gangs that waited past their deadline; requeue their members."""
        now = self.clock()
        for key in list(self._waiting):
            members = self._waiting[key]
            if all(m.deadline > now for m in members.values()):
                continue
            del self._waiting[key]
            for m in members.values():
                retry = self.framework.unreserve(m.cycle, m.pod, m.node)
                if retry is not None:  # not deleted meanwhile
                    self._backoff(retry)
            logger.info("gang %s timed out with %d members waiting; unreserved", key, len(members))

    # -- the loop -------------------------------------------------------------------------------

    def _hold(self) -> bool:
        """Whether decisions wait for informers (logged when that changes)."""
        waiting = self.gate() if self.gate is not None else []
        if waiting != self._held:
            if waiting:
                logger.warning("holding scheduling decisions: waiting for %s", ", ".join(waiting))
            else:
                logger.info("informers current: scheduling")
            self._held = waiting
        return bool(waiting)

    def _log_summary(self) -> None:
        """One line every :data:`SUMMARY_EVERY_S` when something happened."""
        now = time.monotonic()
        since, bound, failures = self._summary
        if now - since < SUMMARY_EVERY_S:
            return
        self._summary = (now, self.bound, self.failures)
        if self.bound == bound and self.failures == failures:
            return
        logger.info(
            "%d pods bound, %d attempts failed in %.0fs; %d queued, %d binding, %d events waiting",
            self.bound - bound,
            self.failures - failures,
            now - since,
            len(self.queue),
            len(self.bindings),
            len(self.events.writes),
        )

    async def run(self) -> None:
        """Schedule forever (cancel to stop: the binding cycles in flight are cancelled)."""
        self.enqueue_all()
        try:
            await self._loop()
        finally:
            await self.close()

    async def _loop(self) -> None:
        while True:
            if self._hold():
                self.queue.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.queue.wake.wait(), GATE_POLL_S)
                continue
            self.events.tick()
            self._log_summary()
            if self.owner_sync is not None:
                await self.owner_sync.flush(self.clock())
            self.expire_gangs()
            pod, wait = self._pop_ready()
            if pod is None:
                self.queue.wake.clear()
                timeout = min(wait if wait is not None else 1.0, 1.0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.queue.wake.wait(), timeout)
                continue
            if pod.uid in self._reservation_names:
                await self.schedule_reservation(pod)
            else:
                await self.schedule_one(pod)
            await asyncio.sleep(0)  # let informer events in between pods


def _same_gang(pod: PodInfo, key: str) -> bool:
    ns, _, name = key.partition("/")
    return pod.namespace == ns and (
        pod.labels.get(LABEL_POD_GROUP) == name or pod.annotations.get(ANNOTATION_GANG_NAME) == name
    )


def build_scheduler(
    client: Any, cfg: Any, scheduler_name: str = SCHEDULER_NAME
) -> tuple[InformedSnapshot, Scheduler]:
    """The informers and the scheduler of one ``koord-scheduler run`` (or one leader's term)
    over ``client``, connected (:func:`connect`) but not started."""
    from scheduler_plugins.binding import KubeBinder
    from scheduler_plugins.informed import InformedSnapshot

    informed = InformedSnapshot(client)
    scheduler = Scheduler(
        cfg.framework(),
        informed.snapshot,
        KubeBinder(client),
        EventRecorder(client, scheduler_name),
        scheduler_name=scheduler_name,
        percentage_of_nodes_to_score=cfg.percentage_of_nodes_to_score,
        reservations=ReservationWriter(client),
        evictor=Evictor(client),
        gate=informed.not_ready,
        conditions=PodConditions(client),
        owner_sync=OwnerSync(client, informed.snapshot),
    )
    connect(informed, scheduler)
    return informed, scheduler


def connect(informed: InformedSnapshot, scheduler: Scheduler) -> None:
    """Feed ``scheduler``'s queue from ``informed``: pending pods, and Reservations added or
    changed (after the snapshot has taken them); and its owner sync, with pods and Reservations
    that changed."""
    informed.on_pending = scheduler.enqueue
    for informer in informed.informers:
        if informer.resource is RESERVATIONS:
            informer.add_handler(
                on_add=scheduler.enqueue_reservation,
                on_update=lambda _old, new: scheduler.enqueue_reservation(new),
            )
    if scheduler.owner_sync is not None:
        informed.watch_owners(scheduler.owner_sync)


def pause_gc() -> None:
    """No cycle collection while a term's informers list (the process is ours alone): what
    the lists build lives as long as the term, and full collections over a growing heap of
    thousands of nodes would delay the first decision by tenths of seconds; :func:`tune_gc`
    resumes it."""
    gc.disable()


def tune_gc() -> None:
    """As the extender does after loading: freeze what is there, collect young objects less
    often (the process is ours alone), and collect again. Nothing is collected first: the
    lists' objects are alive, and a full collection over them would make the first pod wait;
    the little cyclic garbage of the start-up stays frozen."""
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, GC_GEN0_THRESHOLD), gen1, gen2)
    gc.enable()
