"""The Prometheus Operator manifests (``packaging/kubernetes/koordlet/monitoring``) reach the
koordlet DaemonSet's pods: labels, namespaces, port names and the path all line up.

Field names follow the operator's ``monitoring.coreos.com/v1`` API (ServiceMonitor
``spec.endpoints[].port`` names a Service port; PodMonitor ``spec.podMetricsEndpoints[].port``
names a container port).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from koordlet.config import load_config

ROOT = Path(__file__).resolve().parents[2]
KOORDLET = ROOT / "packaging" / "kubernetes" / "koordlet"
MONITORING = KOORDLET / "monitoring"


def _doc(path: Path) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    assert len(docs) == 1, path
    doc: dict[str, Any] = docs[0]
    return doc


def _daemonset() -> dict[str, Any]:
    return _doc(KOORDLET / "daemonset.yaml")


def _container_ports() -> dict[str, int]:
    (container,) = _daemonset()["spec"]["template"]["spec"]["containers"]
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, "only matchLabels selectors are used here"
    want: dict[str, str] = selector["matchLabels"]
    return bool(want) and all(labels.get(k) == v for k, v in want.items())


def test_kustomize_applies_the_service_and_its_monitor_and_the_pod_monitor_is_the_alternative() -> (
    None
):
    listed = _doc(MONITORING / "kustomization.yaml")["resources"]
    assert listed == ["service.yaml", "servicemonitor.yaml", "prometheusrule.yaml"]
    files = {p.name for p in MONITORING.glob("*.yaml")} - {"kustomization.yaml"}
    assert files == {
        "service.yaml",
        "servicemonitor.yaml",
        "podmonitor.yaml",
        "prometheusrule.yaml",
    }
    kinds = {name: _doc(MONITORING / name)["kind"] for name in sorted(files)}
    assert kinds == {
        "podmonitor.yaml": "PodMonitor",
        "prometheusrule.yaml": "PrometheusRule",
        "service.yaml": "Service",
        "servicemonitor.yaml": "ServiceMonitor",
    }
    for name in ("podmonitor.yaml", "servicemonitor.yaml", "prometheusrule.yaml"):
        assert _doc(MONITORING / name)["apiVersion"] == "monitoring.coreos.com/v1"
    rule = _doc(MONITORING / "prometheusrule.yaml")
    assert rule["metadata"]["namespace"] == _daemonset()["metadata"]["namespace"]


def test_the_service_monitor_reaches_the_daemonset_pods_through_the_service() -> None:
    ds = _daemonset()
    namespace = ds["metadata"]["namespace"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    service = _doc(MONITORING / "service.yaml")
    monitor = _doc(MONITORING / "servicemonitor.yaml")

    assert service["metadata"]["namespace"] == namespace
    assert all(pod_labels.get(k) == v for k, v in service["spec"]["selector"].items())
    assert service["spec"]["clusterIP"] == "None"  # one endpoint per koordlet, no proxying

    assert _matches(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    port = ports[endpoint["port"]]
    assert port["targetPort"] in _container_ports()
    assert port["port"] == _container_ports()[port["targetPort"]]
    assert endpoint["path"] == "/metrics"


def test_the_pod_monitor_reaches_the_daemonset_pods() -> None:
    ds = _daemonset()
    monitor = _doc(MONITORING / "podmonitor.yaml")
    assert _matches(monitor["spec"]["selector"], ds["spec"]["template"]["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [ds["metadata"]["namespace"]]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in _container_ports()
    assert endpoint["path"] == "/metrics"


def test_the_monitored_port_is_the_one_the_koordlet_listens_on() -> None:
    (container,) = _daemonset()["spec"]["template"]["spec"]["containers"]
    cfg = load_config(container["args"])
    assert cfg.server.port == _container_ports()["http"]
    assert cfg.server.host == ""  # every interface: Prometheus scrapes the node's address
