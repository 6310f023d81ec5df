"""The admission webhook server: AdmissionReview v1 over TLS (aiohttp).

- ``POST /mutate-pod``: on CREATE of a pod, the ClusterColocationProfiles that match, in name
  order, then the batch/mid resource translation (:mod:`manager.webhook.profiles`); the answer
  carries an RFC 6902 ``JSONPatch`` (base64) or no patch when nothing changed. Other operations
  are allowed untouched. A profile that cannot be applied (its PriorityClass missing, the
  namespace unreadable) denies the pod with code 500 naming the profile, as upstream does.
- ``POST /validate-pod``: the co-location rules of :mod:`manager.webhook.validation`, on CREATE
  and UPDATE; a denial lists every broken rule (code 403).
- ``GET /healthz``: ``ok``.

What the handlers need from the cluster is a :class:`Lookups`: :class:`KubeLookups` keeps the
profiles in an informer and reads namespaces and PriorityClasses from the API server;
tests may pass a fixed one.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from apis.groups import CONFIG_GROUP, V1ALPHA1
from kubeclient.client import KubeClient
from kubeclient.errors import ApiError
from kubeclient.informer import Informer
from kubeclient.resources import Resource
from manager.webhook.profiles import Profile, ProfileError, json_patch, mutate, parse_profiles
from manager.webhook.validation import validate_pod

logger = logging.getLogger(__name__)

PROFILES = Resource(
    CONFIG_GROUP,
    V1ALPHA1,
    "clustercolocationprofiles",
    "ClusterColocationProfile",
    namespaced=False,
)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
PRIORITY_CLASSES = Resource(
    "scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False
)
MUTATE_PATH = "/mutate-pod"
VALIDATE_PATH = "/validate-pod"


class LookupError_(RuntimeError):
    """A namespace or PriorityClass could not be read."""


class Lookups(Protocol):
    """The cluster state the webhook reads."""

    def profiles(self) -> list[Profile]:
        """Every usable profile, in name order."""
        ...

    async def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        """The labels of a namespace; raises :class:`LookupError_`."""
        ...

    async def priority_value(self, name: str) -> int | None:
        """The value of a PriorityClass (None: it does not exist); raises :class:`LookupError_`."""
        ...


class KubeLookups:
    """:class:`Lookups` from the API server: an informer over the profiles, GETs for the rest."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client
        self.informer = Informer(client, PROFILES)

    def profiles(self) -> list[Profile]:
        return parse_profiles(self.informer.list())

    async def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        try:
            ns = await self._client.get(NAMESPACES, namespace)
        except ApiError as err:
            raise LookupError_(f"namespace {namespace}: {err}") from err
        return (ns.get("metadata") or {}).get("labels") or {}

    async def priority_value(self, name: str) -> int | None:
        try:
            pc = await self._client.get(PRIORITY_CLASSES, name)
        except ApiError as err:
            if err.status == 404:
                return None
            raise LookupError_(f"priorityclass {name}: {err}") from err
        value = pc.get("value")
        return value if isinstance(value, int) and not isinstance(value, bool) else None


LOOKUPS = web.AppKey("lookups", Lookups)


def review(uid: str, allowed: bool, *, code: int = 0, message: str = "", patch: Any = None) -> Any:
    """An AdmissionReview v1 response."""
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if code or message:
        response["status"] = {"code": code or (200 if allowed else 403), "message": message}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode("ascii")
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


async def _request(request: web.Request) -> Mapping[str, Any]:
    try:
        body = await request.json()
    except ValueError as err:
        raise web.HTTPBadRequest(text=f"not JSON: {err}") from err
    req = body.get("request") if isinstance(body, Mapping) else None
    if not isinstance(req, Mapping) or not req.get("uid"):
        raise web.HTTPBadRequest(text="not an AdmissionReview with a request")
    return req


def _is_pod(req: Mapping[str, Any]) -> bool:
    kind = req.get("kind") or {}
    return kind.get("kind") == "Pod" and not kind.get("group") and not req.get("subResource")


async def handle_mutate(request: web.Request) -> web.Response:
    req = await _request(request)
    uid = str(req["uid"])
    if req.get("operation") != "CREATE" or not _is_pod(req):
        return web.json_response(review(uid, True))
    lookups = request.app[LOOKUPS]
    pod = dict(req.get("object") or {})
    namespace = str(req.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "")
    profiles = lookups.profiles()
    try:
        ns_labels = None
        if any(p.needs_namespace for p in profiles):
            ns_labels = await lookups.namespace_labels(namespace)
        values: dict[str, int] = {}
        for name in {p.priority_class_name for p in profiles if p.priority_class_name}:
            value = await lookups.priority_value(name)
            if value is not None:
                values[name] = value
        mutated, applied = mutate(pod, profiles, namespace_labels=ns_labels, priority_values=values)
    except (ProfileError, LookupError_, ValueError) as err:
        logger.warning("pod %s/%s: not mutated: %s", namespace, _pod_name(pod), err)
        return web.json_response(review(uid, False, code=500, message=str(err)))
    patch = json_patch(pod, mutated)
    if applied:
        logger.info("pod %s/%s: applied profiles %s", namespace, _pod_name(pod), applied)
    return web.json_response(review(uid, True, patch=patch))


async def handle_validate(request: web.Request) -> web.Response:
    req = await _request(request)
    uid = str(req["uid"])
    if req.get("operation") not in ("CREATE", "UPDATE") or not _is_pod(req):
        return web.json_response(review(uid, True))
    pod = req.get("object") or {}
    old = req.get("oldObject") if req.get("operation") == "UPDATE" else None
    errors = validate_pod(pod, old or None)
    if errors:
        return web.json_response(review(uid, False, code=403, message="; ".join(errors)))
    return web.json_response(review(uid, True))


async def handle_healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("name") or meta.get("generateName") or "")


def make_app(lookups: Lookups) -> web.Application:
    """The webhook application over ``lookups``."""
    app = web.Application(client_max_size=4 * 1024 * 1024)
    app[LOOKUPS] = lookups
    app.router.add_post(MUTATE_PATH, handle_mutate)
    app.router.add_post(VALIDATE_PATH, handle_validate)
    app.router.add_get("/healthz", handle_healthz)
    return app


def server_ssl_context(cert: Path, key: Path) -> ssl.SSLContext:
    """TLS 1.2+ server context for the serving certificate."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


async def start(
    app: web.Application, *, host: str, port: int, cert: Path, key: Path
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` over TLS; the runner (``cleanup()`` to stop) and the bound port."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=server_ssl_context(cert, key))
    await site.start()
    addresses = runner.addresses
    return runner, int(addresses[0][1]) if addresses else port
