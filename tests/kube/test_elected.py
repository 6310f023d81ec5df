"""The elected lifecycle both koord-manager and koord-scheduler run: a term only while holding the
Lease, cancelled at once on losing it, stopped before the Lease is released, and one rule for a
term that fails. Candidates talk to the fake API server through the real client; each has its
own monotonic clock, moved by hand where a deadline or an expiry matters."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from kubeclient.client import KubeClient
from kubeclient.elected import EXIT_STOPPED, EXIT_TERM_FAILED, ElectedRunner
from kubeclient.leaderelection import LeaderElectionConfig
from tests.kube.conftest import eventually
from tests.kubefake import FakeApiServer, Fault
from tests.kubefake.fixtures import Clock

NAMESPACE, LEASE = "koordinator-system", "koord-test"


class Candidate:
    """One replica: an :class:`ElectedRunner` whose terms log when they start and stop."""

    def __init__(
        self,
        client: KubeClient,
        name: str,
        log: list[tuple[str, str, float]],
        *,
        election: bool = True,
        term: Callable[[], Any] | None = None,
    ) -> None:
        self.name = name
        self.log = log
        self.clock = Clock()
        cfg = LeaderElectionConfig(NAMESPACE, LEASE, name, retry_period=0.02)
        self.runner = ElectedRunner(
            client,
            cfg if election else None,
            term or self.term,
            name=name,
            wall_clock=lambda: 1_800_000_000.0 + self.clock.now,
            monotonic=self.clock,
        )
        self.stop = asyncio.Event()
        self.task: asyncio.Task[int] | None = None

    async def term(self) -> None:
        self.log.append(("start", self.name, time.monotonic()))
        try:
            await asyncio.Event().wait()
        finally:
            self.log.append(("stop", self.name, time.monotonic()))

    def start(self) -> None:
        self.task = asyncio.create_task(self.runner.run(self.stop), name=f"candidate-{self.name}")

    async def finish(self) -> int:
        assert self.task is not None
        self.stop.set()
        return await self.task

    def running(self) -> bool:
        """Whether this candidate's latest term runs."""
        mine = [what for what, who, _ in self.log if who == self.name]
        return mine[-1:] == ["start"]


@pytest.fixture
async def candidates(
    kube_api: FakeApiServer, kubeconfig: Path
) -> AsyncIterator[Callable[..., Candidate]]:
    """Candidates with a client each; whatever a test leaves running is stopped after it."""
    clients: list[KubeClient] = []
    made: list[Candidate] = []
    log: list[tuple[str, str, float]] = []

    async def make(name: str, **kwargs: Any) -> Candidate:
        client = await KubeClient.connect(str(kubeconfig), request_timeout=5.0)
        clients.append(client)
        cand = Candidate(client, name, log, **kwargs)
        made.append(cand)
        return cand

    try:
        yield make
    finally:
        for cand in made:
            cand.stop.set()
        await asyncio.gather(*(c.task for c in made if c.task), return_exceptions=True)
        for client in clients:
            await client.close()


def holder(kube_api: FakeApiServer) -> str:
    lease = kube_api.get("leases", LEASE, NAMESPACE) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def lease_puts(kube_api: FakeApiServer) -> int:
    return len(kube_api.writes("PUT", f"/leases/{LEASE}"))


async def test_only_the_leader_runs_a_term_and_its_stop_ends_the_term_before_the_lease_goes(
    kube_api: FakeApiServer, candidates: Callable[..., Any]
) -> None:
    a, b = await candidates("a"), await candidates("b")
    a.start()
    await eventually(lambda: a.running())
    b.start()
    renewals = lease_puts(kube_api)
    await eventually(lambda: lease_puts(kube_api) >= renewals + 10)  # a renews, b follows
    assert (b.runner.leading, b.runner.terms, holder(kube_api)) == (False, 0, "a")

    assert await a.finish() == EXIT_STOPPED
    (stopped_at,) = [at for what, who, at in a.log if (what, who) == ("stop", "a")]
    releases = [
        r
        for r in kube_api.writes("PUT", f"/leases/{LEASE}")
        if r.body["spec"]["holderIdentity"] == ""
    ]
    assert len(releases) == 1
    assert stopped_at < releases[0].at  # the term ended before the Lease was given up
    # b's clock never moved: it takes the emptied Lease at its next retry, not after expiry
    await eventually(lambda: b.running())
    assert holder(kube_api) == "b"
    assert [(what, who) for what, who, _ in a.log] == [
        ("start", "a"),
        ("stop", "a"),
        ("start", "b"),
    ]


async def test_a_leader_that_cannot_renew_stops_its_term_at_the_deadline_and_starts_a_fresh_one(
    kube_api: FakeApiServer, candidates: Callable[..., Any]
) -> None:
    a = await candidates("a")
    a.start()
    await eventually(lambda: a.running())
    first = a.runner.task
    refused = Fault(status=500, method="PUT", path_contains="/leases/", times=10**6)
    kube_api.faults.append(refused)
    a.clock.now += 9.0  # within the renew deadline: still leading, whatever the answers
    tries = lease_puts(kube_api)
    await eventually(lambda: lease_puts(kube_api) >= tries + 3)
    assert a.runner.leading
    assert a.running()

    a.clock.now += 1.5  # past it
    await eventually(lambda: not a.runner.leading)
    assert first is not None
    assert first.cancelled() or first.cancelling()
    assert a.runner.task is None
    await eventually(lambda: not a.running())

    refused.times = 0  # the server answers again: a wins the Lease anew, with a fresh term
    await eventually(lambda: a.running())
    assert a.runner.terms == 2
    assert a.runner.task is not first


async def test_a_renewal_that_hangs_is_abandoned_and_the_term_stops_before_the_server_answers(
    kube_api: FakeApiServer, candidates: Callable[..., Any]
) -> None:
    a = await candidates("a")
    a.start()
    await eventually(lambda: a.running())
    a.clock.now += 9.7  # 0.3 s of the renew deadline left
    # the server holds Lease updates for 1 s (the client would wait 5 s)
    hang = Fault(delay=1.0, method="PUT", path_contains="/leases/", times=10**6)
    kube_api.faults.append(hang)
    await eventually(lambda: kube_api.in_flight > 0)
    a.clock.now += 0.5  # the deadline passes while the renewal is unanswered
    await eventually(lambda: not a.running())
    assert kube_api.in_flight > 0  # the server has not answered yet
    assert not a.runner.leading
    hang.times = 0
    await a.finish()
    await eventually(lambda: kube_api.in_flight == 0)  # the held requests end on the server


@pytest.mark.parametrize("how", ["raises", "returns"])
async def test_a_term_that_ends_by_itself_ends_the_run_with_1_and_releases_the_lease(
    kube_api: FakeApiServer, candidates: Callable[..., Any], how: str
) -> None:
    async def broken() -> None:
        await asyncio.sleep(0)
        if how == "raises":
            raise RuntimeError("informers never synced")

    a = await candidates("a", term=broken)
    a.start()
    assert a.task is not None
    assert await asyncio.wait_for(a.task, 10) == EXIT_TERM_FAILED
    assert a.runner.terms == 1
    assert holder(kube_api) == ""


async def test_cancelling_the_runner_stops_the_term_then_releases_the_lease(
    kube_api: FakeApiServer, candidates: Callable[..., Any]
) -> None:
    a = await candidates("a")
    a.start()
    await eventually(lambda: a.running())
    assert a.task is not None
    a.task.cancel()
    await asyncio.gather(a.task, return_exceptions=True)
    assert a.task.cancelled()
    assert not a.running()
    assert holder(kube_api) == ""


async def test_without_election_the_term_runs_at_once_and_no_lease_is_touched(
    kube_api: FakeApiServer, candidates: Callable[..., Any]
) -> None:
    a = await candidates("a", election=False)
    a.start()
    await eventually(lambda: a.running())
    assert a.runner.leading
    assert await a.finish() == EXIT_STOPPED
    assert not a.running()
    assert not [r for r in kube_api.requests if "/leases" in r.path]


async def test_without_election_a_failing_term_ends_the_run_with_1(
    candidates: Callable[..., Any],
) -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    a = await candidates("a", election=False, term=broken)
    a.start()
    assert a.task is not None
    assert await asyncio.wait_for(a.task, 10) == EXIT_TERM_FAILED


async def test_a_fresh_term_begins_only_once_the_cancelled_one_has_stopped(
    kube_api: FakeApiServer, candidates: Callable[..., Any]
) -> None:
    done_cleaning = asyncio.Event()
    began: list[int] = []

    async def slow_to_stop() -> None:
        began.append(len(began) + 1)
        try:
            await asyncio.Event().wait()
        finally:
            await done_cleaning.wait()  # e.g. flushing writes on the way out

    a = await candidates("a", term=slow_to_stop)
    a.start()
    await eventually(lambda: began == [1])
    refused = Fault(status=500, method="PUT", path_contains="/leases/", times=10**6)
    kube_api.faults.append(refused)
    a.clock.now += 11  # past the renew deadline: the term is cancelled, and still cleaning up
    await eventually(lambda: not a.runner.leading)
    refused.times = 0
    await eventually(lambda: a.runner.leading and a.runner.terms == 2)  # the Lease won again
    renewals = lease_puts(kube_api)
    await eventually(lambda: lease_puts(kube_api) >= renewals + 3)
    assert began == [1]  # the second term waits for the first
    done_cleaning.set()
    await eventually(lambda: began == [1, 2])
