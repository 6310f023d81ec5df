"""systemd's readiness and watchdog protocol (``sd_notify(3)``), without a dependency.

A ``Type=notify`` unit gets ``$NOTIFY_SOCKET``: the path of a unix datagram socket, or an
abstract-namespace name written with a leading ``@``. Each message is one datagram of
newline-separated ``KEY=VALUE`` assignments::

    READY=1          start-up finished (systemd then starts what is ordered after the unit)
    STATUS=...       one line shown by ``systemctl status``
    STOPPING=1       the service is shutting down
    WATCHDOG=1       keep-alive; needed at least every ``$WATCHDOG_USEC`` microseconds

Without ``$NOTIFY_SOCKET`` (run by hand, in a container, in tests) every call is a no-op that
returns False. A send that fails (systemd gone, socket full) is logged once and never raises: the
agent keeps working when its supervisor cannot be told.

The watchdog: :func:`watchdog_interval` reads ``$WATCHDOG_USEC`` (honouring ``$WATCHDOG_PID``,
which names the one process meant to ping) and answers half of it, as ``sd_watchdog_enabled(3)``
advises. :class:`Watchdog` pings from the event loop itself, so a loop that is blocked or wedged
stops the pings and systemd restarts the unit; a ``healthy`` callback can withhold a ping for a
loop that runs but no longer does its work.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping

logger = logging.getLogger(__name__)

NOTIFY_SOCKET = "NOTIFY_SOCKET"
"""Environment variable with the notification socket (path, or ``@name`` for abstract)."""
WATCHDOG_USEC = "WATCHDOG_USEC"
"""Environment variable with the watchdog timeout in microseconds (``WatchdogSec=``)."""
WATCHDOG_PID = "WATCHDOG_PID"
"""Environment variable naming the process the watchdog timeout is meant for."""


def _address(raw: str) -> str | bytes:
    """The ``sendto`` address of ``$NOTIFY_SOCKET``: a leading ``@`` means the abstract
    namespace, whose name starts with a NUL byte."""
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()
    return raw


class Notifier:
    """Sends ``sd_notify`` messages to ``$NOTIFY_SOCKET``; see the module docstring.

    :param environ: where ``NOTIFY_SOCKET`` is read (default ``os.environ``); read once here.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw = env.get(NOTIFY_SOCKET, "")
        self.socket_name = raw
        """``$NOTIFY_SOCKET`` as given; empty when unset."""
        self._address: str | bytes | None = _address(raw) if raw.startswith(("/", "@")) else None
        if raw and self._address is None:
            logger.warning("ignoring NOTIFY_SOCKET=%r: neither an absolute path nor @name", raw)
        self._warned = False

    @property
    def enabled(self) -> bool:
        """Whether a notification socket is configured."""
        return self._address is not None

    def notify(self, *assignments: str) -> bool:
        """Send ``assignments`` (``"READY=1"``, ...) in one datagram; True when it was sent.

        A no-op without a socket. A failed send is logged (once, then at debug level) and
        answered False; it never raises.
        """
        if self._address is None or not assignments:
            return False
        for item in assignments:
            if "=" not in item or "\n" in item:
                raise ValueError(f"not a single KEY=VALUE assignment: {item!r}")
        message = "\n".join(assignments).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message, self._address)
        except OSError as err:
            level = logging.DEBUG if self._warned else logging.WARNING
            self._warned = True
            logger.log(level, "sd_notify to %s failed: %s", self.socket_name, err)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """``READY=1``, with a ``STATUS=`` line when given."""
        return self.notify("READY=1", *self._status(status))

    def stopping(self, status: str | None = None) -> bool:
        """``STOPPING=1``, with a ``STATUS=`` line when given."""
        return self.notify("STOPPING=1", *self._status(status))

    def status(self, text: str) -> bool:
        """``STATUS=<text>`` (newlines become spaces)."""
        return self.notify(*self._status(text))

    def watchdog(self) -> bool:
        """``WATCHDOG=1``: one keep-alive."""
        return self.notify("WATCHDOG=1")

    @staticmethod
    def _status(text: str | None) -> tuple[str, ...]:
        if text is None:
            return ()
        return ("STATUS=" + " ".join(text.splitlines()),)


def watchdog_interval(
    environ: Mapping[str, str] | None = None, *, pid: int | None = None
) -> float | None:
    """Seconds between keep-alives: half of ``$WATCHDOG_USEC``; None when the watchdog is off.

    Off when ``WATCHDOG_USEC`` is unset, not a positive integer, or ``WATCHDOG_PID`` names
    another process than ``pid`` (default this one), as ``sd_watchdog_enabled(3)`` decides.
    """
    env = os.environ if environ is None else environ
    raw = env.get(WATCHDOG_USEC, "").strip()
    if not raw:
        return None
    try:
        usec = int(raw)
    except ValueError:
        logger.warning("ignoring %s=%r: not an integer", WATCHDOG_USEC, raw)
        return None
    if usec <= 0:
        return None
    owner = env.get(WATCHDOG_PID, "").strip()
    if owner:
        me = os.getpid() if pid is None else pid
        if owner != str(me):
            return None
    return usec / 2 / 1_000_000


class Watchdog:
    """Pings systemd's watchdog from the event loop while the agent is healthy.

    :param notifier: where the pings go.
    :param interval: seconds between pings (see :func:`watchdog_interval`).
    :param healthy: asked before each ping; a False answer withholds it (logged once per
        unhealthy spell), so that systemd restarts a daemon that runs but no longer works.
    :param sleep: ``asyncio.sleep`` unless a test drives time.
    """

    def __init__(
        self,
        notifier: Notifier,
        interval: float,
        *,
        healthy: Callable[[], bool] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"watchdog interval must be positive, got {interval}")
        self.notifier = notifier
        self.interval = interval
        self._healthy = healthy
        self._sleep = sleep
        self._withholding = False
        self.pings = 0
        """Keep-alives sent so far."""

    @classmethod
    def from_environ(
        cls,
        notifier: Notifier,
        environ: Mapping[str, str] | None = None,
        *,
        healthy: Callable[[], bool] | None = None,
    ) -> Watchdog | None:
        """The watchdog systemd asked for, or None when it asked for none (or cannot be told)."""
        interval = watchdog_interval(environ)
        if interval is None or not notifier.enabled:
            return None
        return cls(notifier, interval, healthy=healthy)

    async def step(self) -> None:
        """One ping, unless ``healthy`` says no. For ``Supervisor.spawn_loop`` at
        :attr:`interval`."""
        if self._healthy is not None and not self._healthy():
            if not self._withholding:
                logger.error(
                    "watchdog: the agent is unhealthy; withholding keep-alives so that "
                    "systemd restarts it"
                )
            self._withholding = True
            return
        if self._withholding:
            logger.info("watchdog: healthy again; keep-alives resumed")
            self._withholding = False
        if self.notifier.watchdog():
            self.pings += 1

    async def run(self) -> None:
        """Ping every :attr:`interval` seconds until cancelled (an eternal task)."""
        while True:
            await self.step()
            await self._sleep(self.interval)
