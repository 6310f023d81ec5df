"""Core v1 Events as client-go's recorder writes them (``tools/record/event.go``, ``makeEvent``).

:func:`core_event` builds the object; the caller creates it (``client.create(EVENTS, event)``).
The name is ``<object name>.<nanoseconds in hex>``, the Event lives in the object's namespace,
or in ``default`` for a cluster-scoped object (a Node, a NodeSLO), as the recorder does.
"""

from __future__ import annotations

import time

from apis.timestamp import format_time
from kubeclient.client import Obj

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
