"""The QoS manager: builds the enabled strategies of the table and runs each one's ``reconcile()``
as a supervised fixed-rate loop named ``qos/<name>``.

The supervisor owns the interval, the error handling (a failing step is logged, counted in
``koordlet_step_errors_total{component="qos"}`` and retried at the next tick) and cancellation.
The framework a strategy is written against (its context, its report, its table row) is
:mod:`koordlet.qos.framework`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from koordlet.errors import ConfigError
from koordlet.qos.framework import Strategy, StrategyContext, StrategySpec

logger = logging.getLogger(__name__)

COMPONENT = "qos"
"""The ``component`` label of the strategies' steps in the self-metrics."""


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
    :param table: one :class:`~koordlet.qos.framework.StrategySpec` row per strategy, in start
        order.
    :param supervisor: owns the strategies' loops; :meth:`stop` stops it.
    """

    def __init__(
        self, ctx: StrategyContext, table: Sequence[StrategySpec], supervisor: LoopSpawner
    ) -> None:
        self._ctx = ctx
        self._table = {spec.name: spec for spec in table}
        self._supervisor = supervisor
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

    def running(self) -> dict[str, Strategy]:
        """The running strategy objects by name."""
        return dict(self._strategies)

    def exporting(self) -> dict[str, Strategy]:
        """The running strategies whose row names ``koordlet_*`` families of their own (the
        daemon registers them as Prometheus collectors)."""
        return {n: s for n, s in self._strategies.items() if self._table[n].families}

    def start(self) -> None:
        """Build the enabled strategies and start one supervised loop each."""
        config = self._ctx.config
        built: dict[str, Strategy] = {}
        for name, spec in self._table.items():
            if not spec.enabled(config):
                self._disabled[name] = spec.gates_text
                continue
            interval = spec.interval(config.qos)
            if not interval > 0:
                raise ConfigError(
                    f"strategy {name!r} has a non-positive interval {interval!r}",
                    field="strategies",
                )
            strategy = spec.build(self._ctx, interval)
            if strategy.name != name:
                raise ConfigError(
                    f"factory of {name!r} built a strategy named {strategy.name!r}",
                    field="strategies",
                )
            built[name] = strategy
        for name, strategy in built.items():
            self._supervisor.spawn_loop(
                f"qos/{name}", self._step(name, strategy), strategy.interval, component=COMPONENT
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

    def _step(self, name: str, strategy: Strategy) -> Callable[[], Awaitable[None]]:
        """The strategy's ``reconcile`` with its round recorded in the book (errors re-raised
        for the supervisor to log and count)."""
        book = self._ctx.book

        async def step() -> None:
            book.round_started(name)
            t0 = time.perf_counter()
            try:
                await strategy.reconcile()
            except Exception as err:
                book.round_done(name, time.perf_counter() - t0, err)
                raise
            book.round_done(name, time.perf_counter() - t0, None)

        return step

    def describe(self) -> dict[str, Any]:
        """``/debug/qos``: the dry-run settings, the NodeSLO in force (source, generation, each
        section's status), each running strategy's interval, rounds, errors, stale rounds, last
        report, the status of the NodeSLO sections it reads and its own ``describe()`` (``state``;
        None without one), and the strategies that do not run with the reason."""
        ctx = self._ctx
        node_slo = ctx.node_slo()
        return {
            "dry_run": {"all": ctx.dry_run_all, "strategies": sorted(ctx.dry_run_strategies)},
            "max_input_age_s": ctx.max_input_age,
            "nodeslo": node_slo.describe(),
            "strategies": {
                name: {
                    "interval_s": strategy.interval,
                    "dry_run": ctx.dry_run(name),
                    "nodeslo": {s: node_slo.status(s) for s in self._table[name].sections},
                    **ctx.book.describe(name),
                    "state": _describe(strategy),
                }
                for name, strategy in self._strategies.items()
            },
            "disabled": dict(self._disabled),
            "evictor": _describe(ctx.evictor),
            "pod_annotations": ctx.pod_warnings.describe(),
        }

    async def stop(self, timeout: float) -> tuple[str, ...]:  # noqa: ASYNC109 (see LoopSpawner)
        """Cancel every strategy loop, then let each strategy with a ``close()`` release what it
        holds (memory eviction disarms its pressure watch and settles an eviction in flight);
        returns the names of loops that did not stop in time."""
        stuck = await self._supervisor.stop(timeout)
        for name, strategy in self._strategies.items():
            close = getattr(strategy, "close", None)
            if close is None:
                continue
            try:
                await close()
            except Exception:  # the guard: one strategy's cleanup cannot stop the others'
                logger.exception("QoS strategy %s failed to close", name)
        self._strategies.clear()
        return stuck


def _describe(component: object) -> Any:
    """``component.describe()`` when it has one returning plain data, else None."""
    describe = getattr(component, "describe", None)
    return describe() if callable(describe) else None
