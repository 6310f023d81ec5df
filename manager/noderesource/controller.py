"""The node resource controller: batch and mid resources onto every Node.

Informers keep Nodes, NodeMetrics, pods and the ``slo-controller-config`` ConfigMap; their
events queue node names on a :class:`~manager.workqueue.WorkQueue` (a ConfigMap change queues
every node), and a periodic resync queues them all too. The worker's step,
:meth:`NodeResourceController.reconcile`, runs :func:`~manager.noderesource.calculator.calculate`
(the one ``explain`` uses) and, when :func:`~manager.noderesource.calculator.decide_update` says
so, replaces the Node's status (capacity and allocatable of the four resources; removed on a
reset) through the status subresource with conflict retry, and merge-patches the CPU
normalization and resource amplification annotations when they change. With a
NodeResourceTopology whose zones the koordlet has filled, it also writes each zone's batch
resources there (:mod:`~manager.noderesource.zones`), when one moved by more than
``resourceDiffThreshold`` or ``updateTimeThresholdSeconds`` passed since the last zone write
(upstream's ``prepareForNodeResourceTopology``); a reset leaves the zones as they are, as upstream.

The ConfigMap: a bad one (invalid JSON or values) is refused as a whole; the last good
configuration stays in force, an error line and a Warning Event on the ConfigMap name the key
and the field. Before any good configuration was read, no Node is touched. A missing ConfigMap
means Koordinator's defaults (colocation off: the resources are removed).
"""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import datetime
from typing import Any, Unpack

from apis.configuration import SLOControllerConfig
from apis.manager_keys import (
    ANNOTATION_CPU_NORMALIZATION_RATIO,
    ANNOTATION_NODE_RESOURCE_AMPLIFICATION_RATIO,
    EXTENDED_RESOURCES,
    format_extended,
)
from apis.slo import SchemaError
from apis.sloconfig import parse_slo_controller_config
from kubeclient.backoff import Backoff
from kubeclient.client import KubeClient, Obj
from kubeclient.errors import ApiError, Conflict, NotFound
from kubeclient.informer import Informer, name_of
from kubeclient.resources import NODE_METRICS, NODE_RESOURCE_TOPOLOGIES, NODES, PODS
from kubeclient.writes import CONFLICT_ATTEMPTS, update_status
from manager.cpunormalization import amplification_ratios
from manager.errors import InputError
from manager.nodekeyed import NodeKeyedController, Options
from manager.noderesource.calculator import NodeResourceResult, calculate, decide_update
from manager.noderesource.inputs import (
    NodeMetricView,
    PodView,
    parse_node,
    parse_node_metric,
    parse_pod,
)
from manager.noderesource.zones import calculate_zones, read_zones, update_zones

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
        self.topologies = Informer(client, NODE_RESOURCE_TOPOLOGIES)
        self.config: SLOControllerConfig | None = None
        """The configuration in force; None until a good one (or its absence) was seen."""
        self.config_error = ""
        """The last refusal of the ConfigMap (empty when the one in force is the latest)."""
        self.last_write: dict[str, datetime] = {}
        self.last_zone_write: dict[str, datetime] = {}
        """Node → when its NodeResourceTopology zones were last written (upstream's
        ``nrtSyncContext``)."""
        self.zone_writes = 0
        """NodeResourceTopology writes made."""
        self._pods_by_node: dict[str, dict[str, Obj]] = {}
        self._pod_node: dict[str, str] = {}
        self.nodes.add_handler(self._queue, lambda _old, new: self._queue(new), self._node_gone)
        self.node_metrics.add_handler(self._queue, lambda _old, new: self._queue(new), self._queue)
        self.pods.add_handler(self._pod_seen, lambda _old, new: self._pod_seen(new), self._pod_gone)
        self.topologies.add_handler(self._nrt_seen, self._nrt_changed, self._nrt_gone)

    @property
    def _config_read(self) -> bool:
        return self.config is not None

    def _informers(self) -> tuple[Informer, ...]:
        return (*super()._informers(), self.node_metrics, self.pods, self.topologies)

    # Events ------------------------------------------------------------------------------------
    def _node_gone(self, obj: Obj) -> None:
        self.last_write.pop(name_of(obj), None)

    def _nrt_seen(self, obj: Obj) -> None:
        if _zone_inputs(obj) is not None:  # the koordlet has reported its zones
            self.queue.add(name_of(obj))

    def _nrt_changed(self, old: Obj, new: Obj) -> None:
        if _zone_inputs(old) != _zone_inputs(new):  # our own zone writes do not queue
            self.queue.add(name_of(new))

    def _nrt_gone(self, obj: Obj) -> None:
        self.last_zone_write.pop(name_of(obj), None)

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
        inputs = self._inputs(name)
        return None if inputs is None else inputs[0]

    def _inputs(
        self, name: str
    ) -> tuple[NodeResourceResult, NodeMetricView | None, list[PodView]] | None:
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
        nrt = self.topologies.get(name) or {}
        annotations = (nrt.get("metadata") or {}).get("annotations") or {}
        result = calculate(
            self.config, node, metric, pods, self._clock(), record=False,
            topology_annotations=annotations,
        )  # fmt: skip
        return result, metric, pods

    async def reconcile(self, name: str) -> bool:
        """Bring node ``name`` up to date; whether its status was written."""
        inputs = self._inputs(name)
        if inputs is None:
            return False
        result, metric, pods = inputs
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
        if not result.reset_reason and metric is not None:
            await self._sync_zones(name, result, metric, pods)
        return wrote

    async def _sync_zones(
        self, name: str, result: NodeResourceResult, metric: NodeMetricView, pods: list[PodView]
    ) -> None:
        """Write the zones' batch resources onto the node's NodeResourceTopology when due."""
        if self.topologies.get(name) is None:
            return
        node = parse_node(self.nodes.get(name) or {}, f"node {name}")
        strategy = result.strategy.strategy
        now = self._clock()
        last = self.last_zone_write.get(name)
        expired = last is None or (now - last).total_seconds() > (
            strategy.update_time_threshold_seconds
        )
        backoff = Backoff(base=0.01, cap=1.0)
        for attempt in range(CONFLICT_ATTEMPTS):
            current = (
                await self._client.get(NODE_RESOURCE_TOPOLOGIES, name)
                if attempt
                else (self.topologies.get(name) or {})
            )
            try:
                zones = read_zones(current)
            except ValueError as err:
                logger.warning("node %s: NodeResourceTopology zones unreadable: %s", name, err)
                return
            if zones is None:  # the koordlet has not reported its zones yet
                return
            batches = calculate_zones(strategy, node, metric, pods, zones)
            updated, changed = update_zones(
                current, batches, result.normalization.ratio, strategy.resource_diff_threshold
            )
            if not changed and not expired:
                return
            try:
                await self._client.replace(NODE_RESOURCE_TOPOLOGIES, updated)
            except NotFound:
                return
            except Conflict:
                if attempt + 1 >= CONFLICT_ATTEMPTS:
                    raise
                await asyncio.sleep(backoff.next_delay())
                continue
            self.last_zone_write[name] = now
            self.zone_writes += 1
            logger.info(
                "node %s: zone batch resources %s (%s)",
                name,
                {z: (b.cpu, b.memory_milli // 1000) for z, b in batches.items()},
                "moved more than resourceDiffThreshold" if changed else "refreshed",
            )
            return

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


def _zone_inputs(nrt: Obj) -> list[tuple[str, str, str]] | None:
    """The zone resources the calculation reads (``cpu`` and ``memory`` allocatable), None when
    there are none (upstream's ``isNRTResourcesCreated`` / ``isNRTResourcesChanged``)."""
    found = [
        (str(zone.get("name")), str(res.get("name")), str(res.get("allocatable")))
        for zone in nrt.get("zones") or ()
        for res in zone.get("resources") or ()
        if res.get("name") in ("cpu", "memory")
    ]
    return found or None


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
                lst[name] = format_extended(name, value)
        status[field] = lst
    return status
