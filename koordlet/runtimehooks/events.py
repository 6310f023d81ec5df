"""Where the runtime hooks' Warning Events go.

In cluster mode :class:`KubeEventSink` creates a core/v1 Event on the pod (as Koordinator's
recorder does, component ``koordlet``); standalone, :class:`LogEventSink` logs it. Either way the
warning is also in the audit log (the dispatcher records it). Recording never blocks the request
and never raises into it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from apis.timestamp import format_time
from kubeclient.errors import ApiError
from kubeclient.resources import EVENTS

if TYPE_CHECKING:
    from koordlet.runtimehooks.model import PodMeta
    from kubeclient.client import KubeClient

logger = logging.getLogger(__name__)

COMPONENT = "koordlet"
"""The Event's ``source.component``."""


class EventSink(Protocol):
    """Records a Warning Event on a pod; must not block."""

    def warn(self, pod: PodMeta, reason: str, message: str) -> None:
        """Record it (or log why not)."""


class LogEventSink:
    """Standalone: the warning goes to the log."""

    def warn(self, pod: PodMeta, reason: str, message: str) -> None:
        logger.warning("pod %s: %s: %s", pod, reason, message)


class KubeEventSink:
    """Cluster mode: a Warning Event on the pod through the API server, in an owned task."""

    def __init__(self, client: KubeClient, node_name: str) -> None:
        self._client = client
        self._node = node_name
        self._tasks: set[asyncio.Task[None]] = set()

    def warn(self, pod: PodMeta, reason: str, message: str) -> None:
        logger.warning("pod %s: %s: %s", pod, reason, message)
        task = asyncio.get_running_loop().create_task(
            self._create(pod, reason, message), name=f"hook-event-{pod.uid}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Wait briefly for the Events in flight, then cancel what is left."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=1.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _create(self, pod: PodMeta, reason: str, message: str) -> None:
        now = time.time()
        stamp = format_time(now)
        event: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{pod.name}.{int(now * 1e9):x}", "namespace": pod.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": pod.namespace,
                "name": pod.name,
                "uid": pod.uid,
            },
            "type": "Warning",
            "reason": reason,
            "message": message,
            "source": {"component": COMPONENT, "host": self._node},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self._client.create(EVENTS, event)
        except ApiError as err:
            logger.info("event %s on pod %s not recorded: %s", reason, pod, err)
