"""List-then-watch informer: a local store of one kind of object, kept current, with callbacks.

The loop, as client-go's reflector runs it:

1. **list** (paged) and replace the store; callbacks fire for what the list added, changed or
   removed compared with the store before; the informer is *synced* from the first list on.
   The first list asks for ``resourceVersion=0`` (any version the API server has at hand: its
   watch cache answers at once, in one piece, without reading etcd), as client-go's reflector
   does (``relistResourceVersion``), unless ``cache_first_list`` is off; a relist after a 410
   asks for the latest;
2. **watch** from the list's ``resourceVersion`` with ``allowWatchBookmarks``; every event moves
   the resourceVersion on (bookmarks only that); when the server ends the stream (its
   ``timeoutSeconds``) the watch resumes from the last resourceVersion, without a list;
3. **410 Gone** (an HTTP 410 or an ``ERROR`` event with code 410: the resourceVersion fell out of
   the server's window) means the store may have missed events: relist at once; ``relisting``
   is true from the 410 until that list has been applied;
4. any other failure (5xx, a dropped connection, a refused connection) waits an exponential
   backoff with jitter (:class:`~kubeclient.backoff.Backoff`), then resumes the watch, or the
   list if none succeeded yet; a **429** waits at least its ``Retry-After``. A **404** on the
   list means the server does not serve the resource (a CRD not installed): ``absent`` until a
   list succeeds, the list retried on the same backoff. ``last_error`` says what failed last.

A ``transform`` (client-go's ``SetTransform``) turns each listed or watched object into what the
store keeps and the callbacks receive: a view of the fields its readers use, so that an agent on
every node does not keep every pod's whole JSON (``managedFields``, volumes, probes...). It must
keep ``metadata.name``, ``namespace`` and ``resourceVersion``; :func:`strip_managed_fields` is
the minimal one. A list asks for ``page_size`` objects a page and transforms each page as it
arrives, so that at most one page of whole objects is held at a time. ``keep`` narrows further
what the store holds once the callbacks have seen an object (its key and resourceVersion at
least): a reader that keeps its own model of each object (the koordlet's pod inventory) needs
no second copy in the store; ``get`` and ``list`` then return the kept views, and an update's or
a delete's callback receives the kept view as the old object.

The store keeps serving its last content while the API server is away; ``wait_synced(timeout)``
lets a start-up wait a bounded time for the first list, ``wait_settled(timeout)`` for the first
list or the first 404.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from kubeclient.backoff import Backoff
from kubeclient.client import KubeClient, Obj, WatchEvent
from kubeclient.errors import ApiError, Gone, NotFound, TooManyRequests, error_for
from kubeclient.resources import Resource

logger = logging.getLogger(__name__)

AddHandler = Callable[[Obj], None]
UpdateHandler = Callable[[Obj, Obj], None]
DeleteHandler = Callable[[Obj], None]


def object_key(obj: Obj) -> str:
    """``namespace/name`` (``name`` for a cluster-scoped object), as client-go keys its store."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") or ""
    name = str(meta.get("name", ""))
    return f"{ns}/{name}" if ns else name


Transform = Callable[[Obj], Obj]
"""What an informer keeps of each object (see the module docstring)."""


def strip_managed_fields(obj: Obj) -> Obj:
    """``obj`` without ``metadata.managedFields`` (server-side apply's bookkeeping, often the
    largest part of an object and read by no binary here)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        del meta["managedFields"]
    return obj


def name_of(obj: Obj) -> str:
    """``metadata.name`` (``""`` when absent)."""
    return str((obj.get("metadata") or {}).get("name") or "")


def namespaced_name(obj: Obj) -> str:
    """``namespace/name`` of a namespaced object, its namespace ``default`` when the object
    names none (as the API server defaults it)."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def resource_version_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def waiting_for(informers: Iterable[Informer]) -> list[str]:
    """What a reader of ``informers`` still waits for, one line an informer: relisting after a
    410 Gone, or not listed yet (with its last error); empty when every one is current or its
    kind is not served."""
    waiting: list[str] = []
    for informer in informers:
        if informer.relisting:
            waiting.append(f"{informer.name} (relisting after 410 Gone)")
        elif not (informer.synced or informer.absent):
            why = f": {informer.last_error}" if informer.last_error else ""
            waiting.append(f"{informer.name} (not listed yet{why})")
    return waiting


@dataclass
class InformerStats:
    """Counters for tests, logs and self-metrics."""

    lists: int = 0
    """Successful lists (the first one and every relist)."""
    watches: int = 0
    """Watch streams opened."""
    gone: int = 0
    """410 Gone answers (each followed by a relist)."""
    errors: int = 0
    """Other failures, each followed by a backoff."""
    delays: list[float] = field(default_factory=list)
    """The last backoff delays waited, newest last (at most 100)."""


@dataclass
class _Handlers:
    on_add: AddHandler | None
    on_update: UpdateHandler | None
    on_delete: DeleteHandler | None


class Informer:
    """Keeps a local store of the objects of ``resource`` matching the selectors."""

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        *,
        namespace: str | None = None,
        field_selector: str = "",
        label_selector: str = "",
        watch_timeout_seconds: int = 300,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        transform: Transform | None = None,
        keep: Transform | None = None,
        page_size: int = 500,
        cache_first_list: bool = True,
    ) -> None:
        self._client = client
        self._transform = transform
        self._keep = keep
        self.page_size = page_size
        """Objects a list asks for at once (``limit``; client-go's reflector asks 500)."""
        self.cache_first_list = cache_first_list
        """The first list asks for ``resourceVersion=0`` (the API server's watch cache answers
        at once, in one piece), as client-go's reflector does; False: pages of
        :attr:`page_size` from etcd (only a page of whole objects in memory at a time)."""
        self.resource = resource
        self.namespace = namespace
        self.field_selector = field_selector
        self.label_selector = label_selector
        self.watch_timeout_seconds = watch_timeout_seconds
        self._backoff = backoff or Backoff()
        self._sleep = sleep
        self._store: dict[str, Obj] = {}
        self._rv = ""
        self._synced = asyncio.Event()
        self._settled = asyncio.Event()
        self._handlers: list[_Handlers] = []
        self.stats = InformerStats()
        self.connected = False
        """True after a successful list or watch event, False after a failure."""
        self.relisting = False
        """A watch answered 410 and the relist has not been applied yet: the store may have
        missed events."""
        self.absent = False
        """The last list answered 404: the server does not serve the resource (a CRD not
        installed); cleared by a list that succeeds."""
        self.last_error = ""
        """The last failure (``403 Forbidden: ...``); cleared by a list or an event."""

    @property
    def name(self) -> str:
        sel = ",".join(s for s in (self.field_selector, self.label_selector) if s)
        return f"{self.resource.plural}[{sel}]" if sel else self.resource.plural

    # Reading ----------------------------------------------------------------------------------
    def add_handler(
        self,
        on_add: AddHandler | None = None,
        on_update: UpdateHandler | None = None,
        on_delete: DeleteHandler | None = None,
    ) -> None:
        """Callbacks, run on the event loop in the order added; an exception in one is logged
        and does not stop the informer. Objects already in the store are not replayed."""
        self._handlers.append(_Handlers(on_add, on_update, on_delete))

    def get(self, name: str, namespace: str | None = None) -> Obj | None:
        return self._store.get(f"{namespace}/{name}" if namespace else name)

    def list(self) -> list[Obj]:
        return list(self._store.values())

    @property
    def resource_version(self) -> str:
        return self._rv

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self, timeout: float) -> bool:  # noqa: ASYNC109 - a bounded wait is the API
        """Wait up to ``timeout`` seconds for the first list; whether it came."""
        try:
            await asyncio.wait_for(self._synced.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def wait_settled(self, timeout: float) -> bool:  # noqa: ASYNC109 - a bounded wait is the API
        """Wait up to ``timeout`` seconds for the first list or the first 404 on it (see
        ``absent``); whether either came."""
        try:
            await asyncio.wait_for(self._settled.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # The loop ---------------------------------------------------------------------------------
    async def run(self) -> NoReturn:
        """List, then watch, forever (cancel to stop)."""
        need_list = True
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                if not await self._watch_once():
                    await self._wait(None)
            except Gone:
                self.stats.gone += 1
                self.relisting = True
                logger.info("%s: resourceVersion %s expired (410); relisting", self.name, self._rv)
                need_list = True
            except ApiError as err:
                self.stats.errors += 1
                self.connected = False
                self.last_error = str(err)
                if need_list and isinstance(err, NotFound):
                    if not self.absent:
                        logger.warning("%s: not served by the API server (404)", self.name)
                    self.absent = True
                    self._settled.set()
                retry_after = err.retry_after if isinstance(err, TooManyRequests) else None
                delay = await self._wait(retry_after)
                log = logger.warning if self._backoff.failures <= 1 else logger.debug
                log("%s: %s; retrying in %.2fs", self.name, err, delay)

    async def _wait(self, retry_after: float | None) -> float:
        delay = self._backoff.next_delay(retry_after)
        self.stats.delays = [*self.stats.delays[-99:], delay]
        await self._sleep(delay)
        return delay

    async def _relist(self) -> None:
        listed = await self._client.list(
            self.resource,
            self.namespace,
            field_selector=self.field_selector,
            label_selector=self.label_selector,
            limit=self.page_size,
            transform=self._transform,
            resource_version="0" if self.cache_first_list and not self.stats.lists else "",
        )
        listed_rv = listed.resource_version
        old = self._store
        new = {object_key(o): o for o in listed.items}
        del listed
        keep = self._keep
        self._store = new if keep is None else {k: keep(o) for k, o in new.items()}
        self._rv = listed_rv
        self.stats.lists += 1
        self.connected = True
        self._backoff.reset()
        for key, obj in new.items():
            before = old.get(key)
            if before is None:
                self._fire_add(obj)
            elif resource_version_of(before) != resource_version_of(obj):
                self._fire_update(before, obj)
        for key, obj in old.items():
            if key not in new:
                self._fire_delete(obj)
        if not self._synced.is_set():
            logger.info("%s: synced, %d objects at %s", self.name, len(new), self._rv)
        self.relisting = False
        self.absent = False
        self.last_error = ""
        self._synced.set()
        self._settled.set()

    async def _watch_once(self) -> bool:
        """One watch stream; whether it carried at least one event (an empty, ended stream is
        waited on before the next, so a server that closes at once is not hammered)."""
        self.stats.watches += 1
        events = 0
        stream = self._client.watch(
            self.resource,
            self._rv,
            self.namespace,
            field_selector=self.field_selector,
            label_selector=self.label_selector,
            timeout_seconds=self.watch_timeout_seconds,
        )
        async for event in stream:
            events += 1
            self._apply(event)
            self.connected = True
            self.last_error = ""
            self._backoff.reset()
        return events > 0

    def _apply(self, event: WatchEvent) -> None:
        obj = event.object
        if event.type == "ERROR":
            code = int(obj.get("code") or 500)
            raise error_for(code, obj)
        rv = resource_version_of(obj)
        if rv:
            self._rv = rv
        if event.type == "BOOKMARK":
            return
        if self._transform is not None:
            obj = self._transform(obj)
        key = object_key(obj)
        if event.type == "DELETED":
            gone = self._store.pop(key, None)
            self._fire_delete(gone or obj)
        elif event.type in ("ADDED", "MODIFIED"):
            before = self._store.get(key)
            self._store[key] = obj if self._keep is None else self._keep(obj)
            if before is None:
                self._fire_add(obj)
            else:
                self._fire_update(before, obj)
        else:
            logger.debug("%s: ignoring watch event type %r", self.name, event.type)

    # Callbacks --------------------------------------------------------------------------------
    def _fire_add(self, obj: Obj) -> None:
        for h in self._handlers:
            if h.on_add is not None:
                self._guard(h.on_add, obj)

    def _fire_update(self, old: Obj, new: Obj) -> None:
        for h in self._handlers:
            if h.on_update is not None:
                self._guard(h.on_update, old, new)

    def _fire_delete(self, obj: Obj) -> None:
        for h in self._handlers:
            if h.on_delete is not None:
                self._guard(h.on_delete, obj)

    def _guard(self, fn: Callable[..., None], *args: Obj) -> None:
        try:
            fn(*args)
        except Exception:
            logger.exception("%s: event handler %r failed", self.name, fn)
