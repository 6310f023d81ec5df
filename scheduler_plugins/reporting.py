"""What the standalone scheduler reports on the objects it schedules, as kube-scheduler does.

**Events** (:class:`EventRecorder`) are ``events.k8s.io/v1`` Events, which kube-scheduler (v1.19
and later) records through client-go's ``tools/events`` broadcaster
(``events.NewEventBroadcasterAdapter`` in ``cmd/kube-scheduler/app/options``), with its
aggregation (``tools/events/event_broadcaster.go``, ``recordToSink``):

- an Event is keyed by type, ``action``, ``reason``, ``reportingController``,
  ``reportingInstance``, ``regarding`` (an ObjectReference with the object's resourceVersion) and
  ``related``; the ``note`` is not part of the key;
- the first occurrence is created (name ``<object>.<unix nanoseconds in hex>``, ``eventTime``);
- the second is a strategic merge patch of that Event: ``series: {count: 2, lastObservedTime}``;
- later ones only count in memory; the cached series is written every 30 minutes
  (``refreshTime``) and once more when it has not recurred for 6 minutes (``finishTime``, checked
  every 6 minutes), when it is also forgotten; a single Event is forgotten 6 minutes after its
  ``eventTime``; a patch that finds the Event gone creates it again.

Recording never waits for the API server, as client-go writes each Event in a goroutine of its
own: the write is queued (:mod:`scheduler_plugins.writequeue`: one write an Event at a time, at
most 16 in flight, past 1,000 waiting dropped as the broadcaster drops them); an occurrence that
recurs before its Event was written goes out once, with its series.

kube-scheduler writes ``FailedScheduling`` (Warning, action ``Scheduling``) for a pod it could not
place, ``Scheduled`` (Normal, action ``Binding``, ``Successfully assigned ns/name to node``)
once it is bound, and ``Preempted`` (Normal, action ``Preempting``, ``Preempted by ns/name on
node N``) regarding each victim of a preemption, with the preemptor as ``related``
(``prepareCandidate`` in ``pkg/scheduler/framework/preemption``, v1.25); the controller is the
profile's scheduler name, the instance ``<controller>-<host name>``, a note cut to 1 KiB
(``truncateMessage``). Events about cluster-scoped objects (a Reservation) go to namespace
``default``.

**The PodScheduled condition** (:class:`PodConditions`): after a failed attempt kube-scheduler
(``handleSchedulingFailure`` → ``updatePod``) sets ``PodScheduled`` False with reason
``Unschedulable`` (no node fits) or ``SchedulerError`` (reserve or bind failed) and the message,
through a strategic merge patch of ``pods/<name>/status``, only when the condition changes
(``podutil.UpdatePodCondition``: status, reason or message; ``lastTransitionTime`` kept while the
status stays). The binding subresource sets it True. kube-scheduler patches in the failing
cycle; here the patch is queued per pod, and the pod's binding waits for it
(:meth:`PodConditions.settle`), so the order on the pod is the same.

**The message** (:func:`failure_message`) is kube-scheduler's ``0/3 nodes are available: ...``.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from apis.timestamp import format_micro_time, format_time
from kubeclient.client import PatchType
from kubeclient.errors import KubeError, NotFound
from kubeclient.resources import EVENTS_V1, PODS
from scheduler_plugins.snapshot import PodInfo
from scheduler_plugins.writequeue import MAX_IN_FLIGHT, WriteQueue

logger = logging.getLogger(__name__)

REFRESH_S = 30 * 60.0
"""client-go ``refreshTime``: how often a running series' count is written."""
FINISH_S = 6 * 60.0
"""client-go ``finishTime``: a series not seen for this long is written a last time and ended."""
NOTE_LIMIT = 1024
"""``validation.NoteLengthLimit`` (events.k8s.io): longer notes are cut, ``" ..."`` appended."""
NAMESPACE_CLUSTER_SCOPED = "default"
"""Where Events about cluster-scoped objects go (client-go's ``makeEvent``)."""
CONDITION_POD_SCHEDULED = "PodScheduled"
REASON_UNSCHEDULABLE = "Unschedulable"
"""``v1.PodReasonUnschedulable``: no node fits."""
REASON_SCHEDULER_ERROR = "SchedulerError"
"""``v1.PodReasonSchedulerError``: reserve, permit or bind failed."""
FAILED_SCHEDULING = "FailedScheduling"
SCHEDULED = "Scheduled"
PREEMPTED = "Preempted"


def truncate_note(note: str) -> str:
    """kube-scheduler's ``truncateMessage``."""
    if len(note) <= NOTE_LIMIT:
        return note
    return note[: NOTE_LIMIT - 4] + " ..."


def failure_message(total: int, reasons: dict[str, list[str]]) -> str:
    """kube-scheduler's ``FailedScheduling`` message: reasons counted over nodes, sorted. A
    reason with per-node numbers after its kube-scheduler or Koordinator wording
    (``node(s) cpu usage exceed threshold, cpu usage 91% > threshold 65%``) counts under that
    wording when the numbers differ between nodes, with the most frequent numbers as the example
    (``2 node(s) cpu usage exceed threshold (e.g. cpu usage 91% > threshold 65%)``)."""
    counts = Counter(r for rs in reasons.values() for r in dict.fromkeys(rs))
    details: dict[str, Counter[str]] = {}
    for r, n in counts.items():
        head, sep, detail = r.partition(", ")
        details.setdefault(head if sep else r, Counter())[detail] += n
    lines: dict[str, int] = {}
    for head, by_detail in details.items():
        if len(by_detail) == 1:
            (detail,) = by_detail
            lines[f"{head}, {detail}" if detail else head] = by_detail[detail]
        else:
            example = min(by_detail.items(), key=lambda kv: (-kv[1], kv[0]))[0]
            lines[f"{head} (e.g. {example})"] = sum(by_detail.values())
    parts = ", ".join(f"{n} {r}" for r, n in sorted(lines.items(), key=lambda kv: kv[0]))
    return (
        f"0/{total} nodes are available: {parts}." if parts else f"0/{total} nodes are available."
    )


def pod_reference(pod: PodInfo) -> dict[str, str]:
    """The ObjectReference ``reference.GetReference`` makes of a pod."""
    meta = pod.raw.get("metadata") or {}
    ref = {"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid}
    ref["apiVersion"] = "v1"
    if meta.get("resourceVersion"):
        ref["resourceVersion"] = str(meta["resourceVersion"])
    return ref


@dataclass(slots=True)
class _Cached:
    """One isomorphic Event as the recorder last knows it."""

    event: dict[str, Any]
    """The Event as created (name, namespace, eventTime...)."""
    count: int = 1
    """The series count; 1: no series yet."""
    last_observed: float = 0.0
    """When it last occurred (epoch seconds)."""
    first: float = 0.0
    """``eventTime`` (epoch seconds)."""
    created: bool = False
    """Whether a write of it reached the API server."""


class EventRecorder:
    """``events.k8s.io/v1`` Events with client-go's series aggregation (see the module
    docstring), written off the caller's path: recording is synchronous, the writes go through a
    :class:`~scheduler_plugins.writequeue.WriteQueue` (coalesced per Event, bounded in flight,
    dropped past 1,000 waiting as client-go's broadcaster drops them); :meth:`flush` waits for
    them. ``client`` ``None``: only logs."""

    def __init__(
        self,
        client: Any,
        controller: str = "koord-scheduler",
        *,
        clock: Callable[[], float] = time.time,
        instance: str | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.client = client
        self.controller = controller
        """``reportingController``: the scheduler's name."""
        self.instance = instance or f"{controller}-{socket.gethostname()}"
        """``reportingInstance``: ``<controller>-<host name>``, as ``NewRecorder`` builds it."""
        self.clock = clock
        self.sent = 0
        """Events created or patched so far."""
        self.recorded = 0
        """Occurrences recorded so far (written, aggregated or dropped)."""
        self.writes = WriteQueue("events", max_in_flight=max_in_flight)
        """The Event writes waiting or in flight."""
        self._cache: dict[tuple[Any, ...], _Cached] = {}
        start = clock()
        self._next_refresh = start + REFRESH_S
        self._next_finish = start + FINISH_S

    def warn(self, pod: PodInfo, reason: str, message: str) -> None:
        """A Warning about a pod (``FailedScheduling``: action ``Scheduling``)."""
        self.record(pod_reference(pod), "Warning", reason, "Scheduling", message)

    def scheduled(self, pod: PodInfo, node: str) -> None:
        """kube-scheduler's ``Scheduled`` Event once a pod is bound."""
        note = f"Successfully assigned {pod.namespace}/{pod.name} to {node}"
        self.record(pod_reference(pod), "Normal", SCHEDULED, "Binding", note)

    def preempted(self, victim: PodInfo, preemptor: PodInfo, node: str) -> None:
        """kube-scheduler's ``Preempted`` Event regarding a victim, related to the preemptor."""
        note = f"Preempted by {preemptor.namespace}/{preemptor.name} on node {node}"
        self.record(
            pod_reference(victim),
            "Normal",
            PREEMPTED,
            "Preempting",
            note,
            related=pod_reference(preemptor),
        )

    def warn_about(
        self, involved: Mapping[str, str], namespace: str, reason: str, message: str
    ) -> None:
        """A Warning (action ``Scheduling``) about another object: ``involved`` is its
        ObjectReference (``namespace``: where a cluster-scoped object's Events go)."""
        self.record(involved, "Warning", reason, "Scheduling", message, namespace=namespace)

    def record(
        self,
        regarding: Mapping[str, str],
        type_: str,
        reason: str,
        action: str,
        note: str,
        *,
        namespace: str = "",
        related: Mapping[str, str] | None = None,
    ) -> None:
        """Record one occurrence (client-go's ``Eventf`` then ``recordToSink``); the Event goes
        to the object's namespace, else ``namespace``, else ``default``. ``related``: a second
        object's ObjectReference (part of the aggregation key, as ``regarding`` is). The write,
        if one is due, is queued, never awaited."""
        ref = dict(regarding)
        namespace = ref.get("namespace") or namespace or NAMESPACE_CLUSTER_SCOPED
        logger.debug("%s %s/%s: %s", reason, namespace, ref.get("name", ""), note)
        self.recorded += 1
        if self.client is None:
            return
        now = self.clock()
        rel = tuple(sorted(related.items())) if related else ()
        key = (
            type_,
            action,
            reason,
            self.controller,
            self.instance,
            tuple(sorted(ref.items())),
            rel,
        )
        cached = self._cache.get(key)
        if cached is not None:
            cached.count += 1
            cached.last_observed = now
            if cached.count == 2:  # the series starts: written at once
                self._queue(key, cached)
            return
        event = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                "name": f"{ref.get('name', '')}.{time.time_ns():x}",
                "namespace": namespace,
            },
            "eventTime": format_micro_time(now),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": action,
            "reason": reason,
            "regarding": ref,
            "note": truncate_note(note),
            "type": type_,
        }
        if related:
            event["related"] = dict(related)
        cached = _Cached(event, 1, now, now)
        self._cache[key] = cached
        self._queue(key, cached)

    def tick(self) -> None:
        """Queue the writes of running series every :data:`REFRESH_S` and end those not seen
        for :data:`FINISH_S` (client-go's ``refreshExistingEventSeries`` and
        ``finishSeries``); cheap when neither is due. The scheduler's loop calls it."""
        now = self.clock()
        if now >= self._next_refresh:
            self._next_refresh = now + REFRESH_S
            for key, cached in self._cache.items():
                if cached.count > 1:
                    self._queue(key, cached)
        if now >= self._next_finish:
            self._next_finish = now + FINISH_S
            for key, cached in list(self._cache.items()):
                if cached.count > 1 and cached.last_observed < now - FINISH_S:
                    self._queue(key, cached)
                    del self._cache[key]
                elif cached.count == 1 and cached.first < now - FINISH_S:
                    del self._cache[key]

    async def flush(self) -> None:
        """Wait until every write queued so far is done (tests; a clean stop)."""
        await self.writes.flush()

    async def close(self) -> None:
        """Drop the writes left (a term that ends)."""
        await self.writes.close()

    def _queue(self, key: tuple[Any, ...], cached: _Cached) -> None:
        if self.client is None:
            return

        async def write() -> None:
            await self._write(cached)

        self.writes.submit(key, write)

    async def _write(self, cached: _Cached) -> None:
        """Write the Event as it is now: created (with its series when it has recurred
        meanwhile), else its series patched (created again if it was deleted)."""
        if self.client is None:
            return
        event = cached.event
        meta = event["metadata"]
        try:
            if cached.count > 1:
                series = {
                    "count": cached.count,
                    "lastObservedTime": format_micro_time(cached.last_observed),
                }
                if not cached.created:
                    await self.client.create(EVENTS_V1, {**event, "series": series})
                else:
                    try:
                        await self.client.patch(
                            EVENTS_V1,
                            meta["name"],
                            {"series": series},
                            meta["namespace"],
                            patch_type=PatchType.STRATEGIC,
                        )
                    except NotFound:  # deleted meanwhile (its TTL): created again, with series
                        await self.client.create(EVENTS_V1, {**event, "series": series})
            else:
                await self.client.create(EVENTS_V1, event)
            cached.created = True
            self.sent += 1
        except KubeError as err:
            logger.warning("event %s/%s not written: %s", meta["namespace"], meta["name"], err)


class PodConditions:
    """Writes a pod's ``PodScheduled`` condition after a failed attempt (see the module
    docstring), off the caller's path: the patch is queued per pod (the latest condition
    wins), and :meth:`settle` lets a binding wait for the pod's last one, so a late ``False``
    never lands on a pod just bound. ``client`` ``None``: nothing."""

    def __init__(
        self,
        client: Any,
        *,
        clock: Callable[[], float] = time.time,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.client = client
        self.clock = clock
        self.written = 0
        """Status patches made so far."""
        self.writes = WriteQueue("pod-conditions", max_in_flight=max_in_flight)
        """The condition patches waiting or in flight, by pod uid."""

    def unschedulable(self, pod: PodInfo, reason: str, message: str) -> None:
        """Queue ``PodScheduled`` False with ``reason`` and ``message``, unless the pod already
        says so (errors logged: the pod is retried anyway)."""
        if self.client is None:
            return
        conditions = ((pod.raw.get("status") or {}).get("conditions")) or []
        old = next(
            (
                c
                for c in conditions
                if isinstance(c, Mapping) and c.get("type") == CONDITION_POD_SCHEDULED
            ),
            None,
        )
        if (
            old is not None
            and old.get("status") == "False"
            and old.get("reason") == reason
            and old.get("message") == message
            and not old.get("lastProbeTime")
        ):
            return
        since = (
            str(old["lastTransitionTime"])
            if old is not None and old.get("status") == "False" and old.get("lastTransitionTime")
            else format_time(self.clock())
        )
        condition = {
            "type": CONDITION_POD_SCHEDULED,
            "status": "False",
            "lastProbeTime": None,
            "lastTransitionTime": since,
            "reason": reason,
            "message": message,
        }

        async def write() -> None:
            await self._write(pod, condition)

        self.writes.submit(pod.uid, write)

    async def settle(self, uid: str) -> None:
        """Drop the pod's condition write not sent yet and wait for one in flight (its
        binding goes next)."""
        await self.writes.settle(uid)

    async def flush(self) -> None:
        """Wait until every patch queued so far is done."""
        await self.writes.flush()

    async def close(self) -> None:
        """Drop the patches left."""
        await self.writes.close()

    async def _write(self, pod: PodInfo, condition: dict[str, Any]) -> None:
        try:
            await self.client.patch(
                PODS,
                pod.name,
                {"status": {"conditions": [condition]}},
                pod.namespace,
                sub="status",
                patch_type=PatchType.STRATEGIC,
            )
            self.written += 1
        except NotFound:
            logger.debug("PodScheduled condition of %s not written: the pod is gone", pod.key)
        except KubeError as err:
            logger.warning("PodScheduled condition of %s not written: %s", pod.key, err)
