"""What a collector is, and what it is given.

A collector implements one synchronous step, :meth:`Collector.collect`, that reads what it needs
from the host and returns samples. The framework (``koordlet.collectors.loop``) owns the interval,
runs the step in a worker thread, appends the samples to the metric cache on the event loop,
counts errors and retries next tick; a collector never sleeps, loops or catches broadly.

Collectors are built from one explicit table (``koordlet.collectors.table.COLLECTORS``) passed
to the daemon: name → factory taking a :class:`CollectorContext`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from koordlet.metriccache.series import Sample
from koordlet.statesinformer.model import WorkloadSnapshot


class MetricReader(Protocol):
    """The read side of the metric cache that derived collectors (system usage) may use."""

    def last(self, metric: str, entity: str, *, max_age: float | None = None) -> float | None: ...


@dataclass(frozen=True, slots=True)
class CollectResult:
    """What one step produced."""

    samples: Sequence[Sample] = ()
    """Series values at the tick's timestamp."""
    info: Mapping[str, Any] = field(default_factory=dict)
    """Structured facts (node info, topology) stored as latest-value by name."""
    unsupported: Mapping[str, str] = field(default_factory=dict)
    """Sources this step could not read because the host lacks them: source → reason."""


class Collector(Protocol):
    """One collector plugin."""

    name: str
    """Table name, used in logs, metrics and ``/debug``."""
    interval: float
    """Seconds between steps."""

    def collect(self, now: float) -> CollectResult:
        """Read the host once and return the samples for timestamp ``now``.

        Runs in a worker thread. Raise on a real failure (the framework logs and counts it);
        a workload whose cgroup vanished mid-read is skipped, not an error.
        """
        ...


@dataclass(frozen=True, slots=True)
class CollectorContext:
    """Everything a collector factory may use; nothing else is reachable from a collector."""

    host: Any
    """``koordlet.system`` host access (``HostPaths`` plus the cgroup layout)."""
    config: Any
    """The koordlet's frozen configuration."""
    workloads: Callable[[], WorkloadSnapshot]
    """Returns the inventory's current snapshot (cheap; call once per step)."""
    metrics: MetricReader
    """Read side of the metric cache."""


CollectorFactory = Callable[[CollectorContext], Collector]
