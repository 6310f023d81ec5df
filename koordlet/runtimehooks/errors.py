"""The runtime hooks' exception tree.

::

    RuntimeHookError            anything the hooks framework raises
     ├── BadPodInput            the pod's own data is malformed (a bad extended-resource spec, a
     │                          quantity that does not parse): the pod is left unchanged by the
     │                          hook (or gets its ``fallback``, the value without the malformed
     │                          part), a Warning Event names the field,
     │                          koordlet_runtime_hook_bad_input_total counts it
     ├── ProtocolError          a peer sent bytes that are not the protocol (ttrpc framing, an
     │                          NRI message that does not decode): the connection is dropped
     └── TtrpcError             a ttrpc call answered with a non-OK status (``code``,
                                ``message``): the NRI session is redialled

A hook that raises anything else has failed: the request goes on unchanged (fail open), the
failure is counted and audited (docs/runtimehooks.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from koordlet.runtimehooks.model import Change


class RuntimeHookError(Exception):
    """Base of the runtime hooks' errors."""


class BadPodInput(RuntimeHookError):
    """The pod's data is malformed; ``reason`` is the Event reason (CamelCase), ``field`` what
    was malformed."""

    def __init__(
        self, reason: str, field: str, message: str, *, fallback: Change | None = None
    ) -> None:
        super().__init__(f"{field}: {message}")
        self.reason = reason
        """The Warning Event's reason, e.g. ``InvalidExtendedResourceSpec``."""
        self.field = field
        """The annotation key or resource name that was malformed."""
        self.message = message
        """Why, in a sentence."""
        self.fallback = fallback
        """What the hook asks for without the malformed part (a pod override that does not
        parse keeps its class's value); None: the hook leaves the pod unchanged."""


class ProtocolError(RuntimeHookError):
    """A peer broke the wire protocol; the connection cannot go on."""


class TtrpcError(RuntimeHookError):
    """A ttrpc call answered with a non-OK status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"ttrpc status {code}: {message}")
        self.code = code
        self.message = message
