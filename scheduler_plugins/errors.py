"""The scheduler's exception tree::

SchedulerError
├── InputError        a snapshot, pod or config document is unusable (an apis FieldError)
└── PluginArgsError   a plugin's args are invalid (an InputError too)
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
