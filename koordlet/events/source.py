"""The pressure event source: kernel notifications delivered to subscribers on the event loop.

::

    source = PressureEventSource(privileged=has_cap_sys_resource(paths))
    queue: asyncio.Queue[PressureEvent] = asyncio.Queue(maxsize=1024)
    source.subscribe(queue)
    await source.watch_psi("/proc/pressure/memory", "some", 150_000, 2_000_000, "node-mem")
    await source.watch_memcg_threshold(be_memcg_dir, 8 << 30, "be-memory")
    ...
    source.close()

Nothing polls: every watch is an fd in the loop's own selector (``loop.add_reader``; see
``koordlet.events.watches`` for why each PSI trigger sits in an epoll set of its own). A
notification wakes the loop, which builds one :class:`PressureEvent` and hands it to every
subscriber in subscription order: an ``asyncio.Queue`` gets ``put_nowait`` (a full queue drops
the event, counted and logged once), a callable is called on the loop and must not block.

Arming opens and writes kernel files, so it runs in a worker thread (``run_in_executor``); the
descriptors it made are closed even when the awaiting task is cancelled. A watch that cannot be
armed returns False: when the host cannot do it (``EINVAL`` for an unprivileged window,
``EOPNOTSUPP``, no such file) the reason is kept in :attr:`PressureEventSource.unsupported`
and logged once; a cgroup that vanished is a debug line. A watch whose cgroup disappears later
is dropped the same way, and its fds closed. :meth:`PressureEventSource.close` closes them all.

The source belongs to one event loop (the first that arms a watch) and is not thread-safe.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any

from koordlet.errors import CgroupGoneError, InvalidValueError, KoordletError, UnsupportedError
from koordlet.events.watches import EventKind, MemcgWatch, PressureEvent, PsiWatch, Watch
from koordlet.system.psi import arm_memcg_threshold, open_psi_trigger, trigger_spec

logger = logging.getLogger(__name__)

Subscriber = Callable[[PressureEvent], object] | asyncio.Queue[PressureEvent]
"""A callable run on the loop for each event, or a queue that receives them."""

__all__ = ["EventKind", "PressureEvent", "PressureEventSource", "Subscriber"]


class PressureEventSource:
    """Arms PSI triggers and memcg thresholds and delivers their events; see the module docstring.

    :param privileged: whether this process holds ``CAP_SYS_RESOURCE`` (None: unknown), from
        ``koordlet.system.psi.has_cap_sys_resource``; only makes refusal reasons precise.
    :param clock: the monotonic clock stamped on events.
    :param executor: where arming runs; None: the loop's default executor.
    """

    def __init__(
        self,
        *,
        privileged: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        executor: Executor | None = None,
    ) -> None:
        self._privileged = privileged
        self._clock = clock
        self._executor = executor
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watches: dict[str, Watch] = {}
        self._arming: dict[str, bool] = {}
        """Names being armed → False once ``unwatch`` cancelled them."""
        self._subscribers: list[Subscriber] = []
        self._unsupported: dict[str, str] = {}
        self._armed_once: set[str] = set()
        self._lost: dict[str, str] = {}
        self._logged: set[tuple[str, str]] = set()
        self._dropped = 0
        self._closed = False

    # Subscribers ----------------------------------------------------------------------------------

    def subscribe(self, target: Subscriber) -> Callable[[], None]:
        """Deliver every later event to ``target``; returns the function that unsubscribes it."""
        if self._closed:
            raise KoordletError("the pressure event source is closed")
        self._subscribers.append(target)

        def unsubscribe() -> None:
            if target in self._subscribers:
                self._subscribers.remove(target)

        return unsubscribe

    # Watches --------------------------------------------------------------------------------------

    async def watch_psi(
        self, path: str, kind: str, stall_us: int, window_us: int, name: str
    ) -> bool:
        """Arm a PSI trigger on pressure file ``path`` (``/proc/pressure/memory``, a cgroup's
        ``cpu.pressure``): an event each time ``kind`` (``"some"`` or ``"full"``) stall exceeds
        ``stall_us`` within ``window_us``, at most once a window.

        True when armed; False when this host cannot (reason in :attr:`unsupported`) or the
        cgroup is gone. :class:`InvalidValueError` for arguments no kernel accepts (window
        outside 0.5..10 s, stall not within the window) and for a name already in use.
        """
        spec = trigger_spec(kind, stall_us, window_us).rstrip(b"\0").decode()
        arm = functools.partial(
            open_psi_trigger, path, kind, stall_us, window_us, privileged=self._privileged
        )

        def build(fd: int) -> Watch:
            return PsiWatch.wrap(name, path, spec, fd, self._clock())

        return await self._watch(name, path, arm, build)

    async def watch_memcg_threshold(
        self, cgroup_abs_dir: str, threshold_bytes: int, name: str
    ) -> bool:
        """Register a cgroup v1 memory threshold on the memory cgroup folder ``cgroup_abs_dir``:
        an event each time its usage (``memory.usage_in_bytes``) crosses ``threshold_bytes``,
        upwards or downwards. Returns as :meth:`watch_psi` does."""
        if threshold_bytes < 1:
            raise InvalidValueError(f"memcg threshold must be positive, not {threshold_bytes}")
        arm = functools.partial(arm_memcg_threshold, cgroup_abs_dir, threshold_bytes)

        def build(fd: int) -> Watch:
            spec = f"threshold {threshold_bytes}"
            return MemcgWatch(name, cgroup_abs_dir, spec, self._clock(), fds=[fd])

        return await self._watch(name, cgroup_abs_dir, arm, build)

    async def _watch(
        self, name: str, path: str, arm: Callable[[], int], build: Callable[[int], Watch]
    ) -> bool:
        loop = self._bind_loop()
        if name in self._watches or name in self._arming:
            raise InvalidValueError(f"a pressure watch named {name!r} already exists")
        self._arming[name] = True
        future = loop.run_in_executor(self._executor, arm)
        try:
            fd = await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(_close_result)  # the thread may still open the fd
            raise
        except UnsupportedError as err:
            self._note_unsupported(name, err.reason)
            return False
        except CgroupGoneError as err:
            logger.debug("pressure watch %s not armed, cgroup gone: %s", name, err)
            return False
        finally:
            wanted = self._arming.pop(name, False)
        if self._closed or not wanted:
            os.close(fd)
            return False
        try:
            watch = build(fd)  # closes fd when it fails
        except OSError as err:
            # epoll refuses a file that is no pressure file (EPERM on a plain file: a fake or
            # read-only tree): the host cannot watch it, not a fault of this round.
            self._note_unsupported(name, f"{path} cannot be watched: {err.strerror or err}")
            return False
        try:
            loop.add_reader(watch.reader_fd, self._on_ready, watch)
        except BaseException:
            watch.close()
            raise
        self._watches[name] = watch
        self._unsupported.pop(name, None)
        self._armed_once.add(name)
        self._lost.pop(name, None)
        logger.info("pressure watch %s armed: %s on %s", name, watch.spec, path)
        return True

    def unwatch(self, name: str) -> bool:
        """Disarm and forget the watch ``name``; False when there is none. A watch still being
        armed is disarmed as soon as arming finishes."""
        if name in self._arming:
            self._arming[name] = False
            return True
        self._unsupported.pop(name, None)
        watch = self._watches.pop(name, None)
        if watch is None:
            return False
        self._disarm(watch)
        return True

    def close(self) -> None:
        """Disarm every watch, close every fd, forget the subscribers. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for name in list(self._arming):
            self._arming[name] = False
        watches, self._watches = list(self._watches.values()), {}
        for watch in watches:
            self._disarm(watch)
        self._subscribers.clear()
        if watches:
            logger.info("pressure event source closed, %d watches disarmed", len(watches))

    # State ----------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def watches(self) -> tuple[str, ...]:
        """Names of the armed watches."""
        return tuple(self._watches)

    @property
    def lost(self) -> Mapping[str, str]:
        """Watch name → reason, for the watches that were armed once and that this host refused
        when armed again (a capability lost since start)."""
        return dict(self._lost)

    @property
    def unsupported(self) -> Mapping[str, str]:
        """Watch name → why this host could not arm it (until armed or unwatched)."""
        return dict(self._unsupported)

    @property
    def dropped(self) -> int:
        """Events a full subscriber queue did not take."""
        return self._dropped

    def describe(self) -> dict[str, Any]:
        """Plain data for ``/debug``."""
        return {
            "watches": [w.describe() for w in self._watches.values()],
            "unsupported": dict(self._unsupported),
            "subscribers": len(self._subscribers),
            "dropped": self._dropped,
        }

    # Internals ------------------------------------------------------------------------------------

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        if self._closed:
            raise KoordletError("the pressure event source is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise KoordletError("the pressure event source belongs to another event loop")
        return loop

    def _disarm(self, watch: Watch) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(watch.reader_fd)
        watch.close()

    def _note_unsupported(self, name: str, reason: str) -> None:
        self._unsupported[name] = reason
        if name in self._armed_once:
            self._lost[name] = reason
        if (name, reason) in self._logged:
            logger.debug("pressure watch %s still unsupported: %s", name, reason)
            return
        self._logged.add((name, reason))
        logger.warning("pressure watch %s unsupported: %s", name, reason)

    def _on_ready(self, watch: Watch) -> None:
        count, gone = watch.poll()
        if gone:
            logger.info("pressure watch %s dropped: %s went away", watch.name, watch.path)
            if self._watches.get(watch.name) is watch:
                del self._watches[watch.name]
            self._disarm(watch)
            return
        if count:
            self._emit(watch, count)

    def _emit(self, watch: Watch, count: int) -> None:
        event = PressureEvent(watch.name, watch.kind, self._clock(), count)
        watch.events += 1
        watch.last_event = event.time
        for target in tuple(self._subscribers):
            if isinstance(target, asyncio.Queue):
                try:
                    target.put_nowait(event)
                except asyncio.QueueFull:
                    self._dropped += 1
                    if self._dropped == 1:
                        logger.warning("a pressure event subscriber's queue is full; dropping")
                continue
            try:
                target(event)
            except Exception:  # a subscriber's bug must not starve the others
                logger.exception("pressure event subscriber %r failed on %s", target, event.name)


def _close_result(future: asyncio.Future[int]) -> None:
    """Close the fd an arming made after its caller was cancelled."""
    if not future.cancelled() and future.exception() is None:
        os.close(future.result())
