"""Label selectors and node selectors as the API server validates them and kube-scheduler
matches them.

- :class:`LabelSelector` is ``metav1.LabelSelector``: ``matchLabels`` and ``matchExpressions``
  (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``), all ANDed. An empty selector (``{}``) matches
  every label set; an absent one (:data:`NOTHING`) matches none, as
  ``metav1.LabelSelectorAsSelector(nil)`` does for affinity terms and spread constraints.
- :class:`NodeSelector` is ``v1.NodeSelector``: its terms are ORed; a term ANDs its
  ``matchExpressions`` (also ``Gt`` and ``Lt``, comparing integers) and ``matchFields`` (only
  ``metadata.name``, ``In`` or ``NotIn``). A term with neither matches nothing; so does a selector
  with no terms (``k8s.io/component-helpers/scheduling/corev1/nodeaffinity``).

Parsing raises :class:`~scheduler_plugins.errors.InputError` naming the field, where the API
server's validation would have rejected the object. :func:`raw_label_selector_matches` matches a
selector the plugins read from raw custom objects without parsing it (leniently: an unknown
operator rejects nothing). Label selectors are interned
(:func:`label_selector`): equal selectors are one object, compared and hashed by identity, so
plugins key their per-selector caches on them at no cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apis.kubernetes_keys import FIELD_METADATA_NAME
from apis.records import frozen
from scheduler_plugins.errors import InputError

IN = "In"
NOT_IN = "NotIn"
EXISTS = "Exists"
DOES_NOT_EXIST = "DoesNotExist"
GT = "Gt"
LT = "Lt"
_SET_OPS = (IN, NOT_IN, EXISTS, DOES_NOT_EXIST)
_NODE_OPS = (*_SET_OPS, GT, LT)


@frozen
class Requirement:
    """One ``key operator values`` requirement."""

    key: str
    op: str
    values: frozenset[str]
    number: int = 0
    """The one integer value of ``Gt`` and ``Lt``."""

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy the requirement."""
        op = self.op
        if op == IN:
            v = labels.get(self.key)
            return v is not None and v in self.values
        if op == NOT_IN:
            v = labels.get(self.key)
            return v is None or v not in self.values
        if op == EXISTS:
            return self.key in labels
        if op == DOES_NOT_EXIST:
            return self.key not in labels
        v = labels.get(self.key)
        if v is None:
            return False
        try:
            n = int(v)
        except ValueError:
            return False
        return n > self.number if op == GT else n < self.number


@dataclass(frozen=True, slots=True, eq=False)
class LabelSelector:
    """``metav1.LabelSelector`` (``matchLabels`` folded into ``In`` requirements); made by
    :func:`label_selector` only, so equal ones are the same object."""

    requirements: tuple[Requirement, ...] = ()
    nothing: bool = False
    """An absent selector: matches no label set."""

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy every requirement."""
        if self.nothing:
            return False
        return all(r.matches(labels) for r in self.requirements)

    def with_requirements(self, extra: tuple[Requirement, ...]) -> LabelSelector:
        """This selector ANDed with ``extra`` (``matchLabelKeys`` and the like)."""
        if self.nothing or not extra:
            return self
        return label_selector(self.requirements + extra)


_INTERNED: dict[tuple[tuple[Requirement, ...], bool], LabelSelector] = {}


def label_selector(
    requirements: tuple[Requirement, ...] = (), nothing: bool = False
) -> LabelSelector:
    """The one :class:`LabelSelector` with these requirements."""
    key = (requirements, nothing)
    found = _INTERNED.get(key)
    if found is None:
        found = _INTERNED[key] = LabelSelector(requirements, nothing)
    return found


NOTHING = label_selector(nothing=True)
"""The absent selector."""
EVERYTHING = label_selector()
"""The empty selector ``{}``."""


def _values(raw: Any, source: str, where: str) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InputError(source, where, f"must be a list of strings, got {raw!r}")
    return [str(v) for v in raw]


def _requirement(raw: Any, source: str, where: str, ops: tuple[str, ...] = _SET_OPS) -> Requirement:
    if not isinstance(raw, Mapping):
        raise InputError(source, where, "must be an object with key, operator, values")
    key = str(raw.get("key") or "")
    if not key:
        raise InputError(source, where + ".key", "must not be empty")
    op = str(raw.get("operator") or "")
    if op not in ops:
        raise InputError(
            source, where + ".operator", f"must be one of {', '.join(ops)}, got {op!r}"
        )
    values = _values(raw.get("values"), source, where + ".values")
    if op in (IN, NOT_IN) and not values:
        raise InputError(source, where + ".values", f"must be non-empty with {op}")
    if op in (EXISTS, DOES_NOT_EXIST) and values:
        raise InputError(source, where + ".values", f"must be empty with {op}")
    number = 0
    if op in (GT, LT):
        if len(values) != 1:
            raise InputError(source, where + ".values", f"must hold exactly one integer with {op}")
        try:
            number = int(values[0])
        except ValueError as err:
            raise InputError(source, where + ".values", f"{values[0]!r} is not an integer") from err
    return Requirement(key, op, frozenset(values), number)


def parse_label_selector(raw: Any, source: str, where: str) -> LabelSelector:
    """A :class:`LabelSelector`; ``None`` gives :data:`NOTHING`."""
    if raw is None:
        return NOTHING
    if not isinstance(raw, Mapping):
        raise InputError(source, where, "must be a label selector object")
    reqs: list[Requirement] = []
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise InputError(source, where + ".matchLabels", "must be a map")
    for k, v in labels.items():
        reqs.append(Requirement(str(k), IN, frozenset((str(v),))))
    exprs = raw.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise InputError(source, where + ".matchExpressions", "must be a list")
    for i, e in enumerate(exprs):
        reqs.append(_requirement(e, source, f"{where}.matchExpressions[{i}]"))
    return label_selector(tuple(reqs))


def raw_label_selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy a raw ``metav1.LabelSelector`` (``{}`` matches everything), as
    read from a custom object without parsing it: keys and values are compared as strings, and
    an expression with an unknown operator rejects nothing."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(str(k)) != str(v):
            return False
    for expr in selector.get("matchExpressions") or []:
        key = str(expr.get("key") or "")
        op = expr.get("operator")
        values = [str(v) for v in expr.get("values") or []]
        if op == IN and labels.get(key) not in values:
            return False
        if op == NOT_IN and key in labels and labels[key] in values:
            return False
        if op == EXISTS and key not in labels:
            return False
        if op == DOES_NOT_EXIST and key in labels:
            return False
    return True


@frozen
class NodeSelectorTerm:
    """One ``nodeSelectorTerms[]`` entry."""

    expressions: tuple[Requirement, ...]
    fields: tuple[Requirement, ...]

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        """Whether the node matches every expression and field (a term with neither: no)."""
        if not self.expressions and not self.fields:
            return False
        for r in self.expressions:
            if not r.matches(labels):
                return False
        if self.fields:
            fields = {FIELD_METADATA_NAME: name}
            for r in self.fields:
                if not r.matches(fields):
                    return False
        return True


@frozen
class NodeSelector:
    """``v1.NodeSelector``: ORed terms."""

    terms: tuple[NodeSelectorTerm, ...]

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        """Whether any term matches."""
        return any(t.matches(name, labels) for t in self.terms)


def parse_node_selector_term(raw: Any, source: str, where: str) -> NodeSelectorTerm:
    """A :class:`NodeSelectorTerm`."""
    if not isinstance(raw, Mapping):
        raise InputError(source, where, "must be a node selector term object")
    exprs = raw.get("matchExpressions") or []
    fields = raw.get("matchFields") or []
    if not isinstance(exprs, list):
        raise InputError(source, where + ".matchExpressions", "must be a list")
    if not isinstance(fields, list):
        raise InputError(source, where + ".matchFields", "must be a list")
    parsed_fields = []
    for i, f in enumerate(fields):
        r = _requirement(f, source, f"{where}.matchFields[{i}]", (IN, NOT_IN))
        if r.key != FIELD_METADATA_NAME:
            raise InputError(
                source, f"{where}.matchFields[{i}].key", f"only {FIELD_METADATA_NAME} is supported"
            )
        if len(r.values) != 1:
            raise InputError(
                source, f"{where}.matchFields[{i}].values", "must hold exactly one value"
            )
        parsed_fields.append(r)
    return NodeSelectorTerm(
        tuple(
            _requirement(e, source, f"{where}.matchExpressions[{i}]", _NODE_OPS)
            for i, e in enumerate(exprs)
        ),
        tuple(parsed_fields),
    )


def parse_node_selector(raw: Any, source: str, where: str) -> NodeSelector:
    """A :class:`NodeSelector` from ``{"nodeSelectorTerms": [...]}``."""
    if not isinstance(raw, Mapping):
        raise InputError(source, where, "must be a node selector object")
    terms = raw.get("nodeSelectorTerms") or []
    if not isinstance(terms, list):
        raise InputError(source, where + ".nodeSelectorTerms", "must be a list")
    return NodeSelector(
        tuple(
            parse_node_selector_term(t, source, f"{where}.nodeSelectorTerms[{i}]")
            for i, t in enumerate(terms)
        )
    )
