"""Booleans as Go's ``strconv.ParseBool`` reads them: flags, feature gates, boolean labels.

Go (``strconv/atob.go``) accepts exactly ``1 t T TRUE true True`` for true and
``0 f F FALSE false False`` for false; anything else (``yes``, ``tRUE``, `` true``, ``""``) is an
error. Koordinator reads its boolean flags (``--feature-gates``, ``--enable-leader-election``)
and boolean node labels (``node.koordinator.sh/cpu-normalization-enabled``) this way, so ours do
too. :func:`format_go_bool` is ``strconv.FormatBool``.
"""

from __future__ import annotations

GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
"""Every spelling ``strconv.ParseBool`` reads as true."""
GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
"""Every spelling ``strconv.ParseBool`` reads as false."""


def parse_go_bool(text: str) -> bool:
    """``strconv.ParseBool(text)``; ``ValueError`` naming the text for any other spelling."""
    if text in GO_TRUE:
        return True
    if text in GO_FALSE:
        return False
    raise ValueError(f"invalid bool value {text!r} (want true or false)")


def format_go_bool(value: bool) -> str:
    """``strconv.FormatBool``: ``"true"`` or ``"false"``."""
    return "true" if value else "false"
