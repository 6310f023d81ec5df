"""The metric names and selector labels a PromQL expression uses, for checking dashboards.

Not a PromQL parser: a lexer that removes what cannot be a metric name (string literals, label
matchers, ``by``/``without``/``on``/``ignoring``/``group_left``/``group_right`` label lists,
range and subquery brackets, Grafana's ``$variables``, numbers and durations) and keeps the
identifiers that are neither a function or aggregation (followed by ``(``) nor a keyword. That
is exactly the set of metric names of an expression written in the usual style, which is all a
dashboard test needs. Label names come from the ``{...}`` matchers right after a metric name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
    | {"and", "or", "unless", "atan2", "inf", "nan", "start", "end"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_LABEL_LIST = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)", re.IGNORECASE
)
_RANGE = re.compile(r"\[[^\]]*\]")
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^{}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)")
_IDENT = re.compile(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")


@dataclass
class Uses:
    """What an expression uses."""

    metrics: set[str] = field(default_factory=set)
    """Metric names."""
    selector_labels: dict[str, set[str]] = field(default_factory=dict)
    """Metric name → label names its ``{...}`` matchers test."""


class PromQLShapeError(ValueError):
    """Unbalanced brackets or an empty expression."""


def _balanced(expr: str) -> None:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for ch in expr:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            raise PromQLShapeError(f"unbalanced {ch!r} in {expr!r}")
    if stack:
        raise PromQLShapeError(f"unclosed {stack[-1]!r} in {expr!r}")


def uses(expr: str) -> Uses:
    """The metric names and selector labels of ``expr``; :class:`PromQLShapeError` when its
    brackets do not balance (a typo a lexer can see)."""
    if not expr.strip():
        raise PromQLShapeError("empty expression")
    text = _STRING.sub('""', expr)
    _balanced(text)
    text = _VARIABLE.sub("1", text)
    out = Uses()
    for name, body in _SELECTOR.findall(text):
        labels = {m.group(1) for m in _MATCHER.finditer(body)}
        if name:
            out.selector_labels.setdefault(name, set()).update(labels)
            out.metrics.add(name)
    text = _SELECTOR.sub(lambda m: f" {m.group(1) or ''} ", text)
    text = _LABEL_LIST.sub(" ", text)
    text = _RANGE.sub(" ", text)
    for m in _IDENT.finditer(text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        out.metrics.add(name)
    return out
