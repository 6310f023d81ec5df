"""``apis.records.frozen`` behaves as ``@dataclass(frozen=True, slots=True)`` and lets the class
it was built from be collected."""

from __future__ import annotations

import copy
import dataclasses
import gc
import pickle
import weakref

import pytest

from apis.records import frozen


@frozen
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class StdPoint:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()


class Plain(Point):
    """A subclass that is not a dataclass: it has a ``__dict__`` for attributes of its own."""


class StdPlain(StdPoint):
    pass


@frozen
class Point3(Point):
    z: int = 0


def outcome(action: object) -> str:
    try:
        action()  # type: ignore[operator]
    except dataclasses.FrozenInstanceError as err:
        return f"frozen: {err}"
    except AttributeError as err:
        return f"attribute: {type(err).__name__}"
    return "ok"


@pytest.mark.parametrize("name", ["x", "y"])
def test_fields_as_the_standard_library(name: str) -> None:
    for ours, std in ((Point(1, 2), StdPoint(1, 2)), (Plain(1, 2), StdPlain(1, 2))):
        set_ours = outcome(lambda o=ours: setattr(o, name, 5))
        assert set_ours == outcome(lambda s=std: setattr(s, name, 5))
        assert set_ours.startswith("frozen: cannot assign")
        del_ours = outcome(lambda o=ours: delattr(o, name))
        assert del_ours == outcome(lambda s=std: delattr(s, name))
        assert (ours.x, ours.y) == (std.x, std.y) == (1, 2)


def test_other_attributes_are_refused_as_frozen() -> None:
    # Python 3.11's generated methods answer TypeError here (they name the class from before
    # slots=True, which the instance is not an instance of); the documented answer is this one.
    p = Point(1)
    for action in (lambda: setattr(p, "other", 5), lambda: delattr(p, "other")):
        assert outcome(action).startswith("frozen: cannot")
    with pytest.raises(TypeError, match="super"):
        StdPoint(1).other = 5


def test_a_plain_subclass_keeps_attributes_of_its_own() -> None:
    p = Plain(1)
    p.note = "kept"  # type: ignore[attr-defined]
    assert p.note == "kept"  # type: ignore[attr-defined]
    del p.note  # type: ignore[attr-defined]
    assert not hasattr(p, "note")


def test_a_frozen_subclass_refuses_its_own_and_inherited_fields() -> None:
    p = Point3(1, 2, z=3)
    for name in ("x", "z", "other"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(p, name, 9)
    assert (p.x, p.y, p.z) == (1, 2, 3)


def test_still_a_slotted_frozen_dataclass() -> None:
    p = Point(1, 2, ("a",))
    assert [f.name for f in dataclasses.fields(p)] == ["x", "y", "tags"]
    assert Point.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert Point.__slots__ == ("x", "y", "tags")
    assert not hasattr(p, "__dict__")
    assert dataclasses.replace(p, y=5) == Point(1, 5, ("a",))
    assert dataclasses.asdict(p) == {"x": 1, "y": 2, "tags": ("a",)}
    assert hash(p) == hash(Point(1, 2, ("a",)))
    assert repr(p) == "Point(x=1, y=2, tags=('a',))"
    assert pickle.loads(pickle.dumps(p)) == p
    assert copy.deepcopy(p) == p


def test_the_class_before_slots_is_collected() -> None:
    def build(decorate: object) -> tuple[type, weakref.ref[type]]:
        class Record:
            a: int = 0

        original = weakref.ref(Record)
        return decorate(Record), original  # type: ignore[operator]

    ours, ours_original = build(frozen)
    std, std_original = build(dataclasses.dataclass(frozen=True, slots=True))
    gc.collect()
    assert ours is not None
    assert ours_original() is None
    # the standard library's generated __setattr__ keeps its original alive (Python 3.11)
    assert std is not None
    assert std_original() is not None


@frozen
class Flagged:
    shown: int
    hidden: int = dataclasses.field(default=0, repr=False)
    ignored: int = dataclasses.field(default=0, compare=False)
    unhashed: int = dataclasses.field(default=0, hash=False)


@dataclasses.dataclass(frozen=True, slots=True)
class StdFlagged:
    shown: int
    hidden: int = dataclasses.field(default=0, repr=False)
    ignored: int = dataclasses.field(default=0, compare=False)
    unhashed: int = dataclasses.field(default=0, hash=False)


@frozen
class One:
    value: float


@dataclasses.dataclass(frozen=True, slots=True)
class StdOne:
    value: float


@frozen
class Empty:
    pass


@frozen
class Holder:
    items: list[object]


@frozen
class Own:
    a: int

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 7

    def __repr__(self) -> str:
        return "mine"


@frozen
class EqOnly:
    a: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EqOnly)


def test_shared_methods_answer_as_the_generated_ones() -> None:
    cases = [
        (Flagged(1, 2, 3, 4), Flagged(1, 2, 9, 5), StdFlagged(1, 2, 3, 4), StdFlagged(1, 2, 9, 5)),
        (Flagged(1, 2), Flagged(1, 3), StdFlagged(1, 2), StdFlagged(1, 3)),
        (One(1.5), One(1.5), StdOne(1.5), StdOne(1.5)),
        (One(2.0), One(3.0), StdOne(2.0), StdOne(3.0)),
        (Point(1, 2), Plain(1, 2), StdPoint(1, 2), StdPlain(1, 2)),
        (Point(1, 2), Point3(1, 2), StdPoint(1, 2), StdPlain(1, 2)),
    ]
    for a, b, std_a, std_b in cases:
        assert (a == b) == (std_a == std_b), (a, b)
        assert (a != b) == (std_a != std_b), (a, b)
        assert repr(a) == repr(std_a).replace("Std", "")
    nan = float("nan")
    # compared as tuples are: the same NaN object is equal to itself, two NaNs are not
    assert One(nan) == One(nan)
    assert StdOne(nan) == StdOne(nan)
    assert One(float("nan")) != One(float("nan"))
    assert StdOne(float("nan")) != StdOne(float("nan"))
    assert (One(1.0) == 1.0) is False
    assert One(1.0).__eq__(1.0) is NotImplemented
    assert Empty() == Empty()
    assert hash(Empty()) == hash(())
    assert repr(Empty()) == "Empty()"


def test_shared_hash_follows_the_hash_and_compare_flags() -> None:
    assert hash(Flagged(1, 2, 3, 4)) == hash(Flagged(1, 2, 8, 9)) == hash((1, 2))
    assert hash(StdFlagged(1, 2, 3, 4)) == hash((1, 2))
    assert hash(One(1.5)) == hash(StdOne(1.5)) == hash((1.5,))
    assert len({Point(1, 2), Point(1, 2), Point(2, 1)}) == 2


def test_shared_repr_guards_recursion() -> None:
    items: list[object] = []
    h = Holder(items)
    items.append(h)
    assert repr(h) == "Holder(items=[...])"
    assert repr(Flagged(1, 2, 3, 4)) == "Flagged(shown=1, ignored=3, unhashed=4)"


@dataclasses.dataclass(frozen=True, slots=True)
class StdEqOnly:
    a: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StdEqOnly)


def test_methods_of_the_class_body_are_kept() -> None:
    assert Own(1) == Own(2)
    assert hash(Own(1)) == 7
    assert repr(Own(1)) == "mine"
    assert EqOnly(1) == EqOnly(2)
    # a body's __eq__ alone: the dataclass still adds the hash of the fields
    assert hash(EqOnly(1)) == hash(StdEqOnly(1)) == hash((1,))


def test_shared_methods_cost_less_than_generated_ones() -> None:
    def build(decorate: object) -> type:
        class Record:
            a: int = 0
            b: str = ""

        return decorate(Record)  # type: ignore[operator, no-any-return]

    ours, std = build(frozen), build(dataclasses.dataclass(frozen=True, slots=True))
    for name in ("__eq__", "__hash__", "__repr__"):
        assert getattr(ours, name) is getattr(Point, name)
        assert getattr(std, name) is not getattr(StdPoint, name)
