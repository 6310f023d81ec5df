"""Leveled batches: writes across nested cgroups in an order the kernel never rejects.

The kernel checks some knobs against the parent's (cgroup v1 shown; v2 is laxer):

- ``cpuset.cpus`` and ``cpuset.mems`` of a child must be a subset of the parent's: growing a
  child beyond its parent is ``EACCES``, shrinking a parent below a child's set is ``EBUSY``
  (``validate_change`` in ``kernel/cgroup/cpuset.c``);
- ``cpu.cfs_quota_us`` of a child may not exceed the parent's (``EINVAL``);
- ``memory.min``, ``memory.low`` and ``memory.high`` are not refused, but a child protected
  above its parent for a moment gets an effective value it was not meant to have.

So a batch is applied in two passes, like Koordinator's leveled resource updates:

1. **grow, parent before child**: top-down (shallowest cgroup first), each knob that has a merge
   rule is set to the merge of its current and its target value (the union of the CPU sets, the
   larger quota or limit, unlimited above any number). Within one cgroup ``cpuset.mems`` goes
   before ``cpuset.cpus``. After this pass every cgroup allows at least what it allowed before and
   what it will allow after, so no child is ever outside its parent;
2. **shrink, child before parent**: bottom-up (deepest first), every knob is set to its target.
   Within one cgroup ``cpuset.cpus`` goes before ``cpuset.mems``.

A pure grow is written once (in pass 1; pass 2 finds the value in place), a pure shrink once
(in pass 2). Knobs without a merge rule (shares, idle, wmark ratios...) are written once, in
pass 2.

The whole batch runs as ONE job on the writer thread, so nothing interleaves with it and a
shutdown either finishes it or never starts it (queued batches are dropped, never cut in half).
A cgroup that disappears during the batch (``CgroupGoneError``: a pod deleted meanwhile) is
skipped, with its descendants, and the rest of the batch goes on; any other error of one write
is recorded in the result and the rest goes on. In dry run (the writes' strategy is in dry run)
pass 1 is skipped: nothing is written, and only the final values are audited as decisions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from apis.records import frozen
from koordlet.errors import CgroupGoneError, HostError, InvalidValueError
from koordlet.system.knobs import Knob

if TYPE_CHECKING:
    from koordlet.executor.writer import WriteResult

logger = logging.getLogger(__name__)


_V = TypeVar("_V")


@frozen
class BatchWrite(Generic[_V]):
    """One write of a batch: ``BatchWrite(CPUSET_CPUS, rel_dir, frozenset({0, 1}))``; mypy
    checks the value against the knob's type."""

    knob: Knob[_V]
    """The knob (``koordlet.system.knobs.CPUSET_CPUS``...)."""
    rel_dir: str
    """The cgroup, relative to the hierarchy roots (``kubepods/besteffort/pod<uid>``)."""
    value: _V
    """The target value, as :meth:`CgroupWriter.write` takes it."""
    strategy: str = ""
    """Who asks, for the audit log and the dry-run rule."""
    reason: str = ""
    """Why, for the audit log."""

    @property
    def knob_name(self) -> str:
        """The knob's logical name (``cpuset_cpus``)."""
        return self.knob.name


@frozen
class BatchResult:
    """What a batch did."""

    results: tuple[WriteResult, ...]
    """Every write performed or skipped as unchanged, in the order done (pass 1's grow steps
    included)."""
    gone: tuple[str, ...]
    """Cgroups found removed during the batch; their writes (and their descendants') were
    skipped."""
    errors: tuple[tuple[BatchWrite[Any], str], ...]
    """Writes that failed for another reason, with the error."""

    @property
    def ok(self) -> bool:
        """True when no write failed (removed cgroups are not failures)."""
        return not self.errors

    @property
    def changed(self) -> int:
        """How many writes changed a file."""
        return sum(r.changed for r in self.results)


class BatchTarget(Protocol):
    """The part of :class:`~koordlet.executor.writer.CgroupWriter` a batch uses."""

    def write(
        self,
        knob: Knob[Any],
        rel_dir: str,
        value: object,
        *,
        strategy: str = "",
        reason: str = "",
    ) -> WriteResult: ...

    def read(self, knob: Knob[Any], rel_dir: str) -> Any: ...

    def is_dry_run(self, strategy: str) -> bool: ...


def _union(current: Any, target: Any) -> Any:
    return frozenset(current) | frozenset(target)


def _larger_or_unlimited(current: Any, target: Any) -> Any:
    if current is None or target is None:  # None is unlimited: above every number
        return None
    return max(current, target)


MERGE: dict[str, Callable[[Any, Any], Any]] = {
    "cpuset_mems": _union,
    "cpuset_cpus": _union,
    "cpu_cfs_quota": _larger_or_unlimited,
    "memory_limit": _larger_or_unlimited,
    "memory_min": _larger_or_unlimited,
    "memory_low": _larger_or_unlimited,
    "memory_high": _larger_or_unlimited,
}
"""Knob name → how pass 1 combines the current and the target value into one that allows both."""

_GROW_ORDER = {"cpuset_mems": 0, "cpuset_cpus": 1}
"""Within one cgroup, pass 1 writes the memory nodes before the CPUs; pass 2 the reverse."""


def depth(rel_dir: str) -> int:
    """How deep a cgroup is below the roots (``kubepods`` is 0)."""
    parts = [p for p in rel_dir.strip("/").split("/") if p]
    return max(len(parts) - 1, 0)


def _under(rel_dir: str, gone: set[str]) -> bool:
    path = rel_dir.strip("/")
    return any(path == g or path.startswith(g + "/") for g in gone)


def plan(
    writes: Sequence[BatchWrite[Any]],
) -> tuple[list[BatchWrite[Any]], list[BatchWrite[Any]]]:
    """The two passes: (grow top-down over the mergeable writes, shrink bottom-up over all).

    Stable: writes at the same depth and of the same order class keep the caller's order.
    A knob asked twice for the same cgroup keeps the last value asked.
    """
    last: dict[tuple[str, str], BatchWrite[Any]] = {}
    for w in writes:
        key = (w.knob_name, w.rel_dir.strip("/"))
        last.pop(key, None)
        last[key] = w
    unique = list(last.values())
    depths: dict[str, int] = {}  # a cgroup has several writes: its depth once
    for w in unique:
        if w.rel_dir not in depths:
            depths[w.rel_dir] = depth(w.rel_dir)
    grow = sorted(
        (w for w in unique if w.knob_name in MERGE),
        key=lambda w: (depths[w.rel_dir], _GROW_ORDER.get(w.knob_name, 2)),
    )
    shrink = sorted(unique, key=lambda w: (-depths[w.rel_dir], -_GROW_ORDER.get(w.knob_name, -1)))
    return grow, shrink


def apply_batch(target: BatchTarget, writes: Sequence[BatchWrite[Any]]) -> BatchResult:
    """Apply ``writes`` in the leveled order, on the calling thread (the writer thread).

    Raises nothing: every failure is in the result.
    """
    grow, shrink = plan(writes)
    results: list[WriteResult] = []
    gone: set[str] = set()
    errors: list[tuple[BatchWrite[Any], str]] = []
    failed: set[tuple[str, str]] = set()

    def attempt(w: BatchWrite[Any], value: object, reason: str) -> None:
        try:
            results.append(
                target.write(w.knob, w.rel_dir, value, strategy=w.strategy, reason=reason)
            )
        except CgroupGoneError as err:
            gone.add(w.rel_dir.strip("/"))
            logger.debug("batch: %s is gone, skipping its writes (%s)", w.rel_dir, err)
        except (HostError, InvalidValueError) as err:
            failed.add((w.knob_name, w.rel_dir))
            errors.append((w, str(err)))

    for w in grow:
        if (gone and _under(w.rel_dir, gone)) or target.is_dry_run(w.strategy):
            continue
        try:
            current = target.read(w.knob, w.rel_dir)
            merged = MERGE[w.knob_name](current, w.knob.validate(w.value))
        except CgroupGoneError as err:
            gone.add(w.rel_dir.strip("/"))
            logger.debug("batch: %s is gone, skipping its writes (%s)", w.rel_dir, err)
            continue
        except (HostError, InvalidValueError) as err:
            failed.add((w.knob_name, w.rel_dir))
            errors.append((w, str(err)))
            continue
        if merged != current:
            attempt(w, merged, f"{w.reason} (leveled: grow step)" if w.reason else "leveled")
    for w in shrink:
        if (gone and _under(w.rel_dir, gone)) or (failed and (w.knob_name, w.rel_dir) in failed):
            continue
        attempt(w, w.value, w.reason)
    result = BatchResult(tuple(results), tuple(sorted(gone)), tuple(errors))
    if result.errors or result.gone or result.changed:
        logger.debug(
            "batch of %d writes: %d changed, %d cgroups gone, %d errors",
            len(writes),
            result.changed,
            len(result.gone),
            len(result.errors),
        )
    return result
