"""The shipped manifests carry a plugin configuration the scheduler accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scheduler_plugins.config import parse_config
from scheduler_plugins.plugins.loadaware import LoadAwareScheduling

MANIFESTS = Path(__file__).resolve().parents[2] / "packaging" / "kubernetes" / "scheduler"


def test_the_packaged_plugin_config_parses_and_spells_out_koordinators_defaults():
    docs = list(yaml.safe_load_all((MANIFESTS / "config.yaml").read_text()))
    text = next(d for d in docs if d["metadata"]["name"] == "koord-scheduler-config")["data"]
    cfg = parse_config(yaml.safe_load(text["koord-scheduler-config.yaml"]), "config.yaml")
    fw = cfg.framework()
    la = next(p for p in fw.plugins if isinstance(p, LoadAwareScheduling))
    assert la.args.thresholds == {"cpu": 65, "memory": 95}
    assert la.args.factors == {"cpu": 85, "memory": 70}
    assert la.args.node_metric_expiration_seconds == 180


@pytest.mark.parametrize(
    ("key", "api_version"),
    [
        ("kube-scheduler-config.yaml", "kubescheduler.config.k8s.io/v1"),
        ("kube-scheduler-config-v1beta3.yaml", "kubescheduler.config.k8s.io/v1beta3"),
    ],
)
def test_the_kube_scheduler_config_points_every_verb_at_the_extender_service(key, api_version):
    docs = list(yaml.safe_load_all((MANIFESTS / "config.yaml").read_text()))
    text = next(d for d in docs if d["metadata"]["name"] == "kube-scheduler-extender-config")[
        "data"
    ]
    doc = yaml.safe_load(text[key])
    assert (doc["apiVersion"], doc["kind"]) == (api_version, "KubeSchedulerConfiguration")
    ext = doc["extenders"][0]
    assert ext["urlPrefix"].endswith("koord-scheduler-extender.koordinator-system.svc:10262")
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"], ext["preemptVerb"]) == (
        "filter",
        "prioritize",
        "bind",
        "preempt",
    )
    assert ext["nodeCacheCapable"] is True
    assert "managedResources" not in ext
    service = [
        d
        for d in yaml.safe_load_all((MANIFESTS / "extender.yaml").read_text())
        if d["kind"] == "Service"
    ]
    assert service[0]["spec"]["ports"][0]["port"] == 10262
