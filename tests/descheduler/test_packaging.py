"""packaging/kubernetes/descheduler: the manifests parse, the shipped configuration loads, and
the ClusterRole lets the process read everything its informers watch (what it writes is checked
against the same rules by the daemon test, from the requests the process really made)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from descheduler.config import LEASE_NAME, LEASE_NAMESPACE, parse_config
from descheduler.informed import OWN_KINDS, SCHEDULER_KINDS
from tests.kubefake.server import RecordedRequest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "packaging/kubernetes/descheduler"

Permission = tuple[str, str, str]
"""``(apiGroup, resource[/subresource], verb)``."""


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((PACKAGE / name).read_text()) if d]


def allowed(kind: str = "ClusterRole", name: str = "koord-descheduler") -> set[Permission]:
    (role,) = [
        d for d in documents("rbac.yaml") if d["kind"] == kind and d["metadata"]["name"] == name
    ]
    assert not any("resourceNames" in r for r in role["rules"] if kind == "ClusterRole")
    return {
        (group, res, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }


def permission(request: RecordedRequest) -> Permission:
    """The RBAC verb and resource of one API request (as the API server's RequestInfo reads
    the path)."""
    parts = [p for p in request.path.split("/") if p]
    if parts[0] == "api":  # /api/v1/...
        group, rest = "", parts[2:]
    else:  # /apis/group/version/...
        group, rest = parts[1], parts[3:]
    if rest and rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0]
    named = len(rest) > 1
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    method = request.method
    if method == "GET":
        verb = (
            "get" if named else "watch" if request.query.get("watch") in ("1", "true") else "list"
        )
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    return group, resource, verb


def not_allowed(requests: Iterable[RecordedRequest]) -> list[str]:
    """Requests the packaged roles do not allow (a Lease only in its namespace, by name)."""
    cluster = allowed()
    lease = allowed("Role", "koord-descheduler-leader-election")
    out = []
    for r in requests:
        p = permission(r)
        if p[1] == "leases":
            ok = p in lease and f"/namespaces/{LEASE_NAMESPACE}/" in r.path
            ok = ok and (p[2] == "create" or r.path.rstrip("/").endswith(f"/{LEASE_NAME}"))
        else:
            ok = p in cluster
        if not ok:
            out.append(f"{r.method} {r.path} -> {p}")
    return sorted(set(out))


def test_the_manifests_parse_and_the_kustomization_lists_them() -> None:
    (kust,) = documents("kustomization.yaml")
    assert sorted(kust["resources"]) == ["config.yaml", "deployment.yaml", "rbac.yaml"]
    kinds = [d["kind"] for name in kust["resources"] for d in documents(name)]
    assert {"Deployment", "ConfigMap", "ClusterRole", "Role"} <= set(kinds)


def test_the_shipped_configuration_loads_and_names_the_lease_the_role_allows() -> None:
    (cm,) = documents("config.yaml")
    (text,) = cm["data"].values()
    cfg = parse_config(yaml.safe_load(text), "config.yaml")
    le = cfg.leader_election
    assert (le.resource_namespace, le.resource_name) == (LEASE_NAMESPACE, LEASE_NAME)
    (dep,) = documents("deployment.yaml")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["koord-descheduler"]
    assert container["args"][0] == "run"
    mount = container["volumeMounts"][0]["mountPath"]
    assert f"--config={mount}/{next(iter(cm['data']))}" in container["args"]
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "koord-descheduler"


def test_every_kind_the_informers_watch_is_readable() -> None:
    rules = allowed()
    missing = [
        f"{k.group}/{k.plural}"
        for k in (*SCHEDULER_KINDS, *OWN_KINDS)
        if not {(k.group, k.plural, "list"), (k.group, k.plural, "watch")} <= rules
    ]
    assert missing == []


def test_the_role_grants_no_write_beyond_what_the_descheduler_makes() -> None:
    writes = {p for p in allowed() if p[2] not in ("get", "list", "watch")}
    assert writes == {
        ("scheduling.koordinator.sh", "podmigrationjobs", "create"),
        ("scheduling.koordinator.sh", "podmigrationjobs", "patch"),
        ("scheduling.koordinator.sh", "podmigrationjobs", "delete"),
        ("scheduling.koordinator.sh", "podmigrationjobs/status", "update"),
        ("scheduling.koordinator.sh", "reservations", "create"),
        ("scheduling.koordinator.sh", "reservations", "delete"),
        ("", "pods/eviction", "create"),
        ("", "pods", "delete"),
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "patch"),
    }
