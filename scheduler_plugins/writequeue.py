"""Writes to the API server off the scheduling path: Events, pods' ``PodScheduled`` condition.

A :class:`WriteQueue` takes a write with :meth:`~WriteQueue.submit` (synchronous: a scheduling
cycle never waits on the API server for what it reports) and runs it in one of at most
``max_in_flight`` owned tasks, started on demand and ended when nothing is left. Rules:

- **keyed and coalesced**: a write submitted for a key already waiting replaces it (in its
  place in line): the latest state of an Event series or a condition is what goes out;
- **one write a key at a time**: a key being written is not written again before that ends
  (a series patch never races the creation of its Event), the next write waits in line;
- **bounded**: at most ``max_queued`` keys wait; more are dropped and counted (client-go's
  event broadcaster drops past its 1,000 queued events the same way,
  ``maxQueuedEvents`` in ``tools/events/event_broadcaster.go``), one warning a burst;
- :meth:`~WriteQueue.settle` withdraws a key's waiting write and waits for one in flight (a
  binding goes out only after the pod's last condition write); :meth:`~WriteQueue.flush`
  waits until every write is done; :meth:`~WriteQueue.close` cancels what is left.

A write is an ``async`` callable that handles its own API errors (logs them); anything else it
raises is logged here as a bug and does not stop the queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable

logger = logging.getLogger(__name__)

Write = Callable[[], Awaitable[None]]

MAX_IN_FLIGHT = 16
"""Writes in flight at most, per queue."""
MAX_QUEUED = 1000
"""Keys waiting at most (client-go's ``maxQueuedEvents``)."""


class WriteQueue:
    """Keyed, coalesced, bounded writes run by owned tasks (see the module docstring)."""

    def __init__(
        self, name: str, *, max_in_flight: int = MAX_IN_FLIGHT, max_queued: int = MAX_QUEUED
    ) -> None:
        if max_in_flight < 1 or max_queued < 1:
            raise ValueError("max_in_flight and max_queued must be at least 1")
        self.name = name
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self._waiting: dict[Hashable, Write] = {}
        self._active: dict[Hashable, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._workers = 0
        """Tasks in :meth:`_work` now (a finished task leaves ``_tasks`` only later)."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._dropping = False
        self.done = 0
        """Writes run to their end."""
        self.dropped = 0
        """Writes dropped because ``max_queued`` keys were waiting."""

    def __len__(self) -> int:
        """Writes waiting or in flight."""
        return len(self._waiting) + len(self._active)

    def submit(self, key: Hashable, write: Write) -> bool:
        """Queue ``write`` for ``key`` (replacing one waiting); whether it was taken."""
        if key in self._waiting:
            self._waiting[key] = write
            return True
        if len(self._waiting) >= self.max_queued:
            self.dropped += 1
            if not self._dropping:
                self._dropping = True
                logger.warning(
                    "%s: %d writes waiting, dropping more until they drain",
                    self.name,
                    len(self._waiting),
                )
            return False
        self._waiting[key] = write
        self._idle.clear()
        if self._workers < self.max_in_flight:
            self._workers += 1
            task = asyncio.get_running_loop().create_task(self._work(), name=f"{self.name}-writer")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return True

    def _next(self) -> tuple[Hashable, Write] | None:
        for key in self._waiting:
            if key not in self._active:
                return key, self._waiting.pop(key)
        return None

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while (found := self._next()) is not None:
                key, write = found
                done = self._active[key] = loop.create_future()
                try:
                    await write()
                    self.done += 1
                except Exception:  # a write's own errors are its to handle: this is a bug
                    logger.exception("%s: write for %r failed", self.name, key)
                finally:
                    del self._active[key]
                    done.set_result(None)
        finally:
            self._workers -= 1
            # a key left waiting is one another task is writing: that task takes it next
            if not self._waiting and not self._active:
                self._idle.set()
                if self._dropping:
                    self._dropping = False
                    logger.warning("%s: drained; %d writes dropped so far", self.name, self.dropped)

    async def settle(self, key: Hashable) -> None:
        """Withdraw ``key``'s waiting write and wait for its write in flight, if any."""
        self._waiting.pop(key, None)
        active = self._active.get(key)
        if active is not None:
            await asyncio.shield(active)
        if not self._waiting and not self._active:
            self._idle.set()

    async def flush(self) -> None:
        """Wait until every write submitted so far (and since) is done."""
        while self._waiting or self._active:
            self._idle.clear()
            await self._idle.wait()

    async def close(self) -> None:
        """Cancel the writes in flight and drop those waiting."""
        self._waiting.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._workers = 0
        self._active.clear()
        self._idle.set()
