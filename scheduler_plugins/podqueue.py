"""The standalone scheduler's queue (kube-scheduler's scheduling queue, in small): pending pods
and Reservations' reserve pods, highest ``spec.priority`` first, then oldest, then in arrival
order; a pod that failed waits out its backoff, 1 s doubling to 10 s (kube-scheduler's
``podInitialBackoffSeconds``/``podMaxBackoffSeconds``) before it is popped again.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler_plugins.snapshot import PodInfo

INITIAL_BACKOFF_S = 1.0
"""kube-scheduler's ``podInitialBackoffSeconds``: the first retry's wait."""
MAX_BACKOFF_S = 10.0
"""kube-scheduler's ``podMaxBackoffSeconds``: the wait doubles up to this."""


@dataclass(order=True, slots=True)
class _Entry:
    sort_key: tuple[int, float, int]
    uid: str = field(compare=False)


class PodQueue:
    """The queue; the scheduler decides what is queued and looks the pods up when they pop."""

    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._queued: set[str] = set()
        self.attempts: dict[str, int] = {}
        """Failed attempts by uid since the pod was last bound or forgotten."""
        self._not_before: dict[str, float] = {}
        self.wake = asyncio.Event()
        """Set when a pod is queued (the scheduler's loop waits on it)."""
        self._seq = 0

    def __contains__(self, uid: object) -> bool:
        return uid in self._queued

    def __len__(self) -> int:
        """Pods queued (some may have been bound or deleted since: dropped when popped)."""
        return len(self._queued)

    def push(self, pod: PodInfo) -> None:
        """Queue ``pod`` (the caller checks that it is not queued already) and wake the loop."""
        self._seq += 1
        created = pod.scheduled_at or 0.0
        heapq.heappush(self._heap, _Entry((-pod.priority, created, self._seq), pod.uid))
        self._queued.add(pod.uid)
        self.wake.set()

    def pop_ready(
        self, lookup: Callable[[str], PodInfo | None], now: float
    ) -> tuple[PodInfo | None, float | None]:
        """The next pod whose backoff is over at ``now``, else ``None`` and how long until one
        is; ``lookup`` gives a queued uid's pod as it is now (``None``: bound, deleted or assumed
        meanwhile, and dropped)."""
        deferred: list[_Entry] = []
        found: PodInfo | None = None
        soonest: float | None = None
        while self._heap:
            entry = heapq.heappop(self._heap)
            pod = lookup(entry.uid)
            if pod is None:  # bound, deleted, or assumed meanwhile
                self._queued.discard(entry.uid)
                continue
            ready_at = self._not_before.get(entry.uid, 0.0)
            if ready_at > now:
                deferred.append(entry)
                soonest = ready_at if soonest is None else min(soonest, ready_at)
                continue
            self._queued.discard(entry.uid)
            found = pod
            break
        for entry in deferred:
            heapq.heappush(self._heap, entry)
        return found, None if soonest is None else max(soonest - now, 0.0)

    def back_off(self, uid: str, now: float) -> None:
        """Count a failed attempt: the pod is not popped before its backoff ends."""
        n = self.attempts.get(uid, 0) + 1
        self.attempts[uid] = n
        delay = min(INITIAL_BACKOFF_S * 2 ** (n - 1), MAX_BACKOFF_S)
        self._not_before[uid] = now + delay

    def forget(self, uid: str) -> None:
        """Drop the attempts and backoff of ``uid`` (bound, or gone)."""
        self.attempts.pop(uid, None)
        self._not_before.pop(uid, None)
