"""koord-manager's exception tree.

::

    ManagerError
    └── InputError      a Node, NodeMetric, pod list or file that does not fit its schema

Configuration errors are :class:`apis.slo.SchemaError` (raised by ``apis.configuration``); the
CLI reports both kinds the same way (exit 2, naming the file and the field).
"""

from __future__ import annotations


class ManagerError(Exception):
    """Base of every error koord-manager raises on purpose."""


class InputError(ManagerError, ValueError):
    """An input object that does not fit its schema; names its source and the field path."""

    def __init__(self, source: str, field: str, message: str) -> None:
        self.source = source
        self.field = field
        self.message = message
        where = ": ".join(p for p in (source, field) if p)
        super().__init__(f"{where}: {message}" if where else message)
