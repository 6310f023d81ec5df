"""System config (Koordinator's ``sysreconcile``, gate ``SystemConfig``): node-wide memory
watermarks from NodeSLO ``spec.systemStrategy``.

Each round, with ``systemStrategy`` of the NodeSLO in force (``ctx.node_slo()``, over
Koordinator's defaults: every field unset by default, and an unset field is left alone):

- ``vm.min_free_kbytes = total memory (kB) * minFreeKbytesFactor / 10000`` (integer division, as
  upstream), written only inside its valid range 10240..10485760 kB;
- ``vm.watermark_scale_factor = watermarkScaleFactor``, only inside 10..400;
- ``memcg_reaper/reap_background = memcgReapBackGround`` where the (Anolis) file exists.

A value outside its range is refused and reported, never clamped (upstream's validators skip it
likewise). Total memory is the node's ``MemTotal`` as the node-info collector reports it (the sum
of its NUMA nodes' memory), the kernel's view of what the kubelet reports as capacity; until the
collector has run, ``min_free_kbytes`` waits (reported).

**Restore on disable.** The first time the strategy changes a setting it remembers the host's own
value; when the field is unset again (or ``systemStrategy``, or the NodeSLO, goes away) the
remembered value is written back and forgotten. Upstream leaves the last values in place; a node
agent that changes a kernel-wide setting and walks away from it is what we avoid here.

Writes go through :class:`~koordlet.executor.sysctl.SystemFileWriter` on the executor's writer
thread, audited through the executor's ``on_change`` hook and dry-run as the executor's rule says.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from apis.slo_strategies import SystemStrategy, to_json
from koordlet.errors import HostError, InvalidValueError, KoordletError, UnsupportedError
from koordlet.executor.sysctl import (
    MEMCG_REAP_BACKGROUND,
    MIN_FREE_KBYTES,
    SYSTEM_FILES,
    WATERMARK_SCALE_FACTOR,
    SystemFileWriter,
    call_on_writer,
    executor_hooks,
)
from koordlet.qos.framework import StrategyContext, StrategyReport

logger = logging.getLogger(__name__)

NAME = "sysreconcile"
"""Table name."""
FEATURE_GATE = "SystemConfig"
"""Koordinator's feature gate."""
DEFAULT_INTERVAL = 1.0
"""Seconds between rounds (Koordinator's ``--reconcile-interval-seconds``, 1)."""
NODE_INFO_KEY = "node_info"
"""Metric-cache info key of the node-info collector (NUMA memory totals)."""


def min_free_kbytes(total_memory_bytes: int, factor: int) -> int:
    """``vm.min_free_kbytes`` for a node: total kB * factor / 10000, integer division."""
    return (total_memory_bytes // 1024) * factor // 10000


def desired_settings(
    strategy: SystemStrategy, total_memory_bytes: int | None
) -> dict[str, int | str | None]:
    """Setting name → the value to write (int), why nothing is written (str), or None when the
    field is unset (leave the host alone, restoring what this strategy changed)."""
    out: dict[str, int | str | None] = {}
    factor = strategy.min_free_kbytes_factor
    if factor is None:
        out[MIN_FREE_KBYTES.name] = None
    elif not total_memory_bytes or total_memory_bytes <= 0:
        out[MIN_FREE_KBYTES.name] = "node memory total unknown (no node info yet)"
    else:
        out[MIN_FREE_KBYTES.name] = min_free_kbytes(total_memory_bytes, factor)
    out[WATERMARK_SCALE_FACTOR.name] = strategy.watermark_scale_factor
    out[MEMCG_REAP_BACKGROUND.name] = strategy.memcg_reap_background
    for name, value in out.items():
        if isinstance(value, int):
            valid = SYSTEM_FILES[name].valid
            if not valid.lo <= value <= valid.hi:
                out[name] = f"{value} outside {valid.describe()}: not written"
    return out


def node_memory_total(info: object) -> int | None:
    """Total memory in bytes from the node-info collector's value; None when unknown."""
    if not isinstance(info, Mapping):
        return None
    numa = info.get("numa")
    if not isinstance(numa, Mapping) or not numa:
        return None
    total = 0
    for node in numa.values():
        value = node.get("memory_total_bytes") if isinstance(node, Mapping) else None
        if not isinstance(value, int):
            return None
        total += value
    return total or None


class SystemConfigStrategy:
    """See the module docstring."""

    def __init__(self, ctx: StrategyContext, *, interval: float = DEFAULT_INTERVAL) -> None:
        self.name = NAME
        self.interval = interval
        self._ctx = ctx
        self._writer = SystemFileWriter(ctx.host().paths, **executor_hooks(ctx.executor))
        self._originals: dict[str, int] = {}
        self._reported: set[str] = set()

    async def reconcile(self) -> None:
        ctx = self._ctx
        strategy = ctx.node_slo().system_strategy
        total = node_memory_total(ctx.cache.get_info(NODE_INFO_KEY))
        wanted = desired_settings(strategy, total)
        inputs = {"systemStrategy": to_json(strategy), "memory_total_bytes": total}
        if all(v is None for v in wanted.values()) and not self._originals:
            ctx.report(NAME, StrategyReport(inputs, "nothing to do: no setting asked"))
            return
        reason = ", ".join(f"{k}={v}" for k, v in wanted.items() if isinstance(v, int))
        results = await call_on_writer(ctx.executor, lambda: self._apply(wanted, reason))
        changed = sum(r.startswith(("changed", "restored")) for r in results.values())
        ctx.report(
            NAME,
            StrategyReport(
                inputs,
                f"set {reason}" if reason else "restore the host's values",
                f"{changed} changed" + (" (dry run)" if ctx.dry_run(NAME) else ""),
                detail={"decision": wanted, "results": results},
            ),
        )

    def _apply(self, wanted: Mapping[str, int | str | None], reason: str) -> dict[str, str]:
        """On the writer thread: write what is asked, restore what is no longer asked."""
        results: dict[str, str] = {}
        for name, value in wanted.items():
            if isinstance(value, str):
                results[name] = f"skipped: {value}"
                self._once(name, value)
            elif value is None:
                if name in self._originals:
                    results[name] = self._restore(name)
            else:
                results[name] = self._set(name, value, f"systemStrategy: {reason}")
        return results

    def _set(self, name: str, value: int, reason: str) -> str:
        try:
            original = self._writer.read(name) if name not in self._originals else None
            res = self._writer.write(name, value, strategy=NAME, reason=reason)
        except UnsupportedError as err:
            self._once(name, err.reason)
            return f"unsupported: {err.reason}"
        except (InvalidValueError, HostError) as err:
            logger.warning("system config: %s", err)
            return f"failed: {err}"
        if res.dry_run:
            return f"dry run: {res.old} -> {res.new}" if res.old != res.new else "unchanged"
        if res.changed and original is not None:
            self._originals[name] = original
        return f"changed {res.old} -> {res.new}" if res.changed else f"unchanged {res.new}"

    def _restore(self, name: str) -> str:
        value = self._originals[name]
        try:
            res = self._writer.write(name, value, strategy=NAME, reason="unset: host value back")
        except KoordletError as err:
            logger.warning("system config: restoring %s to %s failed: %s", name, value, err)
            return f"restore failed: {err}"
        if res.dry_run:
            return f"dry run: restore {res.new}"
        del self._originals[name]
        return f"restored {res.new}"

    def _once(self, name: str, why: str) -> None:
        if name not in self._reported:
            self._reported.add(name)
            logger.info("system config: %s not set: %s", name, why)


def build(ctx: StrategyContext, interval: float) -> SystemConfigStrategy:
    """Table factory."""
    return SystemConfigStrategy(ctx, interval=interval)
