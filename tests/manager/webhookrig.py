"""The webhook over real TLS on 127.0.0.1 for tests: AdmissionReview requests in, patched pods
out; profiles, namespaces and PriorityClasses come from the fake API server."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import ssl
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from kubeclient.client import KubeClient
from manager.webhook.certs import CA_CERT, SERVER_CERT_TLS, SERVER_KEY_TLS
from manager.webhook.server import KubeLookups, make_app, server_ssl_context, start
from tests.kubefake import FakeApiServer, Kind

EXTRA_KINDS = (
    Kind("", "v1", "namespaces", "Namespace", False, status_subresource=False),
    Kind("", "v1", "secrets", "Secret", True, status_subresource=False),
    Kind("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, False),
    Kind(
        "config.koordinator.sh",
        "v1alpha1",
        "clustercolocationprofiles",
        "ClusterColocationProfile",
        False,
        False,
    ),
    Kind(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        False,
        False,
    ),
    Kind(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        False,
        False,
    ),
)


def register(api: FakeApiServer) -> None:
    for kind in EXTRA_KINDS:
        api.register(kind)


def apply_json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 add/remove/replace, enough to check what the API server would do."""
    out = copy.deepcopy(doc)
    for op in ops:
        if op["path"] == "":
            out = copy.deepcopy(op["value"])
            continue
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = out
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        if isinstance(parent, list):
            idx = len(parent) if last == "-" else int(last)
            if op["op"] == "add":
                parent.insert(idx, copy.deepcopy(op["value"]))
            elif op["op"] == "remove":
                del parent[idx]
            else:
                parent[idx] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            del parent[last]
        else:
            assert op["op"] in ("add", "replace")
            if op["op"] == "replace":
                assert last in parent
            parent[last] = copy.deepcopy(op["value"])
    return out


def admission_review(
    pod: dict[str, Any],
    *,
    operation: str = "CREATE",
    namespace: str = "spark",
    old: dict[str, Any] | None = None,
) -> dict[str, Any]:
    req: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace,
        "operation": operation,
        "object": pod,
    }
    if old is not None:
        req["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


class Webhook:
    """A client of the served webhook."""

    def __init__(
        self,
        url: str,
        session: aiohttp.ClientSession,
        lookups: KubeLookups,
        server_ssl: ssl.SSLContext,
    ) -> None:
        self.url = url
        self.session = session
        self.lookups = lookups
        self.server_ssl = server_ssl
        """The server's TLS context (reload a certificate into it)."""

    async def call(self, path: str, pod: dict[str, Any], **kw: Any) -> dict[str, Any]:
        body = admission_review(pod, **kw)
        async with self.session.post(self.url + path, json=body) as resp:
            assert resp.status == 200
            out = await resp.json()
        assert out["apiVersion"] == "admission.k8s.io/v1"
        assert out["kind"] == "AdmissionReview"
        assert out["response"]["uid"] == body["request"]["uid"]
        return dict(out["response"])

    async def mutated(self, pod: dict[str, Any], **kw: Any) -> dict[str, Any]:
        """The pod after the mutating webhook's patch (it must be allowed)."""
        response = await self.call("/mutate-pod", pod, **kw)
        assert response["allowed"] is True, response
        if "patch" not in response:
            return pod
        assert response["patchType"] == "JSONPatch"
        return dict(apply_json_patch(pod, json.loads(base64.b64decode(response["patch"]))))


@asynccontextmanager
async def serving(
    client: KubeClient, cert_dir: Path, roll: Callable[[], int] | None = None
) -> AsyncIterator[Webhook]:
    """The webhook app on 127.0.0.1 with the certificate files of ``cert_dir``."""
    lookups = KubeLookups(client)
    informer = asyncio.create_task(lookups.informer.run(), name="profiles")
    app = make_app(lookups) if roll is None else make_app(lookups, roll=roll)
    ctx = server_ssl_context(cert_dir / SERVER_CERT_TLS, cert_dir / SERVER_KEY_TLS)
    runner, port = await start(app, host="127.0.0.1", port=0, ssl_context=ctx)
    client_ctx = ssl.create_default_context(cafile=str(cert_dir / CA_CERT))
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx))
    try:
        await lookups.informer.wait_synced(5)
        yield Webhook(f"https://127.0.0.1:{port}", session, lookups, ctx)
    finally:
        await session.close()
        await runner.cleanup()
        informer.cancel()
        await asyncio.gather(informer, return_exceptions=True)


def pod(
    labels: dict[str, str] | None = None,
    *,
    requests: dict[str, Any] | None = None,
    limits: dict[str, Any] | None = None,
    priority: int | None = None,
    annotations: dict[str, str] | None = None,
    name: str = "app",
) -> dict[str, Any]:
    """A pod of one container (``name``) as the API server hands it to a webhook."""
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    spec: dict[str, Any] = {
        "containers": [{"name": name, "image": "nginx:1.15.1", "resources": resources}]
    }
    if priority is not None:
        spec["priority"] = priority
    meta: dict[str, Any] = {"name": "test-pod", "namespace": "spark", "labels": labels or {}}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
