"""Kubelet-free pod discovery: walk the kubepods cgroup hierarchy.

Pod UID and Kubernetes QoS come from directory names (both cgroup drivers); the Koordinator class
follows from the Kubernetes QoS (BestEffort→BE, Burstable→LS, Guaranteed→LSR) because nothing
else is known without the API server. Containers are the runtime scopes under each pod.

On cgroup v1 the walk takes the union over the controllers the collectors read (cpuacct, cpu,
memory): a tree made by hand under only some of them is still found, and what is missing in a
controller shows up later as an unsupported source, not as a missing pod. Between full walks the
walk is incremental (see :class:`KubepodsSource`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from apis.extension import KUBE_QOS_TO_QOS, KubeQOS
from koordlet.statesinformer.model import ContainerInfo, PodInfo
from koordlet.system.cgroups import (
    CgroupVersion,
    kube_qos_of_dir,
    parse_container_dir_name,
    parse_pod_dir_name,
)
from koordlet.system.host import Host

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

    Assigning :attr:`host` (the daemon does when the cgroup driver is re-detected) restarts
    with a full walk.
    """

    host: Host
    name: str = "kubepods"
    full_walk_ticks: int = FULL_WALK_TICKS
    container_rescan_ticks: int = CONTAINER_RESCAN_TICKS
    _calls: int = field(default=0, init=False, repr=False)
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
        if (
            self._walked_host is not self.host
            or self.full_walk_ticks <= 1
            or self._calls % self.full_walk_ticks == 1
        ):
            return self._full_walk()
        return self._incremental()

    # The full walk -------------------------------------------------------------------------------

    def _full_walk(self) -> Mapping[str, PodInfo]:
        self._roots = ()
        roots = self._roots = self._controller_roots()
        self._walked_host = self.host
        drafts: dict[str, _PodDraft] = {}
        primary: set[str] = set()
        for index, root in enumerate(roots):
            for qos, parent_rel, pod_name, uid in self._pod_dirs(root):
                self._add_pod(drafts, root, parent_rel, pod_name, uid, qos)
                if index == 0:
                    primary.add(uid)
        pods = {uid: self._reuse(uid, self._build(uid, d)) for uid, d in drafts.items()}
        self._pods, self._primary = pods, primary
        return dict(pods)

    # The incremental walk ------------------------------------------------------------------------

    def _incremental(self) -> Mapping[str, PodInfo]:
        roots = self._controller_roots()
        rescan = self.container_rescan_ticks
        slot = self._calls % rescan if rescan > 1 else 0
        pods: dict[str, PodInfo] = {}
        primary: set[str] = set()
        for position, (qos, parent_rel, pod_name, uid) in enumerate(self._pod_dirs(roots[0])):
            primary.add(uid)
            known = self._pods.get(uid)
            pod_rel = f"{parent_rel}/{pod_name}"
            if known is not None and known.cgroup_dir == pod_rel and position % rescan != slot:
                pods[uid] = known
                continue
            drafts: dict[str, _PodDraft] = {}
            for root in roots:
                self._add_pod(drafts, root, parent_rel, pod_name, uid, qos)
            pods[uid] = self._reuse(uid, self._build(uid, drafts[uid]))
        for uid, pod in self._pods.items():  # seen only outside the first controller
            if uid not in self._primary and uid not in pods:
                pods[uid] = pod
        self._pods, self._primary = pods, primary
        return dict(pods)

    # Helpers -------------------------------------------------------------------------------------

    def _pod_dirs(self, root: str) -> Iterator[tuple[KubeQOS, str, str, str]]:
        """``(kube QoS, parent dir, pod dir name, uid)`` of every pod under one controller."""
        kube_root = self.host.layout.kube_root
        base = os.path.join(root, kube_root)
        for name in _subdirs(base):
            qos = kube_qos_of_dir(name)
            if qos is not None:
                qos_rel = f"{kube_root}/{name}"
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
