"""The typed NodeMetric: what the koordlet writes validates against the CRD and parses back
equal; upstream's sample parses; bad input is refused naming the field; the manager and the
scheduler read the same values from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from apis.crdschema import CRDSet, load_crds
from apis.nodemetric import (
    NodeMetric,
    node_metric_json,
    node_metric_status_json,
    parse_node_metric,
    parse_node_metric_status,
)
from apis.slo import SchemaError
from koordlet.metriccache.store import MetricCache
from koordlet.reporter.nodemetric import build_metric_status
from koordlet.statesinformer.kube import CollectPolicy
from manager.noderesource.inputs import parse_node_metric as manager_view
from scheduler_plugins.nodeviews import parse_node_metric as scheduler_view
from tests.kube.test_nodemetric import NOW, PODS, _fill, _host_apps

SAMPLE = Path(__file__).resolve().parents[1] / "golden" / "koordinator" / "nodemetric-sample.yaml"


@pytest.fixture(scope="module")
def crds() -> CRDSet:
    return load_crds()


def _written() -> NodeMetric:
    cache = MetricCache(clock=lambda: NOW)
    _fill(cache)
    status = build_metric_status(cache, CollectPolicy(), PODS, _host_apps().host_applications, NOW)
    return NodeMetric(name="node-1", status=status)


def test_what_the_koordlet_writes_validates_against_the_crd(crds: CRDSet) -> None:
    obj = node_metric_json(_written())
    assert crds.validate(obj) == []
    assert obj["status"]["podsMetric"][0]["podUsage"] == {
        "resources": {"cpu": "250m", "memory": "100Mi"}
    }


def test_what_the_koordlet_writes_parses_back_equal() -> None:
    metric = _written()
    assert parse_node_metric(node_metric_json(metric), "node-1") == metric
    status_json = node_metric_status_json(metric.status)
    assert parse_node_metric_status(status_json, "node-1") == metric.status


def test_the_upstream_sample_parses() -> None:
    metric = parse_node_metric(yaml.safe_load(SAMPLE.read_text()), str(SAMPLE))
    assert metric.name == "nodemetric-sample"
    assert metric.collect_policy is None
    assert metric.status.node_metric is None


def test_a_full_object_with_spec_devices_and_extensions_round_trips(crds: CRDSet) -> None:
    obj: dict[str, Any] = {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeMetric",
        "metadata": {"name": "n1"},
        "spec": {
            "metricCollectPolicy": {
                "aggregateDurationSeconds": 300,
                "reportIntervalSeconds": 60,
                "nodeAggregatePolicy": {"durations": ["5m0s", "10m0s"]},
                "nodeMemoryCollectPolicy": "usageWithPageCache",
            }
        },
        "status": {
            "updateTime": "2025-06-01T12:00:00Z",
            "nodeMetric": {
                "nodeUsage": {
                    "resources": {"cpu": "1500m", "memory": "1536Mi"},
                    "devices": [{"type": "gpu", "health": True, "minor": 0}],
                },
                "aggregatedNodeUsages": [
                    {"duration": "5m0s", "usage": {"p50": {"resources": {"cpu": "1"}}}}
                ],
                "systemUsage": {},
                "aggregatedSystemUsages": [],
                "numaUsages": [{"numaNodeID": 0, "nodeUsage": {"resources": {"memory": "1Gi"}}}],
            },
            "podsMetric": [
                {
                    "namespace": "ns",
                    "name": "p",
                    "podUsage": {"resources": {"cpu": "2", "memory": "1k"}},
                    "priority": "koord-prod",
                    "qos": "LS",
                    "extensions": {"data": {"x": 1}},
                }
            ],
            "hostApplicationMetric": [],
            "prodReclaimableMetric": {"resource": {"resources": {"cpu": "500m"}}},
            "prodPeakMetric": {"resource": {"resources": {"memory": "2Gi"}}},
        },
    }
    assert crds.validate(obj) == []
    metric = parse_node_metric(obj, "n1")
    assert metric.status.node_metric is not None
    assert metric.status.node_metric.node_usage.resources == {"cpu": 1500, "memory": 1536 << 20}
    assert node_metric_json(metric) == obj
    assert parse_node_metric(node_metric_json(metric), "n1") == metric


@pytest.mark.parametrize(
    ("status", "field"),
    [
        ({"updateTime": "yesterday"}, "status.updateTime"),
        ({"podsMetric": {}}, "status.podsMetric"),
        (
            {"podsMetric": [{"name": "p", "podUsage": {"resources": {"cpu": "x"}}}]},
            "status.podsMetric[0].podUsage.resources.cpu",
        ),
        ({"podsMetric": [{"name": 3}]}, "status.podsMetric[0].name"),
        (
            {"nodeMetric": {"aggregatedNodeUsages": [{"duration": "5 minutes"}]}},
            "status.nodeMetric.aggregatedNodeUsages[0].duration",
        ),
        ({"nodeMetric": {"numaUsages": [{}]}}, "status.nodeMetric.numaUsages[0].numaNodeID"),
        ({"prodReclaimableMetric": []}, "status.prodReclaimableMetric"),
    ],
)
def test_bad_input_is_refused_naming_the_field(status: dict[str, Any], field: str) -> None:
    with pytest.raises(SchemaError) as info:
        parse_node_metric({"metadata": {"name": "n1"}, "status": status}, "nodemetric n1")
    assert info.value.field == field
    assert str(info.value).startswith(f"nodemetric n1: {field}: ")


def test_the_manager_and_the_scheduler_read_the_same_usage() -> None:
    obj = node_metric_json(_written())
    manager = manager_view(obj, "m")
    scheduler = scheduler_view(obj, "s", "items[0]")
    assert manager.node_usage is not None
    assert scheduler.node_usage is not None
    assert manager.node_usage.cpu == scheduler.node_usage["cpu"] == 4000
    assert manager.node_usage.memory == scheduler.node_usage["memory"] == 8 << 30
    assert [f"{p.namespace}/{p.name}" for p in manager.pods] == list(scheduler.pods)
