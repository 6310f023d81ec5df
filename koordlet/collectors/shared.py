"""Helpers several collectors share; no collector imports another (an import-linter contract).

- :func:`cgroup_targets` and :class:`TargetCache`: the pod and container cgroups of an inventory
  snapshot, recomputed only when the inventory hands out a new snapshot; :func:`target_paths`:
  one stat's file in each of them, one string per file for all the collectors reading it;
- :class:`CpuCounters`: previous readings of monotonically increasing counters turned into
  rates (CPU time, memory bandwidth);
- :func:`by_columns`: a pod collector's tick, on its column path when that applies, else file by
  file (docs/collectors.md, "Columns").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from sys import intern
from typing import Any, NamedTuple

from koordlet.collectors.framework import CollectResult, Tick
from koordlet.metriccache.series import Column, Sample, container_entity, pod_entity
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.stats import BoundStat


class CgroupTarget(NamedTuple):
    """One pod or container cgroup to collect, as of one inventory snapshot."""

    entity: str
    """``pod/<uid>`` or ``container/<uid>/<container id>``."""
    rel: str
    """Cgroup directory relative to a controller root (v1) or the unified root (v2)."""
    is_pod: bool
    """True for the pod-level cgroup, False for a container's."""


def cgroup_targets(snapshot: WorkloadSnapshot) -> tuple[CgroupTarget, ...]:
    """Every pod and container cgroup of ``snapshot``: each pod followed by its containers.

    The collectors of one tick share one tuple (the last snapshot's is kept), and the entity ids
    are interned, so the metric cache's series hold the same string objects: at 1,000 pods each
    copy of them is about 1 MiB.
    """
    global _last_targets  # a one-entry memo, keyed by the snapshot's identity
    last_snapshot, targets = _last_targets
    if last_snapshot is snapshot:
        return targets
    out: list[CgroupTarget] = []
    for uid, pod in snapshot.pods.items():
        out.append(CgroupTarget(intern(pod_entity(uid)), pod.cgroup_dir, True))
        out.extend(
            CgroupTarget(intern(container_entity(uid, c.id)), c.cgroup_dir, False)
            for c in pod.containers
        )
    targets = tuple(out)
    _last_targets = (snapshot, targets)
    return targets


_last_targets: tuple[WorkloadSnapshot | None, tuple[CgroupTarget, ...]] = (None, ())


def target_paths(stat: BoundStat[Any], targets: tuple[CgroupTarget, ...]) -> tuple[str, ...]:
    """``stat``'s file in each of ``targets``, in order.

    Collectors reading the same file of the same targets (``memory.stat``: the pod resource and
    the page cache collectors) get the same string objects: a one-entry memo keyed by the
    targets tuple's identity (:func:`cgroup_targets` hands every collector of a tick the same
    one), then by the file. At 200 pods that is 800 paths, 0.17 MiB, held once instead of twice.
    """
    global _last_paths
    last_targets, by_file = _last_paths
    if last_targets is not targets:
        by_file = {}
        _last_paths = (targets, by_file)
    key = (stat.controller, stat.file)
    paths = by_file.get(key)
    if paths is None:
        path = stat.path
        paths = by_file[key] = tuple(path(t.rel) for t in targets)
    return paths


_last_paths: tuple[tuple[CgroupTarget, ...] | None, dict[tuple[str, str], tuple[str, ...]]] = (
    None,
    {},
)


class TargetCache:
    """Recomputes a per-target plan only when the inventory hands out a new snapshot.

    The inventory replaces its snapshot object on every change and returns the same object
    otherwise, so an identity check is the whole per-tick cost.
    """

    __slots__ = ("_snapshot", "plan")

    def __init__(self) -> None:
        self._snapshot: WorkloadSnapshot | None = None
        self.plan: tuple[CgroupTarget, ...] = ()

    def refresh(self, snapshot: WorkloadSnapshot) -> bool:
        """Adopt ``snapshot``; True when it differs from the previous one."""
        if snapshot is self._snapshot:
            return False
        self._snapshot = snapshot
        self.plan = cgroup_targets(snapshot)
        return True


class CpuCounters:
    """Previous readings of monotonically increasing counters, by entity, turned into rates.

    ``rate`` returns the counter's increase per second since the previous reading, or None when
    this reading only seeds (first reading, counter went backwards, time did not advance).
    """

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: dict[str, tuple[int, float]] = {}
        """Entity -> (previous reading, its timestamp); hot loops may use it directly."""

    def rate(self, entity: str, value: int, now: float) -> float | None:
        prev = self.last.get(entity)
        self.last[entity] = (value, now)
        if prev is None:
            return None
        delta, elapsed = value - prev[0], now - prev[1]
        if delta < 0 or elapsed <= 0:
            return None
        return delta / elapsed

    def forget(self, entity: str) -> None:
        self.last.pop(entity, None)

    def keep_only(self, entities: set[str]) -> None:
        """Drop the state of every entity not in ``entities``."""
        for entity in [e for e in self.last if e not in entities]:
            del self.last[entity]


def by_columns(
    tick: Tick,
    targets: Sequence[str],
    columns: Callable[[Tick], list[Column] | None],
    each: Callable[[Tick], list[Sample]],
) -> CollectResult:
    """``columns(tick)``, the steady state's path, when there are targets and it applies (it
    returns None, having changed nothing, when it does not): its ``(keys, values)`` columns,
    the keys tuples the plan's own, so that the metric cache stores them as groups; else
    ``each(tick)``, file by file, as samples."""
    found = columns(tick) if targets else None
    return CollectResult(samples=each(tick)) if found is None else CollectResult(columns=found)
