"""The QoS manager: runs each QoS strategy's ``reconcile()`` at the strategy's interval.

Koordinator's ``qosmanager`` starts one loop per enabled strategy (CPU suppress, CPU burst,
memory evict, resctrl...). Here a strategy is a plugin built from the explicit table
``koordlet.qos.table.STRATEGIES`` (name → factory taking a :class:`StrategyContext`); the manager
builds the enabled ones and runs each as a supervised fixed-rate loop named ``qos/<name>``. The
supervisor owns the interval, the error handling (a failing step is logged, counted in
``koordlet_step_errors_total{component="qos"}`` and retried at the next tick) and cancellation.

A strategy reads the metric cache and the inventory and writes only through the executor
(``CgroupWriter.submit``); it never opens a file itself. ``reconcile()`` runs on the event loop,
which owns the metric cache; it awaits the writer's futures (``asyncio.wrap_future``) when it
needs their outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from koordlet.errors import ConfigError
from koordlet.statesinformer.model import WorkloadSnapshot

if TYPE_CHECKING:
    from apis.slo import NodeSLOSpec
    from koordlet.events.source import PressureEventSource
    from koordlet.executor.writer import CgroupWriter
    from koordlet.metriccache.store import MetricCache
    from koordlet.system.host import Host
    from koordlet.system.probe import Capabilities

logger = logging.getLogger(__name__)

COMPONENT = "qos"
"""The ``component`` label of the strategies' steps in the self-metrics."""


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


@dataclass(frozen=True, slots=True)
class StrategyContext:
    """Everything a strategy factory may use."""

    host: Callable[[], Host]
    """The current paths and cgroup layout (to name cgroups; never to open files). A call, not a
    value: with ``--cgroup-driver=auto`` the layout changes once when the kubepods root appears
    after start."""
    config: Any
    """The koordlet's frozen configuration (``koordlet.config.KoordletConfig``)."""
    cache: MetricCache
    """The metric cache: windows and aggregates of every series."""
    executor: CgroupWriter
    """The single cgroup writer; every write goes through ``executor.submit``."""
    workloads: Callable[[], WorkloadSnapshot]
    """The inventory's current snapshot."""
    node_slo: Callable[[], NodeSLOSpec]
    """The NodeSLO spec in force (thresholds and per-QoS strategies); empty when none."""
    capabilities: Capabilities | None = None
    """What the start-up probe found supported; None in tests."""
    evictor: Any = None
    """The evictor (``koordlet.qos.evictor``): the only way a strategy evicts; None in tests
    that need none."""
    events: PressureEventSource | None = None
    """The pressure event source (PSI triggers, memcg thresholds) a strategy may arm and
    subscribe to, to act between ticks; None when the daemon has none (tests)."""


StrategyFactory = Callable[[StrategyContext], Strategy]


class LoopSpawner(Protocol):
    """The part of ``koordlet.supervisor.Supervisor`` the manager uses."""

    def spawn_loop(
        self, name: str, step: Callable[[], Awaitable[None]], interval: float, *, component: str
    ) -> object: ...

    async def stop(self, timeout: float | None = None) -> tuple[str, ...]:  # noqa: ASYNC109
        """Cancel the loops (the timeout bounds the wait for them, as the supervisor's does)."""
        ...


class QoSManager:
    """Builds the enabled strategies of a table and runs them on a supervisor.

    :param ctx: handed to every strategy factory.
    :param table: name → factory, in start order.
    :param supervisor: owns the strategies' loops; :meth:`stop` stops it.
    :param gates: strategy → the koordlet feature gate that must be on for it to run.
    """

    def __init__(
        self,
        ctx: StrategyContext,
        table: Mapping[str, StrategyFactory],
        supervisor: LoopSpawner,
        *,
        gates: Mapping[str, str] | None = None,
    ) -> None:
        self._ctx = ctx
        self._table = table
        self._supervisor = supervisor
        self._gates = gates or {}
        self._strategies: dict[str, Strategy] = {}
        self._disabled: dict[str, str] = {}

    @property
    def strategies(self) -> tuple[str, ...]:
        """Names of the running strategies, in table order."""
        return tuple(self._strategies)

    @property
    def disabled(self) -> dict[str, str]:
        """Strategy → why it does not run (its feature gate is off)."""
        return dict(self._disabled)

    def start(self) -> None:
        """Build the enabled strategies and start one supervised loop each."""
        feature_gates = getattr(self._ctx.config, "feature_gates", None)
        built: dict[str, Strategy] = {}
        for name, factory in self._table.items():
            gate = self._gates.get(name)
            if gate is not None and (feature_gates is None or not feature_gates.enabled(gate)):
                self._disabled[name] = f"feature gate {gate} is off"
                continue
            strategy = factory(self._ctx)
            if strategy.name != name:
                raise ConfigError(
                    f"factory of {name!r} built a strategy named {strategy.name!r}",
                    field="strategies",
                )
            if not strategy.interval > 0:
                raise ConfigError(
                    f"strategy {name!r} has a non-positive interval {strategy.interval!r}",
                    field="strategies",
                )
            built[name] = strategy
        for name, strategy in built.items():
            self._supervisor.spawn_loop(
                f"qos/{name}", strategy.reconcile, strategy.interval, component=COMPONENT
            )
            self._strategies[name] = strategy
        logger.info(
            "QoS manager running %d strategies%s%s",
            len(built),
            f" ({', '.join(built)})" if built else " (the strategy table holds none)",
            f"; disabled: {', '.join(f'{n} ({why})' for n, why in self._disabled.items())}"
            if self._disabled
            else "",
        )

    async def stop(self, timeout: float) -> tuple[str, ...]:  # noqa: ASYNC109 (see LoopSpawner)
        """Cancel every strategy loop; returns the names of loops that did not stop in time."""
        stuck = await self._supervisor.stop(timeout)
        self._strategies.clear()
        return stuck
