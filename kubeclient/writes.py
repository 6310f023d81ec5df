"""Writing safely: status updates that survive conflicts, merge patches, a bounded write rate.

* :func:`update_status` reads the object, lets the caller build its new status from it, and
  PUTs it through the ``status`` subresource with the read ``resourceVersion``; a 409 means
  someone wrote in between, so it reads again and retries (client-go's ``RetryOnConflict``:
  five attempts, 10 ms doubling, with jitter).
* :func:`merge_patch` is the RFC 7386 patch that turns one JSON document into another;
  :func:`apply_merge_patch` applies one (or the strategic merge patch subset pod patches use).
* :class:`WriteRateLimiter` is a token bucket: an agent on every node must never turn a bug or a
  flapping value into a write storm against the API server.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubeclient.backoff import Backoff
from kubeclient.client import KubeClient, Obj
from kubeclient.errors import Conflict
from kubeclient.resources import Resource

CONFLICT_ATTEMPTS = 5
"""Attempts of a conflicting write (client-go's ``retry.DefaultRetry.Steps``)."""


async def update_status(
    client: KubeClient,
    res: Resource,
    name: str,
    build: Callable[[Obj], Mapping[str, Any] | None],
    namespace: str | None = None,
    *,
    attempts: int = CONFLICT_ATTEMPTS,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> Obj | None:
    """Replace ``status`` of one object with ``build(current object)``, retrying on 409.

    ``build`` returning None means nothing to write (the answer is then None). NotFound and
    every other error propagate; after ``attempts`` conflicts the last :class:`Conflict` does.
    """
    backoff = Backoff(base=0.01, cap=1.0)
    for attempt in range(attempts):
        current = await client.get(res, name, namespace)
        status = build(current)
        if status is None:
            return None
        updated = dict(current)
        updated["status"] = dict(status)
        try:
            return await client.replace(res, updated, sub="status")
        except Conflict:
            if attempt + 1 >= attempts:
                raise
            await sleep(backoff.next_delay())
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) from ``old`` to ``new``: changed keys, ``None`` for
    removed ones, nested objects patched recursively, lists replaced whole."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key, _MISSING)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif before is _MISSING or before != value:
            patch[key] = copy.deepcopy(value)
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


def apply_merge_patch(target: Any, patch: Any, *, merge_named_lists: bool = False) -> Any:
    """``patch`` applied to ``target`` per RFC 7386 (a new document; inputs untouched).

    With ``merge_named_lists``, the subset of Kubernetes' strategic merge patch that pod patches
    use: a list of objects that all have a ``name`` merges into the target's list by name
    (an item with a new name is appended); other lists and scalars replace.
    """
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif merge_named_lists and isinstance(out.get(key), list) and _named(value):
            merged = list(out[key])
            for item in value:
                idx = next((i for i, c in enumerate(merged) if c.get("name") == item["name"]), -1)
                if idx < 0:
                    merged.append(copy.deepcopy(item))
                else:
                    merged[idx] = apply_merge_patch(merged[idx], item, merge_named_lists=True)
            out[key] = merged
        else:
            out[key] = apply_merge_patch(out.get(key), value, merge_named_lists=merge_named_lists)
    return out


def _named(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(i, Mapping) and "name" in i for i in value)
    )


_MISSING = object()


class WriteRateLimiter:
    """Token bucket: ``rate`` writes a second on average, at most ``burst`` at once.

    Koordinator's NodeMetric status writer uses 0.1/s with a burst of 2.
    """

    def __init__(
        self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"write rate {rate}/s burst {burst}: both must be positive")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self.refused = 0
        """Writes refused so far."""

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now

    def try_acquire(self) -> bool:
        """Take a token if one is there (the write may go ahead), else count a refusal."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.refused += 1
        return False

    def wait_time(self) -> float:
        """Seconds until a token is there (0 when one is)."""
        self._refill()
        return 0.0 if self._tokens >= 1.0 else (1.0 - self._tokens) / self.rate
