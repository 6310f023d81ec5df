"""koord-runtime-proxy's exception tree.

::

    ProxyError          anything the proxy raises itself
     └── ConfigError    a bad flag or hook-server file (names the flag or file and the field)

Errors of the backend runtime are not translated: the kubelet gets the runtime's own status.
A hook server's failure is never an error of the call: the call goes on unchanged (fail open).
"""

from __future__ import annotations


class ProxyError(Exception):
    """Base of the proxy's errors."""


class ConfigError(ProxyError):
    """A bad setting; ``source`` is the flag or file, ``field`` what was wrong in it."""

    def __init__(self, message: str, *, source: str, field: str = "") -> None:
        where = f"{source}: {field}" if field else source
        super().__init__(f"{where}: {message}")
        self.source = source
        self.field = field
