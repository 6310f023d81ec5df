"""ImageLocality: prefer nodes that already have the pod's images (kube-scheduler's in-tree
score plugin, ``pkg/scheduler/framework/plugins/imagelocality``).

For each container image of the pod (``:latest`` added when untagged) that the node lists in
``status.images``, the image's size scaled by the share of nodes that have it; the sum, clamped
to 23 MiB .. 1000 MiB per container, is mapped onto 0..100. Default weight 1. How many nodes have
each image is kept per image name and updated for the nodes that change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler_plugins.framework import MAX_NODE_SCORE, Cycle, Plugin
from scheduler_plugins.plugins.nodecache import Changes
from scheduler_plugins.snapshot import NodeInfo, PodInfo

NAME = "ImageLocality"
MB = 1024 * 1024
MIN_THRESHOLD = 23 * MB
"""``minThreshold``."""
MAX_CONTAINER_THRESHOLD = 1000 * MB
"""``maxContainerThreshold``."""


def image_priority(sum_scores: int, containers: int) -> int:
    """``calculatePriority``: the clamped sum on the 0..100 scale."""
    top = MAX_CONTAINER_THRESHOLD * containers
    clamped = min(max(sum_scores, MIN_THRESHOLD), top)
    return MAX_NODE_SCORE * (clamped - MIN_THRESHOLD) // (top - MIN_THRESHOLD)


class ImageLocality(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self) -> None:
        self._changes = Changes()
        self._spread: dict[str, int] = {}
        """Image name → how many nodes list it."""
        self._of: dict[str, tuple[str, ...]] = {}
        """Node → the image names counted for it."""

    def _prepare(self, cycle: Cycle) -> None:
        snap = cycle.snapshot
        names = self._changes.poll(snap)
        if names is None:
            self._spread.clear()
            self._of.clear()
            names = set(snap.nodes)
        for name in names:
            for image in self._of.pop(name, ()):
                left = self._spread[image] - 1
                if left:
                    self._spread[image] = left
                else:
                    del self._spread[image]
            node = snap.nodes.get(name)
            if node is not None and node.images:
                self._of[name] = tuple(node.images)
                for image in node.images:
                    self._spread[image] = self._spread.get(image, 0) + 1

    def score_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, int]:
        self._prepare(cycle)
        images = [i for i in pod.constraints.images if i in self._spread]
        if not images:
            return dict(cycle.names_of(nodes)[1])
        containers = max(len(pod.constraints.images), 1)
        total = len(cycle.snapshot.nodes) or 1
        out: dict[str, int] = {}
        for node in nodes:
            s = 0
            for image in images:
                size = node.images.get(image)
                if size is not None:
                    s += int(size * (self._spread[image] / total))
            out[node.name] = image_priority(s, containers)
        return out


def build(args: Mapping[str, Any] | None, source: str) -> ImageLocality:
    """Factory for the plugin table (no args)."""
    return ImageLocality()
