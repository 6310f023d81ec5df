"""A small generic client on aiohttp: JSON objects in and out, errors translated.

The binaries want plain decoded JSON (typed by their own ``TypedDict``) for every kind, core and
custom alike, so :class:`KubeClient` sends requests on URL paths from
:class:`~kubeclient.resources.Resource` through one aiohttp session (its connection pool, the
TLS context and credentials of :mod:`kubeclient.config`) and decodes the answers itself. Every
failure is a :mod:`kubeclient.errors` exception. kubernetes-asyncio is not imported (see
``config.py`` for the one case that needs its loader).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiohttp

from kubeclient.config import Connection, load_configuration
from kubeclient.errors import Transient, error_for
from kubeclient.resources import PODS, Resource

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
"""A decoded Kubernetes object."""

MAX_CONNECTIONS = 100
"""Connections to the API server at most (watches hold one each)."""


class PatchType(StrEnum):
    """Content types of a PATCH."""

    MERGE = "application/merge-patch+json"
    """RFC 7386 JSON merge patch (custom resources and core kinds)."""
    STRATEGIC = "application/strategic-merge-patch+json"
    """Kubernetes' strategic merge patch (core kinds only)."""
    JSON = "application/json-patch+json"
    """RFC 6902 JSON patch: a list of operations (``test`` guards the others)."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One event of a watch stream."""

    type: str
    """``ADDED``, ``MODIFIED``, ``DELETED``, ``BOOKMARK`` or ``ERROR``."""
    object: Obj
    """The object (for ``ERROR``, a ``Status``)."""


@dataclass(frozen=True, slots=True)
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


class KubeClient:
    """JSON requests to one API server. Create with :meth:`connect`; ``close()`` when done."""

    def __init__(self, conn: Connection, *, request_timeout: float = 30.0) -> None:
        self._conn = conn
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, ssl=conn.ssl),
            # no cookies, no proxies from the environment: the API server, directly
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
            auto_decompress=True,
        )
        self.request_timeout = request_timeout
        """Seconds one non-watch request may take before it is a :class:`Transient` error."""

    @classmethod
    async def connect(
        cls, kubeconfig: str | None = None, *, request_timeout: float = 30.0
    ) -> KubeClient:
        """A client for ``kubeconfig`` (None: ``$KUBECONFIG`` or in-cluster)."""
        conn = await load_configuration(kubeconfig)
        return cls(conn, request_timeout=request_timeout)

    @property
    def host(self) -> str:
        return self._conn.host

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # Transport --------------------------------------------------------------------------------
    async def _open(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None,
        body: object,
        content_type: str,
        limits: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body, separators=(",", ":")).encode()
        auth = await self._conn.authorization()
        if auth:
            headers["Authorization"] = auth
        try:
            return await self._session.request(
                method,
                self._conn.host + path,
                params=query or None,
                data=data,
                headers=headers,
                timeout=limits,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            raise Transient(0, f"{method} {path}: {err!r}") from err

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
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        resp = await self._open(method, path, query, body, content_type, timeout)
        try:
            data = await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            raise Transient(0, f"{method} {path}: {err!r}") from err
        finally:
            resp.release()
        decoded = _decode(data)
        if not 200 <= resp.status < 300:
            raise error_for(resp.status, decoded, resp.headers.get("Retry-After"))
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
        resource_version: str = "",
    ) -> ObjectList:
        """Every object (pages of ``limit`` joined with ``continue``). ``resource_version``
        ``"0"``: any version the API server has at hand (its watch cache, one answer, no read
        from etcd: what client-go's reflector asks for its first list); empty: the latest."""
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
            items.extend(page.get("items") or [])
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
        timeout = aiohttp.ClientTimeout(
            sock_connect=self.request_timeout, sock_read=timeout_seconds + self.request_timeout
        )
        path = res.path(namespace)
        resp = await self._open("GET", path, query, None, "application/json", timeout)
        try:
            if not 200 <= resp.status < 300:
                data = await resp.read()
                raise error_for(resp.status, _decode(data), resp.headers.get("Retry-After"))
            while True:
                try:
                    line = await resp.content.readline()
                except (aiohttp.ClientError, TimeoutError, OSError) as err:
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
