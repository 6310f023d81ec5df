"""The kubelet's ``/pods`` as a pod source: an alternative (or a companion) to the API-server watch.

Koordinator's koordlet learns the pods of its node by polling the kubelet (its
``kubelet_stub``): ``GET https://<node address>:<kubelet port>/pods`` with the service account's
bearer token and TLS verification skipped, or, with ``--kubelet-insecure-tls``, plain HTTP on the
read-only port (``--kubelet-read-only-port``, 10255). The address is the Node's
``status.addresses`` entry of ``--kubelet-preferred-address-type`` (``InternalIP``), the port the
Node's ``status.daemonEndpoints.kubeletEndpoint.Port``; it polls every ``--kubelet-sync-interval``
(10 s) with ``--kubelet-sync-timeout`` (3 s) per request. :class:`KubeletPodsSource` does the same
and maps each pod with the API-server source's :func:`~koordlet.statesinformer.kube.pod_info`, so
both sources describe a pod identically (only ``PodInfo.source`` differs: ``kubelet``).

A poll that fails (kubelet down, 401, a timeout, a malformed answer) keeps the last good list: the
failure is logged once, at warning, until a poll succeeds again (logged at info). The service
account token is re-read whenever its file changes (projected tokens are rotated hourly by a
symlink swap); the TLS context is made once, the connection pool (:mod:`kubeclient.transport`)
once per kubelet address.

Errors (what :meth:`KubeletPodsSource.fetch` raises; :meth:`~KubeletPodsSource.poll` logs them)::

    KubeletError
    ├── KubeletUnavailable    no answer, a non-200 status, no address known yet
    └── KubeletResponseError  the body is not a PodList; the message names the field

An empty PodList is a failed poll too, as in Koordinator: a kubelet that has just restarted lists
no pods for a moment, and the koordlet's own pod is always there. A pod whose own fields are
malformed (``items[3].metadata.uid``) is skipped with a warning naming
the field; the rest of the list is used.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http
import json
import logging
import os
import ssl
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from apis.errors import FieldError
from apis.kubernetes_keys import SERVICE_ACCOUNT_TOKEN_PATH as SERVICE_ACCOUNT_TOKEN
from apis.quantity import parse_quantity
from apis.records import frozen
from koordlet.statesinformer.kube import pod_info
from koordlet.statesinformer.model import PodInfo
from koordlet.system.cgroups import CgroupLayout
from kubeclient.transport import Transport, TransportError

logger = logging.getLogger(__name__)

DEFAULT_KUBELET_PORT = 10250
"""The kubelet's authenticated port when the Node does not say."""
ADDRESS_TYPES = ("Hostname", "ExternalIP", "InternalIP", "ExternalDNS", "InternalDNS")
"""Node address types (``corev1.NodeAddressType``); an unknown preference falls back to
``InternalIP`` as upstream does."""

Obj = Mapping[str, Any]


class KubeletError(Exception):
    """A poll of the kubelet's ``/pods`` failed."""


class KubeletUnavailable(KubeletError):
    """No answer, a non-200 status, or no address to ask yet."""


class KubeletResponseError(KubeletError, FieldError):
    """The kubelet answered something that is not a PodList; the message names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem, source="kubelet /pods", field=field)


@frozen
class KubeletSourceConfig:
    """How to reach the kubelet's ``/pods`` (Koordinator's ``kubelet_stub`` flags)."""

    address: str = ""
    """Host name or IP of the kubelet; empty: this Node's ``status.addresses`` entry of
    :attr:`preferred_address_type`. ``--kubelet-address``, ours."""
    preferred_address_type: str = "InternalIP"
    """Node address type to connect to; Koordinator's ``--kubelet-preferred-address-type``
    (default ``InternalIP``; an unknown type means ``InternalIP``)."""
    port: int = 0
    """HTTPS port; 0: the Node's ``status.daemonEndpoints.kubeletEndpoint.Port``, else 10250,
    as Koordinator does. ``--kubelet-port``, ours."""
    insecure_tls: bool = False
    """Plain HTTP to :attr:`read_only_port`, without a token; Koordinator's
    ``--kubelet-insecure-tls`` (default false; "for testing purposes only")."""
    read_only_port: int = 10255
    """The kubelet's unauthenticated port, used with :attr:`insecure_tls`; Koordinator's
    ``--kubelet-read-only-port`` (default 10255)."""
    token_file: str = SERVICE_ACCOUNT_TOKEN
    """Bearer token sent over HTTPS, re-read when the file changes; empty: none.
    ``--kubelet-token-file``, ours (Koordinator takes the in-cluster config's token)."""
    ca_file: str = ""
    """CA bundle that signed the kubelet's serving certificate: verify it (and the host name);
    empty: skip verification, as Koordinator always does (kubelet serving certificates are
    self-signed unless ``serverTLSBootstrap``). ``--kubelet-ca-file``, ours."""
    sync_interval: float = 10.0
    """Seconds between polls; Koordinator's ``--kubelet-sync-interval`` (default 10s)."""
    sync_timeout: float = 3.0
    """Seconds one request may take; Koordinator's ``--kubelet-sync-timeout`` (default 3s)."""

    def __post_init__(self) -> None:
        for name in ("port", "read_only_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535 or (name == "read_only_port" and value == 0):
                raise ValueError(f"{name} {value} is not a TCP port")
        for name in ("sync_interval", "sync_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")

    @property
    def scheme(self) -> str:
        """``http`` on the read-only port, else ``https``."""
        return "http" if self.insecure_tls else "https"


# Parsing ---------------------------------------------------------------------------------------
def _want(value: object, kind: type | tuple[type, ...], field: str, what: str) -> None:
    if not isinstance(value, kind):
        raise KubeletResponseError(field, f"expected {what}, got {type(value).__name__}")


def _field(obj: Any, key: str, absent: object) -> Any:
    """``obj[key]``, or ``absent`` when missing or null (but not when empty: ``{}`` for a list
    is malformed)."""
    value = obj.get(key)
    return absent if value is None else value


def _check_pod(pod: object, where: str) -> None:
    """Raise :class:`KubeletResponseError` naming the first field of ``pod`` that
    :func:`pod_info` could not read."""
    _want(pod, dict, where, "an object")
    assert isinstance(pod, dict)
    meta = pod.get("metadata")
    _want(meta, dict, f"{where}.metadata", "an object")
    assert isinstance(meta, dict)
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        raise KubeletResponseError(f"{where}.metadata.uid", "missing or not a string")
    for key in ("labels", "annotations"):
        tags = meta.get(key)
        if tags is None:
            continue
        _want(tags, dict, f"{where}.metadata.{key}", "an object")
        assert isinstance(tags, dict)
        for k, v in tags.items():
            _want(v, str, f"{where}.metadata.{key}[{k}]", "a string")
    spec = _field(pod, "spec", {})
    _want(spec, dict, f"{where}.spec", "an object")
    priority = spec.get("priority")
    if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
        raise KubeletResponseError(f"{where}.spec.priority", "expected an integer")
    containers = _field(spec, "containers", [])
    _want(containers, list, f"{where}.spec.containers", "a list")
    for i, c in enumerate(containers):
        at = f"{where}.spec.containers[{i}]"
        _want(c, dict, at, "an object")
        resources = _field(c, "resources", {})
        _want(resources, dict, f"{at}.resources", "an object")
        for kind in ("requests", "limits"):
            amounts = _field(resources, kind, {})
            _want(amounts, dict, f"{at}.resources.{kind}", "an object")
            for name in ("cpu", "memory"):
                if name in amounts:
                    _check_quantity(amounts[name], f"{at}.resources.{kind}.{name}")
    status = _field(pod, "status", {})
    _want(status, dict, f"{where}.status", "an object")
    statuses = _field(status, "containerStatuses", [])
    _want(statuses, list, f"{where}.status.containerStatuses", "a list")
    for i, s in enumerate(statuses):
        _want(s, dict, f"{where}.status.containerStatuses[{i}]", "an object")


def _check_quantity(value: object, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise KubeletResponseError(field, "expected a quantity")
    try:
        parse_quantity(value)
    except ValueError as err:
        raise KubeletResponseError(field, str(err)) from err


def parse_pod_list(body: bytes) -> list[dict[str, Any]]:
    """The items of a ``/pods`` body. Raises :class:`KubeletResponseError` on a body that is not
    a JSON PodList; items are checked one by one later (:func:`map_pods`)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise KubeletResponseError("(body)", f"not JSON: {err}") from err
    _want(doc, dict, "(body)", "a PodList object")
    kind = doc.get("kind")
    if kind is not None and kind != "PodList":
        raise KubeletResponseError("kind", f"expected PodList, got {kind!r}")
    items = doc.get("items")
    if items is None:
        return []  # an empty list: Go's json.Marshal writes null for a nil slice
    _want(items, list, "items", "a list")
    return list(items)


def _finished(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def map_pods(
    items: list[dict[str, Any]], layout: CgroupLayout, node_name: str, source: str
) -> dict[str, PodInfo]:
    """The running pods of ``items`` bound to ``node_name`` (any, when empty), by UID. A pod
    with a malformed field is skipped with a warning that names the field."""
    pods: dict[str, PodInfo] = {}
    for i, raw in enumerate(items):
        try:
            _check_pod(raw, f"items[{i}]")
            if _finished(raw):
                continue  # no cgroup left
            bound = (raw.get("spec") or {}).get("nodeName")
            if node_name and bound and bound != node_name:
                continue
            info = pod_info(raw, layout)
        except KubeletResponseError as err:
            logger.warning("pod skipped: %s", err)
            continue
        except ValueError as err:
            meta = raw.get("metadata") or {}
            logger.warning(
                "pod skipped: items[%d] (%s/%s): %s",
                i,
                meta.get("namespace"),
                meta.get("name"),
                err,
            )
            continue
        pods[info.uid] = dataclasses.replace(info, source=source)
    return pods


def node_address(node: Obj | None, preferred: str) -> str | None:
    """The Node's address of the preferred type (``InternalIP`` when the type is unknown)."""
    if node is None:
        return None
    kind = preferred if preferred in ADDRESS_TYPES else "InternalIP"
    for entry in (node.get("status") or {}).get("addresses") or []:
        if isinstance(entry, dict) and entry.get("type") == kind and entry.get("address"):
            return str(entry["address"])
    return None


def node_kubelet_port(node: Obj | None) -> int:
    """``status.daemonEndpoints.kubeletEndpoint.Port``, else 10250."""
    endpoints = ((node or {}).get("status") or {}).get("daemonEndpoints") or {}
    port = (endpoints.get("kubeletEndpoint") or {}).get("Port")
    return port if isinstance(port, int) and 0 < port <= 65535 else DEFAULT_KUBELET_PORT


# The source ------------------------------------------------------------------------------------
class _Token:
    """The bearer token file, re-read only when its identity or time stamp changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._value = ""

    def read(self) -> str:
        """Blocking: the current token ("" when the file is missing, logged by the caller)."""
        try:
            st = os.stat(self.path)  # follows the ..data symlink of a projected volume
        except FileNotFoundError:
            self._stamp, self._value = None, ""
            return ""
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            with open(self.path, encoding="utf-8") as f:
                self._value = f.read().strip()
            if self._stamp is not None:
                logger.info("kubelet token file %s changed; using the new token", self.path)
            self._stamp = stamp
        return self._value


class KubeletPodsSource:
    """The pods the kubelet runs, polled from its ``/pods``; a ``PodSource``.

    :meth:`poll` is the step (the daemon runs it every :attr:`KubeletSourceConfig.sync_interval`
    under its supervisor); :meth:`list_pods` is called from the inventory's worker thread and
    returns the last good list, an immutable snapshot replaced whole.
    """

    name = "kubelet"

    def __init__(
        self,
        config: KubeletSourceConfig,
        node_name: str,
        layout: Callable[[], CgroupLayout],
        *,
        node: Callable[[], Obj | None] = lambda: None,
    ) -> None:
        """``node`` returns this node's Node object (for the address and port when the config
        does not give them; the API-server source's ``node``)."""
        self.config = config
        self.node_name = node_name
        self._layout = layout
        self._node = node
        self._token = _Token(config.token_file) if config.token_file else None
        self._transport: Transport | None = None
        self._tls: ssl.SSLContext | None = None
        self._closed = False
        self._pods: Mapping[str, PodInfo] = MappingProxyType({})
        self._synced = asyncio.Event()
        self._failing: str | None = None
        self.polls = 0
        """Polls attempted."""
        self.failures = 0
        """Polls that failed (the last good list stayed)."""

    # Reading ------------------------------------------------------------------------------------
    def list_pods(self) -> Mapping[str, PodInfo]:
        return self._pods

    @property
    def synced(self) -> bool:
        """Whether one poll has succeeded."""
        return self._synced.is_set()

    @property
    def connected(self) -> bool:
        """Whether the last poll succeeded."""
        return self.synced and self._failing is None

    async def wait_synced(self, timeout: float) -> bool:  # noqa: ASYNC109 - a bounded wait is the API
        """Wait up to ``timeout`` seconds for the first good poll; whether it came."""
        try:
            async with asyncio.timeout(timeout):
                await self._synced.wait()
        except TimeoutError:
            return False
        return True

    def url(self) -> str:
        """The ``/pods`` URL now (the address may come from the Node). Raises
        :class:`KubeletUnavailable` while no address is known."""
        host, port = self.endpoint()
        if ":" in host:
            host = f"[{host}]"  # IPv6
        return f"{self.config.scheme}://{host}:{port}/pods"

    def endpoint(self) -> tuple[str, int]:
        """The kubelet's host (an IPv6 address without brackets) and port now. Raises
        :class:`KubeletUnavailable` while no address is known."""
        cfg = self.config
        node = self._node() if not cfg.address or (not cfg.insecure_tls and not cfg.port) else None
        host = cfg.address or node_address(node, cfg.preferred_address_type)
        if not host:
            raise KubeletUnavailable(
                f"no {cfg.preferred_address_type} address for node {self.node_name!r} yet"
            )
        port = cfg.read_only_port if cfg.insecure_tls else cfg.port or node_kubelet_port(node)
        return host.strip("[]"), port

    # Running ------------------------------------------------------------------------------------
    async def poll(self) -> None:
        """One poll: fetch and install the list; on a failure keep the last good one. Logs the
        first failure at warning, the repeats at debug, the recovery at info."""
        self.polls += 1
        try:
            pods = await self.fetch()
        except KubeletError as err:
            self.failures += 1
            if self._failing is None:
                logger.warning(
                    "kubelet pods unavailable, keeping the last %d (%s): %s",
                    len(self._pods),
                    "good list" if self.synced else "none yet",
                    err,
                )
            else:
                logger.debug("kubelet pods still unavailable: %s", err)
            self._failing = str(err)
            return
        if self._failing is not None:
            logger.info("kubelet pods available again: %d pods", len(pods))
        elif not self.synced:
            logger.info("kubelet pods: first list, %d pods", len(pods))
        self._failing = None
        self._pods = MappingProxyType(pods)
        self._synced.set()

    async def fetch(self) -> dict[str, PodInfo]:
        """Ask the kubelet once: this node's running pods by UID. Raises :class:`KubeletError`."""
        url = self.url()
        transport = await self._transport_for(*self.endpoint())
        headers = {"Accept": "application/json"}
        token = ""
        if self._token is not None and not self.config.insecure_tls:
            try:
                token = await asyncio.to_thread(self._token.read)
            except OSError as err:
                raise KubeletUnavailable(f"token file {self._token.path}: {err}") from err
            if token:
                headers["Authorization"] = f"Bearer {token}"
        try:
            resp = await transport.request(
                "GET", "/pods", headers=headers, timeout=self.config.sync_timeout
            )
        except (TransportError, OSError, TimeoutError) as err:
            raise KubeletUnavailable(f"GET {url}: {type(err).__name__}: {err}") from err
        if resp.status != 200:
            hint = ""
            if resp.status in (401, 403) and not self.config.insecure_tls:
                hint = (
                    " (the token needs get on nodes/proxy)"
                    if token
                    else f" (no token: {self.config.token_file or 'none configured'})"
                )
            raise KubeletUnavailable(f"GET {url}: HTTP {resp.status} {_reason(resp.status)}{hint}")
        return await asyncio.to_thread(self._decode, resp.body)

    def _decode(self, body: bytes) -> dict[str, PodInfo]:
        items = parse_pod_list(body)
        if not items:
            # A kubelet that has just restarted lists no pods for a moment; Koordinator ignores
            # an empty list too. It is never right: the koordlet's own pod runs on this node.
            raise KubeletUnavailable("empty PodList (a kubelet restarting?)")
        return map_pods(items, self._layout(), self.node_name, self.name)

    async def _transport_for(self, host: str, port: int) -> Transport:
        """The connection pool to ``host:port``, made anew when the address moved."""
        if self._closed:
            raise KubeletUnavailable("the source is closed")
        transport = self._transport
        if transport is None or (transport.host, transport.port) != (host, port):
            if transport is not None:
                await transport.close()
            tls = None
            if not self.config.insecure_tls:
                if self._tls is None:
                    self._tls = await asyncio.to_thread(self._ssl_context)
                tls = self._tls
            transport = self._transport = Transport(host, port, ssl=tls, max_idle=1)
        return transport

    def _ssl_context(self) -> ssl.SSLContext:
        if self.config.ca_file:
            try:
                return ssl.create_default_context(cafile=self.config.ca_file)
            except (OSError, ssl.SSLError) as err:
                raise KubeletUnavailable(f"CA file {self.config.ca_file}: {err}") from err
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # as Koordinator: kubelet certificates are self-signed
        return ctx

    async def close(self) -> None:
        """Close the connections for good (the daemon's stop); a poll still running fails and
        keeps the last good list, a later one opens no new connection."""
        self._closed = True
        if self._transport is not None:
            await self._transport.close()
            self._transport = None


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""
