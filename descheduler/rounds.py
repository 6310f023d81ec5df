"""One descheduler built from a configuration over a cluster view: its profiles, its evictor,
and :meth:`Descheduler.round`, which runs every profile once and returns what it decided.

``explain`` builds one over a snapshot file and runs one round; the daemon builds one per
elected term over its informers' view and runs a round every ``deschedulingInterval``. The
plugins live as long as the descheduler (LowNodeLoad's anomaly detectors count rounds), the
evictor one round (its per-round limits and the jobs it decided).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from apis.podmigrationjob import PodMigrationJob
from apis.timestamp import format_time
from descheduler.cluster import Cluster
from descheduler.config import DeschedulerConfig
from descheduler.errors import ConfigError
from descheduler.evictor import EvictorFilter
from descheduler.framework import Handle, Profile, RoundLimits, RoundReport, ready_nodes, run_round
from descheduler.loadaware.nodefit import NodeFit
from descheduler.migration.args import MigrationControllerArgs
from descheduler.migration.evictor import MigrationEvictor
from descheduler.migration.filters import MigrationFilter
from descheduler.table import BALANCE, DESCHEDULE, PLUGINS, PluginSpec


@dataclass(slots=True)
class RoundResult:
    """What one round decided."""

    report: RoundReport
    created: list[tuple[PodMigrationJob, dict[str, Any]]]
    """Jobs to create (assumed in the cluster's job store already)."""


def priority_threshold(cluster: Cluster, args: MigrationControllerArgs, source: str) -> int | None:
    """``GetPriorityValueFromPriorityThreshold``: the value, or the named PriorityClass's."""
    if args.priority_threshold_value is not None:
        return args.priority_threshold_value
    name = args.priority_threshold_name
    if not name:
        return None
    pc = cluster.sched.priority_classes.get(name)
    if pc is None or not isinstance(pc.get("value"), int):
        raise ConfigError(source, "priorityThreshold.name", f"no PriorityClass {name!r}")
    return int(pc["value"])


class Descheduler:
    """See the module docstring."""

    def __init__(
        self,
        cfg: DeschedulerConfig,
        cluster: Cluster,
        *,
        table: Mapping[str, PluginSpec] = PLUGINS,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        new_name: Callable[[], str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self.clock = clock
        self.monotonic = monotonic
        self.new_name = new_name
        self.margs: MigrationControllerArgs = cfg.migration_args()
        self.fit = NodeFit(cluster.sched, clock=clock)
        evictor_nodes_selector = self.margs.node_selector

        def fits_elsewhere(pod: Any) -> bool:
            nodes = [
                n
                for n in cluster.sched.nodes.values()
                if evictor_nodes_selector is None or evictor_nodes_selector.matches(n.labels)
            ]
            return self.fit.fits_any_other(pod, nodes)

        self.evictor_filter = EvictorFilter(
            cluster,
            self.margs,
            fits_elsewhere=fits_elsewhere,
            priority_threshold=priority_threshold(cluster, self.margs, cfg.source),
        )
        self.migration_filter = MigrationFilter(
            cluster, self.margs, self.evictor_filter, clock=monotonic
        )
        self.profiles: list[Profile] = []
        for p in cfg.profiles:
            prof = Profile(p.name, node_selector=p.node_selector)
            for name in p.plugins.get(DESCHEDULE, ()):
                factory = table[name].factory
                if factory is not None:
                    prof.deschedule.append(factory(p.args[name]))
            for name in p.plugins.get(BALANCE, ()):
                factory = table[name].factory
                if factory is not None:
                    prof.balance.append(factory(p.args[name]))
            self.profiles.append(prof)

    def plugins(self) -> list[Any]:
        return [pl for p in self.profiles for pl in (*p.deschedule, *p.balance)]

    def round(self, *, detailed: bool = True) -> RoundResult:
        """Run every profile once over the ready nodes."""
        cfg = self.cfg
        limits = RoundLimits(cfg.max_pods_per_node, cfg.max_pods_per_namespace, cfg.max_pods_total)
        kwargs: dict[str, Any] = {"limits": limits, "now": lambda: format_time(self.clock())}
        if self.new_name is not None:
            kwargs["new_name"] = self.new_name
        evictor = MigrationEvictor(self.cluster, self.margs, self.migration_filter, **kwargs)
        report = RoundReport(detailed=detailed)
        handle = Handle(self.cluster, evictor, report, self.clock, self.monotonic)
        run_round(self.profiles, handle, ready_nodes(self.cluster, cfg.node_selector))
        return RoundResult(report, evictor.created)
