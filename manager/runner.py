"""Running koord-manager's controllers under leader election.

Only the replica holding the ``koordinator-system/koordinator-manager`` Lease runs controllers, so
two replicas never both write. :class:`LeaderGate` starts a fresh controller (its own informers,
queue and write history) when leadership is gained and cancels it when it is lost; the
:class:`~kubeclient.leaderelection.LeaderElector` steps down before another replica may take
over (renew deadline shorter than the lease); when cancelled, the controller is stopped first
and the Lease released after, so a successor never overlaps it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, NoReturn

from kubeclient.client import KubeClient
from kubeclient.leaderelection import LeaderElectionConfig, LeaderElector
from manager.noderesource.controller import NodeResourceController

logger = logging.getLogger(__name__)

LEASE_NAME = "koordinator-manager"
"""The Lease the replicas compete for (upstream's ``LeaderElectionID``)."""


@dataclass(frozen=True, slots=True)
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


def identity() -> str:
    """This replica's candidate identity: host name and a unique suffix (client-go style)."""
    host = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{host}_{uuid.uuid4()}"


class LeaderGate:
    """Starts ``work()`` on gaining leadership and cancels it on losing it."""

    def __init__(self, work: Callable[[], Coroutine[Any, Any, Any]], name: str) -> None:
        self._work = work
        self._name = name
        self.task: asyncio.Task[Any] | None = None
        self.starts = 0

    def on_change(self, leading: bool) -> None:
        if leading and self.task is None:
            self.starts += 1
            self.task = asyncio.get_running_loop().create_task(self._work(), name=self._name)
            self.task.add_done_callback(self._ended)
        elif not leading and self.task is not None:
            logger.warning("leadership lost: stopping %s", self._name)
            self.task.cancel()
            self.task = None

    def _ended(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        err = task.exception()
        if err is not None:
            logger.error("%s ended: %r", self._name, err)
        if self.task is task:
            self.task = None

    async def stop(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def run_controllers(
    client: KubeClient,
    settings: ManagerSettings,
    *,
    election: LeaderElectionConfig | None = None,
    make_controller: Callable[[], NodeResourceController] | None = None,
) -> NoReturn:
    """Run the node resource controller, under leader election unless disabled. A fresh
    controller (``make_controller()``, default from ``settings``) starts at each gain of
    leadership."""

    def controller() -> Coroutine[Any, Any, NoReturn]:
        if make_controller is not None:
            return make_controller().run()
        return NodeResourceController(
            client,
            config_namespace=settings.config_namespace,
            config_name=settings.slo_config_name,
            resync_seconds=settings.resync_seconds,
        ).run()

    if not settings.enable_leader_election:
        await controller()
    gate = LeaderGate(controller, "noderesource")
    cfg = election or LeaderElectionConfig(
        namespace=settings.leader_election_namespace, name=LEASE_NAME, identity=identity()
    )
    elector = LeaderElector(client, cfg, on_change=gate.on_change)
    try:
        while True:
            await elector.step()
            await asyncio.sleep(cfg.retry_period)
    finally:
        # stop writing before giving the Lease up, so the successor never overlaps us
        await gate.stop()
        await asyncio.shield(elector.release())
