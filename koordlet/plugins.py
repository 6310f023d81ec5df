"""How a plugin table names a factory without importing it: ``"package.module:attribute"``.

The collector, QoS strategy and runtime hook tables hold every row as data (name, gate, switch,
interval, families) plus the factory's reference, so that importing a table imports no plugin:
a plugin whose feature gate or switch is off by default (CPI, PSI, GPU, cold memory, network
QoS, the evictions...) costs nothing until it is enabled. The framework that builds a table's
enabled rows resolves each reference with :func:`resolve` at that moment, at start: a plugin
that cannot be imported fails the start, as a module-level import did (docs/architecture.md,
"Plugin tables"). Tests may still put a callable in a row.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


def resolve(ref: str) -> Any:
    """The attribute named by ``"package.module:attribute"``, importing the module if it is not
    yet. An unknown module raises ``ModuleNotFoundError``; an unknown attribute ``ImportError``;
    a reference without ``:`` ``ValueError``."""
    module, sep, attribute = ref.partition(":")
    if not sep or not module or not attribute:
        raise ValueError(f"plugin reference {ref!r} is not 'package.module:attribute'")
    loaded = importlib.import_module(module)
    try:
        return getattr(loaded, attribute)
    except AttributeError as err:
        raise ImportError(f"module {module!r} has no {attribute!r} ({ref!r})") from err


def load(factory: F | str) -> F:
    """A row's factory: the callable itself, or what its reference names."""
    if isinstance(factory, str):
        return cast(F, resolve(factory))
    return factory


def module_of(factory: Callable[..., Any] | str) -> str | None:
    """The module a reference names (None for a callable): what resolving it imports."""
    return factory.partition(":")[0] if isinstance(factory, str) else None
