"""The node resource controller: batch and mid resources onto every Node.

Informers keep Nodes, NodeMetrics, pods and the ``slo-controller-config`` ConfigMap; their
events queue node names on a :class:`~manager.workqueue.WorkQueue` (a ConfigMap change queues
every node), and a periodic resync queues them all too. The worker's step,
:meth:`NodeResourceController.reconcile`, runs :func:`~manager.noderesource.calculator.calculate`
(the one ``explain`` uses) and, when :func:`~manager.noderesource.calculator.decide_update` says
so, replaces the Node's status (capacity and allocatable of the four resources; removed on a
reset) through the status subresource with conflict retry, and merge-patches the CPU
normalization and resource amplification annotations when they change.

The ConfigMap: a bad one (invalid JSON or values) is refused as a whole; the last good
configuration stays in force, an error line and a Warning Event on the ConfigMap name the key
and the field. Before any good configuration was read, no Node is touched. A missing ConfigMap
means Koordinator's defaults (colocation off: the resources are removed).
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Any, Unpack

from apis.configuration import SLOControllerConfig, parse_slo_controller_config
from apis.manager_keys import (
    ANNOTATION_CPU_NORMALIZATION_RATIO,
    ANNOTATION_NODE_RESOURCE_AMPLIFICATION_RATIO,
    EXTENDED_RESOURCES,
)
from apis.slo import SchemaError
from kubeclient.client import KubeClient, Obj
from kubeclient.errors import ApiError, NotFound
from kubeclient.informer import Informer
from kubeclient.resources import NODE_METRICS, NODES, PODS
from kubeclient.writes import update_status
from manager.cpunormalization import amplification_ratios
from manager.errors import InputError
from manager.nodekeyed import NodeKeyedController, Options, name_of
from manager.noderesource.calculator import NodeResourceResult, calculate, decide_update
from manager.noderesource.inputs import parse_node, parse_node_metric, parse_pod

logger = logging.getLogger(__name__)

RATIO_EPSILON = 0.01
"""Smallest change of the CPU normalization ratio worth a write (upstream's epsilon)."""


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


class NodeResourceController(NodeKeyedController):
    """Computes and writes every node's batch and mid resources. The resync queues every node,
    so that ``updateTimeThresholdSeconds`` and degradation apply without events."""

    log = logger
    task_prefix = "noderesource"
    retry_errors = (ApiError, InputError)

    def __init__(self, client: KubeClient, **options: Unpack[Options]) -> None:
        super().__init__(client, **options)
        self.node_metrics = Informer(client, NODE_METRICS)
        self.pods = Informer(client, PODS)
        self.config: SLOControllerConfig | None = None
        """The configuration in force; None until a good one (or its absence) was seen."""
        self.config_error = ""
        """The last refusal of the ConfigMap (empty when the one in force is the latest)."""
        self.last_write: dict[str, datetime] = {}
        self._pods_by_node: dict[str, dict[str, Obj]] = {}
        self._pod_node: dict[str, str] = {}
        self.nodes.add_handler(self._queue, lambda _old, new: self._queue(new), self._node_gone)
        self.node_metrics.add_handler(self._queue, lambda _old, new: self._queue(new), self._queue)
        self.pods.add_handler(self._pod_seen, lambda _old, new: self._pod_seen(new), self._pod_gone)

    @property
    def _config_read(self) -> bool:
        return self.config is not None

    def _informers(self) -> tuple[Informer, ...]:
        return (*super()._informers(), self.node_metrics, self.pods)

    # Events ------------------------------------------------------------------------------------
    def _node_gone(self, obj: Obj) -> None:
        self.last_write.pop(name_of(obj), None)

    def _pod_seen(self, obj: Obj) -> None:
        key = _key(obj)
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        old = self._pod_node.get(key)
        if old is not None and old != node:
            self._pods_by_node.get(old, {}).pop(key, None)
            self.queue.add(old)
        if node:
            self._pod_node[key] = node
            self._pods_by_node.setdefault(node, {})[key] = obj
            self.queue.add(node)

    def _pod_gone(self, obj: Obj) -> None:
        key = _key(obj)
        node = self._pod_node.pop(key, None)
        if node is not None:
            self._pods_by_node.get(node, {}).pop(key, None)
            self.queue.add(node)

    def _config_gone(self, _obj: Obj) -> None:
        logger.warning(
            "%s/%s deleted: Koordinator's defaults apply", self.config_namespace, self.config_name
        )
        self.config = SLOControllerConfig()
        self._queue_all()

    def load_config(self, obj: Obj) -> bool:
        """Take the ConfigMap ``obj`` if it is good; else keep the last good one, log and post a
        Warning Event naming the key and the field. Returns whether it was taken."""
        source = f"{self.config_namespace}/{self.config_name}"
        try:
            config = parse_slo_controller_config(obj, source, strict=False)
        except SchemaError as err:
            self.config_error = str(err)
            kept = "the last good configuration stays" if self.config else "no configuration yet"
            logger.error("refusing %s: %s (%s)", source, err, kept)  # noqa: TRY400 - one line, no trace
            self._post_event(obj, str(err))
            return False
        self.config = config
        self.config_error = ""
        self._queue_all()
        return True

    # The step ----------------------------------------------------------------------------------
    def compute(self, name: str) -> NodeResourceResult | None:
        """The result for node ``name`` from the informers' stores (None: no node or config)."""
        node_obj = self.nodes.get(name)
        if node_obj is None or self.config is None:
            return None
        node = parse_node(node_obj, f"node {name}")
        metric_obj = self.node_metrics.get(name)
        metric = None
        if metric_obj is not None:
            try:
                metric = parse_node_metric(metric_obj, f"nodemetric {name}")
            except InputError as err:
                logger.warning("%s: treated as missing (degrades)", err)
        pods = []
        for key, pod in self._pods_by_node.get(name, {}).items():
            try:
                pods.append(parse_pod(pod, f"pod {key}", ""))
            except InputError as err:  # one bad pod must not stop the node: count nothing of it
                logger.warning("%s: skipped", err)
        return calculate(self.config, node, metric, pods, self._clock(), record=False)

    async def reconcile(self, name: str) -> bool:
        """Bring node ``name`` up to date; whether its status was written."""
        result = self.compute(name)
        if result is None:
            return False
        node = parse_node(self.nodes.get(name) or {}, f"node {name}")
        now = self._clock()
        decision = decide_update(result, node.extended, self.last_write.get(name), now)
        wrote = False
        if decision.needed:
            try:
                await update_status(
                    self._client, NODES, name, lambda cur: _status_with(cur, result)
                )
            except NotFound:
                return False
            self.last_write[name] = now
            self.writes += 1
            wrote = True
            logger.info(
                "node %s: wrote %s (%s)", name, dict(result.values), "; ".join(decision.reasons)
            )
        await self._sync_annotations(name, result)
        return wrote

    async def _sync_annotations(self, name: str, result: NodeResourceResult) -> None:
        assert self.config is not None
        node_obj = self.nodes.get(name) or {}
        annotations = (node_obj.get("metadata") or {}).get("annotations") or {}
        patch: dict[str, Any] = {}
        ratio_text = result.normalization.annotation
        if ratio_text is not None and _ratio_changed(
            annotations.get(ANNOTATION_CPU_NORMALIZATION_RATIO), ratio_text
        ):
            patch[ANNOTATION_CPU_NORMALIZATION_RATIO] = ratio_text
        labels = (node_obj.get("metadata") or {}).get("labels") or {}
        cpu_ratio = result.normalization.ratio
        if cpu_ratio is None:  # none worked out now: the ratio on the node, as upstream reads it
            cpu_ratio = current_ratio(annotations.get(ANNOTATION_CPU_NORMALIZATION_RATIO))
        try:
            _, amp = amplification_ratios(self.config.resource_amplification, labels, cpu_ratio)
        except ValueError as err:
            logger.warning("node %s: %s", name, err)
        else:
            if annotations.get(ANNOTATION_NODE_RESOURCE_AMPLIFICATION_RATIO) != amp:
                patch[ANNOTATION_NODE_RESOURCE_AMPLIFICATION_RATIO] = amp
        if patch:
            await self._client.patch(NODES, name, {"metadata": {"annotations": patch}})


def current_ratio(text: str | None) -> float | None:
    """The normalization ratio a node carries (upstream ``GetCPUNormalizationRatio``: absent,
    unreadable or not positive is none)."""
    try:
        ratio = float(text) if text is not None else None
    except ValueError:
        return None
    return ratio if ratio is not None and ratio > 0 else None


def _ratio_changed(old: str | None, new: str) -> bool:
    if old is None:
        return True
    try:
        return math.fabs(float(old) - float(new)) >= RATIO_EPSILON
    except ValueError:
        return True


def _status_with(current: Obj, result: NodeResourceResult) -> Obj:
    status = dict(current.get("status") or {})
    for field in ("capacity", "allocatable"):
        lst = dict(status.get(field) or {})
        for name in EXTENDED_RESOURCES:
            value = result.values.get(name)
            if value is None:
                lst.pop(name, None)
            else:
                lst[name] = str(value)
        status[field] = lst
    return status
