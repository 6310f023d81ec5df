"""Cycles and instructions of every container (Koordinator's CPI collector).

Koordinator's ``performance`` collector, behind the alpha feature gate ``CPICollector`` (off by
default), opens perf counters on each container every ``--cpi-collector-interval`` (60 s), sleeps
``--collect-cpi-timewindow`` (10 s), reads them and closes them; it reports the two raw counts
over the window, ``koordlet_container_cpi{cpi_field="cycles"|"instructions"}``, and consumers
take the ratio. This collector does the same without sleeping, as a two-step state machine
stepped every base tick:

1. **Open** (when a period starts): for every container of the inventory, in perf's cgroup mode
   (the container's perf_event cgroup directory, ``CgroupLayout.abs_dir("perf_event", …)``), one
   group per online CPU, ``cycles`` leading ``instructions``; reset and enable them.
2. **Read** (the first tick at least ``window`` seconds later): read every group, extrapolate
   multiplexed counts (``value * time_enabled / time_running`` per CPU), sum over the CPUs, close
   every descriptor, and emit ``container_cpi_cycles`` and ``container_cpi_instructions``.

No partial CPI: a failure on ANY CPU of a container drops that container's sample, and so does a
CPU where its group was enabled but never got onto the PMU. A container that did not run during
the window has no sample (there is nothing to divide). A container that leaves the inventory
mid-window has its descriptors closed at the next tick; one whose cgroup vanished before it could
be opened is skipped (a race, logged at debug level). Descriptors never outlive a window: at most
``2 * online CPUs * containers`` are held, and only during the window.

**Support.** Before the first period, and then at most once every ``reprobe_interval`` (an hour)
while unsupported, the collector checks that the perf_event cgroup controller is there (cgroup v1)
and that the events open CPU-wide (:func:`~koordlet.system.perf.probe_events`). On a host without
hardware counters (a VM without a virtual PMU) that fails with ``ENOENT``, ``EOPNOTSUPP`` or
``ENODEV``; each step then reports ``unsupported["perf_cpi"]`` with the reason and errno, which the
runner logs once.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from koordlet.collectors.framework import CollectorContext, CollectResult, Tick
from koordlet.collectors.shared import TargetCache
from koordlet.errors import CgroupGoneError, ConfigError, HostError
from koordlet.metriccache.series import (
    CONTAINER_CPI_CYCLES,
    CONTAINER_CPI_INSTRUCTIONS,
    Sample,
    SeriesKey,
)
from koordlet.system.host import Host
from koordlet.system.oserrors import errno_of
from koordlet.system.perf import (
    CYCLES,
    INSTRUCTIONS,
    CgroupCounters,
    PerfEvent,
    PerfOpener,
    PerfSupport,
    SyscallOpener,
    cgroup_mode_unsupported,
    probe_events,
)
from koordlet.system.procfs import read_host_file
from koordlet.system.topology import read_cpulist

logger = logging.getLogger(__name__)

NAME = "cpi"
SOURCE = "perf_cpi"
"""The key of ``CollectResult.unsupported`` (and of the start-up capability)."""
FEATURE_GATE = "CPICollector"
"""Koordinator's gate for this collector (alpha, off by default)."""
DEFAULT_PERIOD = 60.0
"""Seconds between the starts of two windows; Koordinator's ``--cpi-collector-interval``."""
DEFAULT_WINDOW = 10.0
"""Seconds counted in each period; Koordinator's ``--collect-cpi-timewindow``."""
REPROBE_INTERVAL = 3600.0
"""Seconds between two probes while the counters are unsupported."""

OnlineCpus = Callable[[], Sequence[int]]
"""Returns the CPUs to count on (default: the host's online CPUs)."""


def online_cpus_reader(host: Host) -> OnlineCpus:
    """Reads ``/sys/devices/system/cpu/online`` of ``host`` at each call."""
    path = host.paths.sys("devices", "system", "cpu", "online")

    def read() -> tuple[int, ...]:
        cpus = read_cpulist(read_host_file(path), path)
        if not cpus:
            raise HostError(f"{path}: no online CPU")
        return cpus

    return read


@dataclass(slots=True)
class _Counting:
    """One container's counters during a window."""

    counters: CgroupCounters
    cycles: SeriesKey
    instructions: SeriesKey


class CPICollector:
    """See the module docstring.

    :param host: paths and cgroup layout.
    :param step: seconds between two steps: the runner's base tick (``collect.res_used_interval``).
    :param period: seconds between window starts (``DEFAULT_PERIOD``).
    :param window: seconds counted (``DEFAULT_WINDOW``); at most ``period``.
    :param opener: the perf system calls; default :class:`~koordlet.system.perf.SyscallOpener`.
    :param events: the (cycles, instructions) pair to count. The tests and the benchmark pass
        software events here where the host has no PMU; the series names do not change.
    :param cpus: the CPUs to count on; default the host's online CPUs, read at each window.
    :param reprobe_interval: seconds between probes while unsupported.
    """

    def __init__(
        self,
        host: Host,
        *,
        step: float = 1.0,
        period: float = DEFAULT_PERIOD,
        window: float = DEFAULT_WINDOW,
        opener: PerfOpener | None = None,
        events: tuple[PerfEvent, PerfEvent] = (CYCLES, INSTRUCTIONS),
        cpus: OnlineCpus | None = None,
        reprobe_interval: float = REPROBE_INTERVAL,
    ) -> None:
        if not (period > 0 and 0 < window <= period):
            raise ConfigError(
                f"need 0 < window <= period, got window {window!r} s, period {period!r} s",
                field="collect.cpi_window",
            )
        self.name = NAME
        self.interval = step
        self._host = host
        self._period = period
        self._window = window
        self._tolerance = step / 2
        self._opener = opener
        self._events = events
        self._cpus = cpus or online_cpus_reader(host)
        self._reprobe = reprobe_interval
        self._targets = TargetCache()
        self._support: PerfSupport | None = None
        self._next_probe = 0.0
        self._next_start: float | None = None
        self._window_end: float | None = None
        self._counting: dict[str, _Counting] = {}
        self._open_failures: list[HostError] = []
        self._failing = False

    @property
    def support(self) -> PerfSupport | None:
        """The last probe's answer; None before the first step."""
        return self._support

    @property
    def fd_count(self) -> int:
        """Perf descriptors held now (none outside a window)."""
        return sum(c.counters.fd_count for c in self._counting.values())

    def collect(self, tick: Tick) -> CollectResult:
        now = tick.now
        samples: list[Sample] = []
        if self._window_end is not None:
            if self._targets.refresh(tick.workloads):
                self._drop_departed()
            if now < self._window_end - self._tolerance:
                return CollectResult()
            self._window_end = None
            samples = self._finish()
        if self._next_start is not None and now < self._next_start - self._tolerance:
            return CollectResult(samples=samples)
        reason = self._unsupported(now)
        if reason:
            self._next_start = None  # start as soon as a probe succeeds
            return CollectResult(samples=samples, unsupported={SOURCE: reason})
        self._start(tick)
        self._next_start = now + self._period
        self._window_end = now + self._window
        return CollectResult(samples=samples)

    def close(self) -> None:
        """Close every descriptor and forget the window (daemon stop, after the last step)."""
        self._close_counting()
        self._window_end = None
        self._next_start = None

    def _close_counting(self) -> None:
        counting, self._counting = self._counting, {}
        for c in counting.values():
            c.counters.close()

    # Support ------------------------------------------------------------------------------------

    def _unsupported(self, now: float) -> str:
        support = self._support
        if support is None or (not support.supported and now >= self._next_probe):
            support = self._support = self._probe()
            self._next_probe = now + self._reprobe
            logger.debug("%s: probed perf counters: %s", NAME, support.reason)
        return "" if support.supported else support.reason

    def _probe(self) -> PerfSupport:
        why = cgroup_mode_unsupported(self._host.layout)
        if why:
            return PerfSupport(False, why)
        if self._opener is None:
            try:
                self._opener = SyscallOpener()
            except HostError as err:
                return PerfSupport(False, str(err))
        try:
            cpu = self._cpus()[0]
        except HostError as err:
            return PerfSupport(False, f"no CPU to probe on: {err}")
        return probe_events(self._events, self._opener, cpu=cpu)

    # The window ---------------------------------------------------------------------------------

    def _start(self, tick: Tick) -> None:
        assert self._opener is not None  # set by a successful probe
        self._close_counting()  # nothing is left open unless a previous start raised midway
        cpus = self._cpus()
        self._targets.refresh(tick.workloads)
        layout = self._host.layout
        gone = 0
        failed: list[HostError] = []
        for target in self._targets.plan:
            if target.is_pod:
                continue
            path = layout.abs_dir("perf_event", target.rel)
            try:
                counters = CgroupCounters.open(self._opener, path, cpus, self._events)
            except CgroupGoneError:
                gone += 1
                continue
            except HostError as err:
                failed.append(err)
                continue
            try:
                counters.start()
            except HostError as err:
                counters.close()
                failed.append(err)
                continue
            self._counting[target.entity] = _Counting(
                counters,
                SeriesKey(CONTAINER_CPI_CYCLES, target.entity),
                SeriesKey(CONTAINER_CPI_INSTRUCTIONS, target.entity),
            )
        self._open_failures = failed
        logger.debug(
            "%s: counting %d containers on %d CPUs (%d descriptors); %d vanished, %d failed",
            NAME,
            len(self._counting),
            len(cpus),
            self.fd_count,
            gone,
            len(failed),
        )

    def _drop_departed(self) -> None:
        present = {t.entity for t in self._targets.plan}
        for entity in [e for e in self._counting if e not in present]:
            self._counting.pop(entity).counters.close()

    def _finish(self) -> list[Sample]:
        counting, self._counting = self._counting, {}
        samples: list[Sample] = []
        failed, self._open_failures = self._open_failures, []
        idle = 0
        cycles_name, instructions_name = (e.name for e in self._events)
        for c in counting.values():
            try:
                totals = c.counters.read()
            except HostError as err:
                failed.append(err)
                continue
            finally:
                c.counters.close()
            if totals is None:
                idle += 1
                continue
            samples.append(Sample(c.cycles, totals.values[cycles_name]))
            samples.append(Sample(c.instructions, totals.values[instructions_name]))
        logger.debug(
            "%s: window done: %d containers sampled, %d without data, %d failed",
            NAME,
            len(samples) // 2,
            idle,
            len(failed),
        )
        self._note_failures(failed)
        return samples

    def _note_failures(self, failed: list[HostError]) -> None:
        """At most one line per window: a warning when failures start, debug while they go on,
        info when they stop."""
        if not failed:
            if self._failing:
                self._failing = False
                logger.info("%s: every container counted again", NAME)
            return
        first = failed[0]
        hint = " (raise RLIMIT_NOFILE)" if errno_of(first) == errno.EMFILE else ""
        logger.log(
            logging.DEBUG if self._failing else logging.WARNING,
            "%s: no sample for %d containers whose perf counters failed; first: %s%s",
            NAME,
            len(failed),
            first,
            hint,
        )
        self._failing = True


def build(ctx: CollectorContext, interval: float) -> CPICollector:
    """The table's factory: steps every base tick (``interval``, ``collect.res_used_interval``),
    windows from ``collect.cpi_interval`` and ``collect.cpi_window``."""
    collect = ctx.config.collect
    return CPICollector(
        ctx.host, step=interval, period=collect.cpi_interval, window=collect.cpi_window
    )
