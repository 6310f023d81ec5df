"""The skeleton shared by koord-manager's node-keyed controllers.

The NodeMetric, NodeSLO and node resource controllers have one shape: an informer on Nodes and
one on the ``slo-controller-config`` ConfigMap (plus their own), a
:class:`~manager.workqueue.WorkQueue` of node names, one worker that takes a name off the queue
and calls the controller's ``reconcile`` (a failure re-queues the name with per-key backoff), a
resync that queues every node each ``resync_seconds``, and an ``InvalidConfig`` Warning Event on
the ConfigMap when it is refused. :class:`NodeKeyedController` owns that shape; a controller
brings its own step (``reconcile``), its configuration parsing (``load_config``,
``_config_gone``), and its own informers and handlers.

Each controller names its own logger, kind and task names as class attributes, so its log lines
and tasks read as they would without the skeleton.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import ClassVar, NoReturn, TypedDict

from apis.manager_keys import SLO_CONFIG_NAME, SLO_CONFIG_NAMESPACE
from kubeclient.client import KubeClient, Obj
from kubeclient.errors import ApiError
from kubeclient.events import core_event
from kubeclient.informer import Informer, name_of
from kubeclient.resources import CONFIGMAPS, EVENTS, NODES
from manager.workqueue import WorkQueue

EVENT_COMPONENT = "koord-manager"
"""The ``source.component`` of the manager's Events."""
REASON_INVALID_CONFIG = "InvalidConfig"
"""The reason of the Warning Event on a refused ``slo-controller-config``."""


class Options(TypedDict, total=False):
    """The constructor options every node-keyed controller takes (see
    :class:`NodeKeyedController`)."""

    config_namespace: str
    config_name: str
    resync_seconds: float
    clock: Callable[[], datetime]


class NodeKeyedController(abc.ABC):
    """Informers on Nodes and the ConfigMap, a queue of node names, its worker and its resync."""

    log: ClassVar[logging.Logger]
    """The controller's own module logger: every line of the skeleton goes there."""
    kind: ClassVar[str] = ""
    """The kind the worker's retry warning names (``node n: NodeSLO: ...``); empty: none."""
    task_prefix: ClassVar[str]
    """Names the worker and resync tasks: ``<prefix>-worker``, ``<prefix>-resync``."""
    informer_task_prefix: ClassVar[str] = "informer"
    """Names an informer's task: ``<prefix>-<informer name>``."""
    retry_errors: ClassVar[tuple[type[Exception], ...]] = (ApiError,)
    """What a reconcile may raise that re-queues the node with backoff (anything else is a bug
    and ends the worker)."""

    def __init__(
        self,
        client: KubeClient,
        *,
        config_namespace: str = SLO_CONFIG_NAMESPACE,
        config_name: str = SLO_CONFIG_NAME,
        resync_seconds: float = 60.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """``config_namespace``/``config_name``: the slo-controller-config ConfigMap;
        ``resync_seconds``: how often every node is queued; ``clock``: Event timestamps."""
        self._client = client
        self.config_namespace = config_namespace
        self.config_name = config_name
        self.resync_seconds = resync_seconds
        self._clock = clock
        self.nodes = Informer(client, NODES)
        self.configmaps = Informer(
            client,
            CONFIGMAPS,
            namespace=config_namespace,
            field_selector=f"metadata.name={config_name}",
        )
        self.queue = WorkQueue()
        self.writes = 0
        """Writes to the API server so far."""
        self._event_tasks: set[asyncio.Task[None]] = set()
        self.configmaps.add_handler(
            self._config_seen, lambda _old, new: self._config_seen(new), self._config_gone
        )

    # What a controller brings -------------------------------------------------------------------
    @abc.abstractmethod
    async def reconcile(self, name: str) -> object:
        """Bring node ``name``'s objects in line (the worker's step)."""

    @abc.abstractmethod
    def load_config(self, cm: Obj) -> object:
        """Take what is good of the ConfigMap ``cm``."""

    @abc.abstractmethod
    def _config_gone(self, obj: Obj) -> None:
        """The ConfigMap is absent: Koordinator's defaults apply."""

    @property
    @abc.abstractmethod
    def _config_read(self) -> bool:
        """Whether a configuration (or the ConfigMap's absence) has been taken."""

    def _informers(self) -> tuple[Informer, ...]:
        """Every informer :meth:`run` starts, in start order; a controller adds its own."""
        return (self.configmaps, self.nodes)

    def _after_sync(self) -> None:
        """Once the first lists are in: a ConfigMap that is absent means defaults."""
        if not self._config_read and self.configmaps.synced and not self.configmaps.list():
            self._config_gone({})

    def _resync_once(self) -> None:
        """What each resync queues: every node."""
        self._queue_all()

    # Queueing ------------------------------------------------------------------------------------
    def _queue(self, obj: Obj) -> None:
        self.queue.add(name_of(obj))

    def _queue_all(self) -> None:
        for node in self.nodes.list():
            self._queue(node)

    def _config_seen(self, cm: Obj) -> None:
        self.load_config(cm)

    # The InvalidConfig Event ---------------------------------------------------------------------
    def _post_event(self, cm: Obj, message: str) -> None:
        """Post a Warning Event on the ConfigMap, in the background (none outside a loop)."""
        meta = cm.get("metadata") or {}
        involved = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": str(meta.get("name") or self.config_name),
            "namespace": str(meta.get("namespace") or self.config_namespace),
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        }
        self._post(
            core_event(
                involved,
                reason=REASON_INVALID_CONFIG,
                message=message,
                component=EVENT_COMPONENT,
                now=self._clock().timestamp(),
            )
        )

    def _post(self, event: Obj) -> None:
        """Create ``event`` in the background (nothing outside a loop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # parsed outside a loop (tests): nothing to post with
            return
        task = loop.create_task(self._create_event(event), name="invalid-config-event")
        self._event_tasks.add(task)
        task.add_done_callback(self._event_tasks.discard)

    async def _create_event(self, event: Obj) -> None:
        try:
            await self._client.create(EVENTS, event)
        except ApiError as err:
            self.log.warning("cannot post the %s event: %s", event.get("reason"), err)

    # Loops ---------------------------------------------------------------------------------------
    async def worker(self) -> NoReturn:
        """Take node names off the queue forever; a failed node is retried with backoff."""
        kind = f"{self.kind}: " if self.kind else ""
        while True:
            name = await self.queue.get()
            try:
                await self.reconcile(name)
            except self.retry_errors as err:
                delay = self.queue.add_rate_limited(name)
                self.log.warning("node %s: %s%s; retry in %.3fs", name, kind, err, delay)
            else:
                self.queue.forget(name)
            finally:
                self.queue.done(name)

    async def resync(self) -> NoReturn:
        """Queue every node (and what the controller adds) each ``resync_seconds``."""
        while True:
            await asyncio.sleep(self.resync_seconds)
            self._resync_once()

    async def run(self, *, sync_timeout: float = 60.0) -> NoReturn:
        """Start the informers, wait for their first lists, then the worker and the resync."""
        informers = self._informers()
        try:
            async with asyncio.TaskGroup() as tg:
                for inf in informers:
                    tg.create_task(inf.run(), name=f"{self.informer_task_prefix}-{inf.name}")
                for inf in informers:
                    if not await inf.wait_synced(sync_timeout):
                        self.log.warning("informer %s not synced after %ss", inf.name, sync_timeout)
                self._after_sync()
                tg.create_task(self.worker(), name=f"{self.task_prefix}-worker")
                tg.create_task(self.resync(), name=f"{self.task_prefix}-resync")
        finally:
            self.queue.close()
        raise AssertionError("eternal tasks returned")  # pragma: no cover
