"""Immutable records: ``@frozen`` is ``@dataclass(frozen=True, slots=True)`` for less memory.

A frozen dataclass gets a generated ``__setattr__`` and ``__delattr__`` of its own, compiled for
each class, and on Python 3.11 they keep alive the class as it was before ``slots=True`` rebuilt
it (their closures name that class): about 4.4 KiB a class that does nothing a shared pair could
not do. ``@frozen`` builds the same dataclass, then gives it the shared pair below, so the
original class can be collected. The processes load a few hundred such classes (168 in a
standalone koordlet: 0.78 MiB of its resident memory, docs/benchmarks.md).

The behaviour is the documented one: assigning or deleting any attribute of an instance of the
class raises ``dataclasses.FrozenInstanceError``; on an instance of a subclass that is not
itself a dataclass, the class's fields are refused and other attributes go to the next class in
the method resolution order. (For those other attributes Python 3.11's generated methods raise
``TypeError`` from ``super()`` instead, since they name the class from before ``slots=True``;
tests/apis/test_records.py shows both.) ``fields``, ``replace``, ``asdict``, pickling and type
checkers see an ordinary frozen dataclass (``typing.dataclass_transform``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar, dataclass_transform

__all__ = ["frozen"]

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def frozen(cls: type[T]) -> type[T]:
    """``@dataclass(frozen=True, slots=True)`` with the shared attribute guards."""
    built = dataclasses.dataclass(frozen=True, slots=True)(cls)
    built.__setattr__ = _frozen_setattr  # type: ignore[method-assign]
    built.__delattr__ = _frozen_delattr  # type: ignore[method-assign]
    return built


def _owner(kind: type) -> type:
    """The nearest class in ``kind``'s method resolution order that ``@frozen`` made."""
    for klass in kind.__mro__:
        if klass.__dict__.get("__setattr__") is _frozen_setattr:
            return klass
    raise TypeError(f"{kind.__qualname__} has no @frozen class in its bases")  # unreachable


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    owner: Any = _owner(type(self))
    if type(self) is owner or name in owner.__dataclass_fields__:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
    super(owner, self).__setattr__(name, value)


def _frozen_delattr(self: Any, name: str) -> None:
    owner: Any = _owner(type(self))
    if type(self) is owner or name in owner.__dataclass_fields__:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
    super(owner, self).__delattr__(name)
