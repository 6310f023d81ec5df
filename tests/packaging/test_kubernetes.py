"""packaging/kubernetes as a user installs it: rendered by the real kubectl (its kustomize) of the
project's Kubernetes binaries (``../shared/k8s``): one install with every component and one
image, set by one ``images`` entry, that needs no cert-manager; the reset DaemonSet and the
manager with cert-manager on their own; every custom resource valid against its CRD;
Koordinator's PriorityClasses.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml

from apis.priority import PRIORITY_BANDS
from envtest import assets

REPO = Path(__file__).resolve().parents[2]
KUBE = REPO / "packaging" / "kubernetes"
Obj = dict[str, Any]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("koordpy_image", REPO / "packaging/image.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


image = _script()
REF = image.default_ref()


@pytest.fixture(scope="module")
def kubectl() -> str:
    archive = assets.shared_dir() / assets.ARCHIVE_NAME
    if not archive.is_file():
        pytest.skip(f"no {archive} (the real kubectl of ../shared/k8s)")
    return assets.unpack().path("kubectl")  # checked against its .sha256 and SHA256SUMS


@pytest.fixture(scope="module")
def install(kubectl: str) -> list[Obj]:
    """``kubectl kustomize packaging/kubernetes``."""
    return render(kubectl, KUBE)


def render(kubectl: str, folder: Path) -> list[Obj]:
    out = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def overlay(tmp_path: Path, **fields: Any) -> Path:
    """A kustomization in ``tmp_path`` over the install (kustomize wants relative paths)."""
    rel = os.path.relpath(KUBE, tmp_path)
    doc = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
    doc["resources"] = [rel]
    for key, value in fields.items():
        doc[key] = [v.replace("@KUBE@", rel) if isinstance(v, str) else v for v in value]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path


def pod_specs(objs: list[Obj]) -> Iterator[tuple[str, Obj]]:
    for o in objs:
        spec = o.get("spec", {}).get("template", {}).get("spec")
        if spec is not None:
            yield f"{o['kind']}/{o['metadata']['name']}", spec


def containers(objs: list[Obj]) -> Iterator[tuple[str, Obj]]:
    for name, spec in pod_specs(objs):
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            yield f"{name}/{c['name']}", c


def ids(objs: list[Obj]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objs}


def test_the_install_renders_with_every_container_on_the_one_project_image(
    install: list[Obj],
) -> None:
    objs = install
    found = dict(containers(objs))
    assert len(found) == 5  # koordlet; manager and webhook; scheduler; descheduler
    assert {n: c["image"] for n, c in found.items()} == dict.fromkeys(found, REF)
    # a node-local image, imported with ctr, is used as it is; a node without it tries only
    # the loopback registry host of its name
    assert {c["imagePullPolicy"] for c in found.values()} == {"IfNotPresent"}
    kust = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    version = image.project()["version"]
    assert kust["images"] == [
        {"name": image.REPOSITORY, "newName": image.REPOSITORY, "newTag": version}
    ]


def test_the_install_holds_every_component_and_leaves_out_what_is_applied_on_its_own(
    install: list[Obj],
) -> None:
    objs = install
    workloads = {(k, n) for k, n in ids(objs) if k in ("DaemonSet", "Deployment")}
    assert workloads == {
        ("DaemonSet", "koordlet"),
        ("Deployment", "koord-manager"),
        ("Deployment", "koord-scheduler"),  # standalone; the extender is the alternative
        ("Deployment", "koord-descheduler"),
    }
    crds = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in KUBE.glob("crds/*.yaml")}
    assert {n for k, n in ids(objs) if k == "CustomResourceDefinition"} == crds
    assert {n for k, n in ids(objs) if k == "PriorityClass"} == {b[0] for b in PRIORITY_BANDS}
    assert [n for k, n in ids(objs) if k == "Namespace"] == ["koordinator-system"]
    namespaces = {o["metadata"].get("namespace") for o in objs} - {None}
    assert namespaces == {"koordinator-system"}
    # what each pod names is in the install: its ServiceAccount, ConfigMaps, PriorityClass
    have = ids(objs)
    for name, spec in pod_specs(objs):
        assert ("ServiceAccount", spec.get("serviceAccountName", "default")) in have, name
        for v in spec.get("volumes", []):
            if "configMap" in v:
                assert ("ConfigMap", v["configMap"]["name"]) in have, name
        assert spec["priorityClassName"].startswith("system-"), name


def test_an_images_entry_over_the_install_sets_the_image_of_every_container(
    kubectl: str, tmp_path: Path
) -> None:
    other = "127.0.0.1:5000/someone/koordinator"
    folder = overlay(
        tmp_path, images=[{"name": image.REPOSITORY, "newName": other, "newTag": "v9"}]
    )
    found = dict(containers(render(kubectl, folder)))
    assert len(found) == 5
    assert {c["image"] for c in found.values()} == {f"{other}:v9"}


def test_the_reset_daemonset_renders_on_its_own_with_the_installs_image(
    kubectl: str, install: list[Obj]
) -> None:
    objs = render(kubectl, KUBE / "koordlet-reset")
    assert ids(objs) == {("DaemonSet", "koordlet-reset")}
    assert {c["image"] for _, c in containers(objs)} == {REF}
    own = yaml.safe_load((KUBE / "koordlet-reset/kustomization.yaml").read_text())["images"]
    assert own == yaml.safe_load((KUBE / "kustomization.yaml").read_text())["images"]
    assert ("DaemonSet", "koordlet-reset") not in ids(install)


def test_every_kustomization_renders_and_names_only_the_project_image(kubectl: str) -> None:
    folders = sorted(p.parent for p in KUBE.rglob("kustomization.yaml"))
    assert len(folders) >= 7
    for folder in folders:
        objs = render(kubectl, folder)
        assert objs, folder
        assert {c["image"] for _, c in containers(objs)} <= {REF}, folder


def test_the_install_needs_no_cert_manager_and_its_alternative_renders_with_it(
    kubectl: str, install: list[Obj]
) -> None:
    """The webhook makes and shares its own certificate (docs/manager-controllers.md); the
    cert-manager way is manager-cert-manager, instead of manager/."""
    assert not [o for o in install if o["apiVersion"].startswith("cert-manager.io/")]
    for o in install:
        assert "cert-manager.io/inject-ca-from" not in o["metadata"].get("annotations", {})
    with_cm = render(kubectl, KUBE / "manager-cert-manager")
    assert {o["kind"] for o in with_cm if o["apiVersion"].startswith("cert-manager.io/")}
    assert {c["image"] for _, c in containers(with_cm)} == {REF}


# Custom resources against their CRDs -------------------------------------------------------------

BUILT_IN = {
    "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
    "ConfigMap", "Secret", "Service", "Deployment", "DaemonSet", "PriorityClass",
    "CustomResourceDefinition", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
}  # fmt: skip


def schemas(crds: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    """(group, version, kind) -> the openAPIV3Schema of each served version."""
    out = {}
    for crd in crds:
        spec = crd["spec"]
        assert sum(v["storage"] for v in spec["versions"]) == 1, crd["metadata"]["name"]
        for v in spec["versions"]:
            if v["served"]:
                out[(spec["group"], v["name"], spec["names"]["kind"])] = v["schema"][
                    "openAPIV3Schema"
                ]
    return out


def validate(obj: Obj, known: dict[tuple[str, str, str], Obj]) -> bool:
    """Validates ``obj`` against its CRD's schema (raises); False where no CRD applies."""
    group, _, version = obj["apiVersion"].rpartition("/")
    schema = known.get((group, version, obj["kind"]))
    if schema is None:
        return False
    jsonschema.Draft4Validator(schema).validate(obj)  # OpenAPI v3 schemas are draft 4's kin
    return True


def test_every_custom_resource_validates_against_its_crd(install: list[Obj]) -> None:
    objs = install
    known = schemas([o for o in objs if o["kind"] == "CustomResourceDefinition"])
    own_kinds = {k for _, _, k in known}
    assert {o["kind"] for o in objs} <= BUILT_IN | own_kinds
    # the custom resources the project ships: the install's, and the standalone koordlet's
    # local NodeSLO ("the same object as Koordinator's NodeSLO")
    shipped = [*objs, yaml.safe_load((REPO / "packaging/etc/nodeslo.yaml").read_text())]
    validated = [o["kind"] for o in shipped if validate(o, known)]
    assert "NodeSLO" in validated
    # the check has teeth: a wrong type is refused, naming the field
    bad = yaml.safe_load((REPO / "packaging/etc/nodeslo.yaml").read_text())
    bad["spec"]["hostApplications"] = "nginx"
    with pytest.raises(jsonschema.ValidationError) as err:
        validate(bad, known)
    assert list(err.value.absolute_path) == ["spec", "hostApplications"]


# PriorityClasses ---------------------------------------------------------------------------------


def test_koordinators_priority_classes_hold_the_lowest_value_of_their_bands() -> None:
    docs = [d for d in yaml.safe_load_all((KUBE / "priorityclasses.yaml").read_text()) if d]
    got = {d["metadata"]["name"]: d for d in docs}
    assert list(got) == [name for name, _, _ in PRIORITY_BANDS]
    for name, low, high in PRIORITY_BANDS:
        pc = got[name]
        assert (pc["apiVersion"], pc["kind"]) == ("scheduling.k8s.io/v1", "PriorityClass")
        assert pc["value"] == low, name  # Koordinator's own value (website priority.md)
        assert low <= pc["value"] <= high
        assert pc["globalDefault"] is False
        assert f"{low}-{high}" in pc["description"], name
