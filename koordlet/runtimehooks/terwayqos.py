"""``TerwayQoS``: the files Terway's terway-qos daemon enforces network QoS from,
``global_bps_config`` (the node's and the LS and BE classes' bandwidths) and ``pod.json`` (each
pod's level, cgroup and own limits), kept from the NodeSLO and the pods.

Upstream: ``pkg/koordlet/runtimehooks/hooks/terwayqos`` (``terwayqos.go``, ``types.go``); the
formats and the formula are :mod:`apis.terway`, the user's view docs/runtimehooks.md
("TerwayQoS"). Upstream's plugin hooks no container event: it registers rule callbacks (the
NodeSLO, all pods) that rewrite the files. Here it is a row of the reconciler's node level
(``Level.NODE``): each round :meth:`TerwayQoS.node_files` says what the folder must hold and the
reconciler writes what changed through the executor (atomically, audited, dry-run, recorded for
``koordlet reset``). What the folder must hold:

- before the NodeSLO is read (the defaults in force, generation 0): nothing is touched (upstream
  waits for its first NodeSLO callback);
- with ``resourceQOSStrategy.policies.netQOSPolicy: terway-qos``: both files;
- with any other policy: neither (upstream removes them).

A NodeSLO whose ``resourceQOSStrategy`` or ``systemStrategy`` was rejected before any good one
was seen changes nothing (what is in force may be the defaults; the files stay as an earlier run
left them). A NodeSLO value that cannot be applied (a percent above 100, a quantity that does not
parse or is above ``totalNetworkBandwidth``) keeps the last good state: the same
``global_bps_config`` (and whether the policy was terway-qos); the error names the field and is
logged once per NodeSLO; ``pod.json`` still follows the pods. A pod whose
``koordinator.sh/networkQOS`` is malformed is listed with no limits (0) and gets one Warning
Event ``InvalidPodAnnotation`` (upstream leaves such a pod out of ``pod.json`` and only logs);
the other pods are unaffected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from apis.pod_overrides import INVALID_ANNOTATION_REASON, AnnotationError
from apis.slo import SchemaError
from apis.slo_inforce import RESOURCE_QOS_STRATEGY, SYSTEM_STRATEGY, NodeSLOInForce
from apis.slo_qos import NetQOSPolicy
from apis.terway import (
    GLOBAL_BPS_CONFIG,
    POD_CONFIG,
    TERWAY_QOS_DIR,
    GlobalBpsConfig,
    TerwayPod,
    global_bps_config,
    net_cls_dir,
    pod_bandwidth,
    pod_config_text,
    pod_prio,
)
from koordlet.runtimehooks.model import (
    Change,
    ContainerRequest,
    HookWarning,
    NodeFiles,
    PodMeta,
    PodRequest,
)

if TYPE_CHECKING:
    from koordlet.runtimehooks.table import HookContext
    from koordlet.statesinformer.model import PodInfo

logger = logging.getLogger(__name__)

NAME = "TerwayQoS"
"""The gate's and the plugin's name (upstream ``name``)."""


class TerwayQoS:
    """The hook; ``folder`` is terway-qos's folder as the koordlet sees it
    (``--runtime-hooks-terway-qos-dir``)."""

    def __init__(
        self, node_slo: Callable[[], NodeSLOInForce], folder: str = TERWAY_QOS_DIR
    ) -> None:
        self._node_slo = node_slo
        self.folder = folder
        self._seen: NodeSLOInForce | None = None
        self._good: tuple[bool, GlobalBpsConfig | None] | None = None
        """The last NodeSLO that could be applied: (policy is terway-qos, its file)."""
        self._error = ""

    def pod(self, req: PodRequest) -> Change | None:
        return None  # nothing at a pod's creation: terway-qos reads pod.json

    def container(self, req: ContainerRequest) -> Change | None:
        return None

    def node_files(self, pods: Iterable[PodInfo]) -> NodeFiles:
        """What terway-qos's folder must hold now (module docstring)."""
        slo = self._node_slo()
        if slo is not self._seen:
            self._seen = slo
            self._read(slo)
        detail: dict[str, Any] = {"folder": self.folder, "error": self._error}
        if self._good is None:
            detail["state"] = "waiting for the NodeSLO"
            return NodeFiles(self.folder, error=self._error, detail=detail)
        enabled, config = self._good
        if not enabled or config is None:
            detail["state"] = "netQOSPolicy is not terway-qos: no files"
            files: dict[str, str | None] = {GLOBAL_BPS_CONFIG: None, POD_CONFIG: None}
            reason = "netQOSPolicy is not terway-qos"
            return NodeFiles(self.folder, files, reason, self._error, detail=detail)
        listed, warnings = self._pods(pods)
        detail |= {
            "state": "netQOSPolicy terway-qos",
            GLOBAL_BPS_CONFIG: config.as_dict(),
            "pods": len(listed),
            "pods_with_limits": sum(1 for p in listed if p.ingress_bandwidth or p.egress_bandwidth),
        }
        files = {GLOBAL_BPS_CONFIG: config.to_text(), POD_CONFIG: pod_config_text(listed)}
        reason = f"netQOSPolicy terway-qos: {config.hw_tx_bps_max} byte/s total, {len(listed)} pods"
        return NodeFiles(self.folder, files, reason, self._error, tuple(warnings), detail)

    def _read(self, slo: NodeSLOInForce) -> None:
        """Take a new NodeSLO in force, or keep the last good state and say why."""
        if slo.generation == 0:
            return  # the defaults: nothing read yet
        rejected = [s for s in (RESOURCE_QOS_STRATEGY, SYSTEM_STRATEGY) if s in slo.rejected]
        if rejected and self._good is None:
            # what is in force may be the defaults: wait, leaving the files as they are
            why = "; ".join(str(slo.rejected[s].error) for s in rejected)
            self._error = f"{why}; terway-qos's files are left as they are until it parses"
            logger.warning("runtime hook %s: %s", NAME, self._error)
            return
        qos = slo.resource_qos_strategy
        if qos.policies.net_qos_policy is not NetQOSPolicy.TERWAY_QOS:
            self._good, self._error = (False, None), ""
            return
        try:
            config = global_bps_config(qos, slo.system_strategy.total_network_bandwidth)
        except SchemaError as err:
            self._error = f"{err}; terway-qos's files keep their last good content"
            logger.warning("runtime hook %s: %s", NAME, self._error)
            return
        self._good, self._error = (True, config), ""

    def _pods(
        self, pods: Iterable[PodInfo]
    ) -> tuple[list[TerwayPod], list[tuple[PodMeta, HookWarning]]]:
        listed = []
        warnings = []
        for pod in pods:
            try:
                ingress, egress = pod_bandwidth(pod.annotations)
            except AnnotationError as err:
                ingress = egress = 0
                message = f"{err}; listed for terway-qos without bandwidth limits"
                meta = PodMeta(pod.name, pod.namespace, pod.uid)
                warnings.append((meta, HookWarning(NAME, INVALID_ANNOTATION_REASON, message)))
            prio = pod_prio(pod.labels, pod.kube_qos)
            cgroup = net_cls_dir(pod.cgroup_dir)
            listed.append(
                TerwayPod(pod.name, pod.namespace, pod.uid, prio, cgroup, ingress, egress)
            )
        return listed, warnings


def build(ctx: HookContext) -> TerwayQoS:
    """The table's factory (row ``TerwayQoS``)."""
    return TerwayQoS(ctx.node_slo, ctx.terway_qos_dir)
