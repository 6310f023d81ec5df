"""Memory eviction's pressure watch: what wakes a round between ticks (the strategy,
:mod:`koordlet.qos.memoryevict`, runs the round; docs/qos-eviction.md has the details).

On cgroup v1 a memcg threshold on the kubepods memory cgroup at the kubepods usage that puts the
node at the threshold (re-armed when that value moves by more than 1% of capacity); on cgroup v2,
or where the threshold cannot be armed, a PSI trigger on the node's memory pressure (only where
the start-up probe found PSI triggers supported). Nothing is armed while the NodeSLO disables
eviction, its thresholds are invalid, or the capacity or the node's usage is unknown.
"""

from __future__ import annotations

from collections.abc import Callable

from koordlet.events.watches import PressureEvent
from koordlet.metriccache import series
from koordlet.qos.framework import StrategyContext
from koordlet.qos.memoryrules import MemoryEvictSettings, used_thresholds
from koordlet.qos.shared import InvalidThreshold
from koordlet.system.cgroups import CgroupVersion

WATCH_NAME = "memoryevict"
"""Name of memory eviction's pressure watch (the event source's key)."""
PSI_STALL_US = 100_000
PSI_WINDOW_US = 2_000_000
"""PSI wake-up: 100 ms of ``some`` memory stall within 2 s (2 s: allowed without
CAP_SYS_RESOURCE)."""
REARM_FRACTION = 0.01
"""Re-arm the memcg threshold when its target moves by more than this fraction of capacity."""


class PressureWatch:
    """The memcg threshold or PSI trigger memory eviction arms (see the module docstring).

    :param settings: the memory eviction settings of the NodeSLO in force.
    :param capacity: node memory capacity in bytes, or None while unknown.
    :param on_pressure: called on the event loop when the watch fires.
    :param watch_dir: the memory cgroup folder to arm the threshold on; None: the kubepods root.
    """

    def __init__(
        self,
        ctx: StrategyContext,
        settings: Callable[[], MemoryEvictSettings],
        capacity: Callable[[], int | None],
        on_pressure: Callable[[], None],
        watch_dir: str | None = None,
    ) -> None:
        self._ctx = ctx
        self._settings = settings
        self._capacity = capacity
        self._on_pressure = on_pressure
        self._watch_dir = watch_dir
        self.armed: tuple[str, str, int] | None = None
        """``(kind, path, threshold)`` armed now; None: nothing."""
        self._unsubscribe: Callable[[], None] | None = None
        self._memcg_refused = False
        self.unsupported_note = ""
        """Why no PSI trigger is armed, when the start-up probe found them unsupported."""

    def desired(self) -> tuple[str, str, int] | None:
        """``(kind, path, threshold)`` memory eviction wants armed now, or None."""
        ctx = self._ctx
        if ctx.events is None:
            return None
        host = ctx.host()
        settings = self._settings()
        if not settings.enabled:
            return None
        if host.layout.version is CgroupVersion.V2 or self._memcg_refused:
            caps = ctx.capabilities
            if caps is not None and "psi_trigger" in caps and not caps.supported("psi_trigger"):
                # Arm only what the start-up probe found working (on a fake tree the write
                # lands in a plain file, which epoll then refuses every round).
                self.unsupported_note = f"psi_trigger unsupported: {caps['psi_trigger'].reason}"
                return None
            return ("psi", host.paths.proc("pressure", "memory"), PSI_STALL_US)
        try:
            threshold, _ = used_thresholds(settings.threshold, settings.lower)
        except InvalidThreshold:
            return None
        capacity = self._capacity()
        node = ctx.fresh_last(series.NODE_MEMORY_USAGE, series.NODE)
        if not capacity or node is None:
            return None
        pods = ctx.workloads().pods
        kube = 0.0
        for uid in pods:
            v = ctx.fresh_last(series.POD_MEMORY_WITH_PAGE_CACHE, series.pod_entity(uid))
            kube += v or 0.0
        # Pods grow both the node's usage and kubepods' memcg usage by the same bytes: the node
        # crosses its threshold when kubepods reaches this value.
        target = int(capacity * threshold / 100 - (node - kube))
        target = max(target, 1 << 20)
        folder = self._watch_dir or host.layout.abs_dir("memory", host.layout.kube_root)
        return ("memcg", folder, target)

    async def arm(self) -> None:
        """Subscribe to the event source once, then arm, re-arm or disarm the watch as
        :meth:`desired` says (a memcg target that moved by at most 1% of capacity is kept)."""
        events = self._ctx.events
        if events is None:
            return
        if self._unsubscribe is None:
            self._unsubscribe = events.subscribe(self._on_event)
        want = self.desired()
        have = self.armed
        if want == have:
            return
        if want is not None and have is not None and want[:2] == have[:2] and want[0] == "memcg":
            capacity = self._capacity() or 0
            if abs(want[2] - have[2]) <= capacity * REARM_FRACTION:
                return
        if have is not None:
            events.unwatch(WATCH_NAME)
            self.armed = None
        if want is None:
            return
        kind, path, value = want
        if kind == "memcg":
            ok = await events.watch_memcg_threshold(path, value, WATCH_NAME)
            if not ok and WATCH_NAME in events.unsupported:
                self._memcg_refused = True  # the host cannot: PSI from the next tick on
        else:
            ok = await events.watch_psi(path, "some", value, PSI_WINDOW_US, WATCH_NAME)
        if ok:
            self.armed = want

    def _on_event(self, event: PressureEvent) -> None:
        if event.name != WATCH_NAME:
            return
        self._on_pressure()

    def close(self) -> None:
        """Unsubscribe from the event source and disarm the watch."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self.armed is not None and self._ctx.events is not None:
            self._ctx.events.unwatch(WATCH_NAME)
            self.armed = None
