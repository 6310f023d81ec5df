"""The daemon's collectors stage and its collect tick: the open-file limit raised, the collector
runner built over the collector table, the base loop that refreshes the inventory and runs the
due collectors in one worker thread, the series of removed workloads dropped, and the switch to a
re-detected cgroup layout (``--cgroup-driver=auto``) once a kubepods root appears.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from koordlet.collectors.framework import CollectorContext
from koordlet.collectors.runner import CollectorRunner, TickReport
from koordlet.collectors.table import build_collectors
from koordlet.daemon.cluster import start_reporters
from koordlet.daemon.host import raise_nofile_limit
from koordlet.errors import HostError
from koordlet.metriccache.series import container_entity, host_app_entity, pod_entity
from koordlet.statesinformer.inventory import InventoryChange
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.damon import clean_stale_kdamond
from koordlet.system.host import Host
from koordlet.system.libc import name_os_thread

if TYPE_CHECKING:
    from koordlet.daemon import Daemon

logger = logging.getLogger(__name__)


async def start_collectors(daemon: Daemon) -> None:
    """Stage 4: the collector runner and the collect loop (then, in cluster mode, the reporters)."""
    # Kernel files stay open between ticks (koordlet.system.openfiles), and the CPI
    # collector holds two descriptors per container and CPU: lift the soft limit first.
    await asyncio.to_thread(raise_nofile_limit, daemon.cfg.paths)
    await asyncio.to_thread(clean_stale_damon, daemon)
    daemon.runner = build_runner(daemon, daemon.need(daemon.host))
    # One thread of its own, not the loop's shared pool: the same thread (its stack, its CPU's
    # caches) runs every tick, and no other work waits behind a tick.
    daemon.collect_thread = ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="collect", initializer=name_os_thread
    )
    # Registered before the supervisor, so it runs after the collect loop has stopped.
    daemon.on_stop("collectors", lambda t: asyncio.to_thread(close_runner, daemon))
    supervisor = daemon.supervisor_for("collectors")
    interval = daemon.cfg.collect.res_used_interval
    supervisor.spawn_loop(
        "collect", functools.partial(collect_step, daemon), interval, component="daemon"
    )
    daemon.health.watch("daemon", "collect", interval, lambda: daemon.collect_done)
    logger.info(
        "collecting every %gs with %d collectors (%s)",
        daemon.cfg.collect.res_used_interval,
        len(daemon.runner.names),
        ", ".join(daemon.runner.names) or "none",
    )
    if daemon.kube_states is not None:
        await start_reporters(daemon, supervisor, daemon.kube_states)


def clean_stale_damon(daemon: Daemon) -> None:
    """Remove the kdamond a killed koordlet left (``koordlet.system.damon``), gate on or off."""
    paths = daemon.cfg.paths
    try:
        clean_stale_kdamond(paths.sys_root, paths.proc_root, daemon.cfg.state_dir)
    except HostError as err:  # busy (another koordlet's) or the kernel refused: say so, go on
        logger.warning("damon: the kdamond a previous koordlet left is not removed: %s", err)


async def collect_step(daemon: Daemon) -> None:
    """One base tick: refresh and collect in one worker thread, then store on the loop."""
    inventory = daemon.need(daemon.inventory)
    before = inventory.snapshot()
    loop = asyncio.get_running_loop()
    change, runner, report = await loop.run_in_executor(daemon.collect_thread, tick, daemon)
    forget_removed(daemon, before, change)
    runner.apply(report)
    daemon.collect_ticks += 1
    daemon.collect_done = time.time()


def tick(daemon: Daemon) -> tuple[InventoryChange, CollectorRunner, TickReport]:
    """In the worker thread: layout re-detection, inventory refresh, the due collectors.

    The tick is stamped here, after the thread hop and the inventory walk and just before
    the collectors read, so counter deltas divide by the time that really passed between
    two reads (stamping on the event loop let node CPU exceed the CPU count under load).
    """
    adopt_redetected_host(daemon)
    change = daemon.need(daemon.inventory).refresh()
    runner = daemon.need(daemon.runner)
    return change, runner, runner.run_tick(time.time())


def adopt_redetected_host(daemon: Daemon) -> None:
    """Switch every host user to the new layout once the kubepods root appeared."""
    watch, host = daemon.driver_watch, daemon.need(daemon.host)
    new = watch.check(host) if watch is not None else None
    if new is None or new.layout == host.layout:
        return
    daemon.host = new
    daemon.need(daemon.kubepods).host = new
    if daemon.nodeslo is not None:
        daemon.nodeslo.host = new
    daemon.need(daemon.writer).host = new
    if daemon.runner is not None:
        daemon.runner.close()
        daemon.runner = build_runner(daemon, new)


def forget_removed(daemon: Daemon, before: WorkloadSnapshot, change: InventoryChange) -> None:
    """Drop the series (and the writer's cached values) of pods and apps that are gone."""
    cache, writer = daemon.need(daemon.cache), daemon.need(daemon.writer)
    dropped = 0
    gone_dirs = []
    for uid in change.removed:
        dropped += cache.drop_entity(pod_entity(uid))
        dropped += cache.drop_prefix(container_entity(uid, ""))
        pod = before.pods.get(uid)
        if pod is not None:
            writer.forget(pod.cgroup_dir)
            gone_dirs.append(pod.cgroup_dir)
    journal = daemon.originals
    if gone_dirs and journal is not None:  # its file I/O on the writer thread
        writer.call(functools.partial(journal.forget_cgroups, gone_dirs))
    if change.host_apps_changed:
        declared = {a.name for a in change.snapshot.host_apps}
        for app in before.host_apps:
            if app.name not in declared:
                dropped += cache.drop_entity(host_app_entity(app.name))
    if dropped:
        logger.debug("dropped %d series of removed workloads", dropped)


def build_runner(daemon: Daemon, host: Host) -> CollectorRunner:
    """The collector runner over the daemon's collector table, for ``host``'s layout."""
    ctx = CollectorContext(host=host, config=daemon.cfg, capabilities=daemon.capabilities)
    return CollectorRunner(
        build_collectors(ctx, daemon.collector_table),
        daemon.need(daemon.cache),
        daemon.snapshot,
        base_interval=daemon.cfg.collect.res_used_interval,
        recorder=daemon.metrics,
        host=host,
    )


def close_runner(daemon: Daemon) -> None:
    """Close the runner's open kernel files and the walker's inotify instance, once the collect
    loop has stopped."""
    if daemon.runner is not None:
        daemon.runner.close()
    if daemon.kubepods is not None:
        daemon.kubepods.close()
    if daemon.collect_thread is not None:
        daemon.collect_thread.shutdown(wait=True)
