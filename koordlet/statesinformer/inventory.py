"""The workload inventory: merges its sources into one immutable snapshot and says what changed.

``refresh()`` is synchronous (the daemon runs it in a worker thread with the other reads of a
tick); readers call ``snapshot()`` from anywhere and get the current :class:`WorkloadSnapshot`,
which is replaced, never mutated. Change listeners run on the caller of ``refresh()``'s result
(the daemon dispatches them on the event loop); the metric cache drops a removed pod's series
through one of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from apis.records import frozen
from koordlet.statesinformer.model import HostAppInfo, PodInfo, WorkloadSnapshot
from koordlet.statesinformer.sources import HostAppSource, PodSource

logger = logging.getLogger(__name__)

T = TypeVar("T")


@frozen
class InventoryChange:
    """What one refresh changed."""

    snapshot: WorkloadSnapshot
    added: tuple[str, ...] = ()
    """UIDs of new pods."""
    removed: tuple[str, ...] = ()
    """UIDs of pods that are gone."""
    updated: tuple[str, ...] = ()
    """UIDs of pods whose description changed (containers came or went, QoS changed)."""
    host_apps_changed: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed or self.updated or self.host_apps_changed)


class WorkloadInventory:
    """Merges pod sources (first source wins on a UID) and host-application sources."""

    def __init__(
        self,
        pod_sources: Sequence[PodSource],
        host_app_sources: Sequence[HostAppSource] = (),
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._pod_sources = tuple(pod_sources)
        self._host_app_sources = tuple(host_app_sources)
        self._clock = clock
        self._snapshot = WorkloadSnapshot(taken_at=clock())
        self._failing: set[str] = set()

    def snapshot(self) -> WorkloadSnapshot:
        """The current snapshot (cheap; safe from any thread)."""
        return self._snapshot

    @property
    def source_names(self) -> tuple[str, ...]:
        pods = tuple(s.name for s in self._pod_sources)
        return pods + tuple(s.name for s in self._host_app_sources)

    def refresh(self) -> InventoryChange:
        """Ask every source once and install the merged snapshot.

        A source that fails keeps its previous contribution (the last good state): its pods are
        neither dropped nor duplicated until it answers again.
        """
        old = self._snapshot
        pods: dict[str, PodInfo] = {}
        for source in self._pod_sources:
            listed = self._ask(source.name, source.list_pods, None)
            if listed is None:
                listed = {u: p for u, p in old.pods.items() if p.source == source.name}
            for uid, pod in listed.items():
                pods.setdefault(uid, pod)
        apps: list[HostAppInfo] = []
        for app_source in self._host_app_sources:
            got = self._ask(app_source.name, app_source.list_host_apps, None)
            apps.extend(got if got is not None else ())
        host_apps = tuple(apps) if self._host_app_sources else old.host_apps
        if any(s.name in self._failing for s in self._host_app_sources):
            host_apps = old.host_apps

        change = _diff(old.pods, pods)
        apps_changed = host_apps != old.host_apps
        if change[0] or change[1] or change[2] or apps_changed:
            snap = WorkloadSnapshot(
                pods=pods,
                host_apps=host_apps,
                generation=old.generation + 1,
                taken_at=self._clock(),
            )
            self._snapshot = snap
            logger.info(
                "workloads changed: %d pods (+%d -%d ~%d), %d host apps",
                len(pods),
                len(change[0]),
                len(change[1]),
                len(change[2]),
                len(host_apps),
            )
        else:
            snap = old
        return InventoryChange(
            snapshot=snap,
            added=change[0],
            removed=change[1],
            updated=change[2],
            host_apps_changed=apps_changed,
        )

    def _ask(self, name: str, call: Callable[[], T], fallback: T) -> T:
        try:
            result = call()
        except Exception:
            if name not in self._failing:
                logger.exception("workload source %s failed; keeping its last answer", name)
            self._failing.add(name)
            return fallback
        if name in self._failing:
            logger.info("workload source %s answers again", name)
            self._failing.discard(name)
        return result


def _diff(
    old: Mapping[str, PodInfo], new: Mapping[str, PodInfo]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    added = tuple(sorted(u for u in new if u not in old))
    removed = tuple(sorted(u for u in old if u not in new))
    updated = tuple(
        sorted(u for u in new if u in old and new[u] is not old[u] and new[u] != old[u])
    )
    return added, removed, updated
