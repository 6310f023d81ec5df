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

``__eq__``, ``__hash__`` and ``__repr__`` are shared the same way: the generated ones cost about
4.3 KiB a class (three functions compiled from source for each), the shared ones a key getter
and a tuple of names. They answer as the generated ones do: equal only to an instance of the
very same class whose compared fields are equal as tuples are (so a field holding NaN compares
equal to itself, by identity); the hash of the tuple of the hashed fields; ``Name(field=...)``
of the fields shown in the repr, ``...`` on recursion. Fields' ``compare``, ``hash`` and
``repr`` flags are honoured, and a method the class body defines itself is kept.
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform

__all__ = ["frozen"]

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def frozen(cls: type[T]) -> type[T]:
    """``@dataclass(frozen=True, slots=True)`` with the shared methods."""
    body = cls.__dict__
    own_eq = "__eq__" in body
    # the dataclass rule: a __hash__ of the body's own, unless it is the None that Python sets
    # for a body defining __eq__ alone
    own_hash = "__hash__" in body and not (body["__hash__"] is None and own_eq)
    own_repr = "__repr__" in body
    built: Any = dataclasses.dataclass(frozen=True, slots=True, eq=False, repr=False)(cls)
    built.__setattr__ = _frozen_setattr
    built.__delattr__ = _frozen_delattr
    fields = dataclasses.fields(built)
    if not own_eq:
        built._frozen_eq_key = _key([f.name for f in fields if f.compare])
        built.__eq__ = _frozen_eq
    if not own_hash:
        hashed = [f.name for f in fields if (f.compare if f.hash is None else f.hash)]
        built._frozen_hash_key = _key(hashed)
        built.__hash__ = _frozen_hash
    if not own_repr:
        built._frozen_repr_names = tuple(f.name for f in fields if f.repr)
        built.__repr__ = _frozen_repr
    return built  # type: ignore[no-any-return]


class _Few:
    """The tuple of no attribute or of one (``attrgetter`` of one name answers the bare value);
    an object, not a function, so that reading it off an instance binds nothing."""

    __slots__ = ("name",)

    def __init__(self, name: str | None) -> None:
        self.name = name

    def __call__(self, obj: object) -> tuple[object, ...]:
        return () if self.name is None else (getattr(obj, self.name),)


def _key(names: list[str]) -> Callable[[object], tuple[object, ...]]:
    """The tuple of ``names``' values, as the generated methods build it."""
    if len(names) >= 2:
        return attrgetter(*names)
    return _Few(names[0] if names else None)


def _frozen_eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    key = self._frozen_eq_key
    return key(self) == key(other)


def _frozen_hash(self: Any) -> int:
    return hash(self._frozen_hash_key(self))


@reprlib.recursive_repr()
def _frozen_repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._frozen_repr_names)
    return f"{self.__class__.__qualname__}({shown})"


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
