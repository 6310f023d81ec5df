"""One armed kernel notification and how the event loop watches it, without polling.

**PSI trigger** (:class:`PsiWatch`). A trigger file reports a firing as ``EPOLLPRI``; asyncio's
``add_reader`` watches ``EPOLLIN`` only, and a pressure file always polls ``EPOLLIN``
(``psi_trigger_poll`` returns ``DEFAULT_POLLMASK``), so the file cannot be handed to the loop
directly. It goes into an epoll set of its own, registered for ``EPOLLPRI``, and that epoll fd is
what the loop watches: it turns readable when the trigger fires.

One epoll set per trigger, not one for all: ``psi_trigger_poll`` clears the trigger's pending
event when it is polled (``kernel/sched/psi.c``), and when the loop's own epoll checks whether
our epoll fd is ready, the kernel polls the items inside it (``__ep_eventpoll_poll`` in
``fs/eventpoll.c``), which consumes the event. A later ``epoll.poll(0)`` on a shared set then
cannot say which trigger fired (measured on Linux 6.18: with two triggers in one set, one of
the two firings of every round went unreported, under asyncio and uvloop alike). With a set per
trigger the readable fd itself names the trigger. The callback still polls its set once, to see
``EPOLLERR``: a trigger whose cgroup was removed polls ``EPOLLERR | EPOLLPRI`` for ever, so it is
dropped at once rather than waking the loop in a spin.

**Memcg threshold** (:class:`MemcgWatch`). The eventfd polls ``EPOLLIN`` on a crossing; the loop
watches it directly and the callback reads it, which resets it. The kernel also signals it once
when the cgroup is removed; a signal on a cgroup that no longer exists is a removal, not a
crossing.
"""

from __future__ import annotations

import os
import select
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from apis.records import frozen
from koordlet.system.psi import drain_eventfd

_GONE_MASK = select.EPOLLERR | select.EPOLLHUP


class EventKind(StrEnum):
    """What kind of notification an event comes from."""

    PSI = "psi"
    """A PSI trigger: stall above the threshold within the window."""
    MEMCG_THRESHOLD = "memcg_threshold"
    """A cgroup v1 memory usage threshold crossed (either way)."""


@frozen
class PressureEvent:
    """One notification, as the subscribers receive it."""

    name: str
    """The watch's name, as given to ``watch_psi`` or ``watch_memcg_threshold``."""
    kind: EventKind
    """Where it comes from."""
    time: float
    """``time.monotonic()`` when the event loop saw it."""
    count: int = 1
    """Notifications folded into this event: an eventfd's counter (crossings since the last
    read); 1 for a PSI trigger, which fires at most once a window."""


@dataclass(eq=False, slots=True)
class Watch:
    """State common to every armed notification."""

    name: str
    """The caller's name for it, unique within a source."""
    path: str
    """The pressure file, or the memory cgroup's folder."""
    spec: str
    """What was armed: ``some 150000 2000000`` or ``threshold 67108864``."""
    armed_at: float
    """``time.monotonic()`` when it was armed."""
    events: int = 0
    """Events delivered so far."""
    last_event: float | None = None
    """``time.monotonic()`` of the last event, or None."""
    fds: list[int] = field(default_factory=list)
    """Descriptors it owns; the first is the one the loop watches."""

    kind = EventKind.PSI

    @property
    def reader_fd(self) -> int:
        return self.fds[0]

    def poll(self) -> tuple[int, bool]:
        """On readability: ``(notifications, gone)``; ``gone`` means the watched object
        disappeared and the watch must be dropped."""
        raise NotImplementedError

    def close(self) -> None:
        """Close every descriptor (idempotent)."""
        while self.fds:
            os.close(self.fds.pop())

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": str(self.kind),
            "path": self.path,
            "spec": self.spec,
            "armed_at": self.armed_at,
            "events": self.events,
            "last_event": self.last_event,
        }


@dataclass(eq=False, slots=True)
class PsiWatch(Watch):
    """A PSI trigger and the epoll set that holds it (see the module docstring)."""

    epoll: select.epoll | None = None

    kind = EventKind.PSI

    @classmethod
    def wrap(cls, name: str, path: str, spec: str, trigger_fd: int, now: float) -> PsiWatch:
        """Take ownership of ``trigger_fd`` (closed here if the epoll set cannot be made)."""
        try:
            epoll = select.epoll(1, select.EPOLL_CLOEXEC)
        except OSError:
            os.close(trigger_fd)
            raise
        try:
            epoll.register(trigger_fd, select.EPOLLPRI)
        except OSError:
            epoll.close()
            os.close(trigger_fd)
            raise
        return cls(name, path, spec, now, fds=[epoll.fileno(), trigger_fd], epoll=epoll)

    def poll(self) -> tuple[int, bool]:
        assert self.epoll is not None
        mask = 0
        for _, events in self.epoll.poll(0):
            mask |= events
        # The loop's readiness check already consumed the EPOLLPRI that woke us (module
        # docstring): being called is the notification; only an error state persists.
        return (0, True) if mask & _GONE_MASK else (1, False)

    def close(self) -> None:
        if self.epoll is not None:
            self.fds.remove(self.epoll.fileno())
            self.epoll.close()
            self.epoll = None
        Watch.close(self)


@dataclass(eq=False, slots=True)
class MemcgWatch(Watch):
    """A memcg v1 usage threshold: the eventfd the kernel signals."""

    kind = EventKind.MEMCG_THRESHOLD

    def poll(self) -> tuple[int, bool]:
        count = drain_eventfd(self.reader_fd)
        if count and not os.path.isdir(self.path):  # kernfs: a stat in memory, no disk
            return 0, True
        return count, False
