"""Kubelet-free pod discovery: walk the kubepods cgroup hierarchy.

Pod UID and Kubernetes QoS come from directory names (both cgroup drivers); the Koordinator class
follows from the Kubernetes QoS (BestEffort→BE, Burstable→LS, Guaranteed→LSR) because nothing
else is known without the API server. Containers are the runtime scopes under each pod.

On cgroup v1 the walk takes the union over the controllers the collectors read (cpuacct, cpu,
memory): a tree made by hand under only some of them is still found, and what is missing in a
controller shows up later as an unsupported source, not as a missing pod.
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


@dataclass
class KubepodsSource:
    """Discovers pods and containers from the kubepods hierarchy of every walked controller."""

    host: Host
    name: str = "kubepods"

    def _controller_roots(self) -> tuple[str, ...]:
        layout = self.host.layout
        if layout.version is CgroupVersion.V2:
            return (layout.abs_dir("cpu", ""),)
        return tuple(layout.abs_dir(c, "") for c in V1_WALK_CONTROLLERS)

    def list_pods(self) -> Mapping[str, PodInfo]:
        kube_root = self.host.layout.kube_root
        drafts: dict[str, _PodDraft] = {}
        for root in self._controller_roots():
            base = os.path.join(root, kube_root)
            for name in _subdirs(base):
                qos = kube_qos_of_dir(name)
                if qos is not None:
                    qos_rel = f"{kube_root}/{name}"
                    for pod_name in _subdirs(os.path.join(base, name)):
                        self._add_pod(drafts, root, qos_rel, pod_name, qos)
                else:
                    self._add_pod(drafts, root, kube_root, name, KubeQOS.GUARANTEED)
        return {
            uid: PodInfo(
                uid=uid,
                name=f"pod{uid}",
                namespace="",
                qos=KUBE_QOS_TO_QOS[d.kube_qos],
                kube_qos=d.kube_qos,
                cgroup_dir=d.cgroup_dir,
                containers=tuple(d.containers[cid] for cid in sorted(d.containers)),
                source=self.name,
            )
            for uid, d in drafts.items()
        }

    @staticmethod
    def _add_pod(
        drafts: dict[str, _PodDraft], root: str, parent_rel: str, pod_name: str, qos: KubeQOS
    ) -> None:
        uid = parse_pod_dir_name(pod_name)
        if uid is None:
            return
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
