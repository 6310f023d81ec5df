"""koord-descheduler's Prometheus families (``koord_descheduler_*``), on a registry of its own.

- ``koord_descheduler_pods_evicted_total{result, strategy, namespace, node}`` (counter): moves, as
  upstream's ``PodsEvicted`` labels them: ``success`` (a job created by a plugin, or a pod
  evicted by a job: ``strategy`` ``MigrationController``), ``dry-run``, ``error``.
- ``koord_descheduler_migration_jobs{phase}`` (gauge): PodMigrationJobs by phase (an unset phase
  counts as ``Pending``).
- ``koord_descheduler_arbitration_total{result}`` (counter): jobs arbitrated, ``passed``,
  ``held`` or ``failed``.
- ``koord_descheduler_rounds_total`` (counter) and ``koord_descheduler_round_duration_seconds``
  (histogram): descheduling rounds and how long their decisions took.
- ``koord_descheduler_leader`` (gauge): 1 while this replica's term runs.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from apis.podmigrationjob import PHASE_PENDING, PHASES, PodMigrationJob


class Metrics:
    """The families above, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.pods_evicted = Counter(
            "koord_descheduler_pods_evicted",
            "Pods moved (or not) by the descheduler, by result, strategy, namespace and node.",
            ["result", "strategy", "namespace", "node"],
            registry=self.registry,
        )
        self.jobs = Gauge(
            "koord_descheduler_migration_jobs",
            "PodMigrationJobs by phase.",
            ["phase"],
            registry=self.registry,
        )
        self.arbitration = Counter(
            "koord_descheduler_arbitration",
            "PodMigrationJobs arbitrated, by result.",
            ["result"],
            registry=self.registry,
        )
        self.rounds = Counter(
            "koord_descheduler_rounds", "Descheduling rounds run.", registry=self.registry
        )
        self.round_seconds = Histogram(
            "koord_descheduler_round_duration_seconds",
            "How long a descheduling round's decisions took.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
            registry=self.registry,
        )
        self.leader = Gauge(
            "koord_descheduler_leader",
            "1 while this replica leads (its term runs).",
            registry=self.registry,
        )

    def set_jobs(self, jobs: list[PodMigrationJob]) -> None:
        counts = dict.fromkeys(PHASES, 0)
        for job in jobs:
            phase = job.status.phase or PHASE_PENDING
            counts[phase] = counts.get(phase, 0) + 1
        for phase, n in counts.items():
            self.jobs.labels(phase=phase).set(n)
