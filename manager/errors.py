"""koord-manager's exception tree.

::

    ManagerError
    ├── InputError      a Node, NodeMetric, pod list or file that does not fit its schema
    │                   (also an apis.errors.FieldError and a ValueError)
    └── webhook.profiles.ProfileError   a ClusterColocationProfile that cannot be used
                        (also an apis.errors.FieldError and a ValueError)

Configuration errors are :class:`apis.slo.SchemaError` (raised by ``apis.sloconfig``); the
CLI reports both kinds the same way (exit 2, naming the file and the field).
"""

from __future__ import annotations

from apis.errors import FieldError


class ManagerError(Exception):
    """Base of every error koord-manager raises on purpose."""


class InputError(ManagerError, FieldError, ValueError):
    """An input object that does not fit its schema; names its source and the field path."""

    def __init__(self, source: str, field: str, message: str) -> None:
        super().__init__(message, source=source, field=field)
