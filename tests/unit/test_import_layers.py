"""The koordlet's layers contract (pyproject.toml) states an order only where an import uses it.

import-linter checks that no layer imports one above it; this test checks the other half: every
boundary the contract states between two adjacent layers is crossed by at least one direct
import, so each layer is there for an import that needs it. A layer whose boundary nothing
crosses any more should be merged with its neighbour as an independent sibling (``a | b``).
"""

from __future__ import annotations

import tomllib
from itertools import pairwise
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = "koordlet layers point one way"


def _layers() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["name"] == CONTRACT:
            return [[m.strip() for m in layer.split("|")] for layer in contract["layers"]]
    raise AssertionError(f"no contract {CONTRACT!r} in pyproject.toml")


LAYERS = _layers()


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("koordlet")


def _inside(module: str, packages: list[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


@pytest.mark.parametrize(
    ("upper", "lower"),
    list(pairwise(LAYERS)),
    ids=[f"{u[0]}>{lo[0]}" for u, lo in pairwise(LAYERS)],
)
def test_each_stated_boundary_is_crossed_by_an_import(
    graph: grimp.ImportGraph, upper: list[str], lower: list[str]
) -> None:
    crossing = sorted(
        (src, dst)
        for src in graph.modules
        if _inside(src, upper)
        for dst in graph.find_modules_directly_imported_by(src)
        if _inside(dst, lower)
    )
    assert crossing, f"nothing in {upper} imports {lower}: merge the two layers"


def test_every_koordlet_package_is_in_a_layer() -> None:
    """A new top-level module of the koordlet gets a place in the order."""
    placed = {m for layer in LAYERS for m in layer}
    packages = {
        f"koordlet.{p.stem}"
        for p in (ROOT / "koordlet").iterdir()
        if (p.suffix == ".py" or (p / "__init__.py").exists())
        and p.stem not in ("__init__", "__main__")
    }
    assert packages - placed == set()


def _contract_modules(name: str) -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["name"].startswith(name):
            return set(contract["modules"])
    raise AssertionError(f"no contract {name!r} in pyproject.toml")


def test_every_scheduler_plugin_is_in_the_independence_contract() -> None:
    """A plugin added to the table without a line in the contract could import a sibling
    plugin unnoticed; a helper module (nodecache, loadargs, ...) is not a plugin and stays out."""
    from scheduler_plugins.table import PLUGINS

    plugins = {factory.__module__ for factory in PLUGINS.values()}
    assert plugins == _contract_modules("scheduler plugins are independent")
