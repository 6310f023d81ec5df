"""SIGTERM and SIGINT, one rule for the koordlet, koord-manager and koord-scheduler.

- The **first** SIGTERM or SIGINT asks for a graceful stop: :attr:`StopSignals.stop` is set and
  the binary stops in its own order (the koordlet its stages, within 5 s; an elected binary its
  term, then the Lease: :mod:`kubeclient.elected`).
- A **second** one, while that stop is under way, means now: the log handlers are flushed and
  the process exits at once with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM, as
  a shell reports a process a signal ended), the stop unfinished. A held Lease is then left to
  expire; a cgroup write is one ``write(2)`` of a whole value, so none is left half done.
- Other signals may be routed to handlers of their own with ``also`` (the koordlet's SIGHUP,
  which re-reads the NodeSLO file).

The handlers are installed on the running loop for the body of a ``with`` block; after it each
signal gets back the handler it had. Where the loop cannot take signals (not the main thread) a
warning says so, and the ``stop`` event still stops the binary.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that stop a binary."""


class StopSignals:
    """``with StopSignals() as signals: ... await signals.stop.wait()``."""

    def __init__(
        self,
        stop: asyncio.Event | None = None,
        *,
        also: Mapping[signal.Signals, Callable[[], None]] | None = None,
        exit_now: Callable[[int], object] = os._exit,
    ) -> None:
        self.stop = stop if stop is not None else asyncio.Event()
        """Set by the first SIGTERM or SIGINT."""
        self.received: list[signal.Signals] = []
        """The stop signals received, oldest first."""
        self._also = dict(also or {})
        self._exit_now = exit_now
        self._loop: asyncio.AbstractEventLoop | None = None
        self._installed: dict[signal.Signals, Any] = {}
        """Each signal handled, with the Python-level handler it had before."""

    def __enter__(self) -> StopSignals:
        self._loop = asyncio.get_running_loop()
        handlers: dict[signal.Signals, Callable[[], None]] = {
            sig: functools.partial(self._received, sig) for sig in STOP_SIGNALS
        }
        handlers.update(self._also)
        for sig, handler in handlers.items():
            before = signal.getsignal(sig)
            try:
                self._loop.add_signal_handler(sig, handler)
            except (NotImplementedError, RuntimeError, ValueError) as err:  # not the main thread
                logger.warning("cannot handle %s here (%s); use the stop event", sig.name, err)
                continue
            self._installed[sig] = before
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._loop is not None
        for sig, before in self._installed.items():
            self._loop.remove_signal_handler(sig)
            if before is not None:  # as it was (asyncio.run's own SIGINT handler, say)
                signal.signal(sig, before)
        self._installed.clear()

    def _received(self, sig: signal.Signals) -> None:
        self.received.append(sig)
        if len(self.received) == 1:
            logger.info("%s: stopping (send it again to stop at once)", sig.name)
            self.stop.set()
            return
        code = 128 + sig.value
        logger.warning("%s again: exiting now with %d, the stop unfinished", sig.name, code)
        for handler in logging.getLogger().handlers:
            handler.flush()
        self._exit_now(code)
