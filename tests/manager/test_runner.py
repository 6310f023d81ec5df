"""Leader election around the controllers: one writer at a time, hand-over on release."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

from apis.manager_keys import BATCH_CPU
from kubeclient.client import KubeClient
from kubeclient.leaderelection import LeaderElectionConfig
from manager.noderesource.controller import NodeResourceController
from manager.runner import LEASE_NAME, LeaderGate, ManagerSettings, run_controllers
from tests.kubefake import FakeApiServer
from tests.manager.builders import config_map, node, node_metric, pod, rfc3339
from tests.manager.conftest import eventually


def seed(api: FakeApiServer) -> None:
    api.put("nodes", node())
    metric = node_metric(pods=[("default/web", "koord-prod", "2", "4Gi")])
    metric["status"]["updateTime"] = rfc3339(datetime.now(UTC))
    api.put("nodemetrics", metric)
    api.put("pods", pod("web", cpu="4", memory="8Gi", priority=9500))
    api.put("configmaps", config_map(colocation_config={"enable": True}))


class Replica:
    """One koord-manager replica: its own client, election identity and controllers."""

    def __init__(self, client: KubeClient, name: str, log: list[tuple[str, str]]) -> None:
        self.client = client
        self.name = name
        self.log = log
        self.controllers: list[NodeResourceController] = []
        self.task: asyncio.Task[None] | None = None

    def make(self) -> NodeResourceController:
        self.log.append(("start", self.name))
        log, name = self.log, self.name

        class Logged(NodeResourceController):
            async def run(self, *, sync_timeout: float = 60.0) -> NoReturn:
                try:
                    await super().run(sync_timeout=sync_timeout)
                finally:
                    log.append(("stop", name))

        ctrl = Logged(self.client, resync_seconds=3600)
        self.controllers.append(ctrl)
        return ctrl

    def start(self) -> None:
        election = LeaderElectionConfig(
            namespace="koordinator-system",
            name=LEASE_NAME,
            identity=self.name,
            lease_duration=1.0,
            renew_deadline=0.6,
            retry_period=0.1,
        )
        self.task = asyncio.create_task(
            run_controllers(
                self.client, ManagerSettings(), election=election, make_controller=self.make
            ),
            name=f"replica-{self.name}",
        )

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


async def test_only_the_leader_writes_and_the_follower_takes_over_on_release(
    kube_api: FakeApiServer, kube_client: KubeClient, kubeconfig: Path
) -> None:
    seed(kube_api)
    log: list[tuple[str, str]] = []
    other = await KubeClient.connect(str(kubeconfig), request_timeout=5.0)
    a, b = Replica(kube_client, "a", log), Replica(other, "b", log)
    try:
        a.start()
        await eventually(lambda: bool(a.controllers) and a.controllers[0].writes == 1)
        b.start()
        await asyncio.sleep(1.5)  # longer than the lease: b still must not take over
        assert b.controllers == []
        lease = kube_api.get("leases", LEASE_NAME, "koordinator-system")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "a"
        await a.stop()
        await eventually(lambda: bool(b.controllers) and b.controllers[0].writes == 1)
        assert BATCH_CPU in kube_api.get("nodes", "node-1")["status"]["allocatable"]  # type: ignore[index]
    finally:
        await a.stop()
        await b.stop()
        await other.close()
    assert log[:3] == [("start", "a"), ("stop", "a"), ("start", "b")]


async def test_gate_starts_on_gain_and_cancels_on_loss() -> None:
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.sleep(3600)

    gate = LeaderGate(work, "w")
    gate.on_change(True)
    gate.on_change(True)  # a renewal starts nothing new
    await asyncio.wait_for(started.wait(), 1)
    task = gate.task
    assert task is not None
    assert gate.starts == 1
    gate.on_change(False)
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    assert gate.task is None
    await gate.stop()
