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
