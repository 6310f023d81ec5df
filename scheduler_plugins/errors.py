"""The scheduler's exception tree::

SchedulerError
├── InputError        a snapshot, pod or config document is unusable (names file and field)
└── PluginArgsError   a plugin's args are invalid (an InputError too)
"""

from __future__ import annotations


class SchedulerError(Exception):
    """Base of every error raised by ``scheduler_plugins``."""


class InputError(SchedulerError):
    """A document the scheduler was given is unusable: which file, which field, what is wrong."""

    def __init__(self, source: str, field: str, message: str) -> None:
        self.source = source
        self.field = field
        self.message = message
        where = f"{source}: {field}" if field else source
        super().__init__(f"{where}: {message}")


class PluginArgsError(InputError):
    """A plugin's args (``pluginConfig[].args``) are invalid."""
