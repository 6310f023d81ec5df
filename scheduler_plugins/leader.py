"""``koord-scheduler run``: one scheduling term at a time, under leader election by default.

The standalone scheduler binds pods, so two replicas must never both schedule. Every replica is a
candidate for one ``coordination.k8s.io/v1`` Lease (kube-scheduler's ``--leader-elect*`` flags;
Koordinator's koord-scheduler uses ``koordinator-system/koord-scheduler``). The lifecycle is the
shared one of :mod:`kubeclient.elected` (koord-manager runs the same):

- **One term per leadership.** On gaining the Lease a fresh *term* (:func:`scheduling_term`)
  starts: its own informers, snapshot and scheduling loop. Followers run no informers (no warm
  standby): a term never inherits another's assumed pods or waiting gang members, at the price of
  one list of every kind at takeover.
- **Stepping down.** A leader that has not renewed within ``renew_deadline`` cancels its term at
  once (a renewal that hangs is abandoned at the deadline), before any other candidate may take
  over. It stays a candidate and starts a fresh term if it wins again (kube-scheduler exits
  instead; a restart gives the same).
- **Stopping.** On SIGTERM (:mod:`kubeclient.signals`) the term is cancelled *first* and the
  Lease released after. A term that fails (its informers never listed nodes and pods, or it
  crashed) ends the process with 1, releasing the Lease, rather than holding it without
  scheduling. With ``--leader-elect=false`` the term runs at once, without a Lease, under the
  same rules.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Mapping
from typing import Any

from apis.duration import parse_duration
from apis.records import frozen
from kubeclient.client import KubeClient
from kubeclient.elected import ElectedRunner
from kubeclient.leaderelection import LeaderElectionConfig, identity
from kubeclient.signals import StopSignals
from scheduler_plugins.errors import InputError, SchedulerError

logger = logging.getLogger(__name__)

LEASE_NAME = "koord-scheduler"
"""``--leader-elect-resource-name``: Koordinator's koord-scheduler Lease."""
LEASE_NAMESPACE = "koordinator-system"
"""``--leader-elect-resource-namespace``: where Koordinator installs koord-scheduler."""


class TermError(SchedulerError):
    """A scheduling term cannot go on (its informers did not list nodes and pods in time)."""


@frozen
class LeaderElection:
    """kube-scheduler's ``leaderElection`` settings (``--leader-elect*`` flags)."""

    leader_elect: bool = True
    """``--leader-elect``: schedule only while holding the Lease (default true)."""
    lease_duration: float = 15.0
    """``--leader-elect-lease-duration`` in seconds: how long followers wait after the last
    renewal they saw before taking over."""
    renew_deadline: float = 10.0
    """``--leader-elect-renew-deadline`` in seconds: how long a leader keeps trying to renew
    before it stops scheduling (< ``lease_duration``)."""
    retry_period: float = 2.0
    """``--leader-elect-retry-period`` in seconds: between attempts to acquire or renew."""
    resource_name: str = LEASE_NAME
    """``--leader-elect-resource-name``: the Lease's name."""
    resource_namespace: str = LEASE_NAMESPACE
    """``--leader-elect-resource-namespace``: the Lease's namespace."""
    identity: str = ""
    """This candidate's identity; empty: :func:`identity` (host name and a unique suffix)."""

    def config(self) -> LeaderElectionConfig:
        """The elector's config (validates the timings: ``retry < renew < lease``)."""
        return LeaderElectionConfig(
            namespace=self.resource_namespace,
            name=self.resource_name,
            identity=self.identity or identity(),
            lease_duration=self.lease_duration,
            renew_deadline=self.renew_deadline,
            retry_period=self.retry_period,
        )


_DURATIONS = {
    "leaseDuration": "lease_duration",
    "renewDeadline": "renew_deadline",
    "retryPeriod": "retry_period",
}
_NAMES = {"resourceName": "resource_name", "resourceNamespace": "resource_namespace"}


def from_config(doc: Mapping[str, Any], source: str) -> LeaderElection:
    """The ``leaderElection`` stanza of a KubeSchedulerConfiguration (defaults where absent).
    Raises :class:`InputError` naming the field."""
    stanza = doc.get("leaderElection")
    if stanza is None:
        return LeaderElection()
    if not isinstance(stanza, Mapping):
        raise InputError(source, "leaderElection", "must be a map")
    kwargs: dict[str, Any] = {}
    if "leaderElect" in stanza:
        if not isinstance(stanza["leaderElect"], bool):
            raise InputError(source, "leaderElection.leaderElect", "must be true or false")
        kwargs["leader_elect"] = stanza["leaderElect"]
    for key, attr in _DURATIONS.items():
        if key in stanza:
            try:
                kwargs[attr] = parse_duration(str(stanza[key]))
            except ValueError as err:
                raise InputError(source, f"leaderElection.{key}", str(err)) from err
    for key, attr in _NAMES.items():
        if key in stanza:
            if not isinstance(stanza[key], str) or not stanza[key]:
                raise InputError(source, f"leaderElection.{key}", "must be a non-empty string")
            kwargs[attr] = stanza[key]
    lock = stanza.get("resourceLock", "leases")
    if lock != "leases":
        raise InputError(source, "leaderElection.resourceLock", f"only leases, not {lock!r}")
    return LeaderElection(**kwargs)


async def scheduling_term(
    client: KubeClient,
    cfg: Any,
    scheduler_name: str,
    sync_timeout: float = 60.0,
    *,
    own_process: bool = False,
) -> None:
    """One term of the standalone scheduler: fresh informers and loop, until cancelled.

    Built by :func:`~scheduler_plugins.standalone.build_scheduler` on a client it is given.
    Raises :class:`TermError` when its informers have not all listed within ``sync_timeout``.
    ``own_process``: the process is the scheduler's alone (``koord-scheduler run``), so its
    garbage collector may pause while the informers list and be tuned once synced
    (:func:`~scheduler_plugins.standalone.tune_gc`); in-process callers (tests) leave theirs
    alone.
    """
    from scheduler_plugins.standalone import build_scheduler, pause_gc, tune_gc

    informed, scheduler = build_scheduler(client, cfg, scheduler_name)
    if own_process:
        pause_gc()
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(informed.run(), name="scheduler-informers")
            if not await informed.wait_synced(sync_timeout):
                raise TermError(
                    f"informers not listed within {sync_timeout:g}s: waiting for "
                    + ", ".join(informed.not_ready())
                )
            if own_process:
                tune_gc()
            group.create_task(scheduler.run(), name="scheduler-loop")
    finally:
        if own_process:
            gc.enable()  # a term ended before its informers listed


async def run_elected(
    cfg: Any,
    kubeconfig: str | None,
    election: LeaderElection,
    scheduler_name: str,
    sync_timeout: float = 60.0,
) -> int:
    """``koord-scheduler run``: scheduling terms under the Lease (at once with ``leader_elect``
    off) until SIGTERM or SIGINT (0), or until a term fails (1)."""
    client = await KubeClient.connect(kubeconfig)
    try:
        runner = ElectedRunner(
            client,
            election.config() if election.leader_elect else None,
            lambda: scheduling_term(client, cfg, scheduler_name, sync_timeout, own_process=True),
            name="scheduler",
        )
        with StopSignals() as signals:
            return await runner.run(signals.stop)
    finally:
        await client.close()
