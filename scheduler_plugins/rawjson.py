"""Shape checks of raw API JSON where it enters the scheduler's parsers.

An absent (``null``) field reads as empty; a field of the wrong JSON type is an
:class:`~scheduler_plugins.errors.InputError` naming the source, the field and the type found.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler_plugins.errors import InputError


def object_field(raw: Any, source: str, where: str) -> Mapping[str, Any]:
    """``raw`` as a JSON object (``{}`` when absent)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InputError(source, where, f"must be an object, got {type(raw).__name__}")
    return raw


def list_field(raw: Any, source: str, where: str) -> list[Any]:
    """``raw`` as a JSON list (``[]`` when absent)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InputError(source, where, f"must be a list, got {type(raw).__name__}")
    return raw
