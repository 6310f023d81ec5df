"""VolumeBinding, the part koord-scheduler does: pods whose claims are bound go where their
volumes are; pods with unbound claims are refused, never bound blindly.

kube-scheduler's VolumeBinding (``pkg/scheduler/framework/plugins/volumebinding``) also finds or
provisions volumes for unbound claims; this scheduler does not bind volumes. So, for the
PersistentVolumeClaims of the pod's ``volumes`` (and the ``<pod>-<volume>`` claims of generic
ephemeral volumes), in the pod's namespace:

- **PreFilter.** A claim the snapshot does not have: ``persistentvolumeclaim "data" not found``;
  one being deleted: ``persistentvolumeclaim "data" is being deleted`` (kube-scheduler's words);
  one not yet bound to a volume: :data:`ERR_UNBOUND`, naming the claims. The pod stays Pending
  (its ``FailedScheduling`` Event says why) and is retried on the backoff; once something else
  binds the claim, it is placed.
- **Filter.** A bound claim's PersistentVolume with ``spec.nodeAffinity.required`` admits only
  the nodes it matches: ``node(s) had volume node affinity conflict``; a bound claim whose volume
  the snapshot lacks: ``node(s) unavailable due to one or more pvc(s) bound to non-existent
  pv(s)``.

None of these can be cured by evicting pods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler_plugins.framework import Cycle, Plugin
from scheduler_plugins.selectors import NodeSelector
from scheduler_plugins.snapshot import NodeInfo, PodInfo

NAME = "VolumeBinding"
ERR_UNBOUND = "pod has unbound PersistentVolumeClaims (koord-scheduler does not bind volumes): %s"
"""The refusal, with the claims' names."""
ERR_CLAIM_NOT_FOUND = 'persistentvolumeclaim "%s" not found'
ERR_CLAIM_DELETING = 'persistentvolumeclaim "%s" is being deleted'
ERR_NODE_CONFLICT = "node(s) had volume node affinity conflict"
"""``ErrReasonNodeConflict``."""
ERR_PV_NOT_EXIST = "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
"""``ErrReasonPVNotExist``."""
_KEY = f"{NAME}/volumes"


class VolumeBinding(Plugin):
    """See the module docstring."""

    name = NAME

    def pre_filter(self, cycle: Cycle, pod: PodInfo) -> str | None:
        claims = pod.constraints.claims
        if not claims:
            return None
        snap = cycle.snapshot
        unbound = []
        affinities: list[NodeSelector] = []
        missing = False
        for name in claims:
            claim = snap.claims.get(f"{pod.namespace}/{name}")
            if claim is None:
                return ERR_CLAIM_NOT_FOUND % name
            if claim.deleting:
                return ERR_CLAIM_DELETING % name
            if not claim.bound:
                unbound.append(name)
                continue
            volume = snap.volumes.get(claim.volume_name)
            if volume is None:
                missing = True
            elif volume.node_affinity is not None:
                affinities.append(volume.node_affinity)
        if unbound:
            return ERR_UNBOUND % ", ".join(unbound)
        cycle.data[f"{_KEY}/{pod.uid}"] = (missing, affinities)
        return None

    def filter_nodes(self, cycle: Cycle, pod: PodInfo, nodes: Sequence[NodeInfo]) -> dict[str, str]:
        if not pod.constraints.claims:
            return {}
        missing, affinities = cycle.data.get(f"{_KEY}/{pod.uid}") or (False, [])
        if missing:
            return {n.name: ERR_PV_NOT_EXIST for n in nodes}
        if not affinities:
            return {}
        return {
            n.name: ERR_NODE_CONFLICT
            for n in nodes
            if not all(a.matches(n.name, n.labels) for a in affinities)
        }

    def unresolvable(self, reason: str) -> bool:
        return True


def build(args: Mapping[str, Any] | None, source: str) -> VolumeBinding:
    """Factory for the plugin table (no args)."""
    return VolumeBinding()
