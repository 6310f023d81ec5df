"""One elected lifecycle for koord-manager, koord-scheduler and the koord-descheduler to come.

A binary hands :class:`ElectedRunner` a *term factory*: a function returning a fresh coroutine
that does the binary's work (controllers, a scheduling loop) until it is cancelled. The runner
owns everything else:

- **The Lease.** Given a :class:`~kubeclient.leaderelection.LeaderElectionConfig`, it competes
  for the Lease through :class:`~kubeclient.leaderelection.LeaderElector`, one attempt each retry
  period. Given ``None`` (``--enable-leader-election=false``, ``--leader-elect=false``) there is
  no Lease: one term starts at once, under the same stop and failure rules.
- **One term per leadership.** Gaining the Lease starts a fresh term (its own informers, queues
  and write history: nothing is inherited from an earlier term). A fresh term begins only once
  every term cancelled before it has ended, so two terms of one process never overlap.
- **Stepping down.** Losing the Lease, or reaching the renew deadline without a renewal (a
  renewal that hangs is abandoned at the deadline), cancels the term at once, in the same
  callback: none of its code runs after that but its own cleanup. Since
  ``renew_deadline < lease_duration`` and a follower counts the lease on its own clock from the
  last change it saw, no other candidate can take over before that moment. A candidate that
  stepped down stays a candidate and starts a fresh term if it wins again.
- **Stopping.** When ``stop`` is set (the first SIGTERM or SIGINT, :mod:`kubeclient.signals`) or
  :meth:`ElectedRunner.run`'s task is cancelled, the term is cancelled and awaited *first*, and
  the Lease released after (holder emptied, bounded by the renew deadline), so a successor takes
  over at its next retry and never overlaps us. A process killed outright leaves the Lease to
  expire.
- **A failing term.** A term is eternal: one that raises or returns has failed. The rule is the
  same for every binary: the failure is logged with its traceback, the term's leftovers are
  stopped, the Lease is released and :meth:`ElectedRunner.run` returns :data:`EXIT_TERM_FAILED`
  for the process to exit with, so that its supervisor (the Deployment) restarts it. A replica
  never holds the Lease without doing the work. controller-runtime's manager does the same when a
  runnable fails (``Start`` returns the error and the binary exits 1).

API, as koord-manager, koord-scheduler and a koord-descheduler use it::

    runner = ElectedRunner(client, election, lambda: Work(client).run(), name="descheduler")
    with StopSignals() as signals:                 # kubeclient.signals
        return await runner.run(signals.stop)      # 0 after a stop, 1 after a failed term

``runner.leading``, ``runner.terms`` and ``runner.task`` say where it stands (tests, logs).
Docs: docs/architecture.md ("One elected lifecycle").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from kubeclient.client import KubeClient
from kubeclient.leaderelection import LeaderElectionConfig, LeaderElector

logger = logging.getLogger(__name__)

Term = Callable[[], Coroutine[Any, Any, Any]]
"""Starts one term's work: eternal, it runs until cancelled."""

EXIT_STOPPED = 0
""":meth:`ElectedRunner.run` after a requested stop."""
EXIT_TERM_FAILED = 1
""":meth:`ElectedRunner.run` after a term raised or returned."""


class ElectedRunner:
    """Runs ``term()`` only while holding the Lease of ``election`` (at once without one)."""

    def __init__(
        self,
        client: KubeClient,
        election: LeaderElectionConfig | None,
        term: Term,
        *,
        name: str = "term",
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        """Names the term's tasks (``<name>-term-<n>``) and the log lines."""
        self.elector: LeaderElector | None = None
        """The Lease's candidate; None without leader election."""
        if election is not None:
            self.elector = LeaderElector(
                client,
                election,
                on_change=self._on_change,
                wall_clock=wall_clock,
                monotonic=monotonic,
            )
        self._term = term
        self.terms = 0
        """Terms started so far."""
        self.task: asyncio.Task[Any] | None = None
        """The running term."""
        self._stopping: set[asyncio.Task[Any]] = set()
        self._failed: asyncio.Future[None] | None = None

    @property
    def leading(self) -> bool:
        """Whether this candidate holds the Lease (without election: whether its term runs)."""
        if self.elector is None:
            return self.task is not None
        return self.elector.is_leader

    # -- the term ---------------------------------------------------------------------------

    def _on_change(self, leading: bool) -> None:
        if leading:
            if self._failed is None or not self._failed.done():  # after a failure: stopping
                self._start()
        else:
            assert self.elector is not None
            cfg = self.elector.config
            logger.warning(
                "%s lost lease %s/%s: %s stopped", cfg.identity, cfg.namespace, cfg.name, self.name
            )
            self._cancel()

    def _start(self) -> None:
        self._cancel()  # a term still set here (none should be) would never run beside another
        self.terms += 1
        previous = {t for t in self._stopping if not t.done()}
        task = asyncio.get_running_loop().create_task(
            self._fresh_term(previous), name=f"{self.name}-term-{self.terms}"
        )
        task.add_done_callback(self._ended)
        self.task = task

    async def _fresh_term(self, previous: set[asyncio.Task[Any]]) -> Any:
        """The term, once every term cancelled before it has ended: never two at once."""
        if previous:
            logger.info("%s: waiting for the previous term to stop", self.name)
            await asyncio.wait(previous)
        logger.info("%s: term %d started", self.name, self.terms)
        return await self._term()

    def _cancel(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            task.cancel()  # synchronously: none of the term's steps runs after this line
            self._stopping.add(task)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        if task is not self.task:
            return  # cancelled by us; it is awaited before the next term or on the way out
        self.task = None
        if task.cancelled():
            logger.error("%s was cancelled by someone else", task.get_name())
        elif (err := task.exception()) is not None:
            logger.error("%s failed", task.get_name(), exc_info=err)
        else:
            logger.error("%s returned: an eternal term must not", task.get_name())
        if self._failed is not None and not self._failed.done():
            self._failed.set_result(None)

    async def stop_term(self) -> None:
        """Cancel the running term and wait until every term has stopped."""
        self._cancel()
        stopping, self._stopping = self._stopping, set()
        if stopping:
            await asyncio.wait(stopping)

    # -- the run ----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> int:
        """Compete (or, without election, run the term) until ``stop`` is set or a term fails;
        :data:`EXIT_STOPPED` or :data:`EXIT_TERM_FAILED`. The term is always stopped before the
        Lease is released, also when this task is cancelled."""
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._failed = failed
        stopped: asyncio.Task[Any] = asyncio.create_task(
            (stop or asyncio.Event()).wait(), name=f"{self.name}-stop"
        )
        try:
            if self.elector is None:
                self._start()
                await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
            else:
                await self._compete(self.elector, stopped, failed)
            return EXIT_TERM_FAILED if failed.done() else EXIT_STOPPED
        finally:
            stopped.cancel()
            await self.stop_term()  # stop working before the Lease goes: no overlap
            if self.elector is not None:
                await asyncio.shield(self._release(self.elector))

    async def _compete(
        self, elector: LeaderElector, stopped: asyncio.Task[Any], failed: asyncio.Future[None]
    ) -> None:
        cfg = elector.config
        logger.info(
            "%s: candidate %s for lease %s/%s", self.name, cfg.identity, cfg.namespace, cfg.name
        )
        step: asyncio.Task[None] | None = None
        try:
            while not failed.done():
                self._stopping = {t for t in self._stopping if not t.done()}
                step = asyncio.create_task(elector.step(), name=f"{self.name}-lease")
                await asyncio.wait({step, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    return  # stopping: the attempt in flight is abandoned (below)
                step.result()  # a bug in the step ends the run
                await asyncio.wait(
                    {stopped, failed}, timeout=elector.pause(), return_when=asyncio.FIRST_COMPLETED
                )
                if stopped.done():
                    return
        finally:
            if step is not None and not step.done():
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)

    async def _release(self, elector: LeaderElector) -> None:
        try:
            async with asyncio.timeout(elector.config.renew_deadline):
                await elector.release()
        except TimeoutError:
            logger.warning("lease %s: release got no answer; it expires", elector.config.name)
