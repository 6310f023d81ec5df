"""A small generic client of the API server: JSON objects in and out, errors translated.

The binaries want plain decoded JSON (typed by their own ``TypedDict``) for every kind, core and
custom alike, so :class:`KubeClient` sends requests on URL paths from
:class:`~kubeclient.resources.Resource` over :class:`~kubeclient.transport.Transport` (HTTP/1.1,
TLS and the credentials of :mod:`kubeclient.auth`) and decodes the answers itself. Nothing of a
generated client or its model classes is loaded (issue 26: kubernetes-asyncio's cost the koordlet
about 47 MiB). Every failure is a :mod:`kubeclient.errors` exception.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any
from urllib.parse import urlencode, urlsplit

from apis.records import frozen
from kubeclient.auth import BearerToken, tls_context
from kubeclient.config import ClusterConfig, load_configuration
from kubeclient.errors import ConfigError, Transient, error_for
from kubeclient.resources import PODS, Resource
from kubeclient.transport import Transport, TransportError

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
"""A decoded Kubernetes object."""


class PatchType(StrEnum):
    """Content types of a PATCH."""

    MERGE = "application/merge-patch+json"
    """RFC 7386 JSON merge patch (custom resources and core kinds)."""
    STRATEGIC = "application/strategic-merge-patch+json"
    """Kubernetes' strategic merge patch (core kinds only)."""
    JSON = "application/json-patch+json"
    """RFC 6902 JSON patch: a list of operations (``test`` guards the others)."""


@frozen
class WatchEvent:
    """One event of a watch stream."""

    type: str
    """``ADDED``, ``MODIFIED``, ``DELETED``, ``BOOKMARK`` or ``ERROR``."""
    object: Obj
    """The object (for ``ERROR``, a ``Status``)."""


@frozen
class ObjectList:
    """The answer of a list call."""

    items: list[Obj]
    resource_version: str
    """``metadata.resourceVersion`` of the list: where a watch continues from."""


def _selectors(field_selector: str, label_selector: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if field_selector:
        out.append(("fieldSelector", field_selector))
    if label_selector:
        out.append(("labelSelector", label_selector))
    return out


_FAILURES = (TransportError, TimeoutError, OSError)
"""What a request may fail with short of an answer: translated to :class:`Transient`."""


class KubeClient:
    """JSON requests to one API server. Create with :meth:`connect`; ``close()`` when done."""

    def __init__(
        self,
        cfg: ClusterConfig,
        *,
        request_timeout: float = 30.0,
        transport: Transport | None = None,
    ) -> None:
        self.config = cfg
        self.request_timeout = request_timeout
        """Seconds one non-watch request may take before it is a :class:`Transient` error."""
        self._token = BearerToken(cfg)
        self._transport = transport or Transport(
            cfg.hostname,
            cfg.port,
            ssl=tls_context(cfg) if cfg.tls else None,
            server_hostname=cfg.tls_server_name or None,
            headers=self._token.headers,
        )
        self._prefix = urlsplit(cfg.server).path.rstrip("/")

    @classmethod
    async def connect(
        cls, kubeconfig: str | None = None, *, request_timeout: float = 30.0
    ) -> KubeClient:
        """A client for ``kubeconfig`` (None: ``$KUBECONFIG`` or in-cluster). Raises
        :class:`~kubeclient.errors.ConfigError`."""
        cfg = await load_configuration(kubeconfig)
        try:
            return await asyncio.to_thread(cls, cfg, request_timeout=request_timeout)
        except ConfigError:
            raise
        except (OSError, ValueError) as err:
            raise ConfigError(str(err), source=cfg.source) from err

    @property
    def host(self) -> str:
        return self.config.server

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # Transport --------------------------------------------------------------------------------
    def _target(self, path: str, query: list[tuple[str, str]] | None) -> str:
        target = self._prefix + path
        return f"{target}?{urlencode(query)}" if query else target

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: object = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One request; the decoded JSON answer. Raises :class:`~kubeclient.errors.ApiError`."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = content_type
        await self._token.refresh()
        try:
            resp = await self._transport.request(
                method,
                self._target(path, query),
                headers=headers,
                body=data,
                timeout=self.request_timeout,
            )
        except _FAILURES as err:
            raise Transient(0, f"{method} {path}: {err!r}") from err
        decoded = _decode(resp.body)
        if not 200 <= resp.status < 300:
            raise error_for(resp.status, decoded, resp.headers.get("retry-after"))
        return decoded

    # Verbs ------------------------------------------------------------------------------------
    async def get(self, res: Resource, name: str, namespace: str | None = None) -> Obj:
        return await self.request("GET", res.path(namespace, name))

    async def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        field_selector: str = "",
        label_selector: str = "",
        limit: int = 500,
        transform: Callable[[Obj], Obj] | None = None,
        resource_version: str = "",
    ) -> ObjectList:
        """Every object (pages of ``limit`` joined with ``continue``), each passed through
        ``transform`` as its page arrives (so that only one page of whole objects is held).
        ``resource_version`` ``"0"``: any version the API server has at hand (its watch cache:
        one answer, no paging, no read from etcd; what client-go's reflector asks for its first
        list); empty: the latest, paged."""
        items: list[Obj] = []
        token = ""
        while True:
            query = _selectors(field_selector, label_selector)
            query.append(("limit", str(limit)))
            if token:
                query.append(("continue", token))
            elif resource_version:
                query.append(("resourceVersion", resource_version))
            page = await self.request("GET", res.path(namespace), query=query)
            got = page.pop("items", None) or []
            items.extend(got if transform is None else map(transform, got))
            del got
            meta = page.get("metadata") or {}
            token = str(meta.get("continue") or "")
            if not token:
                return ObjectList(items, str(meta.get("resourceVersion", "")))

    async def watch(
        self,
        res: Resource,
        resource_version: str,
        namespace: str | None = None,
        *,
        field_selector: str = "",
        label_selector: str = "",
        timeout_seconds: int = 300,
        bookmarks: bool = True,
    ) -> AsyncIterator[WatchEvent]:
        """Events after ``resource_version`` until the server ends the stream.

        A watch that cannot start raises like any request; an ``ERROR`` event is yielded as is
        (the informer turns a 410 one into a relist); a stream cut mid-line raises
        :class:`~kubeclient.errors.Transient`.
        """
        query = _selectors(field_selector, label_selector)
        query += [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if bookmarks:
            query.append(("allowWatchBookmarks", "true"))
        path = res.path(namespace)
        await self._token.refresh()
        try:
            resp = await self._transport.stream(
                "GET",
                self._target(path, query),
                headers={"Accept": "application/json"},
                connect_timeout=self.request_timeout,
                read_timeout=timeout_seconds + self.request_timeout,
            )
        except _FAILURES as err:
            raise Transient(0, f"GET {path}: {err!r}") from err
        try:
            if not 200 <= resp.status < 300:
                try:
                    data = await resp.read()
                except _FAILURES as err:
                    raise Transient(0, f"watch {path}: {err!r}") from err
                raise error_for(resp.status, _decode(data), resp.headers.get("retry-after"))
            while True:
                try:
                    line = await resp.readline()
                except _FAILURES as err:
                    raise Transient(0, f"watch {path}: {err!r}") from err
                if not line:
                    return
                if not line.endswith(b"\n"):
                    raise Transient(0, f"watch {path}: stream cut mid-event")
                if not line.strip():
                    continue
                event = _decode(line)
                yield WatchEvent(str(event.get("type", "")), event.get("object") or {})
        finally:
            resp.release()

    async def create(self, res: Resource, obj: Mapping[str, Any]) -> Obj:
        ns = (obj.get("metadata") or {}).get("namespace")
        return await self.request("POST", res.path(ns), body=obj)

    async def replace(self, res: Resource, obj: Mapping[str, Any], *, sub: str = "") -> Obj:
        """PUT the whole object (``sub="status"``: through the status subresource). The
        object's ``metadata.resourceVersion`` makes it a compare-and-swap (409 when stale)."""
        meta = obj.get("metadata") or {}
        path = res.path(meta.get("namespace"), str(meta.get("name", "")), sub)
        return await self.request("PUT", path, body=obj)

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        namespace: str | None = None,
        *,
        sub: str = "",
        patch_type: PatchType = PatchType.MERGE,
    ) -> Obj:
        return await self.request(
            "PATCH", res.path(namespace, name, sub), body=patch, content_type=patch_type.value
        )

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        options: Mapping[str, Any] | None = None,
    ) -> Obj:
        """DELETE one object; ``options`` is a ``metav1.DeleteOptions`` body
        (``gracePeriodSeconds``, ``preconditions``...)."""
        body = None if options is None else {"kind": "DeleteOptions", "apiVersion": "v1", **options}
        return await self.request("DELETE", res.path(namespace, name), body=body)

    async def evict(
        self,
        namespace: str,
        name: str,
        *,
        uid: str = "",
        delete_options: Mapping[str, Any] | None = None,
    ) -> Obj:
        """POST a policy/v1 Eviction for a pod (``uid``: only that incarnation of the name;
        ``delete_options``: the Eviction's ``deleteOptions``, a uid precondition added).
        A disruption budget's refusal is :class:`~kubeclient.errors.TooManyRequests`."""
        body: Obj = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        options = dict(delete_options or {})
        if uid:
            options["preconditions"] = {**(options.get("preconditions") or {}), "uid": uid}
        if options:
            body["deleteOptions"] = options
        return await self.request("POST", PODS.path(namespace, name, "eviction"), body=body)


def _decode(data: bytes) -> Obj:
    if not data:
        return {}
    try:
        decoded = json.loads(data)
    except ValueError:
        return {"message": data[:200].decode("utf-8", "replace")}
    return decoded if isinstance(decoded, dict) else {"value": decoded}
