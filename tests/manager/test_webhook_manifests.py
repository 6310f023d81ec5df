"""The manager's manifests install the webhooks without cert-manager: the webhook container's
flags, the Secret, the RBAC its certificate keeping needs (and no more), the configurations
the Service serves; and the cert-manager overlay changes only what cert-manager takes over."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from manager.webhook import _parser
from manager.webhook.server import MUTATE_PATH, VALIDATE_PATH

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "packaging" / "kubernetes" / "manager"
OVERLAY = ROOT / "packaging" / "kubernetes" / "manager-cert-manager"
DEFAULTS = _parser().parse_args([])

USED: set[tuple[str, str, str, str]] = {
    # manager/webhook/server.py: the profiles' informer, a GET of the pod's namespace and of
    # each PriorityClass a profile names
    ("config.koordinator.sh", "clustercolocationprofiles", "list", ""),
    ("config.koordinator.sh", "clustercolocationprofiles", "watch", ""),
    ("", "namespaces", "get", ""),
    ("scheduling.k8s.io", "priorityclasses", "get", ""),
    # manager/webhook/certs.py: the Secret (create when missing, then by name: get, update,
    # and the informer's list and watch with fieldSelector metadata.name)
    ("", "secrets", "create", ""),
    ("", "secrets", "get", DEFAULTS.webhook_secret_name),
    ("", "secrets", "update", DEFAULTS.webhook_secret_name),
    ("", "secrets", "list", DEFAULTS.webhook_secret_name),
    ("", "secrets", "watch", DEFAULTS.webhook_secret_name),
    # ensure_ca_bundle: GET and a JSON patch of each configuration
    (
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        "get",
        DEFAULTS.mutating_webhook_configuration,
    ),
    (
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        "patch",
        DEFAULTS.mutating_webhook_configuration,
    ),
    (
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        "get",
        DEFAULTS.validating_webhook_configuration,
    ),
    (
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        "patch",
        DEFAULTS.validating_webhook_configuration,
    ),
}
"""Every (API group, resource, verb, object name or "" for any) the webhook's code uses."""


def base_docs() -> list[dict[str, Any]]:
    listed = yaml.safe_load((BASE / "kustomization.yaml").read_text(encoding="utf-8"))
    return [
        doc
        for name in listed["resources"]
        for doc in yaml.safe_load_all((BASE / name).read_text(encoding="utf-8"))
        if doc is not None
    ]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, (kind, name)
    return found[0]


def webhook_container(deployment: dict[str, Any]) -> dict[str, Any]:
    spec = deployment["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == "webhook")


def test_the_kustomization_lists_every_file_and_needs_no_cert_manager() -> None:
    listed = yaml.safe_load((BASE / "kustomization.yaml").read_text(encoding="utf-8"))
    assert set(listed["resources"]) == {
        p.name for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml"
    }
    assert not [d for d in base_docs() if d["apiVersion"].startswith("cert-manager.io")]
    for doc in base_docs():
        assert not any("cert-manager" in k for k in (doc["metadata"].get("annotations") or {}))


def test_the_webhook_container_keeps_its_certificates_in_the_shared_secret() -> None:
    docs = base_docs()
    deployment = one(docs, "Deployment", "koord-manager")
    assert deployment["spec"]["replicas"] == 2
    container = webhook_container(deployment)
    assert container["args"][0] == "webhook"
    args = _parser().parse_args(container["args"][1:])
    assert args.webhook_cert_writer == "secret"
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == args.webhook_cert_dir)
    volume = next(
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    )
    assert volume == {"name": mount["name"], "emptyDir": {}}
    secret = one(docs, "Secret")
    assert secret["metadata"]["name"] == args.webhook_secret_name
    assert secret["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert "data" not in secret  # re-applying never overwrites what the webhook wrote
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == args.webhook_port
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"


def test_the_configurations_call_the_paths_the_server_serves_through_the_service() -> None:
    docs = base_docs()
    service = one(docs, "Service", DEFAULTS.webhook_service_name)
    deployment = one(docs, "Deployment", "koord-manager")
    port = webhook_container(deployment)["ports"][0]["containerPort"]
    assert service["spec"]["ports"][0]["targetPort"] == port
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    paths = {}
    for kind, name in (
        ("MutatingWebhookConfiguration", DEFAULTS.mutating_webhook_configuration),
        ("ValidatingWebhookConfiguration", DEFAULTS.validating_webhook_configuration),
    ):
        for hook in one(docs, kind, name)["webhooks"]:
            assert hook["failurePolicy"] == "Ignore"  # upstream's chart: failurePolicy.pods
            assert hook["admissionReviewVersions"] == ["v1"]
            assert "caBundle" not in hook["clientConfig"]  # the webhook writes it
            target = hook["clientConfig"]["service"]
            assert (target["name"], target["namespace"]) == (
                DEFAULTS.webhook_service_name,
                service["metadata"]["namespace"],
            )
            paths[kind] = target["path"]
    assert paths == {
        "MutatingWebhookConfiguration": MUTATE_PATH,
        "ValidatingWebhookConfiguration": VALIDATE_PATH,
    }


def _granted(docs: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    out = set()
    for doc in docs:
        if doc["kind"] not in ("Role", "ClusterRole"):
            continue
        for rule in doc["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [""]:
                            out.add((group, resource, verb, name))
    return out


def test_rbac_grants_what_the_webhook_uses_limited_to_its_objects_by_name() -> None:
    granted = _granted(base_docs())
    assert not USED - granted, USED - granted
    # nothing wider on the Secret or on the configurations than the names above
    for _group, resource, verb, name in granted:
        if resource == "secrets" and verb != "create":
            assert name == DEFAULTS.webhook_secret_name, verb
        if resource.endswith("webhookconfigurations"):
            assert name, verb
            assert verb in ("get", "patch")
    roles = [
        d
        for d in base_docs()
        if d["kind"] == "Role" and any("secrets" in r["resources"] for r in d["rules"])
    ]
    assert [r["metadata"]["namespace"] for r in roles] == ["koordinator-system"]


def _kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not found: the kustomize build of the manifests is not checked")
    out = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d is not None]


def test_kustomize_builds_the_base_as_the_files_say() -> None:
    built = _kustomize(BASE)
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, built)) == sorted(map(key, base_docs()))


def test_the_cert_manager_overlay_swaps_only_where_the_certificate_comes_from() -> None:
    built = _kustomize(OVERLAY)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in built}
    assert ("Secret", DEFAULTS.webhook_secret_name) not in kinds  # cert-manager makes it
    assert ("Role", "koord-manager-webhook-certs") not in kinds
    cert = one(built, "Certificate")
    deployment = one(built, "Deployment", "koord-manager")
    container = webhook_container(deployment)
    args = _parser().parse_args(container["args"][1:])
    assert args.webhook_cert_writer == "none"
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == args.webhook_cert_dir)
    volume = next(
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    )
    assert volume["secret"]["secretName"] == cert["spec"]["secretName"]
    assert "emptyDir" not in volume
    assert f"{DEFAULTS.webhook_service_name}.koordinator-system.svc" in cert["spec"]["dnsNames"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = one(built, kind)["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == (
            f"koordinator-system/{cert['metadata']['name']}"
        )
