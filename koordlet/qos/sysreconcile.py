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
from typing import Any

from apis.slo_strategies import SystemStrategy, to_json
from koordlet.errors import HostError, InvalidValueError, KoordletError, UnsupportedError
from koordlet.executor.sysctl import (
    MEMCG_REAP_BACKGROUND,
    MIN_FREE_KBYTES,
    WATERMARK_SCALE_FACTOR,
    SystemFile,
    SystemFileWriter,
    call_on_writer,
    executor_hooks,
)
from koordlet.qos.framework import StrategyContext, StrategyReport
from koordlet.qos.shared import WriteFailures

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


Wanted = dict[SystemFile, int | str | None]
"""Setting → the value to write (int), why nothing is written (str), or None when the field is
unset (leave the host alone, restoring what this strategy changed)."""


def desired_settings(strategy: SystemStrategy, total_memory_bytes: int | None) -> Wanted:
    """What ``strategy`` asks of each setting on a node of ``total_memory_bytes`` (see
    :data:`Wanted`)."""
    out: Wanted = {}
    factor = strategy.min_free_kbytes_factor
    if factor is None:
        out[MIN_FREE_KBYTES] = None
    elif not total_memory_bytes or total_memory_bytes <= 0:
        out[MIN_FREE_KBYTES] = "node memory total unknown (no node info yet)"
    else:
        out[MIN_FREE_KBYTES] = min_free_kbytes(total_memory_bytes, factor)
    out[WATERMARK_SCALE_FACTOR] = strategy.watermark_scale_factor
    out[MEMCG_REAP_BACKGROUND] = strategy.memcg_reap_background
    for f, value in out.items():
        if isinstance(value, int) and not f.valid.lo <= value <= f.valid.hi:
            out[f] = f"{value} outside {f.valid.describe()}: not written"
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
        self._originals: dict[SystemFile, int] = {}
        self._reported: set[SystemFile] = set()
        self._failures = WriteFailures(NAME, logger, clock=ctx.now)
        self._kept: tuple[SystemStrategy, int | None, Wanted, dict[str, Any]] | None = None
        """The last round's strategy and memory total, and what they asked (:meth:`_decide`)."""

    async def reconcile(self) -> None:
        ctx = self._ctx
        strategy = ctx.node_slo().system_strategy
        total = node_memory_total(ctx.cache.get_info(NODE_INFO_KEY))
        wanted, strategy_json = self._decide(strategy, total)
        inputs = {"systemStrategy": strategy_json, "memory_total_bytes": total}
        if all(v is None for v in wanted.values()) and not self._originals:
            ctx.report(NAME, StrategyReport(inputs, "nothing to do: no setting asked"))
            return
        reason = ", ".join(f"{f.name}={v}" for f, v in wanted.items() if isinstance(v, int))
        results = await call_on_writer(ctx.executor, lambda: self._apply(wanted, reason))
        changed = sum(r.startswith(("changed", "restored")) for r in results.values())
        ctx.report(
            NAME,
            StrategyReport(
                inputs,
                f"set {reason}" if reason else "restore the host's values",
                f"{changed} changed" + (" (dry run)" if ctx.dry_run(NAME) else ""),
                detail={"decision": {f.name: v for f, v in wanted.items()}, "results": results},
            ),
        )

    def _decide(
        self, strategy: SystemStrategy, total: int | None
    ) -> tuple[Mapping[SystemFile, int | str | None], Mapping[str, Any]]:
        """:func:`desired_settings` and the strategy's JSON for the report, kept from the last
        round while the strategy and the memory total are equal (both are values)."""
        kept = self._kept
        if kept is None or not (kept[0] is strategy or kept[0] == strategy) or kept[1] != total:
            kept = (strategy, total, desired_settings(strategy, total), to_json(strategy))
            self._kept = kept
        return kept[2], kept[3]

    def _apply(self, wanted: Mapping[SystemFile, int | str | None], reason: str) -> dict[str, str]:
        """On the writer thread: write what is asked, restore what is no longer asked."""
        results: dict[str, str] = {}
        for f, value in wanted.items():
            if isinstance(value, str):
                results[f.name] = f"skipped: {value}"
                self._once(f, value)
            elif value is None:
                if f in self._originals:
                    results[f.name] = self._restore(f)
            else:
                results[f.name] = self._set(f, value, f"systemStrategy: {reason}")
        return results

    def _set(self, f: SystemFile, value: int, reason: str) -> str:
        try:
            original = self._writer.read(f) if f not in self._originals else None
            res = self._writer.write(f, value, strategy=NAME, reason=reason)
        except UnsupportedError as err:
            self._once(f, err.reason)
            return f"unsupported: {err.reason}"
        except (InvalidValueError, HostError) as err:
            self._failures.failed(f.name, str(err))  # logged once per change, then counted
            return f"failed: {err}"
        self._failures.succeeded(f.name)
        if res.dry_run:
            return f"dry run: {res.old} -> {res.new}" if res.old != res.new else "unchanged"
        if res.changed and original is not None:
            self._originals[f] = original
        return f"changed {res.old} -> {res.new}" if res.changed else f"unchanged {res.new}"

    def _restore(self, f: SystemFile) -> str:
        value = self._originals[f]
        try:
            res = self._writer.write(f, value, strategy=NAME, reason="unset: host value back")
        except KoordletError as err:
            self._failures.failed(f"{f.name} (restore to {value})", str(err))
            return f"restore failed: {err}"
        self._failures.succeeded(f"{f.name} (restore to {value})")
        if res.dry_run:
            return f"dry run: restore {res.new}"
        del self._originals[f]
        return f"restored {res.new}"

    def _once(self, f: SystemFile, why: str) -> None:
        if f not in self._reported:
            self._reported.add(f)
            logger.info("system config: %s not set: %s", f.name, why)


def build(ctx: StrategyContext, interval: float) -> SystemConfigStrategy:
    """Table factory."""
    return SystemConfigStrategy(ctx, interval=interval)
