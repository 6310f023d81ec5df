"""The admission webhook server: AdmissionReview v1 over TLS (aiohttp).

- ``POST /mutate-pod``: on CREATE of a pod, upstream's ``handleCreate`` in order: the
  ClusterColocationProfiles (:mod:`manager.webhook.profiles`), then the
  ``node.koordinator.sh/extended-resource-spec`` annotation (:mod:`manager.webhook.extendedspec`).
  The answer carries an RFC 6902 ``JSONPatch`` (base64) from the pod as received to the pod as
  mutated, both written as Go writes them (:mod:`manager.webhook.podjson`), or no patch when
  nothing changed. Other operations are allowed untouched. A profile that cannot be applied (its
  PriorityClass missing, the namespace unreadable, a bad ``probability``) or an existing
  annotation that cannot be decoded denies the pod with code 500 and a message naming the
  profile or the annotation and the field, as upstream answers ``admission.Errored(500)``.
- ``POST /validate-pod``: the co-location rules of :mod:`manager.webhook.validation`, on CREATE
  and UPDATE; a denial lists every broken rule (code 403).
- ``GET /healthz``: ``ok``.

What the handlers need from the cluster is a :class:`Lookups`: :class:`KubeLookups` keeps the
profiles in an informer and reads namespaces and PriorityClasses from the API server;
tests may pass a fixed one. The TLS context is the caller's (:func:`start`), so the serving
certificate can be replaced while serving (:mod:`manager.webhook.certs`).
"""

from __future__ import annotations

import base64
import json
import logging
import random
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from kubeclient.client import KubeClient
from kubeclient.errors import ApiError
from kubeclient.informer import Informer
from kubeclient.resources import CLUSTER_COLOCATION_PROFILES, NAMESPACES, PRIORITY_CLASSES
from manager.webhook import extendedspec
from manager.webhook.certs import CertificateError
from manager.webhook.podjson import json_patch, marshal_quantities
from manager.webhook.profiles import (
    PriorityClassRef,
    Profile,
    ProfileError,
    mutate,
    parse_profiles,
    plan,
)
from manager.webhook.validation import validate_pod

logger = logging.getLogger(__name__)

MUTATE_PATH = "/mutate-pod"
VALIDATE_PATH = "/validate-pod"
HEALTHZ_PATH = "/healthz"


class LookupError_(RuntimeError):
    """A namespace or PriorityClass could not be read."""


class Lookups(Protocol):
    """The cluster state the webhook reads."""

    def profiles(self) -> list[Profile]:
        """Every usable profile, in the order they apply."""
        ...

    async def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        """The labels of a namespace; raises :class:`LookupError_`."""
        ...

    async def priority_class(self, name: str) -> PriorityClassRef | None:
        """A PriorityClass (None: it does not exist); raises :class:`LookupError_`."""
        ...


class KubeLookups:
    """:class:`Lookups` from the API server: an informer over the profiles, GETs for the rest."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client
        self.informer = Informer(client, CLUSTER_COLOCATION_PROFILES)

    def profiles(self) -> list[Profile]:
        return parse_profiles(self.informer.list())

    async def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        try:
            ns = await self._client.get(NAMESPACES, namespace)
        except ApiError as err:
            raise LookupError_(f"namespace {namespace}: {err}") from err
        return (ns.get("metadata") or {}).get("labels") or {}

    async def priority_class(self, name: str) -> PriorityClassRef | None:
        try:
            pc = await self._client.get(PRIORITY_CLASSES, name)
        except ApiError as err:
            if err.status == 404:
                return None
            raise LookupError_(f"priorityclass {name}: {err}") from err
        value = pc.get("value")
        if isinstance(value, bool) or not isinstance(value, int):
            raise LookupError_(f"priorityclass {name}: value {value!r} is not an integer")
        policy = pc.get("preemptionPolicy")
        return PriorityClassRef(value, policy if isinstance(policy, str) and policy else None)


LOOKUPS = web.AppKey("lookups", Lookups)
Roll = Callable[[], int]
ROLL: web.AppKey[Roll] = web.AppKey("roll")
"""``rand.Intn(100)`` for profiles with a ``probability`` (tests pass a fixed one)."""


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


async def mutate_pod(
    pod: Mapping[str, Any],
    namespace: str,
    lookups: Lookups,
    roll: Callable[[], int] = lambda: random.randrange(100),
) -> tuple[dict[str, Any], list[str]]:
    """The pod as the mutating webhook leaves it on CREATE, and the profiles applied. Raises
    :class:`ProfileError`, :class:`LookupError_` or
    :class:`~manager.webhook.extendedspec.SpecError`."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    profiles = lookups.profiles()
    ns_labels = None
    if any(p.needs_namespace and p.selects_pod(labels) for p in profiles):
        ns_labels = await lookups.namespace_labels(namespace)
    walk = plan(profiles, labels, ns_labels, roll)
    classes: dict[str, PriorityClassRef] = {}
    for name in {
        p.priority_class_name for p in (walk.apply if walk else ()) if p.priority_class_name
    }:
        found = await lookups.priority_class(name)
        if found is not None:
            classes[name] = found
    result = mutate(pod, walk, classes)
    extendedspec.mutate(result.pod, result.made)
    return result.pod, result.applied


async def handle_mutate(request: web.Request) -> web.Response:
    req = await _request(request)
    uid = str(req["uid"])
    if req.get("operation") != "CREATE" or not _is_pod(req):
        return web.json_response(review(uid, True))
    pod = dict(req.get("object") or {})
    namespace = str(req.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "")
    try:
        mutated, applied = await mutate_pod(pod, namespace, request.app[LOOKUPS], request.app[ROLL])
    except (ProfileError, LookupError_, extendedspec.SpecError) as err:
        logger.warning("pod %s/%s: not admitted: %s", namespace, _pod_name(pod), err)
        return web.json_response(review(uid, False, code=500, message=str(err)))
    patch = json_patch(marshal_quantities(json.loads(json.dumps(pod))), marshal_quantities(mutated))
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


def make_app(
    lookups: Lookups, *, roll: Callable[[], int] = lambda: random.randrange(100)
) -> web.Application:
    """The webhook application over ``lookups``."""
    app = web.Application(client_max_size=4 * 1024 * 1024)
    app[LOOKUPS] = lookups
    app[ROLL] = roll
    app.router.add_post(MUTATE_PATH, handle_mutate)
    app.router.add_post(VALIDATE_PATH, handle_validate)
    app.router.add_get(HEALTHZ_PATH, handle_healthz)
    return app


def server_ssl_context(cert: Path, key: Path) -> ssl.SSLContext:
    """TLS 1.2+ server context for the serving certificate (``load_cert_chain`` on it again
    replaces the certificate for the handshakes that follow). Raises
    :class:`~manager.webhook.certs.CertificateError` naming the files."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as err:
        raise CertificateError(f"serving certificate {cert} with key {key}: {err}") from err
    return ctx


async def start(
    app: web.Application, *, host: str, port: int, ssl_context: ssl.SSLContext
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` over TLS; the runner (``cleanup()`` to stop) and the bound port."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    addresses = runner.addresses
    return runner, int(addresses[0][1]) if addresses else port
