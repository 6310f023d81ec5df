"""The NodeSLO controller: each node's NodeSLO from the ``slo-controller-config`` ConfigMap.

Informers keep Nodes, NodeSLOs and the ConfigMap. A node event queues that node, a ConfigMap
change or a NodeSLO edited by someone else queues what it affects, and a periodic resync queues
every node. The step, :meth:`NodeSLOController.reconcile`, renders the node's spec
(:func:`manager.slo.config.render`), checks it against the NodeSLO CRD schema, and creates the
NodeSLO if it is missing or replaces it (compare-and-swap on ``resourceVersion``) only when its
spec differs; one write carries the whole spec, so no NodeSLO is ever half-updated.

The node's ``node.koordinator.sh/network-bandwidth`` annotation overrides the system strategy's
``totalNetworkBandwidth`` (:func:`manager.slo.config.render`). Upstream leaves a bad value to its
Node validating webhook (``getSystemConfigSpec`` then fails); without one here, a value that is
not a quantity is left out, the configured bandwidth stays, and a Warning Event
(``InvalidNodeBandwidth``, on the Node) and a log line say so once per bad value.

The ConfigMap is read key by key, as upstream's config cache does: a key with invalid JSON or
values is refused, its last good value stays in force, and an error line plus a Warning Event
(``InvalidConfig``, on the ConfigMap) name the key and the field; the other keys still apply.
A key that has never been good holds every NodeSLO write back (writing defaults over what the
operator meant could switch protections off). A missing ConfigMap or key means Koordinator's
defaults.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Unpack

from apis.crdschema import CRDSet, load_crds
from apis.slo import API_VERSION, KIND, SchemaError
from kubeclient.client import KubeClient, Obj
from kubeclient.errors import Conflict, NotFound
from kubeclient.events import core_event
from kubeclient.informer import Informer, name_of
from kubeclient.resources import NODE_SLOS
from manager.nodekeyed import EVENT_COMPONENT, NodeKeyedController, Options
from manager.slo.config import NODE_SLO_KEYS, KeyConfig, parse_key, render

logger = logging.getLogger(__name__)

REASON_INVALID_BANDWIDTH = "InvalidNodeBandwidth"
"""Reason of the Warning Event on a Node whose ``network-bandwidth`` annotation is no quantity."""


def _rv(obj: Obj) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:  # opaque on a real server: trust the informer
        return 1 << 62


class NodeSLOController(NodeKeyedController):
    """Keeps every node's NodeSLO equal to what the ConfigMap says for it."""

    log = logger
    kind = "NodeSLO"
    task_prefix = "nodeslo"
    informer_task_prefix = "slo-informer"

    def __init__(
        self, client: KubeClient, *, crds: CRDSet | None = None, **options: Unpack[Options]
    ) -> None:
        super().__init__(client, **options)
        self._crds = crds or load_crds()
        self.node_slos = Informer(client, NODE_SLOS)
        self.keys: dict[str, KeyConfig] = {}
        """Key → its last good value (absent: the ConfigMap lacks it; defaults apply)."""
        self.seen = False
        """Whether the ConfigMap (or its absence) has been read."""
        self.never_good: set[str] = set()
        """Keys present in the ConfigMap that have never parsed; writes wait for them."""
        self.errors: dict[str, str] = {}
        """Key → the refusal of its latest text (empty when the latest text is in force)."""
        self._texts: dict[str, object] = {}
        self._written: dict[str, Obj] = {}
        self._bad_bandwidth: dict[str, str] = {}
        self.nodes.add_handler(self._queue, lambda _o, new: self._queue(new))
        self.node_slos.add_handler(
            self._slo_event, lambda _o, new: self._slo_event(new), self._slo_event
        )

    @property
    def _config_read(self) -> bool:
        return self.seen

    def _informers(self) -> tuple[Informer, ...]:
        return (*super()._informers(), self.node_slos)

    # Events ------------------------------------------------------------------------------------
    def _slo_event(self, obj: Obj) -> None:
        name = name_of(obj)
        if obj.get("metadata", {}).get("deletionTimestamp") or self.node_slos.get(name) is None:
            self._written.pop(name, None)
        if self.nodes.get(name) is not None:
            self.queue.add(name)  # repair an edit or deletion by someone else

    def _config_gone(self, _obj: Obj) -> None:
        logger.warning(
            "%s/%s absent: Koordinator's default NodeSLO applies",
            self.config_namespace,
            self.config_name,
        )
        self.keys.clear()
        self._texts.clear()
        self.never_good.clear()
        self.errors.clear()
        self.seen = True
        self._queue_all()

    def load_config(self, cm: Obj) -> list[str]:
        """Take each NodeSLO key of the ConfigMap ``cm`` that parses; refuse the others (their
        last good value stays; a log line and a Warning Event name the key and the field).
        Returns the refused keys."""
        source = f"{self.config_namespace}/{self.config_name}"
        data = cm.get("data") or {}
        refused: list[str] = []
        changed = not self.seen
        for key in NODE_SLO_KEYS:
            if key not in data:
                if key in self.keys or key in self.never_good:
                    changed = True
                self.keys.pop(key, None)
                self._texts.pop(key, None)
                self.never_good.discard(key)
                self.errors.pop(key, None)
                continue
            text = data[key]
            if self._texts.get(key) == text and key not in self.errors:
                continue
            try:
                parsed = parse_key(key, text, source)
            except SchemaError as err:
                refused.append(key)
                self.errors[key] = str(err)
                kept = "the last good value stays" if key in self.keys else "no good value yet"
                if key not in self.keys:
                    self.never_good.add(key)
                logger.error("refusing %s (%s): %s", key, kept, err)  # noqa: TRY400 - one line
                self._post_event(cm, f"{err} ({kept})")
                continue
            self.keys[key] = parsed
            self._texts[key] = text
            self.never_good.discard(key)
            self.errors.pop(key, None)
            changed = True
        self.seen = True
        if changed:
            self._queue_all()
        return refused

    # The step ----------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Whether NodeSLOs may be written: the ConfigMap was read and no key lacks a good value."""
        return self.seen and not self.never_good

    def desired(self, name: str) -> dict[str, Any] | None:
        """The NodeSLO spec node ``name`` should have (None: no such node, or not ready)."""
        node = self.nodes.get(name)
        if node is None or not self.ready:
            return None
        meta = node.get("metadata") or {}
        labels: Mapping[str, str] = meta.get("labels") or {}
        rendered = render(self.keys, labels, meta.get("annotations") or {})
        if rendered.bandwidth_error and self._bad_bandwidth.get(name) != rendered.bandwidth_error:
            self._bad_bandwidth[name] = rendered.bandwidth_error
            logger.warning(
                "node %s: %s; the configured totalNetworkBandwidth stays",
                name,
                rendered.bandwidth_error,
            )
            ref = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": meta.get("uid")}
            self._post(
                core_event(
                    ref,
                    reason=REASON_INVALID_BANDWIDTH,
                    message=f"{rendered.bandwidth_error} (the configured value stays)",
                    component=EVENT_COMPONENT,
                    now=self._clock().timestamp(),
                )
            )
        elif not rendered.bandwidth_error:
            self._bad_bandwidth.pop(name, None)
        return dict(rendered.spec)

    def _latest(self, name: str) -> Obj | None:
        """The newest NodeSLO known: the informer's, or what our own last write returned when
        the informer has not caught up with it yet."""
        seen = self.node_slos.get(name)
        mine = self._written.get(name)
        if mine is None:
            return seen
        if seen is not None and _rv(seen) >= _rv(mine):
            del self._written[name]
            return seen
        return mine

    async def reconcile(self, name: str) -> bool:
        """Create or update node ``name``'s NodeSLO; whether it wrote."""
        spec = self.desired(name)
        if spec is None:
            return False
        body: Obj = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name},
            "spec": spec,
        }
        errors = self._crds.validate(body, strict=False)
        if errors:  # never write what the API server's schema would refuse or mangle
            logger.error("node %s: rendered NodeSLO invalid: %s", name, "; ".join(map(str, errors)))
            return False
        current = self._latest(name)
        try:
            if current is None:
                try:
                    self._written[name] = await self._client.create(NODE_SLOS, body)
                except Conflict:  # exists already (the informer lags): compare with the server's
                    current = await self._client.get(NODE_SLOS, name)
            if current is not None:
                if current.get("spec") == spec:
                    return False
                updated = dict(current)
                updated["spec"] = spec
                self._written[name] = await self._client.replace(NODE_SLOS, updated)
        except NotFound:
            self._written.pop(name, None)
            self.queue.add_rate_limited(name)  # deleted meanwhile: create on the next round
            return False
        self.writes += 1
        logger.info("node %s: NodeSLO %s", name, "created" if current is None else "updated")
        return True
