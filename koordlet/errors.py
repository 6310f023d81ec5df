"""The koordlet's exception tree.

::

    KoordletError
    ├── ConfigError            bad flags, config file or NodeSLO file (an apis FieldError)
    ├── HostError              the host refused or lacks something
    │   ├── UnsupportedError   a knob or source this host cannot provide (with the reason)
    │   ├── CgroupGoneError    the cgroup vanished (ENOENT); a race with deletion, not a fault
    │   ├── ParseError         a kernel file in a format we do not understand
    │   └── WritesRefusedError a round did all it could, but the kernel refused some writes
    └── InvalidValueError      a value outside a knob's valid range (never written)

Host code translates ``OSError`` into these at the boundary and chains the cause.
"""

from __future__ import annotations

from apis.errors import FieldError


class KoordletError(Exception):
    """Base of every error the koordlet raises on purpose."""


class ConfigError(KoordletError, FieldError):
    """Bad configuration; the message names the file (or flag) and the field."""


class HostError(KoordletError):
    """Something on the host could not be read or written."""


class UnsupportedError(HostError):
    """The host cannot provide this knob or source; ``reason`` says why."""

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"{what} unsupported: {reason}")


class CgroupGoneError(HostError):
    """The cgroup (or file) disappeared while we used it: a normal race with deletion."""


class ParseError(HostError):
    """A kernel file had a format we do not understand; names the file."""


class WritesRefusedError(HostError):
    """A round that went on past refused writes and did all the rest; raised at its end so the
    loop counts a failed step. Each refusal was already logged by its owner (once per change,
    :class:`koordlet.qos.shared.WriteFailures`), so the supervisor logs this one at debug."""

    def __init__(self, who: str, failures: list[str]) -> None:
        self.failures = failures
        more = f" (and {len(failures) - 3} more)" if len(failures) > 3 else ""
        super().__init__(f"{who}: {len(failures)} writes refused: {'; '.join(failures[:3])}{more}")


class InvalidValueError(KoordletError):
    """A value outside a knob's valid range; it is never written."""
