"""Leader election on a Lease: one leader, takeover only after expiry, step-down, release."""

from __future__ import annotations

import asyncio

from kubeclient.client import KubeClient
from kubeclient.leaderelection import LeaderElectionConfig, LeaderElector
from tests.kube.conftest import eventually
from tests.kubefake import FakeApiServer, Fault


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _elector(
    client: KubeClient, identity: str, clock: _Clock, log: list[tuple[str, bool]]
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
    clock_a, clock_b = _Clock(), _Clock()
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
    clock = _Clock()
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


async def test_cancelling_a_leader_releases_the_lease(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    log: list[tuple[str, bool]] = []
    a = _elector(kube_client, "a", _Clock(), log)
    task = asyncio.create_task(a.run())
    await eventually(lambda: a.is_leader)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    lease = kube_api.get("leases", "koord-manager", "koordinator-system")
    assert lease["spec"]["holderIdentity"] == ""  # type: ignore[index]
    assert log == [("a", True), ("a", False)]


async def test_a_renewal_is_cut_off_at_what_is_left_of_the_renew_deadline(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    clock = _Clock()
    log: list[tuple[str, bool]] = []
    a = _elector(kube_client, "a", clock, log)
    await a.step()
    assert a.is_leader
    # 9.5 s after its last renewal the leader has 0.5 s left; the server holds the renewal for
    # 2 s. The attempt is abandoned when the 0.5 s are up (before the server answers).
    kube_api.faults.append(Fault(delay=2.0, method="PUT", path_contains="/leases/"))
    clock.now += 9.5
    await asyncio.wait_for(a.step(), 1.5)
    assert a.is_leader  # by its own clock it is still within the deadline
    # Past the deadline it steps down before trying again, then wins the free Lease anew.
    clock.now += 0.6
    await a.step()
    assert log == [("a", True), ("a", False), ("a", True)]
    await asyncio.sleep(2.0)  # the held request's handler ends on the server
