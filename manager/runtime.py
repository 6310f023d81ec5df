"""The manager process: every controller of the table, run only while holding the Lease.

:data:`CONTROLLERS` is the explicit table (name → factory) of what ``koord-manager run`` runs:
the node resource controller (batch and mid resources), the NodeSLO controller and the
NodeMetric controller. :func:`run_manager` competes for the ``koordinator-system/
koordinator-manager`` Lease (:mod:`kubeclient.leaderelection`); on gaining it, a fresh instance of
each selected controller starts (own informers, queues and write history) under one TaskGroup;
on losing it they are all cancelled, and on shutdown they are stopped *before* the Lease is
released, so a successor never writes beside us. A controller that fails takes the others of
its term down with it, and they start afresh at the next gain of leadership.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, NoReturn, Protocol

from apis.gobool import parse_go_bool
from kubeclient.client import KubeClient
from kubeclient.errors import KubeError
from kubeclient.leaderelection import LeaderElectionConfig, LeaderElector
from manager.nodekeyed import Options
from manager.nodemetric.controller import NodeMetricController
from manager.noderesource.controller import NodeResourceController
from manager.runner import LEASE_NAME, LeaderGate, ManagerSettings, identity
from manager.slo.controller import NodeSLOController

logger = logging.getLogger(__name__)


class Controller(Protocol):
    """What the runtime needs of a controller: an eternal ``run()``."""

    def run(self, *, sync_timeout: float = ...) -> Coroutine[Any, Any, NoReturn]: ...


ControllerFactory = Callable[[KubeClient, ManagerSettings], Controller]


def _options(s: ManagerSettings) -> Options:
    """What every node-keyed controller takes from the settings."""
    return Options(
        config_namespace=s.config_namespace,
        config_name=s.slo_config_name,
        resync_seconds=s.resync_seconds,
    )


def _noderesource(client: KubeClient, s: ManagerSettings) -> Controller:
    return NodeResourceController(client, **_options(s))


def _nodeslo(client: KubeClient, s: ManagerSettings) -> Controller:
    return NodeSLOController(client, **_options(s))


def _nodemetric(client: KubeClient, s: ManagerSettings) -> Controller:
    return NodeMetricController(client, **_options(s))


CONTROLLERS: Mapping[str, ControllerFactory] = {
    "noderesource": _noderesource,
    "nodeslo": _nodeslo,
    "nodemetric": _nodemetric,
}
"""Every controller ``koord-manager run`` knows, by the name ``--controllers`` takes."""


async def run_all(controllers: Sequence[Controller]) -> NoReturn:
    """Run ``controllers`` together until cancelled (or until one fails, which stops all)."""
    async with asyncio.TaskGroup() as tg:
        for ctrl in controllers:
            tg.create_task(ctrl.run(), name=f"controller-{type(ctrl).__name__}")
    raise AssertionError("eternal controllers returned")  # pragma: no cover


async def run_manager(
    client: KubeClient,
    settings: ManagerSettings,
    *,
    controllers: Sequence[str] = tuple(CONTROLLERS),
    table: Mapping[str, ControllerFactory] = CONTROLLERS,
    election: LeaderElectionConfig | None = None,
) -> NoReturn:
    """Run the named controllers of ``table``, under leader election unless
    ``settings.enable_leader_election`` is off. Fresh instances start at each gain of leadership."""
    unknown = [name for name in controllers if name not in table]
    if unknown:
        raise ValueError(f"unknown controllers {unknown} (known: {', '.join(table)})")

    def term() -> Coroutine[Any, Any, NoReturn]:
        logger.info("starting controllers %s", ", ".join(controllers))
        return run_all([table[name](client, settings) for name in controllers])

    if not settings.enable_leader_election:
        await term()
    gate = LeaderGate(term, "controllers")
    cfg = election or LeaderElectionConfig(
        namespace=settings.leader_election_namespace, name=LEASE_NAME, identity=identity()
    )
    elector = LeaderElector(client, cfg, on_change=gate.on_change)
    try:
        while True:
            await elector.step()
            await asyncio.sleep(cfg.retry_period)
    finally:
        await gate.stop()  # stop writing before the Lease goes, so no successor overlaps us
        await asyncio.shield(elector.release())


def _go_bool(text: str) -> bool:
    try:
        return parse_go_bool(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _controllers(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in CONTROLLERS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown controllers {bad} (known: {', '.join(CONTROLLERS)})"
        )
    return names


def parser() -> argparse.ArgumentParser:
    """The options of ``koord-manager run``."""
    p = argparse.ArgumentParser(prog="koord-manager run", description=__doc__)
    p.add_argument("--kubeconfig", help="kubeconfig path (default: $KUBECONFIG or in-cluster)")
    p.add_argument("--config-namespace", default="koordinator-system")
    p.add_argument("--slo-config-name", default="slo-controller-config")
    p.add_argument("--enable-leader-election", type=_go_bool, default=True, metavar="BOOL")
    p.add_argument("--leader-election-namespace", default="koordinator-system")
    p.add_argument("--sync-period", type=float, default=60.0, metavar="SECONDS")
    p.add_argument(
        "--controllers",
        type=_controllers,
        default=tuple(CONTROLLERS),
        metavar="NAMES",
        help=f"comma-separated controllers to run (default: {','.join(CONTROLLERS)})",
    )
    return p


async def _serve(settings: ManagerSettings, controllers: Sequence[str]) -> int:
    client = await KubeClient.connect(settings.kubeconfig)
    main_task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if main_task is not None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, main_task.cancel)
    try:
        await run_manager(client, settings, controllers=controllers)
    except asyncio.CancelledError:
        return 0
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return 1  # pragma: no cover - run_manager never returns


def main(argv: Sequence[str] | None = None) -> int:
    """``koord-manager run``: every controller under leader election; returns the exit status."""
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = ManagerSettings(
        kubeconfig=args.kubeconfig,
        config_namespace=args.config_namespace,
        slo_config_name=args.slo_config_name,
        enable_leader_election=args.enable_leader_election,
        leader_election_namespace=args.leader_election_namespace,
        resync_seconds=args.sync_period,
    )
    try:
        return asyncio.run(_serve(settings, args.controllers))
    except KubeError as err:
        sys.stderr.write(f"koord-manager: error: {err}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
