"""Two standalone schedulers against one fake API server: only the Lease holder binds.

Each candidate talks through its own kubeconfig token, so the fake server can say which one
created each binding (the bindings are what matter: a pod bound twice would be a 409, or worse).
The lifecycle under the Lease (deadlines, release order, a failing term) is tested once, for
both binaries, in tests/kube/test_elected.py; these tests are about what it means for binding.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kubeclient.client import KubeClient
from kubeclient.elected import EXIT_TERM_FAILED, ElectedRunner
from kubeclient.leaderelection import LeaderElectionConfig
from scheduler_plugins.config import SchedulerConfig
from scheduler_plugins.leader import scheduling_term
from tests.kubefake.fixtures import Clock, write_kubeconfig
from tests.kubefake.fixtures import eventually as wait_for_state
from tests.kubefake.server import Fault
from tests.scheduler.bindingfake import BindingFakeApiServer
from tests.scheduler.builders import node, pod, ts

NAMESPACE = "koordinator-system"
LEASE = "koord-scheduler"
TIMING = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.2}


class WhoBindsServer(BindingFakeApiServer):
    """Records the bearer token of every binding and every Lease request."""

    def __init__(self) -> None:
        super().__init__()
        self.bindings: list[tuple[str, str]] = []
        """(pod name, token) of every binding request, in arrival order."""
        self.lease_requests: list[tuple[str, str]] = []
        """(method, token) of every request for the Lease."""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if request.method == "POST" and request.path.endswith("/binding"):
            self.bindings.append((request.path.split("/")[-2], token))
        if "/leases/" in request.path:
            self.lease_requests.append((request.method, token))
        return await super()._handle(request)

    def holder(self) -> str:
        lease = self.get("leases", LEASE, NAMESPACE) or {}
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    def node_of(self, name: str) -> str:
        obj = self.get("pods", name, "default") or {}
        return str((obj.get("spec") or {}).get("nodeName") or "")

    def binders(self, names: list[str]) -> set[str]:
        return {token for pod_name, token in self.bindings if pod_name in names}


def ours(name: str) -> dict[str, Any]:
    p = pod(name, requests={"cpu": "1"})
    p["spec"]["schedulerName"] = "koord-scheduler"
    p["metadata"]["creationTimestamp"] = ts(time.time())
    return p


async def eventually(check: Callable[[], bool], within: float = 20.0) -> None:
    await wait_for_state(check, within=within)


@pytest.fixture
async def server() -> AsyncIterator[WhoBindsServer]:
    srv = WhoBindsServer()
    await srv.start()
    srv.put("nodes", node("n1", cpu="32"))
    try:
        yield srv
    finally:
        await srv.stop()


class Candidate:
    """One in-process ``koord-scheduler run`` replica with its own client and token."""

    def __init__(self, client: KubeClient, name: str) -> None:
        cfg = LeaderElectionConfig(namespace=NAMESPACE, name=LEASE, identity=name, **TIMING)
        self.clock = Clock()
        """This candidate's monotonic clock: only a test moves it past a deadline."""
        self.runner = ElectedRunner(
            client,
            cfg,
            lambda: scheduling_term(client, SchedulerConfig(), "koord-scheduler", 10),
            name=name,
            monotonic=self.clock,
        )
        self.stop = asyncio.Event()
        self.task: asyncio.Task[int] = asyncio.create_task(self.runner.run(self.stop), name=name)

    async def finish(self) -> int:
        self.stop.set()
        return await self.task


@pytest.fixture
async def candidates(server: WhoBindsServer, tmp_path: Path) -> AsyncIterator[Callable[[str], Any]]:
    clients: list[KubeClient] = []
    started: list[Candidate] = []

    async def start(name: str) -> Candidate:
        kc = write_kubeconfig(tmp_path / f"kc-{name}", server.url, token=name)
        client = await KubeClient.connect(str(kc), request_timeout=60.0)
        clients.append(client)
        cand = Candidate(client, name)
        started.append(cand)
        return cand

    try:
        yield start
    finally:
        for cand in started:
            cand.stop.set()
        await asyncio.gather(*(c.task for c in started), return_exceptions=True)
        for client in clients:
            await client.close()


def assert_bound_once(server: WhoBindsServer, names: list[str]) -> None:
    counts = Counter(pod_name for pod_name, _ in server.bindings if pod_name in names)
    assert counts == dict.fromkeys(names, 1)


async def test_only_the_leader_binds_and_a_stopped_leader_hands_over_to_the_other(
    server, candidates
):
    a = await candidates("a")
    await eventually(lambda: server.holder() == "a")
    b = await candidates("b")
    await eventually(lambda: any(token == "b" for _, token in server.lease_requests))
    first = [f"p{i}" for i in range(4)]
    for name in first:
        server.put("pods", ours(name))
    await eventually(lambda: all(server.node_of(n) == "n1" for n in first))
    assert server.binders(first) == {"a"}
    assert (b.runner.leading, b.runner.terms) == (False, 0)

    assert await a.finish() == 0  # SIGTERM: the term stops, then the Lease is released
    assert a.runner.task is None
    second = [f"q{i}" for i in range(4)]
    for name in second:
        server.put("pods", ours(name))
    await eventually(lambda: all(server.node_of(n) == "n1" for n in second))
    assert server.holder() == "b"
    assert server.binders(second) == {"b"}
    assert_bound_once(server, first + second)


async def test_the_leaders_term_places_pending_reservations_as_the_standalone_scheduler_does(
    server, candidates
):
    a = await candidates("a")
    await eventually(lambda: a.runner.leading)
    reservation = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": "r", "uid": "uid-r", "creationTimestamp": ts(time.time())},
        "spec": {
            "template": {
                "spec": {
                    "schedulerName": "koord-scheduler",
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
                }
            },
            "owners": [{"labelSelector": {"matchLabels": {"app": "web"}}}],
            "ttl": "1h",
        },
    }
    server.put("reservations", reservation)
    await eventually(
        lambda: (
            ((server.get("reservations", "r") or {}).get("status") or {}).get("phase")
            == "Available"
        )
    )
    assert server.get("reservations", "r")["status"]["nodeName"] == "n1"


async def test_a_leader_that_cannot_renew_stops_binding_until_it_holds_the_lease_again(
    server, candidates
):
    a = await candidates("a")
    server.put("pods", ours("before"))
    await eventually(lambda: server.node_of("before") == "n1")
    refused = Fault(status=500, method="PUT", path_contains="/leases/", times=10**6)
    server.faults.append(refused)
    a.clock.now += TIMING["renew_deadline"]  # no renewal gets through until the deadline
    await eventually(lambda: not a.runner.leading)
    assert a.runner.task is None
    server.put("pods", ours("during"))
    # five more failed attempts later, the pod is still pending: nobody schedules
    tries = sum(1 for m, _ in server.lease_requests if m == "PUT")
    await eventually(lambda: sum(1 for m, _ in server.lease_requests if m == "PUT") >= tries + 5)
    assert server.node_of("during") == ""
    refused.times = 0
    await eventually(lambda: server.node_of("during") == "n1")
    assert a.runner.terms == 2  # a fresh term: new informers, new queue
    assert_bound_once(server, ["before", "during"])


async def test_a_term_whose_informers_cannot_list_ends_the_run_with_1_and_releases_the_lease(
    server, tmp_path, caplog
):
    kc = write_kubeconfig(tmp_path / "kc", server.url, token="a")
    client = await KubeClient.connect(str(kc), request_timeout=5.0)
    server.faults.append(Fault(status=403, path_contains="/pods", times=10**6))
    cfg = LeaderElectionConfig(namespace=NAMESPACE, name=LEASE, identity="a", **TIMING)
    try:
        runner = ElectedRunner(
            client,
            cfg,
            lambda: scheduling_term(client, SchedulerConfig(), "koord-scheduler", 0.5),
            name="a",
        )
        assert await asyncio.wait_for(runner.run(), 20) == EXIT_TERM_FAILED
        assert runner.terms == 1
        assert server.holder() == ""
        assert server.bindings == []
        assert "TermError: informers not listed within 0.5s: waiting for pods" in caplog.text
    finally:
        await client.close()


# -- two processes: the leader is killed and its lease expires ----------------------------------


FAST = (
    "--leader-elect-lease-duration=3s",
    "--leader-elect-renew-deadline=2s",
    "--leader-elect-retry-period=250ms",
)


async def start_process(
    server: WhoBindsServer, tmp_path: Path, name: str, *flags: str
) -> asyncio.subprocess.Process:
    kc = write_kubeconfig(tmp_path / f"kc-{name}", server.url, token=name)
    log = (tmp_path / f"{name}.log").open("wb")
    env = {**os.environ, "POD_NAME": name}
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "scheduler_plugins.cli",
            "run",
            f"--kubeconfig={kc}",
            *(flags or FAST),
            stdout=log,
            stderr=log,
            env=env,
        )
    finally:
        log.close()


async def test_when_the_leader_process_dies_the_other_takes_over_after_the_lease_expires(
    server, tmp_path
):
    procs: list[asyncio.subprocess.Process] = []
    try:
        procs.append(await start_process(server, tmp_path, "a"))
        await eventually(lambda: server.holder().startswith("a_"), within=60)
        procs.append(await start_process(server, tmp_path, "b"))
        await eventually(lambda: any(t == "b" for _, t in server.lease_requests), within=60)
        first = [f"p{i}" for i in range(3)]
        for name in first:
            server.put("pods", ours(name))
        await eventually(lambda: all(server.node_of(n) == "n1" for n in first), within=60)
        assert server.binders(first) == {"a"}

        procs[0].send_signal(signal.SIGKILL)  # no release: b must wait for the lease to expire
        await procs[0].wait()
        second = [f"q{i}" for i in range(3)]
        for name in second:
            server.put("pods", ours(name))
        await eventually(lambda: all(server.node_of(n) == "n1" for n in second), within=60)
        assert server.holder().startswith("b_")
        assert server.binders(second) == {"b"}
        assert_bound_once(server, first + second)

        procs[1].send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(procs[1].wait(), 30) == 0
        assert server.holder() == ""  # released on the way out
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_with_leader_election_off_the_scheduler_binds_without_touching_the_lease(
    server, tmp_path
):
    proc = await start_process(server, tmp_path, "solo", "--leader-elect=false")
    try:
        server.put("pods", ours("p"))
        await eventually(lambda: server.node_of("p") == "n1", within=60)
        assert server.binders(["p"]) == {"solo"}
        assert server.lease_requests == []
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
