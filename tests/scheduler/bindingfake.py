"""The in-repo fake API server plus the one thing the scheduler needs that it lacks: the pods'
``binding`` subresource (sets ``spec.nodeName`` and, as the API server's ``assignPod`` does, the
``PodScheduled`` condition True; 409 when the pod is already bound)."""

from __future__ import annotations

import copy
import time
from typing import Any

from tests.kubefake.server import ApiStatusError, FakeApiServer, Kind, Obj

CRDS = (
    Kind("scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas", "ElasticQuota", True),
    Kind("scheduling.sigs.k8s.io", "v1alpha1", "podgroups", "PodGroup", True),
    Kind("scheduling.koordinator.sh", "v1alpha1", "reservations", "Reservation", False),
    Kind("scheduling.koordinator.sh", "v1alpha1", "devices", "Device", False),
    Kind("", "v1", "namespaces", "Namespace", False, status_subresource=False),
    Kind("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True),
    Kind("", "v1", "persistentvolumes", "PersistentVolume", False),
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
)


class BindingFakeApiServer(FakeApiServer):
    """:class:`FakeApiServer` with ``POST pods/<name>/binding`` and the scheduler's CRDs."""

    def __init__(self) -> None:
        super().__init__()
        for kind in CRDS:
            self.register(kind)

    def _dispatch(
        self,
        method: str,
        kind: Kind,
        ns: str | None,
        name: str | None,
        sub: str,
        query: dict[str, str],
        body: Any,
        ctype: str,
    ) -> Obj:
        if sub == "binding" and kind.plural == "pods" and method == "POST" and name is not None:
            current = self.objects.get((kind.plural, ns or "", name))
            if current is None:
                raise ApiStatusError(404, "NotFound", f'pods "{name}" not found')
            if (current.get("spec") or {}).get("nodeName"):
                raise ApiStatusError(409, "Conflict", f'pod "{name}" is already assigned')
            target = ((body or {}).get("target") or {}).get("name")
            if not target:
                raise ApiStatusError(400, "BadRequest", "binding without a target")
            new = copy.deepcopy(current)
            new.setdefault("spec", {})["nodeName"] = target
            status = new.setdefault("status", {})
            scheduled = {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            status["conditions"] = [
                c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"
            ] + [scheduled]
            self._commit(kind, (kind.plural, ns or "", name), new, "MODIFIED")
            return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
        return super()._dispatch(method, kind, ns, name, sub, query, body, ctype)
