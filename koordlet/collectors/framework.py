"""What a collector is, and what it is given.

A collector implements one synchronous step, :meth:`Collector.collect`, that reads what it needs
from the host and returns samples. The framework (``koordlet.collectors.runner``) owns the
interval: at each base tick it runs, in one worker thread and in table order, every collector
that is due, hands them one shared :class:`Tick`, and then appends the samples to the metric cache
on the event loop. A collector never sleeps, loops or catches broadly; a raising step is logged,
counted and retried next tick by the framework.

The :class:`Tick` memoizes file reads for its duration, so two collectors that need the same
kernel file in the same tick (the pod collector and the page-cache collector both parse
``memory.stat``) cost one read; and ``Tick.last`` sees the samples that earlier collectors of the
same tick produced, so derived collectors (system usage = node - pods - host apps) combine
values of one instant.

Collectors are built from one explicit table (``koordlet.collectors.table.COLLECTORS``) passed
to the daemon: one :class:`CollectorSpec` row per collector holds everything about it (factory,
feature gate, configuration switch, interval, the ``/metrics`` families it feeds and how long their
samples stay exported). A factory takes a :class:`CollectorContext`, typed with the real classes,
and the interval its row computed; the table names it by reference (``"module:build"``,
:mod:`koordlet.plugins`), so a collector's module is imported only when its row is enabled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from typing import Any, Generic, Protocol, TypeVar

from apis.records import frozen
from koordlet.config import CollectConfig, KoordletConfig
from koordlet.metriccache.series import Column, Sample
from koordlet.plugins import load
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.host import Host
from koordlet.system.nativeread import NativeFormat
from koordlet.system.probe import Capabilities

T = TypeVar("T")


class MetricReader(Protocol):
    """The read side of the metric cache."""

    def last(self, metric: str, entity: str, *, max_age: float | None = None) -> float | None: ...


class Tick(Protocol):
    """One collection instant, shared by the collectors that run in it."""

    now: float
    """``time.time()`` of the tick; every sample of the tick carries it."""
    workloads: WorkloadSnapshot
    """The inventory's snapshot for this tick."""

    def read(self, path: str) -> bytes:
        """The file's bytes, read at most once per tick. Raises ``CgroupGoneError`` when the
        file (or its cgroup) does not exist, ``HostError`` for other failures."""
        ...

    def parsed(self, path: str, parser: Callable[[bytes, str], T]) -> T:
        """``parser(data, path)`` of the file, parsed at most once per tick per parser, so two
        collectors that need the same kernel file share the read and the parse."""
        ...

    def column(self, paths: tuple[str, ...]) -> list[bytes] | None:
        """Every file of ``paths`` read at once, in order, remembered as ``read`` remembers;
        None when that does not apply (then the caller reads file by file, which names each
        failure). For a collector's fixed files, one per pod and container."""
        ...

    def native_column(self, paths: tuple[str, ...], fmt: NativeFormat) -> list[Any] | None:
        """``fmt``'s parse of every file of ``paths``, read and parsed in C
        (``koordlet.system.nativeread``); None when that does not apply (then ``column``)."""
        ...

    def remember(
        self, paths: Sequence[str], parser: Callable[[bytes, str], T], values: Sequence[T]
    ) -> None:
        """Values parsed in bulk from ``column``'s contents, stored as ``parsed`` stores them."""
        ...

    def parsed_column(
        self, paths: Sequence[str], parser: Callable[[bytes, str], T]
    ) -> list[T] | None:
        """``parsed`` of every path when all are in the memo already; else None."""
        ...

    def last(self, metric: str, entity: str) -> float | None:
        """This tick's value from an earlier collector, else the cache's latest value when it is
        fresh (younger than two base intervals); None otherwise."""
        ...


@frozen
class CollectResult:
    """What one step produced."""

    samples: Sequence[Sample] = ()
    """Series values at the tick's timestamp."""
    columns: Sequence[Column] = ()
    """More of them, as ``(keys, values)`` columns: a collector's steady state over many
    cgroups, its keys tuple the same object until its targets change
    (``MetricCache.append_columns`` stores a column's series as groups)."""
    info: Mapping[str, Any] = field(default_factory=dict)
    """Structured facts (node info, topology) stored as latest value by name."""
    unsupported: Mapping[str, str] = field(default_factory=dict)
    """Sources this step could not read because the host lacks them: source → reason."""

    def all_samples(self) -> list[Sample]:
        """``samples`` and then every key and value of ``columns``, as samples."""
        out = list(self.samples)
        for keys, values in self.columns:
            out.extend(map(Sample, keys, values))
        return out

    @property
    def sample_count(self) -> int:
        """How many values it holds, samples and columns."""
        return len(self.samples) + sum(len(values) for _, values in self.columns)


class Collector(Protocol):
    """One collector plugin."""

    name: str
    """Table name, used in logs, metrics and ``/debug``."""
    interval: float
    """Seconds between steps (rounded up to a multiple of the base tick by the runner)."""

    def collect(self, tick: Tick) -> CollectResult:
        """Read the host once through ``tick.read`` and return samples for ``tick.now``.

        Runs in a worker thread. Raise on a real failure; a workload whose cgroup vanished
        mid-read is skipped, not an error. First samples of a counter only seed it.
        """
        ...


@frozen
class CollectorContext:
    """Everything a collector factory may use."""

    host: Host
    """Paths plus the detected cgroup layout."""
    config: KoordletConfig
    """The koordlet's frozen configuration; tests pass ``KoordletConfig(node_name=...)`` for
    Koordinator's defaults."""
    capabilities: Capabilities | None = None
    """Start-up probing's results, or None where nothing was probed (tests, benchmarks)."""


@frozen
class Fresh(Generic[T]):
    """What an on-demand read found: its value, and the samples it stores in the metric cache."""

    value: T
    """The typed value the caller asked for (``MemInfo``...)."""
    samples: Sequence[Sample] = ()
    """Series values at the read's timestamp; the runner appends them to the metric cache."""


@frozen
class OnDemand(Generic[T]):
    """A read a strategy may ask the runner for between ticks (an event handler that needs data
    fresher than the last tick): ``await runner.read_now(NODE_MEMORY)``.

    ``read`` runs in a worker thread, possibly while a tick runs in another: it is stateless and
    reads through the stat table and the tick it is given, never through a collector's state.
    The collector module that owns the formula declares it, beside its ``collect``.
    """

    name: str
    """For logs and errors (``node_memory``)."""
    read: Callable[[Host, Tick], Fresh[T]]
    """``(host, tick) -> Fresh``: the read itself."""
    doc: str
    """What it reads and which series it refreshes."""


CollectorFactory = Callable[[CollectorContext, float], Collector]
"""``(context, interval seconds) -> collector``: builds one collector; the interval is its row's."""


@frozen
class CollectorSpec:
    """One row of the collector table: everything about one collector."""

    name: str
    """Table name: the collector's ``name``, in logs, self-metrics and ``/debug``."""
    factory: CollectorFactory | str
    """Builds the collector: each module's ``build``, named ``"koordlet.collectors.x:build"`` so
    that the module is imported only when the row is enabled (:mod:`koordlet.plugins`)."""
    interval: Callable[[CollectConfig], float]
    """Seconds between its steps, from the ``collect`` configuration (Koordinator's flag)."""
    upstream: str
    """Koordinator's collector it mirrors (``NodeResourceCollector``), for the docs."""
    gate: str = ""
    """The koordlet feature gate that must be on for it to run; empty: none (Koordinator's gate
    names, ``koordlet.features``)."""
    switch: Callable[[CollectConfig], bool] | None = None
    """A ``collect`` setting that must be true for it to run (``--enable-resctrl-collector``);
    None: none."""
    families: tuple[str, ...] = ()
    """The ``/metrics`` families built from its series (``koordlet.server.exporter.FAMILIES``)."""
    max_age: Callable[[CollectConfig], float] | None = None
    """Seconds its families' samples stay exported; None: the exporter's default, a few base
    ticks. A collector slower than the base tick needs one of its own intervals and some."""

    def enabled(self, config: KoordletConfig) -> bool:
        """Whether its gate and its switch let it run under ``config``."""
        if self.gate and not config.feature_gates.enabled(self.gate):
            return False
        return self.switch is None or self.switch(config.collect)

    def build(self, ctx: CollectorContext, interval: float) -> Collector:
        """The collector, its factory imported now if the row names it by reference (an import
        error propagates: the start that builds the row fails)."""
        factory: CollectorFactory = load(self.factory)
        return factory(ctx, interval)
