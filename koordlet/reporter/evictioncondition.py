"""The ``koordinator.sh/BEEvictionPressure`` Node condition: BE pods stay off a node that is
evicting them (ours, gate ``BEEvictionCondition``, off by default; docs/qos-eviction.md).

Koordinator's koordlet evicts BE pods on memory or CPU pressure and nothing tells the scheduler,
which may place new BE pods on the same node at once, to be evicted in turn. Katalyst, Volcano and
the kubelet (``MemoryPressure``) mark such a node. Here:

- the evictor tells :meth:`EvictionCondition.on_evictions` of every eviction round; an eviction
  done (``evicted``, not a dry run, not a duplicate) by memory or CPU eviction turns the
  condition on, and every later one pushes its end back;
- :meth:`EvictionCondition.run` (one supervised task) writes ``status: "True"`` at once, and
  ``status: "False"`` once ``cool_down`` seconds (``--be-eviction-condition-cool-down``, 5 min)
  passed without an eviction. It writes only when the status it wants differs from the Node's,
  through ``kubeclient.writes.update_status`` (GET, PUT ``nodes/<name>/status`` with the read
  ``resourceVersion``, re-read and retried on 409): the kubelet's own conditions and heartbeat
  are kept whole. A failed write is retried with backoff;
- with the gate off it only lifts a ``True`` condition left by an earlier run (a koordlet
  restarted with the gate turned off must not keep BE pods away for ever).

koord-scheduler's ``BEEvictionPressure`` filter keeps BE pods off a node whose condition is
``True``; other pods are not concerned.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from apis.node_conditions import (
    CONDITION_BE_EVICTION_PRESSURE,
    REASON_BE_EVICTION_CONDITION_OFF,
    REASON_BE_EVICTION_COOLED_DOWN,
    REASON_EVICTING_BE_PODS,
)
from apis.timestamp import format_time
from koordlet.qos.evictor import Outcome
from kubeclient.backoff import Backoff
from kubeclient.errors import ApiError
from kubeclient.resources import NODES
from kubeclient.writes import update_status

if TYPE_CHECKING:  # the Kubernetes client is imported in cluster mode only
    from kubeclient.client import KubeClient, Obj

logger = logging.getLogger(__name__)

FEATURE_GATE = "BEEvictionCondition"
"""Our gate (not Koordinator's): write the condition."""
STRATEGIES = frozenset({"memoryevict", "cpuevict"})
"""The strategies whose evictions turn the condition on."""
RESYNC = 60.0
"""Seconds between two looks at the Node when nothing is pending (an edit by someone else, a
Node the informer did not know at start)."""
DEFAULT_COOL_DOWN = 300.0
"""Seconds without an eviction before the condition is lifted (``--be-eviction-condition-cool-
down``)."""


def condition_of(node: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The Node's ``koordinator.sh/BEEvictionPressure`` condition, or None."""
    status = (node or {}).get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for c in conditions if isinstance(conditions, list) else ():
        if isinstance(c, Mapping) and c.get("type") == CONDITION_BE_EVICTION_PRESSURE:
            return c
    return None


def with_condition(
    status: Mapping[str, Any], value: bool, reason: str, message: str, now: float
) -> dict[str, Any] | None:
    """``status`` with the condition set to ``value``; None when it already says so. The
    transition time moves only when the status changes, as the kubelet keeps its own."""
    want = "True" if value else "False"
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    old = next((c for c in conditions if c.get("type") == CONDITION_BE_EVICTION_PRESSURE), None)
    if old is not None and old.get("status") == want and old.get("reason") == reason:
        return None
    stamp = format_time(now)
    same = old is not None and old.get("status") == want
    new = {
        "type": CONDITION_BE_EVICTION_PRESSURE,
        "status": want,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": (old or {}).get("lastTransitionTime", stamp) if same else stamp,
    }
    rest = [dict(c) for c in conditions if c is not old]
    return {**status, "conditions": [*rest, new]}


class EvictionCondition:
    """See the module docstring.

    :param node: the informer's Node object (to skip writes it already agrees with).
    :param enabled: the gate; off: only a stale ``True`` is lifted.
    :param clock: monotonic seconds (the cool-down); :param wall: epoch seconds (timestamps).
    """

    def __init__(
        self,
        client: KubeClient,
        node_name: str,
        node: Callable[[], Mapping[str, Any] | None],
        *,
        enabled: bool,
        cool_down: float = DEFAULT_COOL_DOWN,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self._client = client
        self.node_name = node_name
        self._node = node
        self.enabled = enabled
        self.cool_down = cool_down
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._wake = asyncio.Event()
        self.last_eviction: float | None = None
        """Monotonic seconds of the last eviction that counts."""
        self.evictions = 0
        """Evictions that counted."""
        self._last_reason = ""
        self.written: bool | None = None
        """The status last written (None: nothing written yet)."""
        self.writes = 0
        self.last_error = ""

    # The evictor's listener ----------------------------------------------------------------

    def on_evictions(
        self, strategy: str, reason: str, outcomes: Sequence[Outcome], dry_run: bool
    ) -> None:
        """Note the evictions done by memory or CPU eviction (a dry run changes nothing)."""
        if not self.enabled or dry_run or strategy not in STRATEGIES:
            return
        done = sum(1 for o in outcomes if o.status == "evicted")
        if not done:
            return
        self.evictions += done
        self.last_eviction = self._clock()
        self._last_reason = f"{strategy}: {reason}"
        self._wake.set()

    # The loop ---------------------------------------------------------------------------------

    def desired(self) -> bool:
        """Whether the condition should be ``True`` now."""
        last = self.last_eviction
        return last is not None and self._clock() - last < self.cool_down

    def _node_status(self) -> str | None:
        cond = condition_of(self._safe_node())
        return None if cond is None else str(cond.get("status", ""))

    def _safe_node(self) -> Mapping[str, Any] | None:
        try:
            return self._node()
        except Exception:  # a broken getter must not stop the condition
            logger.exception("BE eviction condition: reading the Node failed")
            return None

    async def step(self) -> float | None:
        """Write what is wanted now, if it differs; returns the seconds until the cool-down ends
        (None: nothing pending)."""
        if not self.enabled:
            if self._node_status() == "True":
                await self._write(
                    False,
                    REASON_BE_EVICTION_CONDITION_OFF,
                    f"feature gate {FEATURE_GATE} is off on this koordlet",
                )
            return None
        if self.written is None and self.last_eviction is None and self._node_status() == "True":
            # Left on by an earlier run (a restart): hold it a whole cool-down from now.
            self.last_eviction = self._clock()
            self._last_reason = "before a koordlet restart"
            self.written = True
        want = self.desired()
        if want:
            remaining = self.cool_down - (self._clock() - (self.last_eviction or 0.0))
            if self.written is not True or self._node_status() != "True":
                until = format_time(self._wall() + remaining)
                await self._write(
                    True,
                    REASON_EVICTING_BE_PODS,
                    f"the koordlet evicted BE pods ({self._last_reason}); new BE pods are kept "
                    f"off until {until} ({self.cool_down:g}s after the last eviction)",
                )
            return remaining
        if self.written is True or (self.written is None and self._node_status() == "True"):
            await self._write(
                False,
                REASON_BE_EVICTION_COOLED_DOWN,
                f"no BE eviction for {self.cool_down:g}s",
            )
        return None

    async def _write(self, value: bool, reason: str, message: str) -> None:
        now = self._wall()

        def build(node: Obj) -> Mapping[str, Any] | None:
            return with_condition(node.get("status") or {}, value, reason, message, now)

        await update_status(self._client, NODES, self.node_name, build, sleep=self._sleep)
        self.written = value
        self.writes += 1
        logger.info(
            "node %s: condition %s=%s (%s)",
            self.node_name,
            CONDITION_BE_EVICTION_PRESSURE,
            value,
            reason,
        )

    async def run(self) -> None:
        """Eternal: write at each eviction, when the cool-down ends and every :data:`RESYNC`
        seconds if the Node disagrees; retry failed writes with backoff."""
        backoff = Backoff(base=1.0, cap=60.0)
        while True:
            try:
                wait = await self.step()
                self.last_error = ""
                backoff.reset()
            except ApiError as err:
                self.last_error = str(err)
                wait = backoff.next_delay()
                logger.warning("BE eviction condition not written (retry in %.1fs): %s", wait, err)
            self._wake.clear()
            try:
                async with asyncio.timeout(RESYNC if wait is None else min(wait, RESYNC)):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def describe(self) -> dict[str, Any]:
        """Plain data for ``/debug/qos``."""
        return {
            "enabled": self.enabled,
            "condition": CONDITION_BE_EVICTION_PRESSURE,
            "cool_down_s": self.cool_down,
            "desired": self.desired(),
            "written": self.written,
            "evictions": self.evictions,
            "writes": self.writes,
            "last_error": self.last_error,
        }
