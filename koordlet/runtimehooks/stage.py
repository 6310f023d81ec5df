"""The daemon's ``runtimehooks`` stage: the dispatcher, the hook server, the NRI plugin and the
reconciler.

Start (after ``qos``, before ``server``): build the dispatcher over :data:`table.HOOKS` with the
koordlet's gates (and, with ``CoreSched`` or ``Resctrl`` on, the container effects, probed once);
start the hook server when ``--runtime-hooks-addr`` is set and its folder
exists (a missing folder is reported as unsupported, with the reason, not created: the systemd
unit's ``RuntimeDirectory`` and the DaemonSet's mount provide it), then write ``koordlet.json``
for koord-runtime-proxy when its folder exists; with ``--enable-nri-runtime-hook`` run the NRI
plugin's loop under the daemon's supervisor (it waits for the runtime's socket in the
background); run the reconciler every ``--runtime-hooks-reconcile-interval`` under the same
supervisor (it also keeps the node files of ``TerwayQoS``). A node-file hook whose gate is off
removes, once at start, the files an earlier run of it wrote (from the originals journal).
Stop: the loops first, then the server (requests in flight get a second).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from koordlet.runtimehooks.effects import ContainerEffects, build_effects
from koordlet.runtimehooks.events import EventSink, KubeEventSink, LogEventSink
from koordlet.runtimehooks.framework import DispatcherOptions, HookDispatcher
from koordlet.runtimehooks.metrics import HookMetrics
from koordlet.runtimehooks.model import HookPoint
from koordlet.runtimehooks.nri import NriOptions, NriPlugin
from koordlet.runtimehooks.reconciler import HookReconciler, remove_disabled_files
from koordlet.runtimehooks.table import HOOKS, HookContext

if TYPE_CHECKING:
    from koordlet.config import KoordletConfig
    from koordlet.executor.audit import AuditLog
    from koordlet.executor.originals import Original
    from koordlet.executor.writer import CgroupWriter
    from koordlet.prom import CollectorRegistry
    from koordlet.runtimehooks.hookserver import HookServer
    from koordlet.statesinformer.model import WorkloadSnapshot
    from koordlet.supervisor import Supervisor
    from kubeclient.client import KubeClient

logger = logging.getLogger(__name__)


class RuntimeHooks:
    """What the stage started; :meth:`stop` undoes it."""

    def __init__(self, dispatcher: HookDispatcher) -> None:
        self.dispatcher = dispatcher
        self.server: HookServer | None = None
        self.nri: NriPlugin | None = None
        self.reconciler: HookReconciler | None = None
        self._unsupported: dict[str, str] = {}
        self._events: EventSink = LogEventSink()

    @property
    def unsupported(self) -> dict[str, str]:
        """``hookserver`` / ``nri`` / ``resctrl`` / ``coresched`` -> why it does not run here
        (``/debug/capabilities``)."""
        effects = self.dispatcher.effects
        return {**self._unsupported, **(effects.unsupported if effects is not None else {})}

    def describe(self) -> dict[str, Any]:
        """JSON-ready state for ``/debug/runtimehooks``."""
        effects = self.dispatcher.effects
        return {
            **self.dispatcher.describe(),
            "server": None if self.server is None else {"socket": self.server.path},
            "nri": None if self.nri is None else self.nri.describe(),
            "reconciler": None if self.reconciler is None else self.reconciler.describe(),
            "effects": None if effects is None else effects.describe(),
            "unsupported": self.unsupported,
        }

    async def stop(self, _timeout: float = 1.0) -> None:
        """Stop the server (the NRI loop is the supervisor's to cancel)."""
        if self.server is not None:
            await self.server.stop(grace=min(_timeout, 1.0))
        if isinstance(self._events, KubeEventSink):
            await self._events.close()


async def start_runtime_hooks(
    cfg: KoordletConfig,
    ctx: HookContext,
    *,
    registry: CollectorRegistry,
    writer: CgroupWriter,
    audit: AuditLog,
    supervisor: Supervisor,
    kube: KubeClient | None,
    enabled: Callable[[str], bool],
    workloads: Callable[[], WorkloadSnapshot],
    originals: Sequence[Original] = (),
) -> RuntimeHooks:
    """Start the stage; see the module docstring. ``originals``: the journal's entries (what
    earlier runs wrote)."""
    rh = cfg.runtime_hooks
    removed = await remove_disabled_files(HOOKS, enabled, originals, writer)
    if removed:
        logger.info("runtime hooks: removed %s (their hooks' gates are off)", ", ".join(removed))
    events: EventSink = LogEventSink() if kube is None else KubeEventSink(kube, cfg.node_name)
    effects: ContainerEffects | None = None
    if enabled("CoreSched") or enabled("Resctrl"):
        effects = await asyncio.to_thread(
            build_effects,
            ctx.host,
            writer,
            audit,
            resctrl=enabled("Resctrl"),
            core_sched=enabled("CoreSched"),
            dry_run=cfg.qos.dry_run,
        )
    dispatcher = HookDispatcher(
        HOOKS,
        ctx,
        enabled=enabled,
        metrics=HookMetrics(registry, node=cfg.node_name),
        options=DispatcherOptions(
            timeout=rh.timeout,
            dry_run=cfg.qos.dry_run,
            disabled_points=frozenset(HookPoint(s) for s in rh.disable_stages),
        ),
        writer=writer,
        audit=audit,
        events=events,
        effects=effects,
    )
    hooks = RuntimeHooks(dispatcher)
    hooks._events = events
    logger.info(
        "runtime hooks: %s", ", ".join(dispatcher.enabled_hooks) or "none enabled by the gates"
    )
    if not rh.addr:
        hooks._unsupported["hookserver"] = "disabled (--runtime-hooks-addr is empty)"
    elif not await asyncio.to_thread(os.path.isdir, os.path.dirname(rh.addr)):
        reason = (
            f"folder {os.path.dirname(rh.addr)} of --runtime-hooks-addr absent (the systemd "
            "unit's RuntimeDirectory or the DaemonSet's mount makes it)"
        )
        hooks._unsupported["hookserver"] = reason
        logger.warning("runtime hook server not started: %s", reason)
    else:
        # imported here: grpc is loaded only where the hook server runs
        from koordlet.runtimehooks.hookserver import HookServer, write_hook_server_config

        server = HookServer(dispatcher, rh.addr)
        await server.start()
        hooks.server = server
        if await asyncio.to_thread(os.path.isdir, rh.config_path):
            path = await asyncio.to_thread(
                write_hook_server_config, rh.config_path, rh.host_endpoint, dispatcher.points()
            )
            logger.info("wrote %s for koord-runtime-proxy", path)
        else:
            logger.info(
                "no %s: koord-runtime-proxy must be pointed at %s itself",
                rh.config_path,
                rh.host_endpoint,
            )
    if not rh.nri:
        hooks._unsupported["nri"] = "disabled (--enable-nri-runtime-hook=false)"
    else:
        plugin = NriPlugin(
            dispatcher,
            NriOptions(
                socket=rh.nri_socket,
                plugin_name=rh.nri_plugin_name,
                plugin_index=rh.nri_plugin_index,
                connect_timeout=rh.nri_connect_timeout,
                backoff_duration=rh.nri_backoff_duration,
                backoff_factor=rh.nri_backoff_factor,
                backoff_cap=rh.nri_backoff_cap,
            ),
        )
        hooks.nri = plugin
        supervisor.spawn("nri-plugin", plugin.run, component="runtimehooks")
    if dispatcher.by_level:
        reconciler = HookReconciler(
            dispatcher,
            workloads=workloads,
            host=ctx.host,
            executor=writer,
            capabilities=ctx.capabilities,
            interval=rh.reconcile_interval,
        )
        hooks.reconciler = reconciler

        async def reconcile_round() -> None:
            await reconciler.reconcile()

        supervisor.spawn_loop(
            "runtimehooks-reconciler",
            reconcile_round,
            rh.reconcile_interval,
            component="runtimehooks",
            step_timeout=max(rh.reconcile_interval * 3, 30.0),
        )
        logger.info(
            "runtime hooks reconciler every %gs: %s",
            rh.reconcile_interval,
            {lv.value: [n for n, _ in hs] for lv, hs in dispatcher.by_level.items()},
        )
    return hooks
