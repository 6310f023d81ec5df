"""The daemon: the only package that knows every component; staged start, reverse-order stop.

Start, one stage after the other, each logged with its duration (``docs/architecture.md``)::

    1 executor     detect the cgroup layout (version, driver, kubepods root); start the audit
                   log and the CgroupWriter thread, which resolves every write through that
                   layout, reads every file before its first write (no cache survives a
                   restart), records every change (and dry-run decision) in the audit log and
                   times every write
    2 metriccache  the embedded metric cache
    3 states       probe the host's capabilities; the inventory (kubepods walker, plus the
                   NodeSLO-file host-application source in standalone mode); first refresh
    4 collectors   the collect loop: every base interval, ONE worker thread refreshes the
                   inventory and runs the due collectors; the loop then drops the series of
                   removed pods and stores the tick's samples
    5 qos          the pressure event source (PSI triggers, memcg thresholds), the evictor,
                   then the QoS manager, one supervised loop per strategy of the table, with
                   the dry-run settings (an unknown name in --qos-dry-run-strategies is a
                   configuration error)
    6 runtimehooks the runtime hooks' dispatcher (the hook plugin table under the feature gates),
                   the hook server koord-runtime-proxy calls and the NRI plugin's loop
                   (docs/runtimehooks.md)
    7 server       /metrics, /healthz, /readyz and /debug (with /debug/audit and /debug/qos);
                   then ready

SIGTERM or SIGINT stops the stages that started, in reverse order, within :data:`STOP_TIMEOUT`
seconds, and :func:`run` returns 0; a second one exits at once (:mod:`kubeclient.signals`). A
stage that fails to start is logged, what started is stopped, and :func:`run` returns 2 for a
configuration error (a bad NodeSLO file), else 1.
SIGHUP re-reads the NodeSLO file; it is also re-read whenever its modification time changes, and
a bad version keeps the last good one (logged with file and field, counted in
``koordlet_nodeslo_reload_errors_total``).

With ``--cgroup-driver=auto`` and no kubepods root at start, the driver is re-detected at each
inventory refresh until one appears; then the sources, the writer and the collectors adopt the
new layout (logged once), so a kubelet started after the koordlet is found.

Here: :class:`Daemon` (its state, the stage order, stop) and :func:`run`. Beside it, each wiring
one part into the daemon: ``writers`` (the executor stage and the evictor), ``collecting`` (the
collectors stage and the collect tick), ``cluster`` (cluster mode: the API server, the kubelet,
the reporters), ``hookviews`` (the runtime hooks' views of the node), ``serving`` (the server
stage and the ``/debug`` views) and ``host`` (the open-file limit, the garbage collector, the
cgroup driver's re-detection).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar, cast

from apis.slo_inforce import NodeSLOInForce
from koordlet import __version__
from koordlet.collectors.framework import CollectorSpec, OnDemand
from koordlet.collectors.nodeinfo import INFO_KEY as NODE_INFO_KEY
from koordlet.collectors.runner import CollectorRunner
from koordlet.collectors.table import COLLECTORS
from koordlet.config import KoordletConfig
from koordlet.daemon.cluster import (
    ACCELERATORS_GATE,
    kubeconfig_error,
    start_eviction_condition,
    start_kube_states,
    start_kubelet_pods,
)
from koordlet.daemon.collecting import adopt_redetected_host, start_collectors
from koordlet.daemon.hookviews import HookViews
from koordlet.daemon.host import (
    CAPABILITY_RECHECK,
    GC_GEN0_THRESHOLD,
    NOFILE_TARGET,
    CapabilityWatch,
    DriverWatch,
    raise_nofile_limit,
    recheck_capabilities,
    settle_gc,
)
from koordlet.daemon.serving import SERVER_SHUTDOWN_TIMEOUT, start_serving
from koordlet.daemon.writers import build_evictor, start_executor
from koordlet.errors import ConfigError
from koordlet.events.source import PressureEventSource
from koordlet.executor.audit import AuditLog
from koordlet.executor.originals import OriginalsJournal
from koordlet.executor.statefiles import StateFiles
from koordlet.executor.writer import CgroupWriter
from koordlet.metriccache.store import MetricCache
from koordlet.prom import Collector, CollectorRegistry, Counter
from koordlet.qos.evictor import Evictor
from koordlet.qos.framework import QoSBook, StrategyContext, StrategySpec
from koordlet.qos.manager import QoSManager
from koordlet.qos.podwarnings import KubeEventSink, PodAnnotationWarnings, PodWarningSink
from koordlet.qos.table import STRATEGIES
from koordlet.sdnotify import Notifier, Watchdog
from koordlet.selfmetrics import NodeSLOSections, Readiness, SelfMetrics
from koordlet.server.app import ServerHandle
from koordlet.server.health import LoopHealth
from koordlet.statesinformer.hostapps import NodeSLOFileSource
from koordlet.statesinformer.inventory import InventoryChange, WorkloadInventory
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.statesinformer.sources import HostAppSource, PodSource
from koordlet.supervisor import Supervisor
from koordlet.system.host import Host
from koordlet.system.probe import Capabilities, probe_capabilities
from koordlet.system.psi import has_cap_sys_resource
from kubeclient.signals import StopSignals

if TYPE_CHECKING:  # cluster mode only: imported when used
    from koordlet.reporter.evictioncondition import EvictionCondition
    from koordlet.reporter.nodemetric import NodeMetricReporter
    from koordlet.reporter.topology import KubeletTopology
    from koordlet.runtimehooks.stage import RuntimeHooks
    from koordlet.statesinformer.kube import KubeStatesSource
    from koordlet.statesinformer.kubelet import KubeletPodsSource
    from kubeclient.client import KubeClient

__all__ = [
    "ACCELERATORS_GATE",
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_OK",
    "GC_GEN0_THRESHOLD",
    "NOFILE_TARGET",
    "SERVER_SHUTDOWN_TIMEOUT",
    "STAGES",
    "STOP_TIMEOUT",
    "Daemon",
    "kubeconfig_error",
    "raise_nofile_limit",
    "run",
    "settle_gc",
]

logger = logging.getLogger(__name__)

STAGES = ("executor", "metriccache", "states", "collectors", "qos", "runtimehooks", "server")
"""Start-up stages, in start order; they stop in the reverse order. Also the readiness stages."""
STOP_TIMEOUT = 5.0
"""Seconds within which every started stage must have stopped."""
EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2

_Stop = Callable[[float], Awaitable[object]]
_DEFAULT_NODE_SLO = NodeSLOInForce()
_T = TypeVar("_T")


class Daemon:
    """The koordlet's components and their lifecycle; :func:`run` drives it."""

    def __init__(
        self,
        cfg: KoordletConfig,
        *,
        collectors: Sequence[CollectorSpec] = COLLECTORS,
        strategies: Sequence[StrategySpec] = STRATEGIES,
        settle_gc_when_ready: bool = False,
    ) -> None:
        self.cfg = cfg
        self.settle_gc_when_ready = settle_gc_when_ready
        """Whether :func:`settle_gc` runs once ready: the process is the daemon's alone
        (``koordlet``'s entry point says so; in-process tests do not)."""
        self.collector_table = collectors
        """The collector plugin table the runner is built from (tests pass their own)."""
        self._strategy_table = strategies
        self.registry = CollectorRegistry()
        self.metrics = SelfMetrics(self.registry, node_name=cfg.node_name, version=__version__)
        self.readiness = Readiness(STAGES, metrics=self.metrics)
        self.nodeslo_errors = Counter(
            "koordlet_nodeslo_reload_errors",
            "Reloads of the local NodeSLO file that failed; the last good version stays.",
            registry=self.registry,
        )
        self.registry.register(NodeSLOSections(self.node_slo))
        self.health = LoopHealth()
        """Whether the collect loop and the QoS strategies keep up (``/readyz``, gauges)."""
        self.registry.register(self.health)
        self.collect_ticks = 0
        """Collect steps completed: the generation of the ``/metrics`` bodies."""
        self.collect_done: float | None = None
        """Wall-clock time the last collect step completed."""
        self.notifier = Notifier()
        """systemd's notify socket (``Type=notify``); does nothing without ``$NOTIFY_SOCKET``."""
        self._stops: list[tuple[str, _Stop]] = []
        self._supervisors: list[Supervisor] = []
        self.host: Host | None = None
        self.writer: CgroupWriter | None = None
        self.audit: AuditLog | None = None
        self.originals: OriginalsJournal | None = None
        self.state_files: StateFiles | None = None
        """The journal and the audit log as one health view (``/readyz``, metrics, status)."""
        self.evictor: Evictor | None = None
        self.cache: MetricCache | None = None
        self.capabilities: Capabilities | None = None
        self.inventory: WorkloadInventory | None = None
        self.kubepods: KubepodsSource | None = None
        self.nodeslo: NodeSLOFileSource | None = None
        self.runner: CollectorRunner | None = None
        self.collect_thread: ThreadPoolExecutor | None = None
        """The one thread every collect tick runs in (its caches stay warm between ticks)."""
        self.kube: KubeClient | None = None
        self.kube_states: KubeStatesSource | None = None
        self.kubelet_pods: KubeletPodsSource | None = None
        self.reporter: NodeMetricReporter | None = None
        self.eviction_condition: EvictionCondition | None = None
        self.events: PressureEventSource | None = None
        self.qos: QoSManager | None = None
        self.server: ServerHandle | None = None
        self.runtime_hooks: RuntimeHooks | None = None
        self.kubelet_topology: KubeletTopology | None = None
        """Cluster mode with ``NodeTopologyReport``: the kubelet's reserved CPUs and CPU manager
        policy, for the share pools of the NRT and of the cpuset hook alike."""
        self.hook_views = HookViews(
            self.snapshot,
            node_info=lambda: (
                self.cache.get_info(NODE_INFO_KEY) if self.cache is not None else None
            ),
            kubelet_topology=lambda: self.kubelet_topology,
            node=self._kube_node,
        )
        """The runtime hooks' views of the node (cpuset share pools, pods' network classes)."""
        self.capability_watch: CapabilityWatch | None = None
        """Re-probes the capabilities while running (``koordlet_capability_lost``)."""
        self.driver_watch: DriverWatch | None = None
        """With ``--cgroup-driver=auto``: re-detects the driver until a kubepods root appears."""

    # Start -------------------------------------------------------------------------------------

    async def start(self) -> int:
        """Start every stage in order; on a failure stop what started. Returns an exit code."""
        began = time.perf_counter()
        self.metrics.mark_started()
        steps: tuple[Callable[[], Awaitable[None]], ...] = (
            functools.partial(start_executor, self),
            self._start_metriccache,
            self._start_states,
            functools.partial(start_collectors, self),
            self._start_qos,
            self._start_runtimehooks,
            functools.partial(start_serving, self),
        )
        for number, (name, step) in enumerate(zip(STAGES, steps, strict=True), 1):
            t0 = time.perf_counter()
            try:
                await step()
            except ConfigError as err:
                # One line naming the flag or file; the CLI prints it, the traceback at debug.
                logger.debug("stage %s failed to start: %s", name, err, exc_info=True)
                logger.info("stage %s failed to start; stopping what started", name)
                await self.stop()
                raise
            except Exception:
                logger.exception("stage %s failed to start; stopping what started", name)
                await self.stop()
                return EXIT_FAILED
            logger.info(
                "stage %d/%d %s started in %.3fs",
                number,
                len(STAGES),
                name,
                time.perf_counter() - t0,
            )
            self.readiness.mark_done(name)
            self.notifier.status(f"stage {number}/{len(STAGES)} {name} started")
        addresses = self.need(self.server).addresses
        took = time.perf_counter() - began
        logger.info("koordlet ready in %.3fs: serving on %s", took, addresses)
        self.notifier.ready(f"ready; serving on {addresses}")
        if self.settle_gc_when_ready:
            settle_gc()
        watchdog = Watchdog.from_environ(self.notifier, healthy=self._tasks_healthy)
        if watchdog is not None:  # registered last: it stops first
            self.supervisor_for("server").spawn_loop(
                "sd-watchdog", watchdog.step, watchdog.interval, component="sdnotify"
            )
        return EXIT_OK

    def _kube_node(self) -> Mapping[str, Any] | None:
        """This node's Node object in cluster mode (None before the first sync, or standalone)."""
        return self.kube_states.node() if self.kube_states is not None else None

    def _tasks_healthy(self) -> bool:
        """No supervised task has crashed; else the watchdog withholds its ping."""
        return not any(t.state == "crashed" for s in self._supervisors for t in s.states())

    async def _start_metriccache(self) -> None:
        self.cache = MetricCache()

    async def _start_states(self) -> None:
        host, writer = self.need(self.host), self.need(self.writer)
        caps = await asyncio.to_thread(probe_capabilities, host)
        self.capabilities = caps
        self.metrics.record_capabilities({name: c.supported for name, c in caps.items()})
        watch = CapabilityWatch(
            lambda: self.need(self.host),
            caps,
            watches_lost=lambda: self.events.lost if self.events is not None else {},
            publish=self.metrics.record_capabilities,
        )
        self.capability_watch = watch
        self.registry.register(watch)
        self.supervisor_for("states").spawn_loop(
            "capabilities", functools.partial(recheck_capabilities, watch), CAPABILITY_RECHECK,
            component="daemon",
        )  # fmt: skip
        writer.capabilities = caps
        self.kubepods = KubepodsSource(host)
        if self.cfg.nodeslo_file is not None:
            self.nodeslo = NodeSLOFileSource(
                self.cfg.nodeslo_file, host, on_error=lambda _err: self.nodeslo_errors.inc()
            )
        pod_sources: list[PodSource] = [self.kubepods]
        app_sources: list[HostAppSource] = [self.nodeslo] if self.nodeslo is not None else []
        if not self.cfg.standalone:
            states = await start_kube_states(self)
            app_sources = [states]
            # The first source wins on a UID; the walker last keeps protecting pods that no
            # other source has listed yet (the API server down at start, a pod created meanwhile).
            mode = self.cfg.kube.pods_source
            if mode == "apiserver":
                pod_sources = [states, self.kubepods]
            else:
                kubelet_pods = await start_kubelet_pods(self, states)
                pod_sources = (
                    [kubelet_pods, self.kubepods]
                    if mode == "kubelet"
                    else [states, kubelet_pods, self.kubepods]
                )
        self.inventory = WorkloadInventory(pod_sources, app_sources)
        if self.cfg.cgroup.driver == "auto":
            self.driver_watch = await asyncio.to_thread(
                DriverWatch, host, self.cfg.cgroup.kube_path
            )
        change = await asyncio.to_thread(self._first_refresh)
        logger.info(
            "inventory: %d pods, %d host applications",
            len(change.snapshot.pods),
            len(change.snapshot.host_apps),
        )

    def _first_refresh(self) -> InventoryChange:
        """In a worker thread: the NodeSLO file's strict first load, then the first refresh."""
        if self.nodeslo is not None:
            self.nodeslo.load()
        adopt_redetected_host(self)
        return self.need(self.inventory).refresh()

    async def _start_qos(self) -> None:
        names = {spec.name for spec in self._strategy_table}
        unknown = sorted(self.cfg.qos.dry_run_strategies - names)
        if unknown:
            raise ConfigError(
                f"unknown strategies {unknown}; the strategy table has {sorted(names) or 'none'}",
                source="--qos-dry-run-strategies",
            )
        host = self.need(self.host)
        events = PressureEventSource(
            privileged=await asyncio.to_thread(has_cap_sys_resource, host.paths)
        )
        self.events = events
        self.on_stop("qos", lambda t: _close_events(events))
        supervisor = Supervisor(self.metrics)
        self._supervisors.append(supervisor)
        audit = self.need(self.audit)
        self.evictor = build_evictor(self, audit)
        ctx = StrategyContext(
            host=lambda: self.need(self.host),
            config=self.cfg,
            cache=self.need(self.cache),
            executor=self.need(self.writer),
            workloads=self.snapshot,
            node_slo=self.node_slo,
            capabilities=self.capabilities,
            evictor=self.evictor,
            read_now=self.read_now,
            node=self._kube_node,
            events=events,
            audit=audit,
            dry_run_all=self.cfg.qos.dry_run,
            dry_run_strategies=self.cfg.qos.dry_run_strategies,
            book=QoSBook(on_stale=self.metrics.stale_inputs),
            pod_warnings=self._pod_warnings(),
        )
        qos = QoSManager(ctx, self._strategy_table, supervisor)
        self.on_stop("qos", qos.stop)
        self.qos = qos
        qos.start()
        running = qos.running()
        self.health.watch_rounds(
            "qos", ctx.book, {name: s.interval for name, s in running.items()}, prefix="qos/"
        )
        if self.kube is not None and self.kube_states is not None:
            start_eviction_condition(self, supervisor, self.evictor, self.kube_states)
        for name, strategy in qos.exporting().items():  # its own koordlet_* families
            self.registry.register(cast(Collector, strategy))
            logger.debug("strategy %s exports its metrics", name)

    def _pod_warnings(self) -> PodAnnotationWarnings:
        """Malformed pod annotations: Warning Events on the pod in cluster mode, log lines
        standalone; registered for ``koordlet_pod_annotation_rejected_total``."""
        sink: PodWarningSink | None = None
        if self.kube is not None:
            kube_sink = KubeEventSink(self.kube, self.cfg.node_name)
            self.on_stop("qos", lambda _t: kube_sink.close())
            sink = kube_sink
        warnings = PodAnnotationWarnings(sink)
        self.registry.register(warnings)
        return warnings

    async def _start_runtimehooks(self) -> None:
        from koordlet.runtimehooks.stage import start_runtime_hooks
        from koordlet.runtimehooks.table import HookContext

        hooks = await start_runtime_hooks(
            self.cfg,
            HookContext(
                node_slo=self.node_slo,
                host=lambda: self.host,
                capabilities=lambda: self.capabilities,
                cpuset_rule=self.hook_views.cpuset_rule,
                pod_net_class_ids=self.hook_views.pod_net_class_ids,
                terway_qos_dir=self.cfg.runtime_hooks.terway_qos_dir,
            ),
            registry=self.registry,
            writer=self.need(self.writer),
            audit=self.need(self.audit),
            supervisor=self.supervisor_for("runtimehooks"),
            kube=self.kube,
            enabled=self.cfg.feature_gates.enabled,
            workloads=self.snapshot,
            originals=self.originals.entries() if self.originals is not None else (),
        )
        self.runtime_hooks = hooks
        self.on_stop("runtimehooks", hooks.stop)

    async def read_now(self, what: OnDemand[_T]) -> _T:
        """An on-demand read through the current collector runner (it is rebuilt when the
        cgroup layout is re-detected): what an event handler awaits for data fresher than the
        last tick; see ``CollectorRunner.read_now``."""
        return await self.need(self.runner).read_now(what)

    # What the stages (here and in the wiring modules beside) use -------------------------------

    def snapshot(self) -> WorkloadSnapshot:
        """The inventory's current workloads."""
        return self.need(self.inventory).snapshot()

    def node_slo(self) -> NodeSLOInForce:
        """The NodeSLO in force: the API server's in cluster mode, the local file's in standalone
        mode with one, else Koordinator's defaults."""
        if self.kube_states is not None:
            return self.kube_states.node_slo
        return self.nodeslo.in_force if self.nodeslo is not None else _DEFAULT_NODE_SLO

    def supervisor_for(self, stage: str) -> Supervisor:
        """A new supervisor whose tasks stop with ``stage``."""
        supervisor = Supervisor(self.metrics)
        self._supervisors.append(supervisor)
        self.on_stop(stage, supervisor.stop)
        return supervisor

    def on_stop(self, stage: str, stop: _Stop) -> None:
        """Run ``stop`` when ``stage`` stops (a stage's steps stop last registered first)."""
        self._stops.append((stage, stop))

    @staticmethod
    def need(value: _T | None) -> _T:
        """``value``, which a started stage has set; RuntimeError when it is still None."""
        if value is None:
            raise RuntimeError("a component was used before its stage started")
        return value

    def reload_node_slo(self) -> None:
        """SIGHUP: re-read the NodeSLO file at the next refresh, changed or not."""
        if self.nodeslo is None:
            logger.info("SIGHUP: no NodeSLO file configured; nothing to reload")
            return
        logger.info("SIGHUP: re-reading %s at the next refresh", self.nodeslo.path)
        self.nodeslo.request_reload()

    # Stop --------------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop the started stages in reverse order, all within :data:`STOP_TIMEOUT` seconds.

        Idempotent. A stage that fails or overruns is logged and the others still stop.
        """
        if not self._stops:
            return
        self.notifier.stopping("stopping")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_TIMEOUT
        self.metrics.ready.set(0)
        logger.info("stopping %d stages", len(self._stops))
        while self._stops:
            stage = self._stops[-1][0]
            t0 = time.perf_counter()
            clean = True
            while self._stops and self._stops[-1][0] == stage:  # a stage's steps, last first
                _, stop = self._stops.pop()
                remaining = max(deadline - loop.time(), 0.1)
                try:
                    async with asyncio.timeout(remaining):
                        await stop(remaining)
                except TimeoutError:
                    clean = False
                    logger.error("stage %s did not stop within %.1fs", stage, remaining)  # noqa: TRY400
                except Exception:
                    clean = False
                    logger.exception("stage %s failed to stop", stage)
            if clean:
                logger.info("stage %s stopped in %.3fs", stage, time.perf_counter() - t0)
        logger.info("stopped")


async def run(
    cfg: KoordletConfig,
    *,
    collectors: Sequence[CollectorSpec] = COLLECTORS,
    strategies: Sequence[StrategySpec] = STRATEGIES,
    stop: asyncio.Event | None = None,
    own_process: bool = False,
) -> int:
    """Run the koordlet until SIGTERM or SIGINT (or ``stop`` is set); returns the exit code.

    ``collectors`` and ``strategies`` are the plugin tables (tests pass their own);
    ``own_process``: the process is the daemon's alone, so its garbage collector may be tuned.
    """
    daemon = Daemon(
        cfg, collectors=collectors, strategies=strategies, settle_gc_when_ready=own_process
    )
    stop_event = stop if stop is not None else asyncio.Event()
    # SIGTERM and SIGINT stop (a second one at once), SIGHUP re-reads the NodeSLO file.
    with StopSignals(stop_event, also={signal.SIGHUP: daemon.reload_node_slo}):
        start = asyncio.ensure_future(daemon.start())
        stopped = asyncio.ensure_future(stop_event.wait())
        try:
            await asyncio.wait((start, stopped), return_when=asyncio.FIRST_COMPLETED)
            if not start.done():
                logger.info("stop requested during start-up")
                return EXIT_OK
            code = start.result()
            if code == EXIT_OK:
                await stopped
            return code
        finally:
            # Also when run() itself is cancelled: nothing started may outlive it.
            for task in (start, stopped):
                task.cancel()
            await asyncio.wait((start, stopped))
            await daemon.stop()


async def _close_events(events: PressureEventSource) -> None:
    events.close()
