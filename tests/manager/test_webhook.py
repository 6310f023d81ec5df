"""The colocation-profile webhooks over real TLS on 127.0.0.1, with AdmissionReview requests;
profiles, namespaces and PriorityClasses come from the fake API server."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import ssl
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from kubeclient.client import KubeClient
from manager.webhook.certs import CertPaths, ensure_certificates, inject_ca_bundle
from manager.webhook.server import MUTATE_PATH, VALIDATE_PATH, KubeLookups, make_app, start
from tests.kubefake import FakeApiServer, Kind
from tests.manager.conftest import eventually

EXTRA_KINDS = (
    Kind("", "v1", "namespaces", "Namespace", False, status_subresource=False),
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
BE_PROFILE = {
    "apiVersion": "config.koordinator.sh/v1alpha1",
    "kind": "ClusterColocationProfile",
    "metadata": {"name": "colocation-profile-example"},
    "spec": {
        "namespaceSelector": {"matchLabels": {"koordinator.sh/enable-colocation": "true"}},
        "selector": {"matchLabels": {"koordinator.sh/enable-colocation": "true"}},
        "qosClass": "BE",
        "priorityClassName": "koord-batch",
        "koordinatorPriority": 1000,
        "schedulerName": "koord-scheduler",
        "labels": {"koordinator.sh/mutated": "true"},
        "annotations": {"koordinator.sh/intercepted": "true"},
        "patch": {"spec": {"terminationGracePeriodSeconds": 30}},
    },
}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertPaths:
    return ensure_certificates(
        tmp_path_factory.mktemp("certs"),
        service="koordinator-webhook-service",
        namespace="koordinator-system",
        extra_hosts=("127.0.0.1",),
    )


def seed(api: FakeApiServer) -> None:
    for kind in EXTRA_KINDS:
        api.register(kind)
    api.put("namespaces", {"metadata": {"name": "spark", "labels": BE_PROFILE_NS_LABELS}})
    api.put("namespaces", {"metadata": {"name": "default", "labels": {}}})
    for name, value in (("koord-batch", 5000), ("koord-mid", 7000), ("koord-prod", 9000)):
        api.put("priorityclasses", {"metadata": {"name": name}, "value": value})
    api.put("clustercolocationprofiles", BE_PROFILE)


BE_PROFILE_NS_LABELS = {"koordinator.sh/enable-colocation": "true"}


class Webhook:
    def __init__(self, url: str, session: aiohttp.ClientSession, lookups: KubeLookups) -> None:
        self.url = url
        self.session = session
        self.lookups = lookups

    async def call(
        self,
        path: str,
        pod: dict[str, Any],
        *,
        operation: str = "CREATE",
        namespace: str = "spark",
        old: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        uid = str(uuid.uuid4())
        req: dict[str, Any] = {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": operation,
            "object": pod,
        }
        if old is not None:
            req["oldObject"] = old
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}
        async with self.session.post(self.url + path, json=body) as resp:
            assert resp.status == 200
            out = await resp.json()
        assert out["apiVersion"] == "admission.k8s.io/v1"
        assert out["kind"] == "AdmissionReview"
        assert out["response"]["uid"] == uid
        return dict(out["response"])

    async def mutated(self, pod: dict[str, Any], **kw: Any) -> dict[str, Any]:
        response = await self.call("/mutate-pod", pod, **kw)
        assert response["allowed"] is True
        if "patch" not in response:
            return pod
        assert response["patchType"] == "JSONPatch"
        return dict(apply_json_patch(pod, json.loads(base64.b64decode(response["patch"]))))


@pytest.fixture
async def webhook(
    kube_api: FakeApiServer, kube_client: KubeClient, certs: CertPaths
) -> AsyncIterator[Webhook]:
    seed(kube_api)
    lookups = KubeLookups(kube_client)
    informer = asyncio.create_task(lookups.informer.run(), name="profiles")
    runner, port = await start(
        make_app(lookups), host="127.0.0.1", port=0, cert=certs.cert, key=certs.key
    )
    ctx = ssl.create_default_context(cafile=str(certs.ca_cert))
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx))
    try:
        await lookups.informer.wait_synced(5)
        yield Webhook(f"https://127.0.0.1:{port}", session, lookups)
    finally:
        await session.close()
        await runner.cleanup()
        informer.cancel()
        await asyncio.gather(informer, return_exceptions=True)


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


def pod(
    labels: dict[str, str] | None = None,
    *,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    spec: dict[str, Any] = {
        "containers": [{"name": "app", "image": "nginx:1.15.1", "resources": resources}]
    }
    if priority is not None:
        spec["priority"] = priority
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "test-pod", "namespace": "spark", "labels": labels or {}},
        "spec": spec,
    }


COLOCATE = {"koordinator.sh/enable-colocation": "true"}


async def test_a_matching_be_profile_labels_prioritises_and_moves_resources_to_batch(
    webhook: Webhook,
) -> None:
    original = pod(
        COLOCATE,
        requests={"cpu": "1", "memory": "3456Mi"},
        limits={"cpu": "1500m", "memory": "3456Mi"},
    )
    out = await webhook.mutated(original)
    meta, spec = out["metadata"], out["spec"]
    assert meta["labels"] == {
        "koordinator.sh/enable-colocation": "true",
        "koordinator.sh/mutated": "true",
        "koordinator.sh/qosClass": "BE",
        "koordinator.sh/priority": "1000",
    }
    assert meta["annotations"] == {"koordinator.sh/intercepted": "true"}
    assert spec["priorityClassName"] == "koord-batch"
    assert spec["priority"] == 5000  # the PriorityClass's value on the API server
    assert spec["schedulerName"] == "koord-scheduler"
    assert spec["terminationGracePeriodSeconds"] == 30
    assert spec["containers"][0]["resources"] == {
        "requests": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "3623878656"},
        "limits": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "3623878656"},
    }
    assert spec["containers"][0]["image"] == "nginx:1.15.1"


async def test_a_request_without_a_limit_gets_the_same_batch_limit(webhook: Webhook) -> None:
    out = await webhook.mutated(pod(COLOCATE, requests={"cpu": "250m"}))
    assert out["spec"]["containers"][0]["resources"] == {
        "requests": {"kubernetes.io/batch-cpu": "250"},
        "limits": {"kubernetes.io/batch-cpu": "250"},
    }


async def test_profiles_apply_in_name_order_and_mid_priority_moves_to_mid_resources(
    kube_api: FakeApiServer, webhook: Webhook
) -> None:
    for name, tier in (("b-mid", "second"), ("a-mid", "first")):
        kube_api.put(
            "clustercolocationprofiles",
            {
                "metadata": {"name": name},
                "spec": {
                    "selector": {"matchLabels": {"app": "mid"}},
                    "qosClass": "LS",
                    "priorityClassName": "koord-mid",
                    "labels": {"tier": tier},
                },
            },
        )
    await eventually(lambda: len(webhook.lookups.profiles()) == 3)
    out = await webhook.mutated(
        pod({"app": "mid"}, requests={"cpu": "2", "memory": "1Gi"}), namespace="default"
    )
    assert out["metadata"]["labels"]["tier"] == "second"  # b-mid applied after a-mid
    assert out["spec"]["priority"] == 7000
    assert out["spec"]["containers"][0]["resources"]["requests"] == {
        "kubernetes.io/mid-cpu": "2000",
        "kubernetes.io/mid-memory": "1073741824",
    }


async def test_a_pod_no_profile_matches_is_allowed_without_a_patch(webhook: Webhook) -> None:
    response = await webhook.call(
        "/mutate-pod", pod(COLOCATE, requests={"cpu": "1"}), namespace="default"
    )
    assert response["allowed"] is True
    assert "patch" not in response


async def test_a_profile_whose_priority_class_is_missing_denies_the_pod_naming_it(
    kube_api: FakeApiServer, webhook: Webhook
) -> None:
    kube_api.remove("priorityclasses", "koord-batch")
    response = await webhook.call("/mutate-pod", pod(COLOCATE, requests={"cpu": "1"}))
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    assert "colocation-profile-example" in response["status"]["message"]
    assert "koord-batch" in response["status"]["message"]


async def test_updates_are_not_mutated(webhook: Webhook) -> None:
    p = pod(COLOCATE, requests={"cpu": "1"})
    response = await webhook.call("/mutate-pod", p, operation="UPDATE", old=p)
    assert response == {"uid": response["uid"], "allowed": True}


@pytest.mark.parametrize(
    ("labels", "priority", "requests", "allowed", "reason"),
    [
        ({"koordinator.sh/qosClass": "BE"}, 9500, {"cpu": "1"}, False, "priorityClass=koord-prod"),
        ({"koordinator.sh/qosClass": "BE"}, None, {"cpu": "1"}, False, "priorityClass=none"),
        ({"koordinator.sh/qosClass": "BE"}, 5500, {"kubernetes.io/batch-cpu": "1000"}, True, ""),
        (
            {"koordinator.sh/qosClass": "LSR"},
            5500,
            {"cpu": "2"},
            False,
            "priorityClass=koord-batch",
        ),
        ({"koordinator.sh/qosClass": "LSR"}, 9500, {"cpu": "1500m"}, False, "must be integer"),
        (
            {"koordinator.sh/qosClass": "LSE"},
            9500,
            {"memory": "1Gi"},
            False,
            "declare the requested",
        ),
        ({"koordinator.sh/qosClass": "LSE"}, 9500, {"cpu": "2"}, True, ""),
        (
            {"koordinator.sh/qosClass": "LS"},
            9500,
            {"kubernetes.io/batch-cpu": "1"},
            False,
            "QoS BE",
        ),
        ({}, None, {"cpu": "500m"}, True, ""),
    ],
)
async def test_the_validating_webhook_enforces_upstreams_qos_and_priority_rules(
    webhook: Webhook,
    labels: dict[str, str],
    priority: int | None,
    requests: dict[str, str],
    allowed: bool,
    reason: str,
) -> None:
    response = await webhook.call(
        "/validate-pod", pod(labels, requests=requests, priority=priority)
    )
    assert response["allowed"] is allowed
    if not allowed:
        assert response["status"]["code"] == 403
        assert reason in response["status"]["message"]


async def test_an_update_may_not_change_the_qos_class(webhook: Webhook) -> None:
    old = pod({"koordinator.sh/qosClass": "LS"}, requests={"cpu": "1"}, priority=9500)
    new = pod({"koordinator.sh/qosClass": "LSR"}, requests={"cpu": "1"}, priority=9500)
    response = await webhook.call("/validate-pod", new, operation="UPDATE", old=old)
    assert response["allowed"] is False
    assert "koordinator.sh/qosClass: field is immutable" in response["status"]["message"]


async def test_an_update_may_not_change_the_priority_class_label(webhook: Webhook) -> None:
    """Upstream compares ``GetPodPriorityClassRaw``: the priority-class label counts, not only
    the band of ``spec.priority`` (which stays the same here)."""
    label = "koordinator.sh/priority-class"
    old = pod({label: "koord-prod"}, requests={"cpu": "1"}, priority=9500)
    new = pod({label: "koord-mid"}, requests={"cpu": "1"}, priority=9500)
    response = await webhook.call("/validate-pod", new, operation="UPDATE", old=old)
    assert response["allowed"] is False
    assert "spec.priority: field is immutable" in response["status"]["message"]


async def test_a_be_pod_labelled_batch_is_allowed_whatever_its_band(webhook: Webhook) -> None:
    """The label wins over the band: BE with ``koord-batch`` is a valid combination."""
    labels = {"koordinator.sh/qosClass": "BE", "koordinator.sh/priority-class": "koord-batch"}
    response = await webhook.call("/validate-pod", pod(labels, requests={}, priority=9500))
    assert response["allowed"] is True


async def test_a_request_that_is_not_an_admission_review_is_a_400(webhook: Webhook) -> None:
    async with webhook.session.post(webhook.url + "/mutate-pod", json={"hello": 1}) as resp:
        assert resp.status == 400


async def test_an_untrusted_client_cannot_complete_the_handshake(
    webhook: Webhook, tmp_path: Path
) -> None:
    other = ensure_certificates(tmp_path, service="other", namespace="x")
    ctx = ssl.create_default_context(cafile=str(other.ca_cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.get(webhook.url + "/healthz")


def test_certificates_are_reused_while_valid_and_name_the_service(tmp_path: Path) -> None:
    first = ensure_certificates(tmp_path, service="svc", namespace="ns")
    cert = first.cert.read_bytes()
    second = ensure_certificates(tmp_path, service="svc", namespace="ns")
    assert second.cert.read_bytes() == cert
    assert (first.key.stat().st_mode & 0o777) == 0o600
    third = ensure_certificates(tmp_path, service="svc", namespace="ns", renew_before_days=400)
    assert third.cert.read_bytes() != cert  # expiring within the window: made afresh
    out = subprocess.run(
        ["openssl", "x509", "-in", str(third.cert), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = {part.strip().removeprefix("DNS:") for part in out.splitlines()[1].split(",")}
    assert names == {"svc", "svc.ns", "svc.ns.svc", "svc.ns.svc.cluster.local"}


async def test_the_ca_is_injected_into_both_webhook_configurations(
    kube_api: FakeApiServer, kube_client: KubeClient, certs: CertPaths
) -> None:
    for kind in EXTRA_KINDS:
        kube_api.register(kind)
    for plural, name in (
        ("mutatingwebhookconfigurations", "m"),
        ("validatingwebhookconfigurations", "v"),
    ):
        kube_api.put(
            plural,
            {
                "metadata": {"name": name},
                "webhooks": [{"name": "a.koordinator.sh", "clientConfig": {}}],
            },
        )
    ca = certs.ca_cert.read_bytes()
    assert await inject_ca_bundle(kube_client, ca, mutating="m", validating="v") == 2
    assert await inject_ca_bundle(kube_client, ca, mutating="m", validating="v") == 0
    hook = kube_api.get("validatingwebhookconfigurations", "v")
    assert hook is not None
    assert base64.b64decode(hook["webhooks"][0]["clientConfig"]["caBundle"]) == ca


MANIFESTS = Path(__file__).resolve().parents[2] / "packaging" / "kubernetes" / "manager"


def manifest_docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text(encoding="utf-8")) if d]


def test_the_webhook_configurations_call_the_paths_the_server_serves_through_the_service() -> None:
    service = manifest_docs("service.yaml")[0]
    deployment = manifest_docs("deployment.yaml")[0]
    webhook = next(
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "webhook"
    )
    assert service["spec"]["ports"][0]["targetPort"] == webhook["ports"][0]["containerPort"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    paths = {}
    for cfg in manifest_docs("webhooks.yaml"):
        for hook in cfg["webhooks"]:
            assert hook["failurePolicy"] in ("Ignore", "Fail")
            assert hook["admissionReviewVersions"] == ["v1"]
            assert hook["clientConfig"]["service"]["name"] == service["metadata"]["name"]
            paths[cfg["kind"]] = hook["clientConfig"]["service"]["path"]
    assert paths == {
        "MutatingWebhookConfiguration": MUTATE_PATH,
        "ValidatingWebhookConfiguration": VALIDATE_PATH,
    }
    cert = next(d for d in manifest_docs("webhook-certmanager.yaml") if d["kind"] == "Certificate")
    mount = deployment["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"]
    assert cert["spec"]["secretName"] == mount
