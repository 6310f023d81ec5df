"""The QoS strategy framework: what a strategy is, what it gets, and its row in the table.

Koordinator's ``qosmanager`` runs one loop per enabled strategy (CPU suppress, CPU burst, memory
evict, resctrl...). Here a strategy is a plugin with one step, ``reconcile()``, built by the
factory of its :class:`StrategySpec` row in ``koordlet.qos.table.STRATEGIES`` (a reference,
imported only when the row is enabled) from a :class:`StrategyContext` and its interval;
:class:`~koordlet.qos.manager.QoSManager` builds the enabled ones and runs each as a supervised
fixed-rate loop.

A strategy reads the metric cache, the inventory and the NodeSLO in force (``ctx.node_slo()``,
typed, parsed once per change by the states informer: a strategy never parses, thaws or caches
it), and writes only through the executor, with the knob objects of ``koordlet.system.knobs``.
It never opens a file itself; an event round that needs data fresher than the last tick awaits
``ctx.read_now(OnDemand)``. ``reconcile()`` runs on the event loop, which owns the metric cache.

The framework API a strategy uses besides the cache and the executor (docs/qos.md has the
contract):

- ``ctx.max_input_age`` and ``ctx.fresh_last(strategy, metric, entity)`` /
  ``ctx.read_last(...)``: inputs older than twice the collection interval are stale; the
  strategy then holds (suppress, burst) or skips (evict) and says so with ``ctx.stale(...)``,
  counted in ``koordlet_qos_stale_inputs_total{strategy}``;
- ``ctx.dry_run(strategy)``: True when the strategy must only compute, log and audit. The
  executor already turns its writes into audited decisions; a strategy passes
  ``dry_run=ctx.dry_run(self.name)`` to ``ctx.evictor.evict``;
- ``ctx.audit``: the audit log, ``ctx.audit.record("evict" | "decision", ...)``;
- ``ctx.report(StrategyReport(...))`` once per round: its inputs, decision and result, served
  by ``/debug/qos`` with the status of the NodeSLO sections its row names.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from apis.records import frozen
from apis.slo_inforce import NodeSLOInForce
from koordlet.config import KoordletConfig, QoSConfig
from koordlet.plugins import load
from koordlet.qos.inputs import Reading, fresh_aggregate, max_input_age, read_last
from koordlet.qos.podwarnings import PodAnnotationWarnings
from koordlet.statesinformer.model import WorkloadSnapshot

if TYPE_CHECKING:
    from koordlet.collectors.framework import OnDemand
    from koordlet.events.source import PressureEventSource
    from koordlet.executor.audit import AuditLog
    from koordlet.executor.writer import CgroupWriter
    from koordlet.metriccache.aggregate import Aggregate
    from koordlet.metriccache.store import MetricCache
    from koordlet.qos.evictor import Evictor
    from koordlet.system.host import Host
    from koordlet.system.probe import Capabilities

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class OnDemandReader(Protocol):
    """``Daemon.read_now``: an on-demand read through the collector runner."""

    def __call__(self, what: OnDemand[_T], /) -> Awaitable[_T]: ...


class Strategy(Protocol):
    """One QoS strategy plugin."""

    name: str
    """Table name; the supervised loop is ``qos/<name>``."""
    interval: float
    """Seconds between two reconciliations."""

    def reconcile(self) -> Awaitable[None]:
        """One round: read the cache and the inventory, submit writes to the executor.

        Runs on the event loop; raise on a real failure (the manager retries next tick).
        """
        ...


@frozen
class StrategyReport:
    """What one round of a strategy saw, decided and did, for ``/debug/qos``.

    A strategy builds one per round and hands it to ``ctx.report``; the framework stamps it.
    Keep the values JSON-ready (numbers, strings, lists, dicts) and small: the last report of
    each strategy is kept, not a history (the audit log is the history of changes).
    """

    inputs: Mapping[str, Any]
    """The inputs the decision used, by name (``{"node_cpu_used": 7.2, "threshold": 0.65}``);
    ``Reading.as_dict()`` is a good value for a metric."""
    decision: str
    """What the strategy decided, in a few words (``suppress BE to 6 CPUs``, ``hold: stale
    inputs``, ``evict 2 pods``, ``nothing to do``)."""
    result: str = ""
    """What happened (``2 writes, 1 unchanged``, ``dry run``, ``cgroup gone``); empty when the
    decision was to do nothing."""
    stale: bool = False
    """True when the round held or skipped because its inputs were stale."""
    detail: Mapping[str, Any] = field(default_factory=dict)
    """Anything else (per-pod targets, the victims and their order)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        out: dict[str, Any] = {
            "inputs": dict(self.inputs),
            "decision": self.decision,
            "result": self.result,
            "stale": self.stale,
        }
        if self.detail:
            out["detail"] = dict(self.detail)
        return out


@dataclass(slots=True)
class _StrategyState:
    rounds: int = 0
    errors: int = 0
    stale_rounds: int = 0
    last_started: float | None = None
    last_done: float | None = None
    last_duration: float | None = None
    last_error: str = ""
    last_report: StrategyReport | None = None
    last_report_at: float | None = None
    last_stale: str = ""


class QoSBook:
    """The framework's mutable record of the strategies' rounds (shared by the context and the
    manager): last reports, stale-input counts, round timings. Thread-safe for reads from the
    HTTP handlers; written on the event loop."""

    def __init__(
        self,
        *,
        on_stale: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.on_stale = on_stale
        """Called with the strategy's name for every stale round (the daemon counts it in
        ``koordlet_qos_stale_inputs_total``)."""
        self.clock = clock
        """Wall-clock seconds: report stamps and input ages."""
        self._states: dict[str, _StrategyState] = {}
        self._lock = threading.Lock()

    def _state(self, strategy: str) -> _StrategyState:
        state = self._states.get(strategy)
        if state is None:
            state = self._states[strategy] = _StrategyState()
        return state

    def report(self, strategy: str, report: StrategyReport) -> None:
        """Keep ``report`` as the strategy's last round."""
        with self._lock:
            state = self._state(strategy)
            state.last_report = report
            state.last_report_at = self.clock()

    def stale(self, strategy: str, why: str) -> None:
        """Count one round of ``strategy`` held or skipped on stale inputs."""
        with self._lock:
            state = self._state(strategy)
            state.stale_rounds += 1
            state.last_stale = why
        hook = self.on_stale
        if hook is not None:
            hook(strategy)

    def round_started(self, strategy: str) -> None:
        with self._lock:
            self._state(strategy).last_started = self.clock()

    def round_done(self, strategy: str, seconds: float, error: BaseException | None) -> None:
        """A round ended (``error``: it raised). A round that raised before it reported gets a
        report of its failure, so ``/debug/qos`` never shows an earlier round's decision as
        the last one."""
        with self._lock:
            state = self._state(strategy)
            state.rounds += 1
            state.last_done = self.clock()
            state.last_duration = seconds
            if error is not None:
                state.errors += 1
                state.last_error = f"{type(error).__name__}: {error}"
                started = state.last_started
                reported = state.last_report_at
                if started is not None and (reported is None or reported < started):
                    state.last_report = StrategyReport(
                        {}, "no decision: the round failed before deciding", state.last_error
                    )
                    state.last_report_at = state.last_done

    def last_round_done(self, strategy: str) -> float | None:
        """Wall-clock time the strategy's last round ended (raised or not); None before its
        first. What ``/readyz`` judges a strategy by (``koordlet.server.health``)."""
        with self._lock:
            state = self._states.get(strategy)
            return None if state is None else state.last_done

    def last_report(self, strategy: str) -> StrategyReport | None:
        """The strategy's last report, or None before its first."""
        with self._lock:
            state = self._states.get(strategy)
            return None if state is None else state.last_report

    def describe(self, strategy: str) -> dict[str, Any]:
        """JSON-ready record of one strategy's rounds."""
        with self._lock:
            state = self._states.get(strategy) or _StrategyState()
            report = state.last_report
            return {
                "rounds": state.rounds,
                "errors": state.errors,
                "last_error": state.last_error,
                "stale_rounds": state.stale_rounds,
                "last_stale": state.last_stale,
                "last_started": state.last_started,
                "last_duration_s": None
                if state.last_duration is None
                else round(state.last_duration, 6),
                "last_round": None
                if report is None
                else {"at": state.last_report_at, **report.as_dict()},
            }


@frozen
class StrategyContext:
    """Everything a strategy factory may use."""

    host: Callable[[], Host]
    """The current paths and cgroup layout (to name cgroups; never to open files). A call, not a
    value: with ``--cgroup-driver=auto`` the layout changes once when the kubepods root appears
    after start."""
    config: KoordletConfig
    """The koordlet's frozen configuration."""
    cache: MetricCache
    """The metric cache: windows and aggregates of every series."""
    executor: CgroupWriter
    """The single cgroup writer; every write goes through ``executor.submit``."""
    workloads: Callable[[], WorkloadSnapshot]
    """The inventory's current snapshot."""
    node_slo: Callable[[], NodeSLOInForce]
    """The NodeSLO in force (``apis.slo_inforce``): each section typed over Koordinator's
    defaults, its last good value when the NodeSLO's was rejected; the defaults when none."""
    capabilities: Capabilities | None = None
    """What the start-up probe found supported; None in tests."""
    evictor: Evictor | None = None
    """The evictor (``koordlet.qos.evictor``): the only way a strategy evicts; None in tests
    that need none."""
    read_now: OnDemandReader | None = None
    """An on-demand read through the collector runner (``Daemon.read_now``): what an event round
    awaits for data fresher than the last tick; None in tests that need none."""
    events: PressureEventSource | None = None
    """The pressure event source (PSI triggers, memcg thresholds) a strategy may arm and
    subscribe to, to act between ticks; None when the daemon has none (tests)."""
    node: Callable[[], Mapping[str, Any] | None] | None = None
    """The Node object (``KubeStatesSource.node()``) in cluster mode; None in standalone mode
    and tests. CPU suppress takes the node's reserved CPU from it (kubelet capacity -
    allocatable, ``node.koordinator.sh/reservation``)."""
    audit: AuditLog | None = None
    """The audit log: ``audit.record("evict" | "decision", strategy=..., reason=..., ...)``.
    Writes through the executor are audited without asking; None in tests that need none."""
    dry_run_all: bool = False
    """``--dry-run``: every strategy only computes, logs and audits."""
    dry_run_strategies: frozenset[str] = frozenset()
    """``--qos-dry-run-strategies``: these strategies only compute, log and audit."""
    book: QoSBook = field(default_factory=QoSBook)
    """Where reports and stale rounds are recorded (shared with the manager)."""
    pod_warnings: PodAnnotationWarnings = field(default_factory=PodAnnotationWarnings)
    """Where a strategy reports a pod annotation it cannot apply (once per pod and value: a
    Warning Event, ``koordlet_pod_annotation_rejected_total``, ``/debug/qos``)."""

    # The framework API for strategies --------------------------------------------------------

    def dry_run(self, strategy: str) -> bool:
        """True when ``strategy`` must change nothing: compute, log and audit only.

        The executor applies the same rule to writes submitted with ``strategy=``; a strategy
        passes it to ``evictor.evict(..., dry_run=ctx.dry_run(name))``, which then records a
        ``decision`` instead of evicting.
        """
        return self.dry_run_all or strategy in self.dry_run_strategies

    @property
    def collect_interval(self) -> float:
        """Seconds between two collections of the usage series (``--collect-res-used-interval``)."""
        return self.config.collect.res_used_interval

    @property
    def max_input_age(self) -> float:
        """Seconds after which an input is stale: twice the collection interval."""
        return max_input_age(self.collect_interval)

    def now(self) -> float:
        """Wall-clock seconds, the time base of the metric cache."""
        return self.book.clock()

    def read_last(self, metric: str, entity: str, *, max_age: float | None = None) -> Reading:
        """The newest sample of a series with its age judged (``Reading.fresh``); the default
        ``max_age`` is :attr:`max_input_age`. Counts nothing: see :meth:`stale`."""
        limit = self.max_input_age if max_age is None else max_age
        return read_last(self.cache, metric, entity, max_age=limit, now=self.now())

    def fresh_last(self, metric: str, entity: str, *, max_age: float | None = None) -> float | None:
        """The newest value of a series when fresh; None when stale or absent."""
        reading = self.read_last(metric, entity, max_age=max_age)
        return reading.value if reading.fresh else None

    def fresh_aggregate(
        self, metric: str, entity: str, window: float, *, max_age: float | None = None
    ) -> Aggregate | None:
        """The aggregate of the last ``window`` seconds when its newest sample is fresh."""
        limit = self.max_input_age if max_age is None else max_age
        return fresh_aggregate(self.cache, metric, entity, window, limit, now=self.now())

    def stale(self, strategy: str, why: str) -> None:
        """Record that this round of ``strategy`` held (or skipped) on stale inputs: counted in
        ``koordlet_qos_stale_inputs_total{strategy}``, shown in ``/debug/qos``, logged at
        debug. Call it once per round, not once per input."""
        logger.debug("%s: stale inputs (%s); holding", strategy, why)
        self.book.stale(strategy, why)

    def report(self, strategy: str, report: StrategyReport) -> None:
        """Keep ``report`` as this round's for ``/debug/qos``. Call it once per round."""
        self.book.report(strategy, report)


StrategyFactory = Callable[[StrategyContext, float], Strategy]
"""A strategy module's ``build(ctx, interval)``."""


@frozen
class StrategySpec:
    """One row of the strategy table: everything about one strategy."""

    name: str
    """Table name: the strategy's ``name``, its loop ``qos/<name>``, ``--qos-dry-run-strategies``
    and ``/debug/qos``."""
    factory: StrategyFactory | str
    """Builds the strategy: each module's ``build(ctx, interval)``, named
    ``"koordlet.qos.x:build"`` so that the module is imported only when the row is enabled
    (:mod:`koordlet.plugins`)."""
    interval: Callable[[QoSConfig], float]
    """Seconds between its rounds, from the ``qos`` configuration (Koordinator's flag)."""
    upstream: str
    """Koordinator's strategy it mirrors (``cpuSuppress``), for the docs."""
    gate: str = ""
    """The koordlet feature gate that must be on for it to run (``BECPUSuppress``); empty:
    none."""
    other_gates: tuple[str, ...] = ()
    """Further gates any one of which also lets it run (upstream's memory and CPU eviction run
    when ``BEMemoryEvict``, ``MemoryEvict`` or ``MemoryAllocatableEvict`` is on; each task then
    checks its own gate)."""
    sections: tuple[str, ...] = ()
    """The NodeSLO sections it reads (``resourceUsedThresholdWithBE``...): ``/debug/qos`` shows
    their status under the strategy, so a rejected one is seen where it matters."""
    families: tuple[str, ...] = ()
    """The ``koordlet_*`` families it exports itself; the daemon registers a strategy that has
    some as a Prometheus collector (``collect()``)."""

    def enabled(self, config: KoordletConfig) -> bool:
        """Whether its gates let it run under ``config``: no gate, or any of them on."""
        gates = (self.gate, *self.other_gates) if self.gate else self.other_gates
        return not gates or any(config.feature_gates.enabled(g) for g in gates)

    def build(self, ctx: StrategyContext, interval: float) -> Strategy:
        """The strategy, its factory imported now if the row names it by reference (an import
        error propagates: the start that builds the row fails)."""
        factory: StrategyFactory = load(self.factory)
        return factory(ctx, interval)

    @property
    def gates_text(self) -> str:
        """``feature gate X is off`` or ``feature gates X, Y are all off``."""
        gates = [g for g in (self.gate, *self.other_gates) if g]
        if len(gates) == 1:
            return f"feature gate {gates[0]} is off"
        return f"feature gates {', '.join(gates)} are all off"
