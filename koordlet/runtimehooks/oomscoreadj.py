"""``OOMScoreAdj``: a new container starts with the ``oom_score_adj`` its pod's annotations ask for.

Koordinator (HEAD, PR #3139, gate ``OOMScoreAdj``) lets a pod set the ``oom_score_adj`` of its
containers' processes: ``koordinator.sh/oom-score-adj-spec`` (``{"main": -500}``) for a
container, else ``koordinator.sh/oom-score-adj`` (``"-500"``) for every container of the pod
(:func:`apis.pod_overrides.oom_score_adj_for`, upstream's ``getOOMScoreAdjForContainer``).
Upstream writes it into ``/proc/<pid>/oom_score_adj`` of the running processes every reconcile
round; this koordlet's ``oomscoreadj`` QoS strategy does the same. Between a container's start and
that round its processes have the kubelet's value (1000 for a BestEffort pod). This hook closes
that window, ours: at ``PreCreateContainer`` the value goes into the creation request, CRI's
``LinuxContainerResources.oom_score_adj`` (proxy mode) or NRI's
``LinuxContainerAdjustment.oom_score_adj`` (NRI mode), so the runtime starts the container's
first process with it and its children inherit it.

The sandbox (pause) container is never touched: it is not created through ``CreateContainer``,
and upstream leaves its runtime-managed value alone too. A container the annotations do not name
keeps the kubelet's value. A value that does not parse, or lies outside -1000..1000, changes
nothing here; the strategy, under the same gate, reports it once (a Warning Event
``InvalidPodAnnotation``). In proxy mode a target of 0 cannot be sent (CRI's 0 reads "not
specified", and the proxy keeps the kubelet's value): the strategy writes 0 at its next round.
The reconciler does not run this hook (running processes are the strategy's).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from apis.pod_overrides import AnnotationError, oom_score_adj_for
from koordlet.runtimehooks.model import Change, ContainerRequest, PodRequest, Resources

if TYPE_CHECKING:
    from koordlet.runtimehooks.table import HookContext

logger = logging.getLogger(__name__)

NAME = "OOMScoreAdj"
"""Upstream's plugin name and feature gate."""


class OOMScoreAdj:
    """The hook."""

    def pod(self, req: PodRequest) -> Change | None:
        return None

    def container(self, req: ContainerRequest) -> Change | None:
        try:
            value = oom_score_adj_for(req.pod_annotations, req.container_name)
        except AnnotationError as err:  # the strategy reports it, once
            logger.debug("pod %s container %s: %s", req.pod, req.container_name, err)
            return None
        if value is None:
            return None
        return Change(
            resources=Resources(oom_score_adj=value),
            reason=f"oom_score_adj {value} from the pod's annotations",
        )


def build(_ctx: HookContext) -> OOMScoreAdj:
    """The table's factory (row ``OOMScoreAdj``)."""
    return OOMScoreAdj()
