"""A fake API server on 127.0.0.1, faithful on what our client layer relies on.

Faithful on:
- **resourceVersion**: one monotonic counter for the server; every write stamps the object with
  the next value; a PUT carrying a stale ``metadata.resourceVersion`` is a **409 Conflict**;
- **list** (``fieldSelector`` on ``metadata.name``, ``metadata.namespace``, ``spec.nodeName``,
  ``labelSelector`` with ``=``, ``!=`` and existence; ``limit``/``continue`` paging) answering
  the current resourceVersion;
- **watch** streams as chunked JSON lines: events after the given resourceVersion (synthetic
  ADDED for everything when it is empty or ``0``), ``BOOKMARK`` events when
  ``allowWatchBookmarks`` is set, the stream ending at ``timeoutSeconds``, and an ``ERROR`` event
  with a 410 ``Expired`` Status for a resourceVersion older than the compacted history (or an
  HTTP 410 with ``gone_as_http``);
- **status subresource**: a PUT or PATCH of the object ignores ``status``; one of ``/status``
  changes only ``status``; ``metadata.generation`` moves on spec changes only;
- JSON **merge patch**, RFC 6902 **JSON patch** (``add``, ``remove``, ``replace``, ``test``: a
  failed test is a 422) and a **strategic merge patch** subset (maps merge, ``null`` deletes;
  lists of objects merge by their patch merge key: ``name`` when every item has one, else
  ``type``, as ``conditions`` do; ``$setElementOrder`` directives are ignored);
- creation (409 AlreadyExists), deletion (a DELETED event; a ``DeleteOptions`` body's UID
  precondition, 409 when it does not match), **policy/v1 evictions** as the API server's
  eviction REST handler (``registry/core/pod/storage/eviction.go``) does them: UID precondition;
  a pod in phase Pending, Succeeded or Failed, or already terminating, is deleted without
  looking at disruption budgets; otherwise the PodDisruptionBudgets of its namespace whose
  selector matches its labels decide: none, deleted; more than one, 500; one whose
  ``status.observedGeneration`` is behind its generation or whose ``status.disruptionsAllowed``
  is 0, **429** ``TooManyRequests`` "Cannot evict pod as it would violate the pod's disruption
  budget." with a ``DisruptionBudget`` cause; else ``disruptionsAllowed`` is decremented and the
  pod recorded in ``disruptedPods`` (a PDB status write) before the pod is deleted. A pod name
  in ``eviction_blocked`` is refused with 429 whatever the budgets say.

Fault injection (:class:`Fault`, matched in order, each for ``times`` requests): an HTTP status
with an optional ``Retry-After``, a dropped connection, a delay; ``drop_watches()`` cuts every
open watch stream mid-flight. Every request is recorded in ``requests``; ``in_flight`` counts
those not answered yet.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

Obj = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    """One resource the fake serves."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


DEFAULT_KINDS = (
    Kind("", "v1", "nodes", "Node", False),
    Kind("", "v1", "pods", "Pod", True),
    Kind("", "v1", "configmaps", "ConfigMap", True, status_subresource=False),
    Kind("", "v1", "events", "Event", True, status_subresource=False),
    # events.k8s.io/v1 Events: the same objects as core/v1 Events in the API server; the fake
    # stores both under "events" and converts nothing (a test writes and reads one version)
    Kind("events.k8s.io", "v1", "events", "Event", True, status_subresource=False),
    Kind("coordination.k8s.io", "v1", "leases", "Lease", True, status_subresource=False),
    Kind("slo.koordinator.sh", "v1alpha1", "nodemetrics", "NodeMetric", False),
    Kind("slo.koordinator.sh", "v1alpha1", "nodeslos", "NodeSLO", False),
    Kind(
        "topology.node.k8s.io", "v1alpha1", "noderesourcetopologies", "NodeResourceTopology", False
    ),
    # every API server serves these; the descheduler reads them
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
    Kind("apps", "v1", "replicasets", "ReplicaSet", True),
    Kind("apps", "v1", "deployments", "Deployment", True),
    Kind("apps", "v1", "statefulsets", "StatefulSet", True),
    Kind("", "v1", "replicationcontrollers", "ReplicationController", True),
)


@dataclass
class Fault:
    """A failure injected into the next ``times`` requests that match."""

    status: int = 0
    """HTTP status to answer (0: no status answer; see ``drop`` and ``delay``)."""
    retry_after: float | None = None
    """``Retry-After`` header (seconds) with the status."""
    drop: bool = False
    """Close the connection without an answer."""
    delay: float = 0.0
    """Seconds to wait before handling the request (then handled normally)."""
    method: str = ""
    """Only requests with this method (empty: any)."""
    path_contains: str = ""
    """Only requests whose path contains this (empty: any)."""
    watch: bool | None = None
    """Only watch requests (True), only others (False), or both (None)."""
    times: int = 1
    """How many matching requests it applies to."""

    def matches(self, method: str, path: str, is_watch: bool) -> bool:
        if self.times <= 0:
            return False
        if self.method and self.method != method:
            return False
        if self.path_contains and self.path_contains not in path:
            return False
        return self.watch is None or self.watch == is_watch


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str
    at: float


@dataclass
class _Watcher:
    kind: Kind
    namespace: str | None
    queue: asyncio.Queue[tuple[int, str, Obj] | None] = field(default_factory=asyncio.Queue)


def _status(code: int, reason: str, message: str, **details: Any) -> Obj:
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class ApiStatusError(Exception):
    def __init__(
        self, code: int, reason: str, message: str, causes: list[Obj] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.causes = causes or []


def _selector_matches(selector: Any, labels: dict[str, str]) -> bool:
    """A ``metav1.LabelSelector`` (``matchLabels``, ``matchExpressions`` In, NotIn, Exists,
    DoesNotExist) against labels; a missing selector matches nothing, an empty one everything
    (a PDB's rule)."""
    if not isinstance(selector, dict):
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _field_value(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    return "" if cur is None else str(cur)


def _match_fields(obj: Obj, selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, want = term.split("!=", 1)
            if _field_value(obj, key) == want:
                return False
        else:
            key, want = term.split("==", 1) if "==" in term else term.split("=", 1)
            if _field_value(obj, key) != want:
                return False
    return True


def _match_labels(obj: Obj, selector: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, want = term.split("!=", 1)
            if labels.get(key) == want:
                return False
        elif "=" in term:
            key, want = term.split("==", 1) if "==" in term else term.split("=", 1)
            if labels.get(key) != want:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 ``add``, ``remove``, ``replace`` and ``test``; a failed ``test`` or a path that
    does not resolve is a 422, and nothing is changed."""
    if not isinstance(ops, list):
        raise ApiStatusError(400, "BadRequest", "a JSON patch is a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in str(op["path"]).split("/")[1:]]
        parent = doc
        try:
            for part in parts[:-1]:
                parent = parent[int(part)] if isinstance(parent, list) else parent[part]
            last = parts[-1]
            if op["op"] == "test":
                here = parent[int(last)] if isinstance(parent, list) else parent[last]
                if here != op["value"]:
                    raise ApiStatusError(422, "Invalid", f"test failed at {op['path']}")
            elif op["op"] == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            elif isinstance(parent, list):
                idx = len(parent) if last == "-" else int(last)
                if op["op"] == "add":
                    parent.insert(idx, copy.deepcopy(op["value"]))
                else:
                    parent[idx] = copy.deepcopy(op["value"])
            else:
                if op["op"] == "replace" and last not in parent:
                    raise ApiStatusError(422, "Invalid", f"no value at {op['path']}")
                parent[last] = copy.deepcopy(op["value"])
        except (KeyError, IndexError, ValueError, TypeError) as err:
            raise ApiStatusError(422, "Invalid", f"{op['op']} {op['path']}: {err!r}") from err
    return doc


def _merge_key(items: list[Any]) -> str | None:
    """The patch merge key of a list (``name`` for containers, ``type`` for conditions)."""
    for key in ("name", "type"):
        if all(isinstance(v, dict) and key in v for v in items):
            return key
    return None


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """The subset we need: maps merge (null deletes), lists of objects with a merge key merge
    by it, other lists are replaced."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/"):
            continue
        if value is None:
            out.pop(key, None)
        elif (
            isinstance(value, list)
            and isinstance(out.get(key), list)
            and (mkey := _merge_key(value + out[key])) is not None
        ):
            merged = {v[mkey]: v for v in out[key]}
            for item in value:
                merged[item[mkey]] = strategic_merge_patch(merged.get(item[mkey]), item)
            out[key] = list(merged.values())
        else:
            out[key] = strategic_merge_patch(out.get(key), value)
    return out


class FakeApiServer:
    """The fake; ``await start()`` then point a kubeconfig at :attr:`url`."""

    def __init__(self, kinds: tuple[Kind, ...] = DEFAULT_KINDS) -> None:
        self.kinds: dict[tuple[str, str, str], Kind] = {}
        for k in kinds:
            self.register(k)
        self.rv = 100
        self.compacted_rv = 0
        """Watches from a resourceVersion below this get 410 Gone."""
        self.objects: dict[tuple[str, str, str], Obj] = {}
        """(plural, namespace, name) → object."""
        self.history: list[tuple[int, Kind, str, Obj]] = []
        self.faults: list[Fault] = []
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        """Requests received and not yet answered (open watches included)."""
        self.eviction_blocked: set[str] = set()
        """Pod names whose eviction a disruption budget refuses (429)."""
        self.gone_as_http = False
        """Answer a too-old watch with HTTP 410 instead of a 200 stream with an ERROR event."""
        self.bookmark_interval = 0.2
        """Seconds between bookmarks on a watch that asked for them."""
        self._watchers: list[_Watcher] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    def register(self, kind: Kind) -> None:
        """Serve another resource (generic custom resources)."""
        self.kinds[(kind.group, kind.version, kind.plural)] = kind

    # Lifecycle --------------------------------------------------------------------------------
    async def start(self) -> str:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # Direct access for test setup -------------------------------------------------------------
    def kind_of(self, plural: str) -> Kind:
        for k in self.kinds.values():
            if k.plural == plural:
                return k
        raise KeyError(plural)

    def get(self, plural: str, name: str, namespace: str = "") -> Obj | None:
        return self.objects.get((plural, namespace, name))

    def put(self, plural: str, obj: Obj) -> Obj:
        """Create or replace an object as a controller would (new resourceVersion, event)."""
        kind = self.kind_of(plural)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        ns = meta.get("namespace", "") if kind.namespaced else ""
        key = (plural, ns, meta["name"])
        old = self.objects.get(key)
        obj.setdefault("apiVersion", kind.api_version)
        obj.setdefault("kind", kind.kind)
        if old is None:
            self._stamp_new(obj)
        else:
            meta.setdefault("uid", old["metadata"]["uid"])
            meta.setdefault("creationTimestamp", old["metadata"]["creationTimestamp"])
            gen = old["metadata"].get("generation", 1)
            meta["generation"] = gen + 1 if obj.get("spec") != old.get("spec") else gen
        return self._commit(kind, key, obj, "ADDED" if old is None else "MODIFIED")

    def remove(self, plural: str, name: str, namespace: str = "") -> None:
        kind = self.kind_of(plural)
        key = (plural, namespace, name)
        obj = self.objects.pop(key)
        self._emit(kind, "DELETED", self._bump(obj))

    def compact(self) -> None:
        """Forget the history: every resourceVersion before now is too old to watch from."""
        self.compacted_rv = self.rv + 1
        self.history.clear()

    @property
    def open_watches(self) -> int:
        """Watch streams open now."""
        return len(self._watchers)

    def drop_watches(self) -> None:
        """Cut every open watch stream without ending it properly."""
        for w in self._watchers:
            w.queue.put_nowait(None)

    def send_bookmark(self) -> None:
        for w in self._watchers:
            w.queue.put_nowait((self.rv, "BOOKMARK", {}))

    def writes(self, method: str = "", path_contains: str = "") -> list[RecordedRequest]:
        """Recorded non-GET requests (optionally one method, a path fragment)."""
        return [
            r
            for r in self.requests
            if r.method != "GET" and (not method or r.method == method) and path_contains in r.path
        ]

    # Internals --------------------------------------------------------------------------------
    def _stamp_new(self, obj: Obj) -> None:
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        meta["generation"] = 1

    def _bump(self, obj: Obj) -> Obj:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return obj

    def _commit(self, kind: Kind, key: tuple[str, str, str], obj: Obj, event: str) -> Obj:
        self._bump(obj)
        self.objects[key] = obj
        self._emit(kind, event, obj)
        return copy.deepcopy(obj)

    def _emit(self, kind: Kind, event: str, obj: Obj) -> None:
        snapshot = copy.deepcopy(obj)
        self.history.append((self.rv, kind, event, snapshot))
        for w in self._watchers:
            if w.kind == kind:
                w.queue.put_nowait((self.rv, event, snapshot))

    def _route(self, path: str) -> tuple[Kind, str | None, str | None, str]:
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiStatusError(404, "NotFound", f"the server could not find {path}")
        ns: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise ApiStatusError(404, "NotFound", f"the server could not find {path}")
        kind = self.kinds.get((group, version, rest[0]))
        if kind is None:
            raise ApiStatusError(404, "NotFound", f"the server could not find {path}")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        return kind, ns if kind.namespaced else None, name, sub

    def _matching(self, kind: Kind, ns: str | None, query: dict[str, str]) -> list[Obj]:
        fs = query.get("fieldSelector", "")
        ls = query.get("labelSelector", "")
        return [
            o
            for (plural, ons, _), o in sorted(self.objects.items())
            if plural == kind.plural
            and (ns is None or ons == ns)
            and _match_fields(o, fs)
            and _match_labels(o, ls)
        ]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        query = dict(parse_qsl(request.query_string))
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        is_watch = query.get("watch") in ("true", "1")
        self.requests.append(
            RecordedRequest(
                request.method,
                request.path,
                query,
                body,
                request.headers.get("Content-Type", ""),
                time.monotonic(),
            )
        )
        for fault in self.faults:
            if fault.matches(request.method, request.path, is_watch):
                fault.times -= 1
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                if fault.drop:
                    assert request.transport is not None
                    request.transport.close()
                    raise asyncio.CancelledError
                if fault.status:
                    headers = {}
                    if fault.retry_after is not None:
                        headers["Retry-After"] = str(fault.retry_after)
                    return web.json_response(
                        _status(fault.status, "Injected", "injected fault"),
                        status=fault.status,
                        headers=headers,
                    )
                break
        try:
            kind, ns, name, sub = self._route(request.path)
            if is_watch and request.method == "GET" and name is None:
                return await self._watch(request, kind, ns, query)
            ctype = request.headers.get("Content-Type", "")
            result = self._dispatch(request.method, kind, ns, name, sub, query, body, ctype)
        except ApiStatusError as err:
            details = {"causes": err.causes} if err.causes else {}
            return web.json_response(
                _status(err.code, err.reason, err.message, **details), status=err.code
            )
        code = 201 if request.method == "POST" else 200
        return web.json_response(result, status=code)

    def _dispatch(
        self,
        method: str,
        kind: Kind,
        ns: str | None,
        name: str | None,
        sub: str,
        query: dict[str, str],
        body: Any,
        ctype: str,
    ) -> Obj:
        if name is None:
            if method == "GET":
                return self._list(kind, ns, query)
            if method == "POST":
                return self._create(kind, ns, body)
            raise ApiStatusError(405, "MethodNotAllowed", method)
        key = (kind.plural, ns or "", name)
        if sub == "eviction" and kind.plural == "pods" and method == "POST":
            return self._evict(key, body)
        if sub and (sub != "status" or not kind.status_subresource):
            raise ApiStatusError(404, "NotFound", f"no subresource {sub}")
        current = self.objects.get(key)
        if current is None:
            raise ApiStatusError(404, "NotFound", f'{kind.plural} "{name}" not found')
        if method == "GET":
            return copy.deepcopy(current)
        if method == "DELETE":
            want_uid = ((body or {}) if isinstance(body, dict) else {}).get("preconditions") or {}
            want_uid = want_uid.get("uid")
            if want_uid and want_uid != current["metadata"].get("uid"):
                raise ApiStatusError(
                    409,
                    "Conflict",
                    f"Precondition failed: UID in precondition: {want_uid}, "
                    f"UID in object meta: {current['metadata'].get('uid')}",
                )
            del self.objects[key]
            self._emit(kind, "DELETED", self._bump(copy.deepcopy(current)))
            return copy.deepcopy(current)
        if method == "PUT":
            if not isinstance(body, dict):
                raise ApiStatusError(400, "BadRequest", "body must be an object")
            want = str((body.get("metadata") or {}).get("resourceVersion", ""))
            if want and want != current["metadata"]["resourceVersion"]:
                raise ApiStatusError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {kind.plural} "{name}": the object has '
                    "been modified; please apply your changes to the latest version and try again",
                )
            return self._write(kind, key, current, body, sub)
        if method == "PATCH":
            if "json-patch" in ctype:
                patched = json_patch(current, body)
            elif "strategic" in ctype:
                patched = strategic_merge_patch(current, body)
            else:
                patched = merge_patch(current, body)
            return self._write(kind, key, current, patched, sub)
        raise ApiStatusError(405, "MethodNotAllowed", method)

    def _write(
        self, kind: Kind, key: tuple[str, str, str], current: Obj, new: Obj, sub: str
    ) -> Obj:
        new = copy.deepcopy(new)
        if kind.status_subresource:
            if sub == "status":
                merged = copy.deepcopy(current)
                if "status" in new:
                    merged["status"] = new["status"]
                else:
                    merged.pop("status", None)
                new = merged
            elif "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        meta = new.setdefault("metadata", {})
        for fixed in ("uid", "creationTimestamp", "name", "namespace"):
            if fixed in current["metadata"]:
                meta[fixed] = current["metadata"][fixed]
        gen = current["metadata"].get("generation", 1)
        meta["generation"] = gen + 1 if new.get("spec") != current.get("spec") else gen
        new["apiVersion"] = kind.api_version
        new["kind"] = kind.kind
        return self._commit(kind, key, new, "MODIFIED")

    def _list(self, kind: Kind, ns: str | None, query: dict[str, str]) -> Obj:
        items = [copy.deepcopy(o) for o in self._matching(kind, ns, query)]
        limit = int(query.get("limit") or 0)
        start = int(query.get("continue") or 0)
        meta: Obj = {"resourceVersion": str(self.rv)}
        if limit:
            if start + limit < len(items):
                meta["continue"] = str(start + limit)
            items = items[start : start + limit]
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": meta,
            "items": items,
        }

    def _create(self, kind: Kind, ns: str | None, body: Any) -> Obj:
        if not isinstance(body, dict) or not (body.get("metadata") or {}).get("name"):
            raise ApiStatusError(422, "Invalid", "metadata.name: Required value")
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        if kind.namespaced:
            meta["namespace"] = ns or meta.get("namespace") or "default"
        key = (kind.plural, meta.get("namespace", "") if kind.namespaced else "", meta["name"])
        if key in self.objects:
            raise ApiStatusError(409, "AlreadyExists", f'{kind.plural} "{meta["name"]}" exists')
        obj["apiVersion"] = kind.api_version
        obj["kind"] = kind.kind
        meta.pop("resourceVersion", None)
        self._stamp_new(obj)
        return self._commit(kind, key, obj, "ADDED")

    def _evict(self, key: tuple[str, str, str], body: Any) -> Obj:
        pod = self.objects.get(key)
        if pod is None:
            raise ApiStatusError(404, "NotFound", f'pods "{key[2]}" not found')
        want_uid = (((body or {}).get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
        if want_uid and want_uid != pod["metadata"]["uid"]:
            raise ApiStatusError(409, "Conflict", "Precondition failed: UID in precondition")
        if key[2] in self.eviction_blocked:
            raise ApiStatusError(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the disruption budget.",
            )
        self._check_disruption_budget(pod)
        del self.objects[key]
        self._emit(self.kind_of("pods"), "DELETED", self._bump(copy.deepcopy(pod)))
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

    def _check_disruption_budget(self, pod: Obj) -> None:
        """The eviction handler's PDB check (see the module docstring); decrements the budget
        that allows the eviction."""
        meta = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Pending", "Succeeded", "Failed") or meta.get("deletionTimestamp"):
            return
        if ("poddisruptionbudgets", "policy", "v1") not in {
            (k.plural, k.group, k.version) for k in self.kinds.values()
        }:
            return
        labels = meta.get("labels") or {}
        matching = [
            (key, pdb)
            for key, pdb in sorted(self.objects.items())
            if key[0] == "poddisruptionbudgets"
            and key[1] == meta.get("namespace", "")
            and _selector_matches((pdb.get("spec") or {}).get("selector"), labels)
        ]
        if not matching:
            return
        if len(matching) > 1:
            raise ApiStatusError(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction "
                "subresource does not support.",
            )
        key, pdb = matching[0]
        status = pdb.get("status") or {}
        name = pdb["metadata"]["name"]
        if int(status.get("observedGeneration") or 0) < int(pdb["metadata"].get("generation", 1)):
            raise ApiStatusError(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                causes=[
                    {
                        "reason": "DisruptionBudget",
                        "message": f"The disruption budget {name} is still being processed "
                        "by the server.",
                    }
                ],
            )
        allowed = int(status.get("disruptionsAllowed") or 0)
        if allowed < 0:
            raise ApiStatusError(403, "Forbidden", "pdb disruptions allowed is negative")
        if allowed == 0:
            raise ApiStatusError(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                causes=[
                    {
                        "reason": "DisruptionBudget",
                        "message": f"The disruption budget {name} needs "
                        f"{status.get('desiredHealthy', 0)} healthy pods and has "
                        f"{status.get('currentHealthy', 0)} currently",
                    }
                ],
            )
        new = copy.deepcopy(pdb)
        new_status = new.setdefault("status", {})
        new_status["disruptionsAllowed"] = allowed - 1
        disrupted = dict(new_status.get("disruptedPods") or {})
        disrupted[meta["name"]] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        new_status["disruptedPods"] = disrupted
        self._commit(self.kind_of("poddisruptionbudgets"), key, new, "MODIFIED")

    async def _watch(
        self, request: web.Request, kind: Kind, ns: str | None, query: dict[str, str]
    ) -> web.StreamResponse:
        rv_text = query.get("resourceVersion", "")
        since = int(rv_text) if rv_text.isdigit() else 0
        too_old = since and since < self.compacted_rv
        if too_old and self.gone_as_http:
            raise ApiStatusError(410, "Expired", f"too old resource version: {since}")
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)

        async def send(event: str, obj: Obj) -> None:
            await resp.write(json.dumps({"type": event, "object": obj}).encode() + b"\n")

        if too_old:
            await send("ERROR", _status(410, "Expired", f"too old resource version: {since}"))
            await resp.write_eof()
            return resp
        watcher = _Watcher(kind, ns)
        fs = query.get("fieldSelector", "")
        ls = query.get("labelSelector", "")
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        # Register before replaying: nothing can slip between (no await in between).
        self._watchers.append(watcher)
        if since == 0:
            backlog = [(self.rv, "ADDED", copy.deepcopy(o)) for o in self._matching(kind, ns, {})]
        else:
            backlog = [(r, e, o) for (r, k, e, o) in self.history if k == kind and r > since]
        sent_rv = self.rv
        try:
            for _, event, obj in backlog:
                if self._visible(obj, ns, fs, ls):
                    await send(event, obj)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wait = min(left, self.bookmark_interval) if bookmarks else left
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and time.monotonic() < deadline:
                        await send("BOOKMARK", self._bookmark(kind))
                    continue
                if item is None:  # drop_watches(): cut the stream mid-flight
                    if request.transport is not None:  # None: the client has gone already
                        request.transport.close()
                    return resp
                rv, event, obj = item
                if event == "BOOKMARK":
                    if bookmarks:
                        await send("BOOKMARK", self._bookmark(kind))
                    continue
                if rv <= sent_rv:
                    continue
                if self._visible(obj, ns, fs, ls):
                    await send(event, obj)
            await resp.write_eof()
        except ConnectionResetError:
            pass
        finally:
            self._watchers.remove(watcher)
        return resp

    def _bookmark(self, kind: Kind) -> Obj:
        return {
            "kind": kind.kind,
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(self.rv)},
        }

    @staticmethod
    def _visible(obj: Obj, ns: str | None, fs: str, ls: str) -> bool:
        if ns is not None and (obj.get("metadata") or {}).get("namespace") != ns:
            return False
        return _match_fields(obj, fs) and _match_labels(obj, ls)
