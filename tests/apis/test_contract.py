"""``apis/`` is the one contract: no Koordinator or Kubernetes key literal and no second parser
of a shared notation outside it (STYLE.md, "The contract is spelt once")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("koordlet", "manager", "scheduler_plugins", "kubeclient", "descheduler", "bench")
KEY = re.compile(
    r"(koordinator\.sh|kubernetes\.io/|sigs\.k8s\.io|nvidia\.com/)|^koord-(prod|mid|batch|free)$"
)
"""A key, label, annotation, resource name, API group or priority class."""
PARSERS = frozenset(
    {
        "parse_quantity",
        "format_cpu",
        "format_bytes",
        "resource_value",
        "parse_cpulist",
        "format_cpulist",
        "parse_cpuset",
        "format_cpuset",
        "parse_duration",
        "format_duration",
        "parse_bool",
        "parse_go_bool",
        "parse_time",
        "parse_time_datetime",
        "parse_micro_time",
        "format_time",
        "format_micro_time",
        "is_openapi_date_time",
        "rfc3339",
        "micro_time",
    }
)
"""Functions of apis.quantity, apis.cpulist, apis.duration, apis.gobool and apis.timestamp (or
their old copies' names) that nothing else may define."""
TIME_CALLS = frozenset({"fromisoformat", "isoformat"})
"""``datetime`` methods that read or write ISO 8601, which is not Go's RFC 3339 (apis.timestamp's
docstring lists the differences)."""
TIME_LAYOUT = re.compile(r"%Y-%m-%d|%Y%m%d")
"""A ``strftime``/``strptime`` layout that spells a Kubernetes timestamp by hand."""


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:  # a string statement documents what precedes or contains it
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    ids.add(id(stmt.value))
    return ids


def _key_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
            # prose (an error message, a help text) may name a key; a key alone may not appear
            if not re.search(r"\s", text.strip()) and KEY.search(text):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text!r}")
    return found


def test_no_key_literal_outside_apis() -> None:
    found = [hit for path in _sources() for hit in _key_literals(path)]
    assert found == [], "define these in apis/ and import them:\n" + "\n".join(found)


def test_no_second_parser_outside_apis() -> None:
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef) and node.name in PARSERS:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: def {node.name}")
            if isinstance(node, ast.Constant) and node.value in ("TRUE", "\u00b5s", "Ki"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert found == [], "use apis.quantity/cpulist/duration/gobool/timestamp:\n" + "\n".join(found)


def test_no_timestamp_read_or_written_by_hand_outside_apis_timestamp() -> None:
    # apis/ too: its models read and write through apis.timestamp like everyone else
    models = [p for p in (ROOT / "apis").rglob("*.py") if p.name != "timestamp.py"]
    found = []
    for path in [*_sources(), *models]:
        tree = ast.parse(path.read_text(), str(path))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Attribute) and node.attr in TIME_CALLS:
                found.append(f"{where}: .{node.attr}")
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in skip
                and TIME_LAYOUT.search(node.value)
            ):
                found.append(f"{where}: {node.value!r}")
    assert found == [], "use apis.timestamp (parse_time, format_time, ...):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "module", ["apis.quantity", "apis.cpulist", "apis.duration", "apis.gobool", "apis.timestamp"]
)
def test_each_notation_has_its_one_module(module: str) -> None:
    path = ROOT / (module.replace(".", "/") + ".py")
    names = {
        n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)
    }
    assert names & PARSERS
