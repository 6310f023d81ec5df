"""The daemon's executor stage, what changes the host: the cgroup layout detected, the audit log,
the originals journal (what ``koordlet reset`` puts back), the single cgroup writer, and the
evictor every strategy evicts through.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING

from koordlet.executor.audit import AuditLog, audit_log_for
from koordlet.executor.originals import OriginalsJournal, read_boot_id
from koordlet.executor.statefiles import StateFiles
from koordlet.executor.writer import CgroupWriter
from koordlet.qos.evictor import CgroupKillEvictor, EvictionBackend, Evictor
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from koordlet.system.host import Host

if TYPE_CHECKING:
    from koordlet.daemon import Daemon

logger = logging.getLogger(__name__)


async def start_executor(daemon: Daemon) -> None:
    """Stage 1: detect the cgroup layout, start the audit log, load the originals journal and
    start the cgroup writer (in dry run as configured)."""
    cfg = daemon.cfg.cgroup
    daemon.host = await asyncio.to_thread(
        Host.detect_configured,
        daemon.cfg.paths,
        version=None if cfg.version == "auto" else CgroupVersion(cfg.version),
        driver=None if cfg.driver == "auto" else CgroupDriver(cfg.driver),
        kube_path=cfg.kube_path,
    )
    audit = audit_log_for(daemon.cfg)
    audit.start()
    daemon.audit = audit
    # Registered as soon as its thread runs, so that a stop during the awaits below closes it too;
    # it stops after the writer (a stage's steps stop last registered first): the writer's last
    # changes still reach the file.
    daemon.on_stop("executor", lambda t: asyncio.to_thread(audit.close, min(t, 2.0)))
    journal = OriginalsJournal(
        daemon.cfg.state_dir, boot_id=read_boot_id(daemon.cfg.paths.proc_root)
    )
    await asyncio.to_thread(journal.load)
    pruned = await asyncio.to_thread(journal.prune_missing)
    daemon.originals = journal
    logger.info(
        "originals journal %s: %d values recorded before this koordlet's first writes "
        "(koordlet reset puts them back)%s",
        journal.path,
        len(journal),
        f", {pruned} of removed cgroups dropped" if pruned else "",
    )
    state = StateFiles(journal, audit)
    daemon.state_files = state
    daemon.registry.register(state)
    # What the disk refused is written again every collect interval, also with no new record.
    daemon.supervisor_for("executor").spawn_loop(
        "statefiles",
        functools.partial(retry_state_files, state),
        daemon.cfg.collect.res_used_interval,
        component="daemon",
    )
    qos = daemon.cfg.qos
    writer = CgroupWriter(
        daemon.host,
        on_change=audit.on_write,
        observe=daemon.metrics.resource_updated,
        dry_run_all=qos.dry_run,
        dry_run_strategies=qos.dry_run_strategies,
        record_original=journal.record,
    )
    writer.start()
    daemon.writer = writer
    # cancel_pending: a batch already running finishes (it is one job), queued ones are
    # dropped, so no batch is left half-applied.
    daemon.on_stop("executor", lambda t: asyncio.to_thread(writer.stop, cancel_pending=True))
    if qos.dry_run or qos.dry_run_strategies:
        logger.warning(
            "dry run for %s: decisions are audited in %s, nothing is written or evicted",
            "every QoS strategy" if qos.dry_run else ", ".join(sorted(qos.dry_run_strategies)),
            audit.path,
        )


async def retry_state_files(state: StateFiles) -> None:
    """One round of the ``statefiles`` loop: write what the journal holds, off the loop."""
    if state.needs_retry():
        await asyncio.to_thread(state.retry)


def build_evictor(daemon: Daemon, audit: AuditLog) -> Evictor:
    """The evictor every strategy evicts through. Its backend empties the victim's cgroup
    (standalone: cgroup-discovered pods and host applications); the Kubernetes mode swaps
    in the Eviction API backend here. The global ``--dry-run`` is the evictor's own; a
    strategy in ``--qos-dry-run-strategies`` passes ``dry_run=ctx.dry_run(name)``."""
    qos = daemon.cfg.qos
    backend: EvictionBackend
    if daemon.kube is not None and qos.only_evict_by_api:  # Koordinator's --only-evict-by-api
        from koordlet.qos.evict_api import EvictionApiBackend

        backend = EvictionApiBackend(daemon.kube, node_name=daemon.cfg.node_name)
    else:
        backend = CgroupKillEvictor(lambda: daemon.need(daemon.host))
    return Evictor(
        backend,
        max_per_round=qos.evict_max_per_round,
        dedupe_window=qos.evict_dedupe_window,
        dry_run=qos.dry_run,
        audit=audit,
        registry=daemon.registry,
        node_name=daemon.cfg.node_name,
    )
