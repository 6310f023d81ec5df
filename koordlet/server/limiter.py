"""Admission control for the HTTP server: a bound on what requests may cost the daemon.

The server shares the event loop (and the GIL) with the collection tick's apply step and every
QoS strategy; a request that burns CPU there delays them, and the collection thread's file reads
wait for the GIL behind it. A :class:`RequestLimiter` keeps the requests of one class (probes,
or reads) within two limits:

- **in flight**: at most ``max_in_flight`` requests admitted at once (being served, or waiting
  for CPU budget). One more is answered ``503`` with ``Retry-After`` after a pause of
  ``reject_delay`` seconds, so that a client retrying at once (wrk, a tight loop) cannot turn
  refusals into a busy loop; past ``max_rejecting`` such pauses the refusal is immediate and the
  connection is closed.
- **CPU budget**: a token bucket of thread CPU seconds, refilled at ``cpu_share`` seconds per
  second up to ``burst``. An admitted request waits (sleeping, at no cost) while the bucket is
  empty, at most ``max_wait`` seconds, then gets ``503``. Each request is charged what it cost
  the event loop's thread (``time.thread_time``) while it was served and written, plus
  ``overhead`` for the parsing and dispatch around it.

So over any stretch of time, the requests of a class are charged at most ``cpu_share`` of one
core plus one ``burst``, whatever the load; the ``403``/``404``/``405`` answers are charged like
the rest. What the span does not see (the event loop's and the kernel's socket work, parsing
beyond ``overhead``) is not charged: under ``bench.scrape_load``'s wrk storm the charges were
0.72-0.81 of the daemon's extra CPU, some of the rest being the collection thread's own
slowdown, so the HTTP side stays within about 1.2-1.4 times the share (docs/benchmarks.md).

:class:`LimiterFamilies` serves the limiters' counters on ``/metrics``
(``koordlet_http_requests_served_total``, ``koordlet_http_requests_limited_total``,
``koordlet_http_request_cpu_seconds_total``; docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping

from apis.records import frozen
from koordlet.prom import CounterMetricFamily, Metric

REASONS = ("busy", "budget")
"""Why a request is refused: too many in flight, or no CPU budget within ``max_wait``."""


@frozen
class LimitConfig:
    """The limits of one request class."""

    max_in_flight: int = 8
    """Requests admitted at once (served or waiting for budget); one more is refused."""
    cpu_share: float = 0.1
    """Fraction of one core the class may use on average (0.1: 100 ms of CPU a second)."""
    burst: float = 0.1
    """CPU seconds the bucket holds: what a quiet server may spend at once."""
    max_wait: float = 2.0
    """Seconds an admitted request waits for budget before it is refused."""
    reject_delay: float = 0.5
    """Seconds a refused request is held before its ``503`` (0: at once)."""
    max_rejecting: int = 64
    """Refused requests held at once; past it, refusals are immediate and close the
    connection."""
    retry_after: int = 1
    """The ``Retry-After`` seconds of a ``503``."""
    overhead: float = 150e-6
    """CPU seconds charged per request for what happens outside the measured span (parsing the
    request, the connection's task, the keep-alive bookkeeping). Measured under wrk on this
    project's 2-vCPU machine: about 140 µs a request beyond what the span saw."""

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.max_rejecting < 0:
            raise ValueError("max_in_flight must be at least 1 and max_rejecting at least 0")
        if not 0 < self.cpu_share <= 1 or not self.burst > 0:
            raise ValueError(f"cpu_share must be in (0, 1] and burst positive: {self}")
        if self.max_wait < 0 or self.reject_delay < 0 or self.overhead < 0:
            raise ValueError(f"max_wait, reject_delay and overhead must not be negative: {self}")


@frozen
class Refusal:
    """Why a request was not admitted."""

    reason: str
    """``busy`` (too many in flight) or ``budget`` (no CPU budget within ``max_wait``)."""
    close: bool
    """Close the connection after the answer (immediate refusals past ``max_rejecting``)."""


class RequestLimiter:
    """The limits of :class:`LimitConfig` for one request class; runs on the event loop.

    :param clock: monotonic seconds (the bucket's refill).
    :param cpu_clock: CPU seconds of the calling thread (what a request is charged).
    :param sleep: how to wait.
    """

    def __init__(
        self,
        config: LimitConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._sleep = sleep
        self._tokens = config.burst
        self._refilled_at = clock()
        self.in_flight = 0
        self._rejecting = 0
        self.served = 0
        """Requests admitted and served since start."""
        self.refused: dict[str, int] = dict.fromkeys(REASONS, 0)
        """Requests refused since start, by reason."""
        self.cpu_seconds = 0.0
        """CPU seconds charged since start."""

    def tokens(self) -> float:
        """CPU seconds left in the bucket now (negative: owed)."""
        now = self._clock()
        cfg = self.config
        self._tokens = min(cfg.burst, self._tokens + (now - self._refilled_at) * cfg.cpu_share)
        self._refilled_at = now
        return self._tokens

    async def admit(self) -> Refusal | None:
        """Wait for admission; None when admitted (then call :meth:`release` once done), else
        the refusal to answer with."""
        cfg = self.config
        if self.in_flight >= cfg.max_in_flight:
            self.refused["busy"] += 1
            if self._rejecting >= cfg.max_rejecting or not cfg.reject_delay:
                return Refusal("busy", close=cfg.reject_delay > 0)
            self._rejecting += 1
            try:
                await self._sleep(cfg.reject_delay)
            finally:
                self._rejecting -= 1
            return Refusal("busy", close=False)
        self.in_flight += 1
        deadline = self._clock() + cfg.max_wait
        try:
            while (tokens := self.tokens()) <= 0:
                left = deadline - self._clock()
                if left <= 0:
                    self.refused["budget"] += 1
                    self.in_flight -= 1
                    return Refusal("budget", close=False)
                await self._sleep(min(-tokens / cfg.cpu_share + 1e-3, left))
        except BaseException:
            self.in_flight -= 1
            raise
        return None

    def charge(self, seconds: float) -> None:
        """Take ``seconds`` of CPU (plus the per-request overhead) from the bucket."""
        cost = max(seconds, 0.0) + self.config.overhead
        self.tokens()
        self._tokens -= cost
        self.cpu_seconds += cost

    def release(self, cpu_seconds: float) -> None:
        """An admitted request is done; it cost ``cpu_seconds`` of the loop's thread."""
        self.in_flight -= 1
        self.served += 1
        self.charge(cpu_seconds)

    def cpu_now(self) -> float:
        """The calling thread's CPU seconds (what :meth:`release` expects differences of)."""
        return self._cpu_clock()

    def describe(self) -> dict[str, object]:
        """Counters for ``/debug``."""
        cfg = self.config
        return {
            "max_in_flight": cfg.max_in_flight,
            "cpu_share": cfg.cpu_share,
            "in_flight": self.in_flight,
            "served": self.served,
            "refused": dict(self.refused),
            "cpu_seconds": round(self.cpu_seconds, 6),
            "tokens_s": round(self.tokens(), 6),
        }


class LimiterFamilies:
    """The counters of the limiters, by request class (``reads``, ``probes``), as Prometheus
    families built fresh at each collection (the Collector protocol)."""

    def __init__(self, limiters: Mapping[str, RequestLimiter]) -> None:
        self._limiters = dict(limiters)

    def describe(self) -> list[Metric]:
        """The families without samples, so a registry checks their names at registration."""
        return list(self._families(with_samples=False))

    def collect(self) -> Iterator[Metric]:
        return self._families(with_samples=True)

    def _families(self, *, with_samples: bool) -> Iterator[Metric]:
        served = CounterMetricFamily(
            "koordlet_http_requests_served",
            "HTTP requests admitted by the request limiter and served, by request class",
            labels=["class"],
        )
        limited = CounterMetricFamily(
            "koordlet_http_requests_limited",
            "HTTP requests the request limiter answered 503 with Retry-After, by request class "
            "and reason (busy: too many in flight; budget: no CPU budget in time)",
            labels=["class", "reason"],
        )
        cpu = CounterMetricFamily(
            "koordlet_http_request_cpu_seconds",
            "CPU seconds of the event loop's thread charged to HTTP requests, by request class",
            labels=["class"],
        )
        if with_samples:
            for name, limiter in sorted(self._limiters.items()):
                served.add_metric([name], limiter.served)
                for reason in REASONS:
                    limited.add_metric([name, reason], limiter.refused[reason])
                cpu.add_metric([name], limiter.cpu_seconds)
        yield served
        yield limited
        yield cpu
