"""Core v1 Events as client-go's recorder writes them (``tools/record/event.go``, ``makeEvent``).

:func:`core_event` builds the object; the caller creates it (``client.create(EVENTS, event)``).
The name is ``<object name>.<nanoseconds in hex>``, the Event lives in the object's namespace,
or in ``default`` for a cluster-scoped object (a Node, a NodeSLO), as the recorder does.

:class:`PodEventSink` is the node agent's Warning Event writer for pods: it logs the warning,
then creates the Event in an owned task, so recording never blocks its caller and never raises
into it. The module imports no transport (standalone binaries import it for free).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Protocol

from kubeclient.errors import ApiError
from kubeclient.resources import EVENTS

if TYPE_CHECKING:
    from kubeclient.client import KubeClient, Obj

logger = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "default"
"""Where the Events of cluster-scoped objects go (``metav1.NamespaceDefault``)."""
MAX_MESSAGE = 1024
"""Characters of the message kept (the API server refuses longer ones)."""


def core_event(
    involved: Obj,
    *,
    reason: str,
    message: str,
    component: str,
    host: str = "",
    event_type: str = "Warning",
    now: float | None = None,
) -> Obj:
    """A ``v1`` Event about ``involved`` (``apiVersion``, ``kind``, ``name`` and, when it has
    them, ``namespace``, ``uid``, ``resourceVersion``), first and last seen ``now`` (wall-clock
    seconds; default the current time), counted once."""
    # Imported here: ``datetime`` (0.26 MiB) is then loaded only once an Event is made, never
    # by a standalone koordlet, which imports this module for its pod-warning sinks.
    from apis.timestamp import format_time

    stamp_ns = time.time_ns() if now is None else int(now * 1e9)
    stamp = format_time(stamp_ns // 1_000_000_000)
    ref = {k: v for k, v in involved.items() if v not in ("", None)}
    source = {"component": component, **({"host": host} if host else {})}
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{involved.get('name', '')}.{stamp_ns:x}",
            "namespace": involved.get("namespace") or DEFAULT_NAMESPACE,
        },
        "involvedObject": ref,
        "type": event_type,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "source": source,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class PodRef(Protocol):
    """Who a pod is: what an Event's ``involvedObject`` names."""

    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...


class PodEventSink:
    """Warning Events on pods through the API server, each created in an owned task.

    :meth:`warn` logs ``pod <namespace>/<name>: <reason>: <message>`` on ``log``, then creates the
    Event (``source.component`` is ``component``, ``source.host`` the node); an API error is
    logged at INFO, never raised. :meth:`close` waits briefly for the Events in flight.
    """

    def __init__(
        self,
        client: KubeClient,
        node_name: str,
        *,
        component: str,
        task_prefix: str,
        log: logging.Logger = logger,
    ) -> None:
        self._client = client
        self._node = node_name
        self._component = component
        self._task_prefix = task_prefix
        """Each Event's task is named ``<task_prefix><pod uid>``."""
        self._log = log
        self._tasks: set[asyncio.Task[None]] = set()

    def warn(self, pod: PodRef, reason: str, message: str) -> None:
        """Log the warning and create its Event on ``pod`` in the background; must be called on
        the event loop."""
        self._log.warning("pod %s/%s: %s: %s", pod.namespace, pod.name, reason, message)
        involved = {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": pod.namespace,
            "name": pod.name,
            "uid": pod.uid,
        }
        event = core_event(
            involved, reason=reason, message=message, component=self._component, host=self._node
        )
        task = asyncio.get_running_loop().create_task(
            self._create(pod, event), name=f"{self._task_prefix}{pod.uid}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _create(self, pod: PodRef, event: Obj) -> None:
        try:
            await self._client.create(EVENTS, event)
        except ApiError as err:
            self._log.info(
                "event %s on pod %s/%s not recorded: %s",
                event["reason"],
                pod.namespace,
                pod.name,
                err,
            )

    async def close(self) -> None:
        """Wait briefly (1 s) for the Events in flight, then cancel what is left."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=1.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
