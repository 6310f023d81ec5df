"""The descheduler's exception tree::

    DeschedulerError
    ├── ConfigError       the configuration file or a flag is unusable (names the field); exit 2
    └── InputError        a snapshot or an API object is unusable (names the file and field)

Both are :class:`~apis.errors.FieldError`\\ s: ``str()`` reads ``source: field: message``.
"""

from __future__ import annotations

from apis.errors import FieldError


class DeschedulerError(Exception):
    """Base of every error raised by ``descheduler``."""


class ConfigError(DeschedulerError, FieldError):
    """A configuration document or flag is invalid: which file, which field, what is wrong."""

    def __init__(self, source: str, field: str, message: str) -> None:
        super().__init__(message, source=source, field=field)


class InputError(DeschedulerError, FieldError):
    """A snapshot file or an API object cannot be read: which document, which field."""

    def __init__(self, source: str, field: str, message: str) -> None:
        super().__init__(message, source=source, field=field)
