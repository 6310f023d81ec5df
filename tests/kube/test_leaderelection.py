"""Leader election on a Lease: one leader, takeover only after expiry, step-down, release."""

from __future__ import annotations

import pytest

from kubeclient.client import KubeClient
from kubeclient.leaderelection import LeaderElectionConfig, LeaderElector
from tests.kubefake import FakeApiServer, Fault
from tests.kubefake.fixtures import Clock


def _elector(
    client: KubeClient, identity: str, clock: Clock, log: list[tuple[str, bool]]
) -> LeaderElector:
    cfg = LeaderElectionConfig("koordinator-system", "koord-manager", identity)
    return LeaderElector(
        client,
        cfg,
        on_change=lambda leading: log.append((identity, leading)),
        wall_clock=lambda: 1_800_000_000.0 + clock.now,
        monotonic=clock,
    )


async def test_one_candidate_leads_and_the_other_takes_over_only_after_expiry(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    clock_a, clock_b = Clock(), Clock()
    log: list[tuple[str, bool]] = []
    a = _elector(kube_client, "a", clock_a, log)
    b = _elector(kube_client, "b", clock_b, log)
    await a.step()
    await b.step()
    assert (a.is_leader, b.is_leader) == (True, False)
    lease = kube_api.get("leases", "koord-manager", "koordinator-system")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "a"
    assert lease["spec"]["leaseDurationSeconds"] == 15
    # a stops renewing; b's own clock passes the lease duration since it last saw a change.
    clock_b.now += 10
    await b.step()
    assert not b.is_leader
    clock_b.now += 6
    await b.step()
    assert b.is_leader
    lease = kube_api.get("leases", "koord-manager", "koordinator-system")
    assert lease["spec"]["holderIdentity"] == "b"  # type: ignore[index]
    assert lease["spec"]["leaseTransitions"] == 1  # type: ignore[index]
    # a comes back, cannot renew (b holds it) and steps down after its renew deadline.
    clock_a.now += 11
    await a.step()
    assert not a.is_leader
    assert log == [("a", True), ("b", True), ("a", False)]


async def test_a_leader_that_cannot_reach_the_server_steps_down_after_the_deadline(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    clock = Clock()
    log: list[tuple[str, bool]] = []
    a = _elector(kube_client, "a", clock, log)
    await a.step()
    kube_api.faults.append(Fault(status=503, times=100))
    clock.now += 5
    await a.step()
    assert a.is_leader  # within its renew deadline
    clock.now += 6
    await a.step()
    assert not a.is_leader


async def test_a_leader_waits_no_longer_than_what_is_left_of_its_renew_deadline(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    clock = Clock()
    a = _elector(kube_client, "a", clock, [])
    b = _elector(kube_client, "b", clock, [])
    await a.step()
    await b.step()
    assert (a.pause(), b.pause()) == (2.0, 2.0)  # the retry period
    clock.now += 9.5
    assert a.pause() == pytest.approx(0.5)  # the leader looks again as its deadline ends
    assert b.pause() == 2.0


async def test_release_empties_the_holder_only_when_it_names_this_candidate(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    clock = Clock()
    log: list[tuple[str, bool]] = []
    a = _elector(kube_client, "a", clock, log)
    b = _elector(kube_client, "b", clock, log)
    await a.step()
    assert not await b.release()  # b does not hold it: nothing written
    assert (
        kube_api.get("leases", "koord-manager", "koordinator-system")["spec"][  # type: ignore[index]
            "holderIdentity"
        ]
        == "a"
    )
    assert await a.release()
    assert not a.is_leader
    lease = kube_api.get("leases", "koord-manager", "koordinator-system")
    assert lease["spec"]["holderIdentity"] == ""  # type: ignore[index]
    assert lease["spec"]["leaseDurationSeconds"] == 1  # type: ignore[index]
    await b.step()  # the emptied Lease is free at once, whatever b's clock says
    assert b.is_leader
    assert log == [("a", True), ("b", True)]  # stopping is the caller's: no callback
