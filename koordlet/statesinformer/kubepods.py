"""Kubelet-free pod discovery: walk the kubepods cgroup hierarchy.

Pod UID and Kubernetes QoS come from directory names (both cgroup drivers); the Koordinator class
follows from the Kubernetes QoS (BestEffort→BE, Burstable→LS, Guaranteed→LSR) because nothing
else is known without the API server. Containers are the runtime scopes under each pod.

On cgroup v1 the walk takes the union over the controllers the collectors read (cpuacct, cpu,
memory): a tree made by hand under only some of them is still found, and what is missing in a
controller shows up later as an unsupported source, not as a missing pod. Between full walks the
walk is incremental (see :class:`KubepodsSource`), and with inotify it lists a folder only when
the kernel said that a child folder appeared or went away in it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from apis.extension import KUBE_QOS_TO_QOS, KubeQOS
from koordlet.errors import HostError
from koordlet.statesinformer.model import ContainerInfo, PodInfo
from koordlet.system.cgroups import (
    CgroupVersion,
    kube_qos_of_dir,
    parse_container_dir_name,
    parse_pod_dir_name,
)
from koordlet.system.host import Host
from koordlet.system.inotify import DirWatcher

logger = logging.getLogger(__name__)

V1_WALK_CONTROLLERS = ("cpuacct", "cpu", "memory")
"""v1 controllers whose kubepods trees are walked (their union makes the inventory)."""


def _subdirs(path: str) -> Iterator[str]:
    """Names of the child directories of ``path``; nothing when it vanished or never existed."""
    try:
        with os.scandir(path) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    yield entry.name
    except (FileNotFoundError, NotADirectoryError):
        return


@dataclass
class _PodDraft:
    kube_qos: KubeQOS
    cgroup_dir: str
    containers: dict[str, ContainerInfo] = field(default_factory=dict)


FULL_WALK_TICKS = 30
"""Every this many calls, :meth:`KubepodsSource.list_pods` walks every controller's whole tree."""
CONTAINER_RESCAN_TICKS = 10
"""Between full walks, each known pod's containers are listed again once in this many calls
(a tenth of the pods per call, round robin); new pods are listed at once."""
WATCHED_FULL_WALK_TICKS = 600
"""With inotify watches, every this many calls a full walk still runs (a safety net: events are
the kernel's promise, the walk the proof)."""


@dataclass
class KubepodsSource:
    """Discovers pods and containers from the kubepods hierarchy of every walked controller.

    The first call, and every :data:`FULL_WALK_TICKS`-th, walks the whole tree of every walked
    controller and takes the union. The calls between are incremental, which keeps the walk off
    the per-tick budget (a full walk of 200 pods costs about 600 directory listings):

    - the pod directories of the first controller are listed (four listings): a pod that
      appeared is described at once from every controller, a pod that vanished from it is gone;
    - a known pod keeps its description (the same :class:`PodInfo` object, so the inventory's
      diff is an identity check), except that one pod in :data:`CONTAINER_RESCAN_TICKS` has its
      containers listed again, round robin, so a restarted container is found within that many
      ticks;
    - a pod seen only in other controllers (a tree made by hand under some of them) stays until
      the next full walk.

    **With inotify** (``watch``, the default; :mod:`koordlet.system.inotify`) every full walk
    also watches, in each walked controller, the kubepods folder, its QoS folders and every pod
    folder, for child folders created, removed or renamed. A call between full walks then reads
    the events (one ``read`` when there are none) and returns the known pods without listing
    anything; after events it lists the pod folders of the first controller and describes again
    only the new pods and those whose folder had events (a container made or removed). A lost
    event (queue overflow) forces a full walk; full walks come every
    :data:`WATCHED_FULL_WALK_TICKS` calls instead. Where inotify cannot be had (no instance or
    watch left, no inotify), the walk logs the reason once and lists as above.

    Assigning :attr:`host` (the daemon does when the cgroup driver is re-detected) restarts
    with a full walk.
    """

    host: Host
    name: str = "kubepods"
    full_walk_ticks: int = FULL_WALK_TICKS
    container_rescan_ticks: int = CONTAINER_RESCAN_TICKS
    watch: bool = True
    """Use inotify between full walks (see above)."""
    watched_full_walk_ticks: int = WATCHED_FULL_WALK_TICKS
    _calls: int = field(default=0, init=False, repr=False)
    _since_full: int = field(default=0, init=False, repr=False)
    _watcher: DirWatcher | None = field(default=None, init=False, repr=False)
    _watch_failed: str | None = field(default=None, init=False, repr=False)
    _wd_of: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    """Watched folder → watch descriptor."""
    _pod_of_wd: dict[int, str | None] = field(default_factory=dict, init=False, repr=False)
    """Watch descriptor → pod UID (None: a kubepods or QoS folder)."""
    _paths_of_wd: dict[int, tuple[str, ...]] = field(default_factory=dict, init=False, repr=False)
    """Watch descriptor → the folders watched with it (one, unless a folder is reached twice),
    so a watch the kernel drops is forgotten without scanning ``_wd_of`` (a mass deletion at
    1,000 pods drops about 3,000). A tuple, not a set: 56 bytes for one folder instead of 216,
    at 200 pods 0.1 MiB."""
    _pods: dict[str, PodInfo] = field(default_factory=dict, init=False, repr=False)
    _primary: set[str] = field(default_factory=set, init=False, repr=False)
    _walked_host: Host | None = field(default=None, init=False, repr=False)
    _uids: dict[str, str | None] = field(default_factory=dict, init=False, repr=False)

    _roots: tuple[str, ...] = field(default=(), init=False, repr=False)

    def _controller_roots(self) -> tuple[str, ...]:
        """The walked roots, resolved once per host (at each full walk): on v1, a controller
        mounted together with an earlier one (``cpu,cpuacct`` with ``cpu`` and ``cpuacct`` as
        symbolic links to it, as systemd mounts them) is the same tree and is walked once."""
        if self._roots and self._walked_host is self.host:
            return self._roots
        layout = self.host.layout
        if layout.version is CgroupVersion.V2:
            return (layout.abs_dir("cpu", ""),)
        roots: list[str] = []
        seen: set[str] = set()
        for controller in V1_WALK_CONTROLLERS:
            root = layout.abs_dir(controller, "")
            real = os.path.realpath(root)
            if real not in seen:
                seen.add(real)
                roots.append(root)
        return tuple(roots)

    def list_pods(self) -> Mapping[str, PodInfo]:
        self._calls += 1
        self._since_full += 1
        watcher = self._watcher
        every = self.watched_full_walk_ticks if watcher is not None else self.full_walk_ticks
        if self._walked_host is not self.host or every <= 1 or self._since_full >= every:
            return self._full_walk()
        if watcher is None:
            return self._incremental()
        base = os.path.join(self._roots[0], self.host.layout.kube_root)
        if base not in self._wd_of:  # no kubepods folder (yet, or any more) to watch
            return self._full_walk() if os.path.isdir(base) else self._incremental()
        try:
            changes = watcher.changes()
        except HostError as err:
            self._stop_watching(str(err))
            return self._full_walk()
        if changes.overflow:
            logger.info("kubepods: inotify events were lost (queue overflow); walking everything")
            return self._full_walk()
        for wd in changes.gone:
            self._forget_watch(wd)
        if not changes.changed:
            return dict(self._pods)
        pod_of = self._pod_of_wd
        dirty = {uid for wd in changes.changed if (uid := pod_of.get(wd)) is not None}
        return self._incremental(dirty)  # lists the pod folders too: a parent may have changed

    def close(self) -> None:
        """Close the inotify instance, if any (idempotent); the next call lists as without."""
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        self._wd_of.clear()
        self._pod_of_wd.clear()
        self._paths_of_wd.clear()

    # The full walk -------------------------------------------------------------------------------

    def _full_walk(self) -> Mapping[str, PodInfo]:
        self._since_full = 0
        self._roots = ()
        roots = self._roots = self._controller_roots()
        self._walked_host = self.host
        watched: dict[str, str | None] | None = None
        if self._start_watching():
            watched = {}
            self._drain()  # the walk below looks at everything; events so far say no more
        drafts: dict[str, _PodDraft] = {}
        primary: set[str] = set()
        for index, root in enumerate(roots):
            for qos, parent_rel, pod_name, uid in self._pod_dirs(root, watched):
                if watched is not None:
                    self._watch(os.path.join(root, parent_rel, pod_name), uid, watched)
                self._add_pod(drafts, root, parent_rel, pod_name, uid, qos)
                if index == 0:
                    primary.add(uid)
        if watched is not None and self._watcher is not None:
            self._unwatch_others(watched)
        pods = {uid: self._reuse(uid, self._build(uid, d)) for uid, d in drafts.items()}
        self._pods, self._primary = pods, primary
        return dict(pods)

    # The watches ---------------------------------------------------------------------------------

    def _start_watching(self) -> bool:
        """True when an inotify instance is there or could be made; the reason it could not is
        logged once."""
        if self._watcher is not None:
            return True
        if not self.watch or self._watch_failed is not None:
            return False
        try:
            self._watcher = DirWatcher()
        except HostError as err:
            self._stop_watching(str(err))
            return False
        return True

    def _stop_watching(self, reason: str) -> None:
        if self._watch_failed is None:
            logger.warning(
                "kubepods: %s; listing the pod folders (a tenth of them each call) instead of "
                "watching them",
                reason,
            )
        self._watch_failed = reason
        self.close()

    def _drain(self) -> None:
        watcher = self._watcher
        if watcher is None:
            return
        try:
            changes = watcher.changes()
        except HostError as err:
            self._stop_watching(str(err))
            return
        for wd in changes.gone:
            self._forget_watch(wd)

    def _watch(self, path: str, uid: str | None, watched: dict[str, str | None] | None) -> None:
        """Watch folder ``path`` (a pod's: ``uid``; else a kubepods or QoS folder) BEFORE it is
        listed, so a child made after the listing has an event; adding a watch that exists
        returns it (and a folder made again under the same name gets its new one)."""
        watcher = self._watcher
        if watcher is None:
            return
        try:
            wd = watcher.add(path)
        except HostError as err:
            self._stop_watching(str(err))
            return
        if wd is None:
            return  # gone meanwhile: its parent's event says so
        old = self._wd_of.get(path)
        if old is not None and old != wd and self._drop_path(old, path):
            # Another folder under this name (made again; or the old one renamed away, which
            # cgroup v1 allows): drop the old watch, a no-op when the kernel dropped it already.
            watcher.remove(old)
        self._wd_of[path] = wd
        self._pod_of_wd[wd] = uid
        paths = self._paths_of_wd.get(wd, ())
        if path not in paths:
            self._paths_of_wd[wd] = (*paths, path)
        if watched is not None:
            watched[path] = uid

    def _unwatch_others(self, watched: Mapping[str, str | None]) -> None:
        """After a full walk: stop watching the folders it did not see."""
        watcher = self._watcher
        assert watcher is not None
        for path in [p for p in self._wd_of if p not in watched]:
            wd = self._wd_of.pop(path)
            if self._drop_path(wd, path):
                watcher.remove(wd)

    def _drop_path(self, wd: int, path: str) -> bool:
        """Unlink ``path`` from watch ``wd``; True when no folder is left on the watch."""
        paths = self._paths_of_wd.get(wd)
        if paths is not None:
            left = tuple(p for p in paths if p != path)
            if left:
                self._paths_of_wd[wd] = left
                return False
            del self._paths_of_wd[wd]
        self._pod_of_wd.pop(wd, None)
        return True

    def _forget_watch(self, wd: int) -> None:
        """The kernel dropped watch ``wd`` (its folder removed): forget its folders, those
        watched since under a new descriptor apart."""
        self._pod_of_wd.pop(wd, None)
        for path in self._paths_of_wd.pop(wd, ()):
            if self._wd_of.get(path) == wd:
                del self._wd_of[path]

    # The incremental walk ------------------------------------------------------------------------

    def _incremental(self, dirty: set[str] | None = None) -> Mapping[str, PodInfo]:
        """Without watches (``dirty`` None), known pods are described again round robin; with
        them, only the pods in ``dirty`` (whose folders had events)."""
        roots = self._controller_roots()
        rescan = self.container_rescan_ticks
        slot = self._calls % rescan if rescan > 1 else 0
        pods: dict[str, PodInfo] = {}
        primary: set[str] = set()
        # Watching, a QoS folder made since the full walk is watched before it is listed.
        listing = self._pod_dirs(roots[0], {} if dirty is not None else None)
        for position, (qos, parent_rel, pod_name, uid) in enumerate(listing):
            primary.add(uid)
            known = self._pods.get(uid)
            pod_rel = f"{parent_rel}/{pod_name}"
            if dirty is not None:  # watching: a pod folder not watched (new, made again) is dirty
                fresh = uid in dirty or os.path.join(roots[0], pod_rel) not in self._wd_of
            else:
                fresh = position % rescan == slot
            if known is not None and known.cgroup_dir == pod_rel and not fresh:
                pods[uid] = known
                continue
            drafts: dict[str, _PodDraft] = {}
            for root in roots:
                if dirty is not None:
                    self._watch(os.path.join(root, pod_rel), uid, None)
                self._add_pod(drafts, root, parent_rel, pod_name, uid, qos)
            pods[uid] = self._reuse(uid, self._build(uid, drafts[uid]))
        for uid, pod in self._pods.items():  # seen only outside the first controller
            if uid not in self._primary and uid not in pods:
                pods[uid] = pod
        self._pods, self._primary = pods, primary
        return dict(pods)

    # Helpers -------------------------------------------------------------------------------------

    def _pod_dirs(
        self, root: str, watched: dict[str, str | None] | None = None
    ) -> Iterator[tuple[KubeQOS, str, str, str]]:
        """``(kube QoS, parent dir, pod dir name, uid)`` of every pod under one controller;
        with ``watched`` (a full walk that watches), the kubepods and QoS folders are watched
        before they are listed and noted there."""
        kube_root = self.host.layout.kube_root
        base = os.path.join(root, kube_root)
        if watched is not None:
            self._watch(base, None, watched)
        for name in _subdirs(base):
            qos = kube_qos_of_dir(name)
            if qos is not None:
                qos_rel = f"{kube_root}/{name}"
                if watched is not None:
                    self._watch(os.path.join(base, name), None, watched)
                for pod_name in _subdirs(os.path.join(base, name)):
                    uid = self._uid(pod_name)
                    if uid is not None:
                        yield qos, qos_rel, pod_name, uid
            else:
                uid = self._uid(name)
                if uid is not None:
                    yield KubeQOS.GUARANTEED, kube_root, name, uid

    def _uid(self, dir_name: str) -> str | None:
        """The pod UID of a directory name, memoized (the names repeat every tick)."""
        try:
            return self._uids[dir_name]
        except KeyError:
            if len(self._uids) > 65536:  # bound the memo on a node with heavy pod churn
                self._uids.clear()
            uid = self._uids[dir_name] = parse_pod_dir_name(dir_name)
            return uid

    def _build(self, uid: str, d: _PodDraft) -> PodInfo:
        return PodInfo(
            uid=uid,
            name=f"pod{uid}",
            namespace="",
            qos=KUBE_QOS_TO_QOS[d.kube_qos],
            kube_qos=d.kube_qos,
            cgroup_dir=d.cgroup_dir,
            containers=tuple(d.containers[cid] for cid in sorted(d.containers)),
            source=self.name,
        )

    def _reuse(self, uid: str, pod: PodInfo) -> PodInfo:
        """The known object when nothing changed, so the inventory's diff is an identity check."""
        known = self._pods.get(uid)
        return known if known is not None and known == pod else pod

    @staticmethod
    def _add_pod(
        drafts: dict[str, _PodDraft],
        root: str,
        parent_rel: str,
        pod_name: str,
        uid: str,
        qos: KubeQOS,
    ) -> None:
        pod_rel = f"{parent_rel}/{pod_name}"
        draft = drafts.setdefault(uid, _PodDraft(kube_qos=qos, cgroup_dir=pod_rel))
        for child in _subdirs(os.path.join(root, pod_rel)):
            parsed = parse_container_dir_name(child)
            if parsed is None:
                continue
            runtime, cid = parsed
            draft.containers.setdefault(
                cid,
                ContainerInfo(
                    id=cid, name=cid[:12], runtime=runtime, cgroup_dir=f"{pod_rel}/{child}"
                ),
            )
