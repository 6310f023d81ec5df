"""The scheduler's exception tree::

SchedulerError
├── InputError        a snapshot, pod, config or extender request is unusable (names the field)
│   └── PluginArgsError   a plugin's args are invalid
└── NotReady          a decision would read informers not synced yet (names them)
"""

from __future__ import annotations

from apis.errors import FieldError


class SchedulerError(Exception):
    """Base of every error raised by ``scheduler_plugins``."""


class InputError(SchedulerError, FieldError):
    """A document the scheduler was given is unusable: which file, which field, what is wrong."""

    def __init__(self, source: str, field: str, message: str) -> None:
        super().__init__(message, source=source, field=field)


class PluginArgsError(InputError):
    """A plugin's args (``pluginConfig[].args``) are invalid."""


class NotReady(SchedulerError):
    """A decision was asked for before every informer it reads had listed (or while one
    relists after a 410): the message names them."""
