"""The manager process: every controller of the table, run only while holding the Lease.

:data:`CONTROLLERS` is the explicit table (name → factory) of what ``koord-manager run`` runs:
the node resource controller (batch and mid resources), the NodeSLO controller and the
NodeMetric controller. :func:`run_manager` hands one *term* to the shared elected lifecycle
(:class:`kubeclient.elected.ElectedRunner`) on the ``koordinator-system/koordinator-manager``
Lease: a fresh instance of each selected controller (own informers, queues and write history),
all under one TaskGroup, started on gaining the Lease, cancelled at once on losing it, and on
shutdown stopped *before* the Lease is released, so a successor never writes beside us. A
controller that fails takes the others of its term down with it and the process exits 1,
releasing the Lease (the lifecycle's one rule for a failed term); the Deployment restarts it.
SIGTERM and SIGINT: :mod:`kubeclient.signals`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, NoReturn, Protocol

from apis.records import frozen
from kubeclient.client import KubeClient
from kubeclient.elected import ElectedRunner
from kubeclient.errors import KubeError
from kubeclient.flags import SuggestingParser, go_bool_flag
from kubeclient.leaderelection import LeaderElectionConfig, identity
from kubeclient.signals import StopSignals
from manager.nodekeyed import Options
from manager.nodemetric.controller import NodeMetricController
from manager.noderesource.controller import NodeResourceController
from manager.noderesource.gpudevice import GPUDeviceLabelController
from manager.slo.controller import NodeSLOController

logger = logging.getLogger(__name__)

LEASE_NAME = "koordinator-manager"
"""The Lease the replicas compete for: upstream's ``LeaderElectionID`` (``cmd/koord-manager``)."""


@frozen
class ManagerSettings:
    """Command-line settings of ``koord-manager run``."""

    kubeconfig: str | None = None
    """``--kubeconfig``: path; None for in-cluster (or ``$KUBECONFIG``)."""
    config_namespace: str = "koordinator-system"
    """``--config-namespace``: namespace of the slo-controller-config ConfigMap."""
    slo_config_name: str = "slo-controller-config"
    """``--slo-config-name``: name of the ConfigMap."""
    enable_leader_election: bool = True
    """``--enable-leader-election``: run controllers only while holding the Lease."""
    leader_election_namespace: str = "koordinator-system"
    """``--leader-election-namespace``: namespace of the Lease."""
    resync_seconds: float = 60.0
    """``--sync-period`` in seconds: every node is recomputed at least this often."""

    def election(self) -> LeaderElectionConfig | None:
        """The Lease to hold (client-go's timings); None with leader election off."""
        if not self.enable_leader_election:
            return None
        return LeaderElectionConfig(
            namespace=self.leader_election_namespace, name=LEASE_NAME, identity=identity()
        )


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


def _gpudevice(client: KubeClient, s: ManagerSettings) -> Controller:
    return GPUDeviceLabelController(client, **_options(s))


CONTROLLERS: Mapping[str, ControllerFactory] = {
    "noderesource": _noderesource,
    "nodeslo": _nodeslo,
    "nodemetric": _nodemetric,
    "gpudevice": _gpudevice,
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
    stop: asyncio.Event | None = None,
) -> int:
    """Run the named controllers of ``table`` until ``stop`` is set (0) or a controller fails
    (1), under leader election (``election``, default from ``settings``) unless
    ``settings.enable_leader_election`` is off. Fresh instances start at each gain of
    leadership."""
    unknown = [name for name in controllers if name not in table]
    if unknown:
        raise ValueError(f"unknown controllers {unknown} (known: {', '.join(table)})")

    def term() -> Coroutine[Any, Any, NoReturn]:
        logger.info("starting controllers %s", ", ".join(controllers))
        return run_all([table[name](client, settings) for name in controllers])

    if not settings.enable_leader_election:
        election = None
    elif election is None:
        election = settings.election()
    runner = ElectedRunner(client, election, term, name="controllers")
    return await runner.run(stop)


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
    p = SuggestingParser(
        prog="koord-manager run",
        description="Run the controllers against the API server, only while holding the "
        f"{LEASE_NAME} Lease unless leader election is off. SIGTERM or SIGINT stops them and "
        "releases the Lease (a second one exits at once); exit 1 when a controller fails.",
    )
    p.add_argument("--kubeconfig", help="kubeconfig path (default: $KUBECONFIG or in-cluster)")
    p.add_argument("--config-namespace", default="koordinator-system")
    p.add_argument("--slo-config-name", default="slo-controller-config")
    p.add_argument(
        "--enable-leader-election",
        type=go_bool_flag,
        default=True,
        metavar="BOOL",
        help=f"run controllers only while holding the {LEASE_NAME} Lease (default true)",
    )
    p.add_argument("--leader-election-namespace", default="koordinator-system")
    p.add_argument(
        "--sync-period",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="recompute every node at least this often (default 60)",
    )
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
    try:
        with StopSignals() as signals:
            return await run_manager(client, settings, controllers=controllers, stop=signals.stop)
    finally:
        with contextlib.suppress(Exception):
            await client.close()


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
