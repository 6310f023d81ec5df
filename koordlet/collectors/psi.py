"""Pressure stall information of the node, its pods and containers (the PSI half of Koordinator's
``performance`` collector, feature gate ``PSICollector``, interval ``collect.psi_interval``).

Each step reads, through the tick (memoized, parsed once by :func:`~koordlet.system.psi.parse_psi`):

- **node**: ``/proc/pressure/{cpu,memory,io}``;
- **pods and containers**: ``{cpu,memory,io}.pressure`` in each cgroup of the inventory: on
  cgroup v2 every cgroup has them; on cgroup v1 only Anolis kernels booted with ``psi_v1=1``
  put them in the ``cpuacct`` controller's folders (where Koordinator reads them).

and records, per entity and resource (``cpu``, ``mem``, ``io``, Koordinator's spelling), the
``some`` and ``full`` averages over 10, 60 and 300 s in percent (series
``psi_<resource>_<degree>_<window>``), and ``psi_<resource>_full_supported`` (1 or 0). A file
without a ``full`` line (cpu before Linux 5.13) records no ``full`` series: absent, not zero.
Upstream records ``avg10`` only in its cache and exports all three windows; here the exporter
reads the cache, so all three are kept.

Unsupported, with the reason, in ``CollectResult.unsupported`` (never zeros):

- ``node``: ``/proc/pressure`` absent (no ``CONFIG_PSI``, or ``psi=0``) or ``EOPNOTSUPP``;
- ``cgroup``: the start-up probe found no cgroup pressure files (``psi_cgroup``), a pressure
  file is absent from a cgroup that exists (cgroup v1 without ``psi_v1``; a v2 cgroup with
  ``cgroup.pressure`` 0), or the kernel answers ``EOPNOTSUPP`` (PSI disabled at boot).

A cgroup that vanished mid-step is skipped (one debug line a step).
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

from koordlet.collectors.framework import CollectorContext, CollectResult, Tick
from koordlet.collectors.shared import TargetCache
from koordlet.errors import CgroupGoneError, HostError
from koordlet.metriccache.series import (
    NODE,
    PSI_WINDOWS,
    Sample,
    SeriesKey,
    psi_full_supported_series,
    psi_series,
)
from koordlet.system.host import Host
from koordlet.system.oserrors import refused_errno
from koordlet.system.probe import Capabilities
from koordlet.system.psi import PSIStats
from koordlet.system.stats import CPU_PRESSURE, IO_PRESSURE, MEMORY_PRESSURE, PRESSURE

logger = logging.getLogger(__name__)

NAME = "psi"
FEATURE_GATE = "PSICollector"
"""Koordinator's feature gate for this collector."""
DEFAULT_INTERVAL = 10.0
"""Seconds; Koordinator's ``--psi-collector-interval-seconds`` default."""
RESOURCES = (
    ("cpu", "cpu", CPU_PRESSURE),
    ("mem", "memory", MEMORY_PRESSURE),
    ("io", "io", IO_PRESSURE),
)
"""(Koordinator's resource type, the kernel's file stem, the cgroup's pressure stat)."""
SOURCE_NODE = "node"
SOURCE_CGROUP = "cgroup"
PROBE_CGROUP = "psi_cgroup"
"""The start-up probe's capability name for cgroup pressure files."""


class _ResourceKeys(NamedTuple):
    some: tuple[SeriesKey, ...]
    full: tuple[SeriesKey, ...]
    flag: SeriesKey


def _keys(entity: str) -> tuple[_ResourceKeys, ...]:
    return tuple(
        _ResourceKeys(
            tuple(SeriesKey(psi_series(res, "some", w), entity) for w in PSI_WINDOWS),
            tuple(SeriesKey(psi_series(res, "full", w), entity) for w in PSI_WINDOWS),
            SeriesKey(psi_full_supported_series(res), entity),
        )
        for res, _, _ in RESOURCES
    )


class _Plan(NamedTuple):
    entity: str
    directory: str
    files: tuple[str, ...]
    keys: tuple[_ResourceKeys, ...]


def _samples(stats: list[PSIStats], keys: tuple[_ResourceKeys, ...], out: list[Sample]) -> None:
    for st, k in zip(stats, keys, strict=True):
        some = st.some
        out += (Sample(k.some[0], some.avg10), Sample(k.some[1], some.avg60))
        out.append(Sample(k.some[2], some.avg300))
        full = st.full
        if full is None:
            out.append(Sample(k.flag, 0.0))
            continue
        out += (Sample(k.full[0], full.avg10), Sample(k.full[1], full.avg60))
        out += (Sample(k.full[2], full.avg300), Sample(k.flag, 1.0))


class PSICollector:
    """See the module docstring.

    :param host: paths and cgroup layout.
    :param interval: seconds between steps (``collect.psi_interval``).
    :param capabilities: the start-up probe's results; when it found no cgroup pressure files
        (``psi_cgroup``), pods and containers are not read and its reason is reported.
    """

    def __init__(
        self,
        host: Host,
        interval: float = DEFAULT_INTERVAL,
        capabilities: Capabilities | None = None,
    ) -> None:
        self.name = NAME
        self.interval = interval
        self._stats = tuple(stat.bind(host.layout) for _, _, stat in RESOURCES)
        self._kernel_wide = self._stats[0].kernel_wide
        node_files = tuple(PRESSURE.path(host.paths, resource=stem) for _, stem, _ in RESOURCES)
        self._node = _Plan(NODE, host.paths.proc("pressure"), node_files, _keys(NODE))
        self._cgroup_unsupported = _probe_reason(capabilities)
        self._targets = TargetCache()
        self._plan: tuple[_Plan, ...] = ()

    def _replan(self) -> None:
        stats = self._stats
        self._plan = tuple(
            _Plan(
                t.entity, stats[0].dir(t.rel), tuple(s.path(t.rel) for s in stats), _keys(t.entity)
            )
            for t in self._targets.plan
        )

    def collect(self, tick: Tick) -> CollectResult:
        samples: list[Sample] = []
        unsupported: dict[str, str] = {}
        why = self._collect_node(tick, samples)
        if why:
            unsupported[SOURCE_NODE] = why
        if self._cgroup_unsupported:
            unsupported[SOURCE_CGROUP] = self._cgroup_unsupported
        else:
            if self._targets.refresh(tick.workloads):
                self._replan()
            why = self._collect_cgroups(tick, samples)
            if why:
                unsupported[SOURCE_CGROUP] = why
        return CollectResult(samples=samples, unsupported=unsupported)

    def _collect_node(self, tick: Tick, out: list[Sample]) -> str:
        node = self._node
        try:
            stats = [PRESSURE.get(tick, path) for path in node.files]
        except CgroupGoneError:  # read_file_bytes' name for ENOENT
            return f"{node.directory} absent: kernel without PSI (CONFIG_PSI) or booted with psi=0"
        except HostError as err:
            code = refused_errno(err)
            if code is None:
                raise
            return f"{err} (errno {code}): PSI is built in but disabled (booted with psi=0)"
        _samples(stats, node.keys, out)
        return ""

    def _collect_cgroups(self, tick: Tick, out: list[Sample]) -> str:
        """Read every pod and container; the reason cgroup PSI is unsupported, or empty."""
        why = ""
        gone = 0
        readers = tuple(s.get for s in self._stats)
        for plan in self._plan:
            try:
                stats = [get(tick, path) for get, path in zip(readers, plan.files, strict=True)]
            except CgroupGoneError:
                if not os.path.isdir(plan.directory):
                    gone += 1
                    continue
                why = why or (
                    f"no pressure files in {plan.directory}: cgroup v1 without Anolis psi_v1=1, "
                    "a kernel without PSI, or cgroup.pressure set to 0"
                )
                if self._kernel_wide:
                    break  # a boot-time switch (v1 psi_v1): every other cgroup lacks them too
                continue
            except HostError as err:
                code = refused_errno(err)
                if code is None:
                    raise
                why = f"{err} (errno {code}): PSI is built in but disabled (booted with psi=0)"
                break  # the whole kernel refuses: no other cgroup will answer
            _samples(stats, plan.keys, out)
        if gone:
            logger.debug("%s: %d cgroups vanished during the step, skipped", NAME, gone)
        return why


def _probe_reason(capabilities: Capabilities | None) -> str:
    """The probe's reason when it found cgroup PSI unsupported; empty otherwise (or unprobed)."""
    cap = None if capabilities is None else capabilities.get(PROBE_CGROUP)
    if cap is None or cap.supported:
        return ""
    return f"start-up probe: {cap.reason}"


def build(ctx: CollectorContext, interval: float) -> PSICollector:
    """The table's factory: interval ``collect.psi_interval``, the start-up probe's results."""
    return PSICollector(ctx.host, interval, ctx.capabilities)
