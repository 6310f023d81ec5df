"""The NodeMetric controller: one NodeMetric per Node, carrying the collect policy.

See :mod:`manager.nodemetric.controller`.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """``koord-manager nodemetric [run options]``: run only the NodeMetric controller (under
    leader election, see :func:`manager.runtime.main`)."""
    from manager.runtime import main as run_main  # runtime imports this package

    return run_main(["--controllers", "nodemetric", *(argv or [])])
