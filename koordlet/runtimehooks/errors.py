"""The runtime hooks' exception tree.

::

    RuntimeHookError            anything the hooks framework raises
     ├── BadPodInput            the pod's own data is malformed (a bad extended-resource spec, a
     │                          quantity that does not parse): the pod is left unchanged, a
     │                          Warning Event names the field, koordlet_runtime_hook_bad_input_total
     │                          counts it
     └── ProtocolError          a peer sent bytes that are not the protocol (ttrpc framing, an
                                NRI message that does not decode): the connection is dropped

A hook that raises anything else has failed: the request goes on unchanged (fail open), the
failure is counted and audited (docs/runtimehooks.md).
"""

from __future__ import annotations


class RuntimeHookError(Exception):
    """Base of the runtime hooks' errors."""


class BadPodInput(RuntimeHookError):
    """The pod's data is malformed; ``reason`` is the Event reason (CamelCase), ``field`` what
    was malformed."""

    def __init__(self, reason: str, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.reason = reason
        """The Warning Event's reason, e.g. ``InvalidExtendedResourceSpec``."""
        self.field = field
        """The annotation key or resource name that was malformed."""
        self.message = message
        """Why, in a sentence."""


class ProtocolError(RuntimeHookError):
    """A peer broke the wire protocol; the connection cannot go on."""
