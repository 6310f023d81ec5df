"""The manager runtime: all controllers under one Lease, hand-over between two replicas, a
failing controller ending the process, and ``koord-manager`` run as a user runs it.

The lifecycle itself (terms, deadlines, release order) is tested once, in
tests/kube/test_elected.py; these tests are about the manager's use of it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

import pytest
import yaml

from kubeclient.client import KubeClient
from kubeclient.leaderelection import LeaderElectionConfig
from manager.runtime import (
    CONTROLLERS,
    LEASE_NAME,
    Controller,
    ControllerFactory,
    ManagerSettings,
    main,
    parser,
    run_manager,
)
from tests.kubefake import FakeApiServer
from tests.manager.builders import config_map, node
from tests.manager.conftest import eventually


class Replica:
    """One manager replica running the NodeSLO and NodeMetric controllers; logs its terms."""

    def __init__(self, client: KubeClient, name: str, log: list[tuple[str, str, str]]) -> None:
        self.client = client
        self.name = name
        self.log = log
        self.task: asyncio.Task[int] | None = None

    def table(self) -> Mapping[str, ControllerFactory]:
        def logged(kind: str) -> ControllerFactory:
            def make(client: KubeClient, settings: ManagerSettings) -> Controller:
                inner = CONTROLLERS[kind](client, settings)
                log, name = self.log, self.name

                class Logged:
                    async def run(self, *, sync_timeout: float = 5.0) -> NoReturn:
                        log.append(("start", name, kind))
                        try:
                            await inner.run(sync_timeout=sync_timeout)
                        finally:
                            log.append(("stop", name, kind))

                return Logged()

            return make

        return {"nodeslo": logged("nodeslo"), "nodemetric": logged("nodemetric")}

    def start(self) -> None:
        election = LeaderElectionConfig(
            namespace="koordinator-system",
            name=LEASE_NAME,
            identity=self.name,
            # A leader steps down when a renewal cannot complete within the renew deadline
            # (an event loop stalled by the first imports of a term counts): room for that.
            lease_duration=3.0,
            renew_deadline=2.0,
            retry_period=0.1,
        )
        self.task = asyncio.create_task(
            run_manager(
                self.client,
                ManagerSettings(resync_seconds=3600),
                controllers=("nodeslo", "nodemetric"),
                table=self.table(),
                election=election,
            ),
            name=f"replica-{self.name}",
        )

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


def lease_requests(api: FakeApiServer, method: str) -> int:
    """Requests of ``method`` for the manager's Lease so far."""
    return sum(1 for r in api.requests if r.method == method and f"/leases/{LEASE_NAME}" in r.path)


async def test_the_second_replica_takes_over_every_controller_when_the_leader_stops(
    kube_api: FakeApiServer, kube_client: KubeClient, kubeconfig: Path
) -> None:
    kube_api.put("nodes", node("n1"))
    kube_api.put("configmaps", config_map(colocation_config={"enable": True}))
    log: list[tuple[str, str, str]] = []
    other = await KubeClient.connect(str(kubeconfig), request_timeout=5.0)
    a, b = Replica(kube_client, "a", log), Replica(other, "b", log)
    try:
        a.start()
        await eventually(
            lambda: (
                kube_api.get("nodeslos", "n1") is not None
                and kube_api.get("nodemetrics", "n1") is not None
            )
        )
        b.start()
        gets, puts = lease_requests(kube_api, "GET"), lease_requests(kube_api, "PUT")
        # a renews (GET, then PUT), b only looks (GET): wait for three looks of b
        await eventually(
            lambda: (
                (lease_requests(kube_api, "GET") - gets) - (lease_requests(kube_api, "PUT") - puts)
                >= 3
            )
        )
        assert {who for _, who, _ in log} == {"a"}
        await a.stop()
        kube_api.put("nodes", node("n2"))  # only a leader can write n2's objects now
        await eventually(
            lambda: (
                kube_api.get("nodeslos", "n2") is not None
                and kube_api.get("nodemetrics", "n2") is not None
            )
        )
        lease = kube_api.get("leases", LEASE_NAME, "koordinator-system")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "b"
    finally:
        await a.stop()
        await b.stop()
        await other.close()
    a_stops = [i for i, (what, who, _) in enumerate(log) if (what, who) == ("stop", "a")]
    b_starts = [i for i, (what, who, _) in enumerate(log) if (what, who) == ("start", "b")]
    assert len(a_stops) == 2
    assert len(b_starts) == 2
    assert max(a_stops) < min(b_starts)  # never both running


async def test_without_leader_election_the_controllers_run_at_once(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodes", node("n1"))
    task = asyncio.create_task(
        run_manager(
            kube_client,
            ManagerSettings(enable_leader_election=False, resync_seconds=3600),
            controllers=("nodemetric",),
        ),
        name="manager",
    )
    try:
        await eventually(lambda: kube_api.get("nodemetrics", "n1") is not None)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert kube_api.get("leases", LEASE_NAME, "koordinator-system") is None
    assert kube_api.get("nodeslos", "n1") is None  # not selected


async def test_a_failing_controller_ends_the_manager_with_1_and_releases_the_lease(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodes", node("n1"))
    stopped: list[str] = []

    def broken(client: KubeClient, settings: ManagerSettings) -> Controller:
        class Broken:
            async def run(self, *, sync_timeout: float = 5.0) -> NoReturn:
                raise RuntimeError("informer cache corrupted")

        return Broken()

    def healthy(client: KubeClient, settings: ManagerSettings) -> Controller:
        inner = CONTROLLERS["nodemetric"](client, settings)

        class Logged:
            async def run(self, *, sync_timeout: float = 5.0) -> NoReturn:
                try:
                    await inner.run(sync_timeout=sync_timeout)
                finally:
                    stopped.append("nodemetric")

        return Logged()

    election = LeaderElectionConfig("koordinator-system", LEASE_NAME, "a", retry_period=0.1)
    code = await asyncio.wait_for(
        run_manager(
            kube_client,
            ManagerSettings(resync_seconds=3600),
            controllers=("nodemetric", "broken"),
            table={"nodemetric": healthy, "broken": broken},
            election=election,
        ),
        10,
    )
    assert code == 1
    assert stopped == ["nodemetric"]  # the rest of the term stopped with it
    lease = kube_api.get("leases", LEASE_NAME, "koordinator-system")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == ""


def test_an_unknown_controller_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--controllers", "nodeslo,bogus"])
    assert exc.value.code == 2
    assert "bogus" in capsys.readouterr().err


MANIFESTS = Path(__file__).resolve().parents[2] / "packaging" / "kubernetes" / "manager"


def test_the_deployment_runs_two_leader_elected_replicas_allowed_to_hold_the_lease() -> None:
    docs = {
        (d["kind"], d["metadata"]["name"]): d
        for name in ("deployment.yaml", "rbac.yaml")
        for d in yaml.safe_load_all((MANIFESTS / name).read_text(encoding="utf-8"))
        if d
    }
    deployment = docs[("Deployment", "koord-manager")]
    assert deployment["spec"]["replicas"] == 2
    manager = deployment["spec"]["template"]["spec"]["containers"][0]
    assert manager["args"][0] == "run"
    assert main_parser_accepts(manager["args"][1:])
    role = docs[("Role", "koord-manager-leader-election")]
    assert role["metadata"]["namespace"] == "koordinator-system"
    assert {"get", "create", "update"} <= set(role["rules"][0]["verbs"])
    cluster = docs[("ClusterRole", "koord-manager")]
    granted = {
        (group, res, verb)
        for rule in cluster["rules"]
        for group in rule["apiGroups"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }
    for need in (
        ("slo.koordinator.sh", "nodeslos", "create"),
        ("slo.koordinator.sh", "nodeslos", "update"),
        ("slo.koordinator.sh", "nodemetrics", "delete"),
        ("", "nodes/status", "update"),
        ("", "events", "create"),
        ("config.koordinator.sh", "clustercolocationprofiles", "watch"),
    ):
        assert need in granted


def main_parser_accepts(args: list[str]) -> bool:
    parsed = parser().parse_args(args)
    return bool(parsed.enable_leader_election) and parsed.controllers == tuple(CONTROLLERS)
