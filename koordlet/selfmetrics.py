"""The koordlet's own health as Prometheus metrics, and the readiness stages behind ``/readyz``.

Everything is registered in a registry the caller passes in (the daemon builds one; tests build a
fresh ``CollectorRegistry``), never in prometheus-client's global default registry.

Names follow Koordinator's ``pkg/koordlet/metrics`` where the Go koordlet has the same metric
(``koordlet_start_time``); the rest carry the ``koordlet_`` prefix and are listed in
``docs/metrics.md``. A collector's step is a step like any other: its duration and failures go
into ``koordlet_step_duration_seconds`` and ``koordlet_step_errors_total`` with
``component="collector"`` rather than into a separate collect-duration family, so one query
covers every loop of the daemon.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from apis.slo_inforce import ALL_SECTIONS, NodeSLOInForce
from koordlet.prom import (
    CollectorRegistry,
    Counter,
    Gauge,
    GaugeMetricFamily,
    Histogram,
    Info,
    Metric,
)
from koordlet.system import libc

logger = logging.getLogger(__name__)

STEP_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
"""Histogram buckets (seconds) for one step: a collector tick is a few milliseconds, a stuck
step is several seconds."""

RESOURCE_UPDATE_BUCKETS: tuple[float, ...] = tuple(0.01 * 4**i for i in range(8))
"""Milliseconds, 10 µs to 163.84 ms in powers of four: Koordinator's buckets for
``koordlet_resource_update_duration_milliseconds`` (a cgroup write takes tens of µs)."""


class SelfMetrics:
    """The daemon's own metrics, registered in ``registry``.

    :param registry: where the families are registered (never the global default registry).
    :param node_name: value of the ``node`` label on ``koordlet_start_time``, as upstream.
    :param version: the koordlet's version for ``koordlet_build_info``.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        node_name: str = "",
        version: str = "",
    ) -> None:
        self.registry = registry
        self.node_name = node_name
        self.step_duration = Histogram(
            "koordlet_step_duration_seconds",
            "Duration of one step of a koordlet loop (collector, strategy, reconciler).",
            ("component", "name"),
            buckets=STEP_BUCKETS,
            registry=registry,
        )
        self.step_errors = Counter(
            "koordlet_step_errors",
            "Steps of a koordlet loop that raised; the loop retries at its next tick.",
            ("component", "name"),
            registry=registry,
        )
        self.skipped_ticks = Counter(
            "koordlet_step_skipped_ticks",
            "Ticks a fixed-rate loop skipped because its previous step overran its interval.",
            ("component", "name"),
            registry=registry,
        )
        self.task_restarts = Counter(
            "koordlet_task_restarts",
            "Restarts of an eternal task; reason is 'raised' or 'returned' (a bug).",
            ("name", "reason"),
            registry=registry,
        )
        self.capability_supported = Gauge(
            "koordlet_capability_supported",
            "1 when the host supports the capability (a cgroup knob, a source), else 0.",
            ("name",),
            registry=registry,
        )
        self.start_time = Gauge(
            "koordlet_start_time",
            "The start time of koordlet, in seconds since the epoch.",
            ("node",),
            registry=registry,
        )
        self.ready = Gauge(
            "koordlet_ready",
            "1 once every start-up stage has completed, else 0.",
            registry=registry,
        )
        self.resource_update_duration = Histogram(
            "koordlet_resource_update_duration_milliseconds",
            "time duration of resource update such as cgroup files",
            ("type", "status"),
            buckets=RESOURCE_UPDATE_BUCKETS,
            registry=registry,
        )
        self.qos_stale_inputs = Counter(
            "koordlet_qos_stale_inputs",
            "QoS strategy rounds that held or skipped because their inputs were older than twice "
            "the collection interval.",
            ("strategy",),
            registry=registry,
        )
        self.build_info = Info(
            "koordlet_build",
            "Version of this koordlet and the Python running it (value is always 1).",
            registry=registry,
        )
        self.build_info.info(
            {
                "version": version,
                "python_version": libc.python_version(),
                "implementation": libc.python_implementation(),
            }
        )
        self.ready.set(0)

    def observe_step(self, component: str, name: str, seconds: float, *, failed: bool) -> None:
        """Record one step: its duration always, and an error when it raised."""
        self.step_duration.labels(component, name).observe(max(seconds, 0.0))
        if failed:
            self.step_errors.labels(component, name).inc()

    def skipped(self, component: str, name: str, ticks: int) -> None:
        """Record ticks a fixed-rate loop skipped."""
        if ticks > 0:
            self.skipped_ticks.labels(component, name).inc(ticks)

    def restarted(self, name: str, reason: str) -> None:
        """Record a restart of an eternal task (``reason``: ``raised`` or ``returned``)."""
        self.task_restarts.labels(name, reason).inc()

    def resource_updated(self, kind: str, status: str, seconds: float) -> None:
        """Record one resource write (``kind``: the file, ``status``: ``success`` or
        ``failed``), as Koordinator's ``RecordResourceUpdateDuration``."""
        self.resource_update_duration.labels(kind, status).observe(max(seconds, 0.0) * 1000.0)

    def stale_inputs(self, strategy: str) -> None:
        """Count one round of ``strategy`` held or skipped on stale inputs."""
        self.qos_stale_inputs.labels(strategy).inc()

    def record_capabilities(self, supported: Mapping[str, bool]) -> None:
        """Publish the start-up probe's result: one gauge per capability, 1 or 0."""
        for name, ok in supported.items():
            self.capability_supported.labels(name).set(1 if ok else 0)

    def mark_started(self, at: float | None = None) -> None:
        """Set ``koordlet_start_time`` (``time.time()`` unless given)."""
        self.start_time.labels(self.node_name).set(time.time() if at is None else at)


class Readiness:
    """Start-up stages that must all complete before ``/readyz`` answers 200.

    Stages are declared up front, in order (``probe``, ``inventory``, ``first-collect``...);
    :meth:`pending` lists those not yet done, first the one the daemon is most likely waiting on.
    """

    def __init__(self, stages: Iterable[str], *, metrics: SelfMetrics | None = None) -> None:
        self._stages = tuple(dict.fromkeys(stages))
        if not self._stages:
            raise ValueError("Readiness needs at least one stage")
        self._done: set[str] = set()
        self._metrics = metrics
        self._publish()

    @property
    def stages(self) -> tuple[str, ...]:
        return self._stages

    def mark_done(self, stage: str) -> None:
        """Record that ``stage`` completed; unknown stages are a programming error."""
        if stage not in self._stages:
            raise ValueError(f"unknown readiness stage {stage!r}; declared: {self._stages}")
        if stage in self._done:
            return
        self._done.add(stage)
        logger.info("start-up stage %s done (%d/%d)", stage, len(self._done), len(self._stages))
        self._publish()

    def pending(self) -> tuple[str, ...]:
        """Stages not yet done, in declaration order."""
        return tuple(s for s in self._stages if s not in self._done)

    def ready(self) -> bool:
        return not self.pending()

    def _publish(self) -> None:
        if self._metrics is not None:
            self._metrics.ready.set(1 if self.ready() else 0)


class NodeSLOSections:
    """``koordlet_nodeslo_section_rejected{section}``: 1 while the NodeSLO's value of a section
    is rejected (its last good value, or the default, is in force), else 0; one sample per
    section, built at each scrape from the NodeSLO in force. Ours: upstream's koordlet does not
    validate the NodeSLO."""

    def __init__(self, node_slo: Callable[[], NodeSLOInForce]) -> None:
        self._node_slo = node_slo

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        """Prometheus collector protocol: fresh samples per scrape."""
        family = self._family()
        rejected = self._node_slo().rejected
        for section in ALL_SECTIONS:
            family.add_metric([section], 1.0 if section in rejected else 0.0)
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "koordlet_nodeslo_section_rejected",
            "1 while the NodeSLO's value of the section is rejected and its last good value "
            "(or the default) stays in force",
            labels=["section"],
        )
