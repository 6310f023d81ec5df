"""L3 occupancy and memory bandwidth of the QoS resctrl groups (Koordinator's resctrl collector).

Upstream runs it when ``--enable-resctrl-collector`` and its ``ResctrlCollector`` gate are on;
interval ``collect.resctrl_interval`` (``--resctrl-collector-interval``, 1 s; the base interval
when the configuration has none). Each step, for each of Koordinator's control groups ``LSR``,
``LS`` and ``BE`` that exists under ``<sys>/fs/resctrl``, and each L3 domain
``mon_data/mon_L3_<NN>`` of it:

- **LLC occupancy**, in bytes, per domain (``llc_occupancy``) and for the group, summed over the
  domains;
- **memory bandwidth**, in bytes per second: the running counters ``mbm_total_bytes`` and
  ``mbm_local_bytes`` differenced against the previous step and divided by the seconds between
  the two steps, per domain and summed for the group. The first reading of a counter only seeds
  it; a counter that went backwards (the group was recreated and its RMID reset) re-seeds it. The
  raw counters are kept per domain too (what upstream exports).

A domain whose file says ``Unavailable`` or ``Error`` is skipped with the reason in
``CollectResult.unsupported`` (key ``<group>/mon_L3_<NN>/<event>``) and its counter state is
dropped; the group's sum for that event is then not reported for the step (a partial sum would
understate it). Events the CPU or kernel lacks, and a host without resctrl monitoring at all, are
reported there with the missing flag or file (key ``resctrl`` or the event name). Groups that do
not exist (the resctrl QoS strategy creates them) are listed under ``info["resctrl_groups"]``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from koordlet.collectors.framework import CollectorContext, CollectResult, Tick
from koordlet.collectors.shared import CpuCounters
from koordlet.errors import CgroupGoneError, UnsupportedError
from koordlet.metriccache.series import (
    RESCTRL_DOMAIN_LLC_OCCUPANCY,
    RESCTRL_DOMAIN_MBM_LOCAL_BANDWIDTH,
    RESCTRL_DOMAIN_MBM_LOCAL_BYTES,
    RESCTRL_DOMAIN_MBM_TOTAL_BANDWIDTH,
    RESCTRL_DOMAIN_MBM_TOTAL_BYTES,
    RESCTRL_LLC_OCCUPANCY,
    RESCTRL_MBM_LOCAL_BANDWIDTH,
    RESCTRL_MBM_TOTAL_BANDWIDTH,
    Sample,
    SeriesKey,
    resctrl_domain_entity,
    resctrl_group_entity,
)
from koordlet.system.host import Host
from koordlet.system.resctrl import (
    LLC_OCCUPANCY,
    MBM_LOCAL,
    MBM_TOTAL,
    RESCTRL_GROUPS,
    mon_domains,
    monitoring_support,
    parse_mon_value,
    resctrl_root,
)
from koordlet.system.stats import CPUINFO_FLAGS

logger = logging.getLogger(__name__)

NAME = "resctrlmon"
INFO_KEY = "resctrl_groups"
"""Name of the ``info`` entry: ``{"present": [groups], "absent": [groups], "events": [...]}``."""

_DOMAIN_SERIES = {
    LLC_OCCUPANCY: RESCTRL_DOMAIN_LLC_OCCUPANCY,
    MBM_TOTAL: RESCTRL_DOMAIN_MBM_TOTAL_BYTES,
    MBM_LOCAL: RESCTRL_DOMAIN_MBM_LOCAL_BYTES,
}
"""Event → the per-domain series of its raw value."""
_DOMAIN_RATE = {
    MBM_TOTAL: RESCTRL_DOMAIN_MBM_TOTAL_BANDWIDTH,
    MBM_LOCAL: RESCTRL_DOMAIN_MBM_LOCAL_BANDWIDTH,
}
"""Counter event → the per-domain bandwidth series."""
_GROUP_SERIES = {
    LLC_OCCUPANCY: RESCTRL_LLC_OCCUPANCY,
    MBM_TOTAL: RESCTRL_MBM_TOTAL_BANDWIDTH,
    MBM_LOCAL: RESCTRL_MBM_LOCAL_BANDWIDTH,
}
"""Event → the group series (occupancy summed, bandwidth summed)."""


class ResctrlMonCollector:
    """See the module docstring.

    :param host: the host (``<sys>/fs/resctrl``, ``/proc/cpuinfo``).
    :param interval: seconds between steps.
    :param groups: the control groups to read; Koordinator's QoS groups by default.
    """

    def __init__(
        self, host: Host, interval: float = 1.0, groups: Sequence[str] = RESCTRL_GROUPS
    ) -> None:
        self.name = NAME
        self.interval = interval
        self._paths = host.paths
        self._root = resctrl_root(host.paths)
        self._groups = tuple(groups)
        self._flags: frozenset[str] | None = None
        self._counters = CpuCounters()

    def _cpu_flags(self, tick: Tick) -> frozenset[str]:
        if self._flags is None:  # CPU features do not change while the host runs
            self._flags = CPUINFO_FLAGS.get(tick, CPUINFO_FLAGS.path(self._paths))
        return self._flags

    def collect(self, tick: Tick) -> CollectResult:
        try:
            support = monitoring_support(self._paths, self._cpu_flags(tick), tick.read)
        except UnsupportedError as err:
            self._counters.keep_only(set())
            return CollectResult(unsupported={"resctrl": err.reason})
        unsupported = dict(support.missing)
        samples: list[Sample] = []
        present: list[str] = []
        absent: list[str] = []
        seen: set[str] = set()
        for group in self._groups:
            try:
                group_samples = self._group(tick, group, support.events, unsupported, seen)
            except CgroupGoneError:
                absent.append(group)
                continue
            present.append(group)
            samples.extend(group_samples)
        self._counters.keep_only(seen)
        info = {"present": present, "absent": absent, "events": list(support.events)}
        return CollectResult(samples=samples, info={INFO_KEY: info}, unsupported=unsupported)

    def _group(
        self,
        tick: Tick,
        group: str,
        events: tuple[str, ...],
        unsupported: dict[str, str],
        seen: set[str],
    ) -> list[Sample]:
        """Samples of one control group; :class:`CgroupGoneError` when it does not exist."""
        domains = mon_domains(self._root, group)
        now = tick.now
        samples: list[Sample] = []
        sums = dict.fromkeys(events, 0.0)
        complete = dict.fromkeys(events, bool(domains))
        for cache_id, folder in domains:
            entity = resctrl_domain_entity(group, cache_id)
            for event in events:
                path = os.path.join(folder, event)
                value, why = parse_mon_value(tick.read(path), path)
                counter = f"{entity}/{event}"
                if value is None:
                    unsupported[f"{group}/mon_L3_{cache_id:02d}/{event}"] = why
                    complete[event] = False
                    self._counters.forget(counter)
                    continue
                samples.append(Sample(SeriesKey(_DOMAIN_SERIES[event], entity), float(value)))
                if event == LLC_OCCUPANCY:
                    sums[event] += value
                    continue
                seen.add(counter)
                rate = self._counters.rate(counter, value, now)
                if rate is None:
                    complete[event] = False
                    continue
                samples.append(Sample(SeriesKey(_DOMAIN_RATE[event], entity), rate))
                sums[event] += rate
        group_entity = resctrl_group_entity(group)
        samples.extend(
            Sample(SeriesKey(_GROUP_SERIES[event], group_entity), sums[event])
            for event in events
            if complete[event]
        )
        return samples


def build(ctx: CollectorContext, interval: float) -> ResctrlMonCollector:
    """The table's factory (interval ``collect.resctrl_interval``)."""
    return ResctrlMonCollector(ctx.host, interval)
