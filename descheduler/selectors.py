"""Label selectors: ``metav1.LabelSelector`` documents and the string form of ``labels.Parse``.

A :class:`Selector` is a list of requirements, all of which must hold (``matchLabels`` entries are
``In`` with one value). ``None`` (no selector) and an empty selector mean different things to
different callers (a PodDisruptionBudget without a selector selects nothing, an args field left
out selects everything), so the callers decide; :meth:`Selector.matches` of an empty selector is
true, as ``labels.Everything()`` is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from apis.records import frozen

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class SelectorError(ValueError):
    """A selector that does not parse; the message names the part."""


@frozen
class Requirement:
    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return self.key not in labels or labels[self.key] not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels


@frozen
class Selector:
    """ANDed requirements."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


EVERYTHING = Selector()


def from_label_selector(raw: Any, where: str = "selector") -> Selector:
    """A ``metav1.LabelSelector`` (``matchLabels``, ``matchExpressions``). Raises
    :class:`SelectorError` naming the bad part relative to ``where``."""
    if raw is None:
        return EVERYTHING
    if not isinstance(raw, Mapping):
        raise SelectorError(f"{where}: must be a label selector object")
    reqs: list[Requirement] = []
    match_labels = raw.get("matchLabels") or {}
    if not isinstance(match_labels, Mapping):
        raise SelectorError(f"{where}.matchLabels: must be a map of strings")
    for k, v in match_labels.items():
        reqs.append(Requirement(str(k), "In", frozenset({str(v)})))
    exprs = raw.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise SelectorError(f"{where}.matchExpressions: must be a list")
    for i, expr in enumerate(exprs):
        path = f"{where}.matchExpressions[{i}]"
        if not isinstance(expr, Mapping) or not expr.get("key"):
            raise SelectorError(f"{path}: needs a key")
        op = str(expr.get("operator") or "")
        if op not in OPERATORS:
            raise SelectorError(f"{path}.operator: must be one of {', '.join(OPERATORS)}")
        values = expr.get("values") or []
        if not isinstance(values, list):
            raise SelectorError(f"{path}.values: must be a list")
        if op in ("In", "NotIn") and not values:
            raise SelectorError(f"{path}.values: {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and values:
            raise SelectorError(f"{path}.values: {op} takes no values")
        reqs.append(Requirement(str(expr["key"]), op, frozenset(str(v) for v in values)))
    return Selector(tuple(reqs))


_SET = re.compile(
    r"^\s*(!?)([A-Za-z0-9_./-]+)\s*(?:(in|notin)\s*\(([^)]*)\)|(==|=|!=)\s*(\S*))?\s*$"
)


def parse_selector_string(text: str) -> Selector:
    """``labels.Parse``: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``,
    ``!a``, comma separated (commas inside parentheses belong to the set)."""
    if not text.strip():
        return EVERYTHING
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    reqs: list[Requirement] = []
    for part in parts:
        m = _SET.match(part)
        if m is None:
            raise SelectorError(f"cannot parse {part.strip()!r}")
        neg, key, setop, setvals, op, value = m.groups()
        if neg and (setop or op):
            raise SelectorError(f"cannot parse {part.strip()!r}")
        if neg:
            reqs.append(Requirement(key, "DoesNotExist"))
        elif setop:
            vals = frozenset(v.strip() for v in setvals.split(",") if v.strip())
            reqs.append(Requirement(key, "In" if setop == "in" else "NotIn", vals))
        elif op:
            reqs.append(Requirement(key, "NotIn" if op == "!=" else "In", frozenset({value})))
        else:
            reqs.append(Requirement(key, "Exists"))
    return Selector(tuple(reqs))
