"""The NodeMetric controller: one NodeMetric per Node, with the collect policy in its spec.

For every Node it creates the cluster-scoped NodeMetric of the same name, owned by the Node
(``ownerReferences`` with the Node's UID, so the garbage collector removes it with the Node),
whose ``spec.metricCollectPolicy`` says how the koordlet collects and reports:

- ``aggregateDurationSeconds`` ← ``metricAggregateDurationSeconds``;
- ``reportIntervalSeconds`` ← ``metricReportIntervalSeconds``;
- ``nodeAggregatePolicy.durations`` ← ``metricAggregatePolicy.durations`` (as Go writes
  ``metav1.Duration``: ``"5m0s"``);
- ``nodeMemoryCollectPolicy`` ← ``metricMemoryCollectPolicy``;

from the ``colocation-config`` strategy of the node (the first ``nodeConfigs`` entry whose
selector matches wins). The spec is replaced only when it differs; ``status`` belongs to the
koordlet and is never written. When the Node goes, the NodeMetric is deleted explicitly too, as
upstream's controller does (a cluster without a garbage collector, or an owner reference added
late, still loses it). A bad ``colocation-config`` is refused: the last good one stays in force
and an error line names the key and the field (the node resource controller, which reads the
same key, posts the Event).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Unpack

from apis.configuration import COLOCATION_CONFIG_KEY, ColocationConfig, ColocationStrategy
from apis.duration import format_duration, parse_duration
from apis.slo import SchemaError
from apis.sloconfig import parse_slo_controller_config
from kubeclient.client import KubeClient, Obj
from kubeclient.errors import Conflict, NotFound
from kubeclient.informer import Informer
from kubeclient.resources import NODE_METRICS
from manager.nodekeyed import NodeKeyedController, Options

logger = logging.getLogger(__name__)


def _meta(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


def collect_policy(strategy: ColocationStrategy) -> dict[str, Any]:
    """``spec.metricCollectPolicy`` for a node's colocation strategy."""
    return {
        "aggregateDurationSeconds": strategy.metric_aggregate_duration_seconds,
        "reportIntervalSeconds": strategy.metric_report_interval_seconds,
        "nodeAggregatePolicy": {
            "durations": [
                format_duration(parse_duration(d)) for d in strategy.metric_aggregate_durations
            ]
        },
        "nodeMemoryCollectPolicy": strategy.metric_memory_collect_policy,
    }


def owner_reference(node: Obj) -> dict[str, Any]:
    """The Node as the controlling owner of its NodeMetric."""
    meta = _meta(node)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "name": str(meta.get("name") or ""),
        "uid": str(meta.get("uid") or ""),
        "controller": True,
    }


class NodeMetricController(NodeKeyedController):
    """Keeps one NodeMetric per Node, with the collect policy of the colocation config."""

    log = logger
    kind = "NodeMetric"
    task_prefix = "nodemetric"
    informer_task_prefix = "nodemetric-informer"

    def __init__(self, client: KubeClient, **options: Unpack[Options]) -> None:
        super().__init__(client, **options)
        self.node_metrics = Informer(client, NODE_METRICS)
        self.colocation: ColocationConfig | None = None
        """The colocation config in force; None until a good one (or its absence) was read."""
        self.config_error = ""
        """The refusal of the latest colocation-config (empty when it is in force)."""
        self._text: object = None
        self.nodes.add_handler(self._queue, lambda _o, new: self._queue(new), self._queue)
        self.node_metrics.add_handler(self._queue, lambda _o, new: self._queue(new), self._queue)

    @property
    def _config_read(self) -> bool:
        return self.colocation is not None

    def _informers(self) -> tuple[Informer, ...]:
        return (*super()._informers(), self.node_metrics)

    def _after_sync(self) -> None:
        if self.colocation is None and self.configmaps.synced and (cms := self.configmaps.list()):
            self.load_config(cms[0])
        super()._after_sync()
        for metric in self.node_metrics.list():
            self._queue(metric)  # orphans whose Node went while we were away

    def _resync_once(self) -> None:
        """Queue every node and every NodeMetric."""
        super()._resync_once()
        for metric in self.node_metrics.list():
            self._queue(metric)

    def _config_gone(self, _obj: Obj) -> None:
        self.colocation = ColocationConfig()
        self._text = None
        self.config_error = ""
        self._queue_all()

    def load_config(self, cm: Obj) -> bool:
        """Take ``colocation-config`` of the ConfigMap if it parses (else keep the last good
        one and log the key and the field). Returns whether it was taken."""
        data = cm.get("data") or {}
        text = data.get(COLOCATION_CONFIG_KEY)
        if self.colocation is not None and text == self._text and not self.config_error:
            return True
        source = f"{self.config_namespace}/{self.config_name}"
        try:
            parsed = parse_slo_controller_config(
                {} if text is None else {COLOCATION_CONFIG_KEY: text}, source, strict=False
            )
        except SchemaError as err:
            self.config_error = str(err)
            kept = "the last good one stays" if self.colocation else "no configuration yet"
            logger.error("refusing %s (%s): %s", COLOCATION_CONFIG_KEY, kept, err)  # noqa: TRY400
            return False
        self.colocation = parsed.colocation
        self._text = text
        self.config_error = ""
        self._queue_all()
        return True

    def desired_spec(self, node: Obj) -> dict[str, Any] | None:
        """The NodeMetric spec of ``node`` (None before any configuration was read)."""
        if self.colocation is None:
            return None
        labels: Mapping[str, str] = _meta(node).get("labels") or {}
        strategy, _ = self.colocation.for_node(labels)
        return {"metricCollectPolicy": collect_policy(strategy)}

    async def reconcile(self, name: str) -> str:
        """Bring node ``name``'s NodeMetric in line; what was done: ``created``, ``updated``,
        ``deleted`` or ``""``."""
        node = self.nodes.get(name)
        current = self.node_metrics.get(name)
        if node is None:
            if current is None:
                return ""
            try:
                await self._client.delete(NODE_METRICS, name)
            except NotFound:
                return ""
            self.writes += 1
            logger.info("node %s gone: NodeMetric deleted", name)
            return "deleted"
        spec = self.desired_spec(node)
        if spec is None:
            return ""
        owner = owner_reference(node)
        if current is None:
            body: Obj = {
                "apiVersion": NODE_METRICS.api_version,
                "kind": NODE_METRICS.kind,
                "metadata": {"name": name, "ownerReferences": [owner]},
                "spec": spec,
            }
            try:
                await self._client.create(NODE_METRICS, body)
            except Conflict:  # the informer lags: the next event brings it
                return ""
            self.writes += 1
            logger.info("node %s: NodeMetric created", name)
            return "created"
        refs = list(_meta(current).get("ownerReferences") or [])
        others = [r for r in refs if not (r.get("kind") == "Node" and r.get("apiVersion") == "v1")]
        want_refs = [*others, owner]
        if current.get("spec") == spec and refs == want_refs:
            return ""
        updated = dict(current)
        updated["metadata"] = {**_meta(current), "ownerReferences": want_refs}
        updated["spec"] = spec
        await self._client.replace(NODE_METRICS, updated)
        self.writes += 1
        logger.info("node %s: NodeMetric collect policy updated", name)
        return "updated"
