"""``koord-descheduler run``: descheduling rounds and the MigrationController, elected.

The process competes for the ``koordinator-system/koord-descheduler`` Lease through the shared
elected lifecycle (:class:`kubeclient.elected.ElectedRunner`; docs/architecture.md, "One elected
lifecycle"); ``leaderElection.leaderElect: false`` (or ``--leader-elect=false``) runs at once.
A term (:func:`descheduling_term`) owns fresh informers (``informed.py``) and three named loops:

- ``descheduler-rounds``: once every informer has listed, a round every ``deschedulingInterval``
  (0: one round, then only the controller works); the jobs a round decides are created through
  the API (a create that fails is forgotten and counted as ``error``). With ``--dry-run`` nothing
  is created: each would-be job is logged and counted (``result="dry-run"``) and forgotten.
- ``descheduler-arbitration``: every ``arbitrationArgs.interval`` the waiting jobs are arbitrated
  (``migration/arbitrator.py``); the passed ones are annotated and handed to the controller, the
  failed ones written ``Failed``; held ones wait, with their reason logged once per change.
- ``descheduler-migration``: jobs that passed are reconciled (``migration/controller.py``) when
  an informer event touches them or their requeue time comes; every minute old jobs are
  scavenged. With ``--dry-run`` neither loop writes anything.

HTTP on ``--metrics-addr``: ``/metrics`` (``metrics.py``), ``/healthz``, ``/readyz`` (503 until
this replica's informers have listed, or while it does not lead).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from apis.podmigrationjob import PHASE_PENDING, PHASE_RUNNING, PodMigrationJob
from descheduler.config import DeschedulerConfig
from descheduler.errors import DeschedulerError
from descheduler.informed import InformedCluster
from descheduler.metrics import Metrics
from descheduler.migration.arbitrator import Arbitrator
from descheduler.migration.controller import MigrationController
from descheduler.rounds import Descheduler
from kubeclient.client import KubeClient
from kubeclient.elected import ElectedRunner
from kubeclient.errors import KubeError
from kubeclient.leaderelection import LeaderElectionConfig, identity
from kubeclient.resources import POD_MIGRATION_JOBS
from kubeclient.signals import StopSignals
from scheduler_plugins.reporting import EventRecorder

logger = logging.getLogger(__name__)

SYNC_TIMEOUT_S = 60.0
SCAVENGE_EVERY_S = 60.0
CONTROLLER_NAME = "koord-descheduler"


class TermError(DeschedulerError):
    """A term cannot go on (its informers did not list in time)."""


class Term:
    """One leadership's work (see the module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        cfg: DeschedulerConfig,
        metrics: Metrics,
        *,
        dry_run: bool,
        sync_timeout: float = SYNC_TIMEOUT_S,
    ) -> None:
        self.client = client
        self.cfg = cfg
        self.metrics = metrics
        self.dry_run = dry_run
        self.sync_timeout = sync_timeout
        self.view = InformedCluster(client)
        self.events = EventRecorder(client, CONTROLLER_NAME)
        self.descheduler: Descheduler | None = None
        self.controller: MigrationController | None = None
        self.arbitrator: Arbitrator | None = None
        self._queue: dict[str, float] = {}
        """Job name → when to reconcile it (monotonic)."""
        self._wake = asyncio.Event()
        self._held: dict[str, str] = {}
        self._gone: list[PodMigrationJob] = []
        """Deleted jobs whose Reservation the migration loop deletes."""
        self.rounds = 0
        self.synced = False

    # -- wiring --------------------------------------------------------------------------------
    def _on_job(self, event: str, old: PodMigrationJob | None, new: PodMigrationJob | None) -> None:
        if event == "deleted":
            if old is not None:
                self._queue.pop(old.name, None)
                if self.arbitrator is not None:
                    self.arbitrator.remove(old.name)
                self._gone.append(old)
                self._wake.set()
            return
        assert new is not None
        self._admit(new)

    def _admit(self, job: PodMigrationJob) -> None:
        """New jobs wait for arbitration; passed or running ones go to the controller."""
        if job.status.phase not in ("", PHASE_PENDING, PHASE_RUNNING):
            self._queue.pop(job.name, None)
            return
        margs = self.cfg.migration_args()
        store = self.view.cluster.jobs
        if (
            self.arbitrator is not None
            and margs.arbitration_enabled
            and job.effective_phase == PHASE_PENDING
            and not store.passed(job)
        ):
            self.arbitrator.add(job)
            return
        self._queue.setdefault(job.name, 0.0)
        self._wake.set()

    def _poke(self) -> None:
        """Something the controller waits for changed: look at running jobs soon."""
        for name in self._queue:
            self._queue[name] = 0.0
        self._wake.set()

    # -- the term ------------------------------------------------------------------------------
    async def run(self) -> None:
        self.metrics.leader.set(1)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.view.run(), name="descheduler-informers")
                if not await self.view.wait_synced(self.sync_timeout):
                    raise TermError(
                        f"informers not listed within {self.sync_timeout:g}s: waiting for "
                        + ", ".join(self.view.not_ready())
                    )
                self.synced = True
                cluster = self.view.cluster
                self.descheduler = Descheduler(self.cfg, cluster)
                margs = self.descheduler.margs
                self.controller = MigrationController(
                    self.client,
                    cluster,
                    margs,
                    self.descheduler.migration_filter,
                    self.events.record,
                    on_evicted=self._evicted,
                )
                self.arbitrator = Arbitrator(cluster, self.descheduler.migration_filter)
                self.view.on_job = self._on_job
                self.view.on_change = self._poke
                for job in list(cluster.jobs.jobs.values()):
                    self._admit(job)
                group.create_task(self._rounds(), name="descheduler-rounds")
                group.create_task(self._arbitration(), name="descheduler-arbitration")
                group.create_task(self._migration(), name="descheduler-migration")
        finally:
            self.metrics.leader.set(0)

    def _evicted(self, job: PodMigrationJob, policy: str, node: str) -> None:
        self.metrics.pods_evicted.labels(
            result="success",
            strategy="MigrationController",
            namespace=job.spec.pod_ref.namespace,
            node=node,
        ).inc()

    async def _hold(self) -> None:
        """Decisions wait for every informer (a 410 relist holds them again)."""
        while self.view.not_ready():  # noqa: ASYNC110 - informer state has no event to wait on
            await asyncio.sleep(0.1)

    async def _rounds(self) -> None:
        assert self.descheduler is not None
        while True:
            await self._hold()
            await self.round_once()
            if self.cfg.interval_s <= 0:
                await asyncio.Event().wait()  # one round only; the controller goes on
            await asyncio.sleep(self.cfg.interval_s)

    async def round_once(self) -> None:
        """One round: decide, then create (or, dry-run, log) the jobs."""
        assert self.descheduler is not None
        started = time.perf_counter()
        result = self.descheduler.round(detailed=logger.isEnabledFor(logging.DEBUG))
        self.metrics.round_seconds.observe(time.perf_counter() - started)
        self.metrics.rounds.inc()
        self.rounds += 1
        store = self.view.cluster.jobs
        for note in result.report.notes:
            logger.info("round %d: %s", self.rounds, note)
        for v in result.report.verdicts:
            logger.debug("round %d: %s %s %s: %s", self.rounds, v.node, v.pod, v.outcome, v.detail)
        by_pod = {m.pod: m for m in result.report.migrations}
        for job, obj in result.created:
            ref = job.spec.pod_ref
            key = f"{ref.namespace}/{ref.name}"
            m = by_pod.get(key)
            node = m.node if m is not None else ""
            plugin = m.plugin if m is not None else ""
            if self.dry_run:
                logger.info(
                    "dry run: would migrate %s off %s (%s): %s",
                    key,
                    node,
                    plugin,
                    m.reason if m else "",
                )
                store.forget(job.name)
                self.metrics.pods_evicted.labels(
                    result="dry-run", strategy=plugin, namespace=ref.namespace, node=node
                ).inc()
                continue
            try:
                created = await self.client.create(POD_MIGRATION_JOBS, obj)
            except KubeError as err:
                store.forget(job.name)
                logger.warning("PodMigrationJob for %s not created: %s", key, err)
                self.metrics.pods_evicted.labels(
                    result="error", strategy=plugin, namespace=ref.namespace, node=node
                ).inc()
                continue
            logger.info(
                "migrating %s off %s (%s): job %s",
                key,
                node,
                plugin,
                (created.get("metadata") or {}).get("name"),
            )
            self.metrics.pods_evicted.labels(
                result="success", strategy=plugin, namespace=ref.namespace, node=node
            ).inc()
        self.metrics.set_jobs(list(store.jobs.values()))

    async def _arbitration(self) -> None:
        assert self.arbitrator is not None
        assert self.controller is not None
        interval = self.cfg.migration_args().arbitration_interval_s
        while True:
            await asyncio.sleep(interval)
            if self.dry_run or not self.arbitrator.waiting or self.view.not_ready():
                continue
            out = self.arbitrator.arbitrate()
            for job, reason in out.failed:
                self.metrics.arbitration.labels(result="failed").inc()
                try:
                    await self.controller.mark_failed(job, reason)
                except KubeError as err:
                    logger.warning("job %s: not marked failed: %s", job.name, err)
            for job in out.passed:
                self.metrics.arbitration.labels(result="passed").inc()
                try:
                    await self.controller.mark_passed(job)
                except KubeError as err:
                    logger.warning("job %s: not marked passed: %s", job.name, err)
                self._queue[job.name] = 0.0
                self._wake.set()
            for job, reason in out.held:
                self.metrics.arbitration.labels(result="held").inc()
                if self._held.get(job.name) != reason:
                    logger.info("job %s held back: %s", job.name, reason)
                self._held[job.name] = reason

    async def _migration(self) -> None:
        assert self.controller is not None
        next_scavenge = time.monotonic() + SCAVENGE_EVERY_S
        while True:
            now = time.monotonic()
            if not self.dry_run and now >= next_scavenge:
                next_scavenge = now + SCAVENGE_EVERY_S
                await self.controller.scavenge()
            gone, self._gone = self._gone, []
            for old in gone:
                if not self.dry_run:
                    await self.controller.job_deleted(old)
            due = [n for n, at in self._queue.items() if at <= now]
            for name in due:
                job = self.view.cluster.jobs.get(name)
                self._queue.pop(name, None)
                if job is None or self.dry_run:
                    continue
                try:
                    step = await self.controller.reconcile(job)
                except KubeError as err:
                    logger.warning("job %s: reconcile failed: %s; again in 3s", name, err)
                    self._queue[name] = time.monotonic() + 3.0
                    continue
                current = self.view.cluster.jobs.get(name)
                if step.requeue_after is not None and current is not None:
                    self._queue[name] = time.monotonic() + step.requeue_after
            self.metrics.set_jobs(list(self.view.cluster.jobs.jobs.values()))
            soonest = min(self._queue.values(), default=now + 1.0)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._wake.wait(), max(min(soonest - time.monotonic(), 1.0), 0.01)
                )


def _split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"not HOST:PORT: {addr!r}")
    return host or "0.0.0.0", int(port)


async def serve_http(metrics: Metrics, addr: str, ready: Any) -> web.AppRunner:
    """``/metrics``, ``/healthz`` and ``/readyz`` on ``addr``."""

    async def metrics_view(_r: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_r: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_r: web.Request) -> web.Response:
        why = ready()
        return (
            web.Response(text="ok")
            if not why
            else web.Response(text=f"not ready: {why}", status=503)
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics_view)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    host, port = _split_addr(addr)
    await web.TCPSite(runner, host, port).start()
    return runner


async def run_daemon(
    cfg: DeschedulerConfig,
    *,
    kubeconfig: str | None,
    dry_run: bool,
    leader_elect: bool | None,
    metrics_addr: str,
    sync_timeout: float = SYNC_TIMEOUT_S,
) -> int:
    """The ``run`` command: 0 after a stop, 1 after a failed term."""
    client = await KubeClient.connect(kubeconfig)
    metrics = Metrics()
    state: dict[str, Term] = {}

    def term() -> Any:
        t = Term(client, cfg, metrics, dry_run=dry_run, sync_timeout=sync_timeout)
        state["term"] = t
        return t.run()

    def ready() -> str:
        t = state.get("term")
        if t is None:
            return "not leading"
        waiting = t.view.not_ready()
        return ", ".join(waiting) if waiting else ("" if t.synced else "starting")

    le = cfg.leader_election
    elect = le.leader_elect if leader_elect is None else leader_elect
    election = (
        LeaderElectionConfig(
            namespace=le.resource_namespace,
            name=le.resource_name,
            identity=identity(),
            lease_duration=le.lease_duration_s,
            renew_deadline=le.renew_deadline_s,
            retry_period=le.retry_period_s,
        )
        if elect
        else None
    )
    runner = ElectedRunner(client, election, term, name="descheduler")
    http = await serve_http(metrics, metrics_addr, ready)
    if dry_run:
        logger.warning("dry run: no PodMigrationJob, Reservation or eviction will be made")
    try:
        with StopSignals() as signals:
            return await runner.run(signals.stop)
    finally:
        await http.cleanup()
        await client.close()
