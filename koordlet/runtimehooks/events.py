"""Where the runtime hooks' Warning Events go.

In cluster mode :class:`KubeEventSink` creates a core/v1 Event on the pod (as Koordinator's
recorder does, component ``koordlet``); standalone, :class:`LogEventSink` logs it. Either way the
warning is also in the audit log (the dispatcher records it). Recording never blocks the request
and never raises into it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from kubeclient.events import PodEventSink

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


class KubeEventSink(PodEventSink):
    """Cluster mode: a Warning Event on the pod through the API server (the shared
    :class:`~kubeclient.events.PodEventSink`), in an owned task."""

    def __init__(self, client: KubeClient, node_name: str) -> None:
        super().__init__(
            client, node_name, component=COMPONENT, task_prefix="hook-event-", log=logger
        )
