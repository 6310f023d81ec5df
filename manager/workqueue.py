"""A keyed, deduplicating, rate-limited work queue (client-go's ``workqueue``, on asyncio).

- A key added while it waits is not added twice; a key added while a worker holds it is queued
  again when the worker calls :meth:`WorkQueue.done`, so no change is lost and no key is worked
  on by two workers at once.
- :meth:`WorkQueue.add_rate_limited` re-adds a failed key after a per-key exponential delay
  (``base`` doubling up to ``cap``, client-go's 5 ms to 1000 s); :meth:`WorkQueue.forget`
  resets it after a success.
"""

from __future__ import annotations

import asyncio
from collections import deque


class WorkQueue:
    """Keys (node names) waiting for a worker."""

    def __init__(self, *, base: float = 0.005, cap: float = 1000.0) -> None:
        self._queue: deque[str] = deque()
        self._waiting: set[str] = set()
        self._processing: set[str] = set()
        self._dirty_while_processing: set[str] = set()
        self._failures: dict[str, int] = {}
        self._delayed: dict[str, asyncio.TimerHandle] = {}
        self._ready = asyncio.Event()
        self.base = base
        self.cap = cap

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: str) -> None:
        """Queue ``key`` unless it is already waiting."""
        if key in self._processing:
            self._dirty_while_processing.add(key)
            return
        if key in self._waiting:
            return
        self._waiting.add(key)
        self._queue.append(key)
        self._ready.set()

    async def get(self) -> str:
        """The next key; the caller must call :meth:`done` with it."""
        while not self._queue:
            self._ready.clear()
            await self._ready.wait()
        key = self._queue.popleft()
        self._waiting.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: str) -> None:
        """The worker finished ``key``; queue it again if it changed meanwhile."""
        self._processing.discard(key)
        if key in self._dirty_while_processing:
            self._dirty_while_processing.discard(key)
            self.add(key)

    def delay_for(self, key: str) -> float:
        """The delay :meth:`add_rate_limited` would use now for ``key``."""
        return float(min(self.cap, self.base * 2.0 ** self._failures.get(key, 0)))

    def add_rate_limited(self, key: str) -> float:
        """Re-add ``key`` after its backoff delay; returns the delay."""
        delay = self.delay_for(key)
        self._failures[key] = self._failures.get(key, 0) + 1
        if key not in self._delayed:
            loop = asyncio.get_running_loop()
            self._delayed[key] = loop.call_later(delay, self._fire, key)
        return delay

    def _fire(self, key: str) -> None:
        self._delayed.pop(key, None)
        self.add(key)

    def forget(self, key: str) -> None:
        """Reset ``key``'s backoff after a success."""
        self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        """Consecutive failures recorded for ``key``."""
        return self._failures.get(key, 0)

    def idle(self) -> bool:
        """Nothing waiting and nothing held by a worker."""
        return not self._queue and not self._processing

    def close(self) -> None:
        """Cancel pending delayed adds."""
        for handle in self._delayed.values():
            handle.cancel()
        self._delayed.clear()
