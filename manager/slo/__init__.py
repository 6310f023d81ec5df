"""The NodeSLO controller: ``slo-controller-config`` rendered into each node's NodeSLO.

:mod:`manager.slo.config` parses the keys and renders a node's spec; :mod:`manager.slo.controller`
keeps the NodeSLOs on the API server equal to it. Errors are :class:`apis.slo.SchemaError`
(configuration) and :class:`kubeclient.errors.ApiError` (the API server).
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """``koord-manager nodeslo [run options]``: run only the NodeSLO controller (under leader
    election, see :func:`manager.runtime.main`)."""
    from manager.runtime import main as run_main  # runtime imports this package

    return run_main(["--controllers", "nodeslo", *(argv or [])])
