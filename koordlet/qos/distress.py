"""Memory distress: the kernel's own signs of a memory shortage, as a memory eviction trigger.

Koordinator evicts BE pods on a usage threshold only (``memoryEvictThresholdPercent``). Usage
says nothing of how hard the kernel works to keep it there: a node can thrash below the
threshold (page cache churned, refaults, tasks stalled in reclaim). Katalyst and the kubelet also
watch the kernel's distress; here two signals, each with its own hysteresis, make memory eviction
evict BE pods while either is on (``koordlet.qos.memoryevict``; docs/qos-eviction.md):

- **PSI full**: the percent of wall time during which every non-idle task was stalled on memory
  at once, over the last ``window`` seconds, from the ``full`` ``total`` of
  ``/proc/pressure/memory`` (µs, brought up to date at each read, unlike ``avg10`` which moves
  every 2 s);
- **reclaim rate**: pages scanned by reclaim per second over the window, from the ``pgscan_*``
  counters of ``/proc/vmstat`` (global reclaim; a cgroup reclaiming at its own limit is not
  counted there).

Hysteresis (:class:`Hysteresis`): a signal turns **on** when it has been at or above its ``on``
threshold for ``sustain`` seconds, and **off** as soon as it is below its ``off`` threshold
(``off < on``); between the two it keeps its state, so a signal hovering around one threshold
does not flap. A threshold of 0 disables that signal; both 0 (the default) disables the trigger.

:class:`DistressMonitor` samples both counters every ``interval`` seconds through the collector
runner's on-demand read (``noderesource.MEMORY_DISTRESS``), never a file of its own, in one named
task that the strategy owns; when the trigger turns on it calls the strategy back at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from apis.records import frozen
from koordlet.collectors.noderesource import DistressReading
from koordlet.config import QoSConfig
from koordlet.errors import HostError

logger = logging.getLogger(__name__)

PSI_FULL = "psi_full"
"""The PSI signal's name (``koordlet_memory_distress{signal}``, ``/debug/qos``)."""
RECLAIM = "reclaim"
"""The reclaim-rate signal's name."""
MIN_SPAN_FRACTION = 0.5
"""A rate needs readings spanning at least this fraction of the window (after start or a
counter reset, the first half window has no rate)."""


@frozen
class DistressConfig:
    """The distress trigger's settings (``qos.memoryDistress*``, ours; docs/configuration.md)."""

    psi_full_on: float = 0.0
    """Percent of wall time in ``full`` memory stall over the window that turns the PSI signal
    on; 0: no PSI signal."""
    psi_full_off: float = 0.0
    """Below this percent the PSI signal turns off (< ``psi_full_on``; the configuration's 0
    means half of ``psi_full_on``)."""
    reclaim_on: float = 0.0
    """Pages scanned per second by reclaim that turn the reclaim signal on; 0: none."""
    reclaim_off: float = 0.0
    """Below this rate the reclaim signal turns off (< ``reclaim_on``; the configuration's 0
    means half of ``reclaim_on``)."""
    window: float = 0.5
    """Seconds over which both rates are computed."""
    sustain: float = 0.0
    """Seconds a signal must stay at or above ``on`` before it turns on."""
    interval: float = 0.1
    """Seconds between two samples while the trigger is enabled."""

    @property
    def enabled(self) -> bool:
        """Whether any signal has an ``on`` threshold."""
        return self.psi_full_on > 0 or self.reclaim_on > 0

    @classmethod
    def of(cls, q: QoSConfig) -> DistressConfig:
        """From the ``qos`` configuration (checked there: ``off < on``, positive durations); an
        ``off`` of 0 is half of ``on``."""
        psi_on, reclaim_on = q.memory_distress_psi_full_on, q.memory_distress_reclaim_on
        return cls(
            psi_full_on=psi_on,
            psi_full_off=q.memory_distress_psi_full_off or psi_on / 2,
            reclaim_on=reclaim_on,
            reclaim_off=q.memory_distress_reclaim_off or reclaim_on / 2,
            window=q.memory_distress_window,
            sustain=q.memory_distress_sustain,
            interval=q.memory_distress_interval,
        )


class RateWindow:
    """The rate per second of a cumulative counter over the last ``window`` seconds."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._points: deque[tuple[float, int]] = deque()
        self._rate: float | None = None

    def add(self, at: float, value: int) -> float | None:
        """Add a reading; the rate over the window, None until the readings span enough of it.
        A reading no newer than the last is ignored; a counter that went backwards (it cannot,
        short of a reboot under us) starts over."""
        points = self._points
        if points and at <= points[-1][0]:
            return self._rate
        if points and value < points[-1][1]:
            points.clear()
        points.append((at, value))
        cutoff = at - self.window
        while len(points) > 2 and points[1][0] <= cutoff:  # keep one reading at or before it
            points.popleft()
        first_at, first = points[0]
        span = at - first_at
        self._rate = None if span < self.window * MIN_SPAN_FRACTION else (value - first) / span
        return self._rate


class Hysteresis:
    """One signal's state: on at or above ``on`` for ``sustain`` seconds, off below ``off``."""

    def __init__(self, on: float, off: float, sustain: float) -> None:
        self.on, self.off, self.sustain = on, off, sustain
        self.active = False
        """Whether the signal is on."""
        self.since: float | None = None
        """Monotonic seconds when it last turned on."""
        self.value: float | None = None
        """The last value seen (None: no reading)."""
        self._above_since: float | None = None

    def update(self, value: float | None, now: float) -> bool:
        """Feed one value (None: no signal, which turns it off); True when it just turned on."""
        self.value = value
        if value is None or value < self.off:
            self.active = False
            self._above_since = None
            return False
        if value < self.on:
            self._above_since = None
            return False
        if self._above_since is None:
            self._above_since = now
        if not self.active and now - self._above_since >= self.sustain:
            self.active = True
            self.since = now
            return True
        return False


class DistressMonitor:
    """Samples the distress counters and keeps the two signals (see the module docstring).

    :param read: the on-demand read (``lambda: ctx.read_now(MEMORY_DISTRESS)``).
    :param on_active: called on the event loop when the trigger turns on.
    """

    def __init__(
        self,
        config: DistressConfig,
        read: Callable[[], Awaitable[DistressReading]],
        on_active: Callable[[], None],
        *,
        name: str = "qos/memoryevict-distress",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._read = read
        self._on_active = on_active
        self._name = name
        self._clock = clock
        self._rates = {PSI_FULL: RateWindow(config.window), RECLAIM: RateWindow(config.window)}
        self.signals: dict[str, Hysteresis] = {}
        """The enabled signals by name."""
        if config.psi_full_on > 0:
            self.signals[PSI_FULL] = Hysteresis(
                config.psi_full_on, config.psi_full_off, config.sustain
            )
        if config.reclaim_on > 0:
            self.signals[RECLAIM] = Hysteresis(
                config.reclaim_on, config.reclaim_off, config.sustain
            )
        self.unsupported: dict[str, str] = {}
        """Signal → why this host cannot give it (no PSI)."""
        self.samples = 0
        """Readings taken."""
        self.errors = 0
        """Readings that failed."""
        self.last: DistressReading | None = None
        self._task: asyncio.Task[None] | None = None
        self._logged_error = False

    @property
    def active(self) -> bool:
        """Whether any signal is on."""
        return any(s.active for s in self.signals.values())

    def why(self) -> str:
        """The signals that are on, with their values (``psi full 12.3% >= 10% over 0.5s``)."""
        parts = []
        window = f"over {self.config.window:g}s"
        for name, s in self.signals.items():
            if s.active and s.value is not None:
                if name == PSI_FULL:
                    parts.append(f"memory PSI full {s.value:.1f}% >= {s.on:g}% {window}")
                else:
                    parts.append(f"reclaim {s.value:.0f} pages/s >= {s.on:g} {window}")
        return "; ".join(parts)

    # Sampling ---------------------------------------------------------------------------------

    def observe(self, reading: DistressReading) -> bool:
        """Feed one reading; True when the trigger just turned on."""
        self.samples += 1
        self.last = reading
        at = reading.at
        values: dict[str, float | None] = {}
        if reading.psi_full_us is None:
            self.unsupported[PSI_FULL] = reading.psi_error or "no full line in the pressure file"
            values[PSI_FULL] = None
        else:
            rate = self._rates[PSI_FULL].add(at, reading.psi_full_us)
            values[PSI_FULL] = None if rate is None else rate / 1e4  # µs/s -> percent
        values[RECLAIM] = self._rates[RECLAIM].add(at, reading.vmstat.pgscan)
        was = self.active
        for name, signal in self.signals.items():
            if signal.update(values[name], at):
                logger.info("memory distress: %s on (%s)", name, self.why())
        if was and not self.active:
            logger.info("memory distress: off")
        return self.active and not was

    async def step(self) -> None:
        """One sample; calls ``on_active`` when the trigger turns on."""
        try:
            reading = await self._read()
        except HostError as err:
            self.errors += 1
            if not self._logged_error:
                self._logged_error = True
                logger.warning("memory distress: reading the counters failed: %s", err)
            for signal in self.signals.values():
                signal.update(None, self._clock())
            return
        if self.observe(reading):
            self._on_active()

    def start(self) -> None:
        """Start sampling in an owned task (idempotent; not when no signal is enabled)."""
        if self._task is None and self.signals:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def _run(self) -> None:
        interval = self.config.interval
        next_at = self._clock()
        while True:
            try:
                await self.step()
            except Exception:  # a task of our own: log, keep sampling
                logger.exception("memory distress: sampling failed")
            next_at += interval
            delay = next_at - self._clock()
            if delay < 0:  # late (a busy loop): skip the missed samples, no burst
                next_at = self._clock()
                delay = 0.0
            await asyncio.sleep(delay)

    async def close(self) -> None:
        """Stop sampling."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def describe(self) -> dict[str, Any]:
        """Plain data for ``/debug/qos``."""
        last = self.last
        return {
            "active": self.active,
            "why": self.why(),
            "window_s": self.config.window,
            "interval_s": self.config.interval,
            "sustain_s": self.config.sustain,
            "signals": {
                name: {
                    "value": None if s.value is None else round(s.value, 3),
                    "on": s.on,
                    "off": s.off,
                    "active": s.active,
                    "since": s.since,
                }
                for name, s in self.signals.items()
            },
            "unsupported": dict(self.unsupported),
            "samples": self.samples,
            "errors": self.errors,
            "last": None
            if last is None
            else {
                "psi_full_us": last.psi_full_us,
                "psi_some_us": last.psi_some_us,
                "pgscan": last.vmstat.pgscan,
                "pgsteal": last.vmstat.pgsteal,
                "pgscan_direct": last.vmstat.pgscan_direct,
                "refault": last.vmstat.refault,
            },
        }
