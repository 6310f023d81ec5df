"""``koord-scheduler run`` under leader election: one replica binds, the others wait.

The standalone scheduler binds pods, so two replicas must never both schedule. Every replica is a
candidate for one ``coordination.k8s.io/v1`` Lease (kube-scheduler's ``--leader-elect*`` flags;
Koordinator's koord-scheduler uses ``koordinator-system/koord-scheduler``), through the shared
compare-and-swap logic of :class:`~kubeclient.leaderelection.LeaderElector`.

- **One term per leadership.** On gaining the Lease a fresh *term* starts (:func:`scheduling_term`
  by default): its own informers, snapshot and scheduling loop. Followers run no informers
  (no warm standby): a term never inherits another's assumed pods or waiting gang members, at
  the price of one list of every kind at takeover.
- **Stepping down.** A leader that has not renewed for ``renew_deadline`` cancels its term at once,
  before any other candidate may take over (``renew_deadline < lease_duration``, and a follower
  waits ``lease_duration`` after the last change it saw, by its own clock). A renewal that hangs
  is cut off at the renew deadline too (the request is abandoned), so a slow API server cannot
  keep a leader binding past its lease. A replica that stepped down stays a candidate and starts
  a fresh term if it wins again (kube-scheduler exits instead; a restart gives the same).
- **Stopping.** On SIGTERM the term is cancelled *first* and the Lease released after (holder
  emptied), so the successor takes over at its next retry and never overlaps us. A term that
  fails (its informers never listed nodes and pods, or it crashed) ends the process with 1,
  releasing the Lease, rather than holding it without scheduling.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from apis.duration import parse_duration
from kubeclient.client import KubeClient
from kubeclient.errors import KubeError
from kubeclient.leaderelection import LeaderElectionConfig, LeaderElector
from scheduler_plugins.errors import InputError, SchedulerError

logger = logging.getLogger(__name__)

LEASE_NAME = "koord-scheduler"
"""``--leader-elect-resource-name``: Koordinator's koord-scheduler Lease."""
LEASE_NAMESPACE = "koordinator-system"
"""``--leader-elect-resource-namespace``: where Koordinator installs koord-scheduler."""

Term = Callable[[], Coroutine[Any, Any, Any]]
"""Starts one leadership term's work (eternal; cancelled when leadership ends)."""


class TermError(SchedulerError):
    """A leadership term ended by itself (it should run until cancelled)."""


@dataclass(frozen=True, slots=True)
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


def identity() -> str:
    """kube-scheduler's candidate identity: the host (in a pod, the pod's name; ``POD_NAME``
    when set) and ``_`` and a UUID, so a restarted pod is a new candidate."""
    host = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{host}_{uuid.uuid4()}"


class ElectedRunner:
    """Competes for the Lease and runs ``term()`` only while holding it."""

    def __init__(
        self,
        client: KubeClient,
        config: LeaderElectionConfig,
        term: Term,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.config = config
        self.elector = LeaderElector(client, config, monotonic=monotonic)
        self._term = term
        self._mono = monotonic
        self.leading = False
        """Whether this candidate holds the Lease (and its term runs)."""
        self.terms = 0
        """Terms started so far."""
        self.task: asyncio.Task[Any] | None = None
        """The running term."""
        self._last_renew = 0.0
        self._failed: asyncio.Future[BaseException] | None = None

    # -- leadership -------------------------------------------------------------------------

    def _set_leading(self, leading: bool) -> None:
        if leading == self.leading:
            return
        self.leading = leading
        cfg = self.config
        if leading:
            logger.info("%s leads lease %s/%s", cfg.identity, cfg.namespace, cfg.name)
            self.terms += 1
            self.task = asyncio.get_running_loop().create_task(
                self._term(), name=f"scheduler-term-{self.terms}"
            )
            self.task.add_done_callback(self._ended)
        else:
            logger.warning(
                "%s lost lease %s/%s: scheduling stopped", cfg.identity, cfg.namespace, cfg.name
            )
            if self.task is not None:
                self.task.cancel()  # synchronously: no bind starts after this line
                self.task = None

    def _ended(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        err = task.exception() or TermError(f"{task.get_name()} returned")
        logger.error("%s ended: %r", task.get_name(), err)
        if self._failed is not None and not self._failed.done():
            self._failed.set_result(err)

    async def step(self) -> None:
        """One attempt to acquire or renew, bounded by what is left of the renew deadline; a
        leader past its deadline stops its term."""
        cfg = self.config
        budget = cfg.renew_deadline
        if self.leading:
            budget = self._last_renew + cfg.renew_deadline - self._mono()
            if budget <= 0:
                self._set_leading(False)
                budget = cfg.renew_deadline
        try:
            async with asyncio.timeout(budget):
                held = await self.elector.try_acquire_or_renew()
        except TimeoutError:
            logger.warning("lease %s: no answer within the renew deadline", cfg.name)
            held = False
        except KubeError as err:
            logger.warning("lease %s: %s", cfg.name, err)
            held = False
        now = self._mono()
        if held:
            self._last_renew = now
            self._set_leading(True)
        elif self.leading and now - self._last_renew >= cfg.renew_deadline:
            self._set_leading(False)

    def _pause(self) -> float:
        """Seconds to the next attempt: the retry period, shortened so that a leader notices its
        renew deadline passing on time."""
        wait = self.config.retry_period
        if self.leading:
            wait = min(wait, max(self._last_renew + self.config.renew_deadline - self._mono(), 0))
        return wait

    async def release(self) -> None:
        """Give the Lease up (empty holder, 1 s duration) if we hold it, so a successor need not
        wait for it to expire."""
        cfg = self.config
        if await self.elector.give_up():
            logger.info("%s released lease %s/%s", cfg.identity, cfg.namespace, cfg.name)

    async def stop_term(self) -> None:
        """Cancel the running term and wait until it has stopped."""
        task, self.task = self.task, None
        self.leading = False
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def run(self, stop: asyncio.Event | None = None) -> int:
        """Compete until ``stop`` is set (or this task is cancelled): 0; 1 when a term failed.
        The term is always stopped before the Lease is released."""
        failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        self._failed = failed
        stopped: asyncio.Future[Any] = asyncio.ensure_future((stop or asyncio.Event()).wait())
        try:
            while not failed.done():
                await self.step()
                if failed.done():
                    break
                pause: asyncio.Future[Any] = asyncio.ensure_future(asyncio.sleep(self._pause()))
                await asyncio.wait({pause, stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
                pause.cancel()
                if stopped.done() and not failed.done():
                    return 0
            return 1
        finally:
            stopped.cancel()
            await self.stop_term()  # stop binding before the Lease goes: no overlap
            if self.terms:
                await asyncio.shield(self._bounded_release())

    async def _bounded_release(self) -> None:
        try:
            async with asyncio.timeout(self.config.renew_deadline):
                await self.release()
        except TimeoutError:
            logger.warning("lease %s: release got no answer; it expires", self.config.name)


async def scheduling_term(
    client: KubeClient, cfg: Any, scheduler_name: str, sync_timeout: float = 60.0
) -> None:
    """One term of the standalone scheduler: fresh informers and loop, until cancelled.

    Built as :func:`~scheduler_plugins.standalone.run_standalone` builds its own
    (:func:`~scheduler_plugins.standalone.build_scheduler`), on a client it is given. Raises
    :class:`TermError` when nodes and pods are not listed within ``sync_timeout``.
    """
    from scheduler_plugins.standalone import build_scheduler, tune_gc

    informed, scheduler = build_scheduler(client, cfg, scheduler_name)
    async with asyncio.TaskGroup() as group:
        group.create_task(informed.run(), name="scheduler-informers")
        if not await informed.wait_synced(sync_timeout):
            raise TermError(f"nodes and pods not listed within {sync_timeout:.0f}s")
        tune_gc()
        group.create_task(scheduler.run(), name="scheduler-loop")


async def run_elected(
    cfg: Any,
    kubeconfig: str | None,
    election: LeaderElection,
    scheduler_name: str,
    sync_timeout: float = 60.0,
) -> int:
    """``koord-scheduler run`` with ``--leader-elect``: until SIGTERM or SIGINT (0), or until a
    term fails (1)."""
    import signal

    client = await KubeClient.connect(kubeconfig)
    try:
        runner = ElectedRunner(
            client,
            election.config(),
            lambda: scheduling_term(client, cfg, scheduler_name, sync_timeout),
        )
        logger.info(
            "candidate %s for lease %s/%s",
            runner.config.identity,
            runner.config.namespace,
            runner.config.name,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await runner.run(stop)
    finally:
        await client.close()
