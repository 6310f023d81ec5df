"""The CRD schema validator against the CRDs this repository installs, and on small schemas for the
keywords those CRDs do not use."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import pytest

from apis.crdschema import (
    DEFAULT_CRD_DIR,
    CRDSet,
    Violation,
    load_crds,
    validate,
    validate_or_raise,
    validate_value,
)
from apis.slo import SchemaError, parse_node_slo
from apis.slo_strategies import NodeSLOStrategies, spec_json, strategies_of, to_json

SHARED_CRDS = Path(__file__).resolve().parents[3] / "shared/koordinator/crds"


@pytest.fixture(scope="module")
def crds() -> CRDSet:
    return load_crds()


def paths(errors: list[Violation]) -> list[str]:
    return [e.path for e in errors]


NODE_METRIC: dict[str, Any] = {
    "apiVersion": "slo.koordinator.sh/v1alpha1",
    "kind": "NodeMetric",
    "metadata": {"name": "node-1"},
    "spec": {
        "metricCollectPolicy": {
            "aggregateDurationSeconds": 300,
            "reportIntervalSeconds": 60,
            "nodeMemoryCollectPolicy": "usageWithoutPageCache",
            "nodeAggregatePolicy": {"durations": ["5m0s", "10m0s"]},
        }
    },
    "status": {
        "updateTime": "2026-11-21T20:00:00Z",
        "nodeMetric": {
            "nodeUsage": {"resources": {"cpu": "1500m", "memory": "4Gi"}},
            "systemUsage": {"resources": {"cpu": "200m", "memory": 104857600}},
            "aggregatedNodeUsages": [
                {"duration": "5m0s", "usage": {"p90": {"resources": {"cpu": "2"}}}}
            ],
        },
        "podsMetric": [
            {
                "name": "web-0",
                "namespace": "default",
                "priority": "koord-prod",
                "qos": "LS",
                "podUsage": {"resources": {"cpu": "500m", "memory": "1Gi"}},
                "extensions": {"anything": {"goes": [1, 2]}},
            }
        ],
        "hostApplicationMetric": [
            {"name": "nginx", "qos": "LS", "usage": {"resources": {"cpu": "100m"}}}
        ],
    },
}

NODE_RESOURCE_TOPOLOGY: dict[str, Any] = {
    "apiVersion": "topology.node.k8s.io/v1alpha1",
    "kind": "NodeResourceTopology",
    "metadata": {"name": "node-1"},
    "topologyPolicies": ["None"],
    "zones": [
        {
            "name": "node-0",
            "type": "Node",
            "resources": [
                {"name": "cpu", "capacity": 32, "allocatable": "31", "available": "20"},
            ],
            "costs": [{"name": "node-1", "value": 20}],
            "attributes": [{"name": "cpuset", "value": "0-15"}],
        }
    ],
}

ELASTIC_QUOTA: dict[str, Any] = {
    "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
    "kind": "ElasticQuota",
    "metadata": {"name": "team-a", "namespace": "team-a"},
    "spec": {"min": {"cpu": 10, "memory": "20Gi"}, "max": {"cpu": "20", "memory": "40Gi"}},
    "status": {"used": {"cpu": "3500m"}},
}

RESERVATION: dict[str, Any] = {
    "apiVersion": "scheduling.koordinator.sh/v1alpha1",
    "kind": "Reservation",
    "metadata": {"name": "reserve-1"},
    "spec": {
        "template": {
            "namespace": "default",
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
        },
        "owners": [{"object": {"name": "pod-0", "namespace": "default"}}],
        "ttl": "1h",
        "allocateOnce": True,
        "allocatePolicy": "Aligned",
    },
}

DEVICE: dict[str, Any] = {
    "apiVersion": "scheduling.koordinator.sh/v1alpha1",
    "kind": "Device",
    "metadata": {"name": "node-1"},
    "spec": {
        "devices": [
            {
                "type": "gpu",
                "id": "GPU-0",
                "minor": 0,
                "health": True,
                "resources": {
                    "koordinator.sh/gpu-core": "100",
                    "koordinator.sh/gpu-memory": "80Gi",
                },
                "labels": {"type": "H100"},
                "topology": {"socketID": 0, "nodeID": 0, "pcieID": "pci0000:00", "busID": "0"},
                "conditions": [
                    {
                        "type": "Healthy",
                        "status": "True",
                        "reason": "Probed",
                        "message": "ok",
                        "lastTransitionTime": "2026-11-21T20:00:00.123+08:00",
                    }
                ],
            }
        ]
    },
}


def node_slo(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeSLO",
        "metadata": {"name": "node-1"},
        "spec": spec,
    }


def test_the_repository_carries_the_thirteen_crds_that_we_install(crds: CRDSet) -> None:
    kinds = {v.kind for v in crds}
    assert len(list(DEFAULT_CRD_DIR.glob("*.yaml"))) == 13
    assert {"NodeSLO", "NodeMetric", "NodeResourceTopology", "Device", "Reservation"} <= kinds
    assert crds.version_for("NodeResourceTopology").version == "v1alpha2"
    nrt = "topology.node.k8s.io/v1alpha1"
    assert crds.version_for("NodeResourceTopology", nrt).version == "v1alpha1"


@pytest.mark.skipif(not SHARED_CRDS.exists(), reason="the upstream reference copy is not here")
def test_the_packaged_crds_are_upstreams_unchanged() -> None:
    for upstream in SHARED_CRDS.glob("*.yaml"):
        ours = DEFAULT_CRD_DIR / upstream.name
        digest = hashlib.sha256(upstream.read_bytes()).hexdigest()
        assert hashlib.sha256(ours.read_bytes()).hexdigest() == digest, upstream.name


@pytest.mark.parametrize(
    "obj",
    [NODE_METRIC, NODE_RESOURCE_TOPOLOGY, ELASTIC_QUOTA, RESERVATION, DEVICE],
    ids=lambda o: o["kind"],
)
def test_valid_koordinator_objects_pass(crds: CRDSet, obj: dict[str, Any]) -> None:
    assert crds.validate(obj) == []
    validate_or_raise(obj, crds=crds)


def test_the_nodeslo_the_model_renders_with_defaults_fits_the_crd(crds: CRDSet) -> None:
    """The contract test of apis.slo_strategies: its full default JSON is a valid NodeSLO."""
    assert validate(node_slo(to_json(NodeSLOStrategies())), crds=crds) == []
    spec = parse_node_slo(
        {
            "hostApplications": [{"name": "nginx", "qos": "LS"}],
            "resourceQOSStrategy": {
                "beClass": {"networkQOS": {"enable": True, "ingressLimit": "50M"}},
                "cgroupRoot": {
                    "blkioQOS": {
                        "enable": True,
                        "blocks": [{"name": "sda", "type": "device", "ioCfg": {"readIOPS": 9}}],
                    }
                },
            },
            "systemStrategy": {"schedFeatures": {"ID_ABSOLUTE_EXPELLER": True}},
        },
        "node",
    )
    rendered = spec_json(strategies_of(spec), spec)
    assert validate(node_slo(dict(rendered)), crds=crds) == []


@pytest.mark.parametrize(
    ("mutate", "path", "message"),
    [
        (
            lambda o: o["spec"].__setitem__("metricCollectPolicy", {"reportIntervalSeconds": "60"}),
            "spec.metricCollectPolicy.reportIntervalSeconds",
            "must be of type integer",
        ),
        (
            lambda o: o["spec"]["metricCollectPolicy"].__setitem__(
                "nodeMemoryCollectPolicy", "rss"
            ),
            "spec.metricCollectPolicy.nodeMemoryCollectPolicy",
            "must be one of 'usageWithHotPageCache'",
        ),
        (
            lambda o: o["spec"].__setitem__("reportEvery", 5),
            "spec.reportEvery",
            "unknown field",
        ),
        (
            lambda o: o["status"].__setitem__("updateTime", "yesterday"),
            "status.updateTime",
            "must be an RFC 3339 date-time",
        ),
        (
            lambda o: o["status"]["nodeMetric"]["nodeUsage"]["resources"].__setitem__("cpu", 1.5),
            "status.nodeMetric.nodeUsage.resources.cpu",
            "must be an integer or a string",
        ),
        (
            lambda o: o["status"]["podsMetric"].__setitem__(0, "web-0"),
            "status.podsMetric[0]",
            "must be of type object",
        ),
        (
            lambda o: o["metadata"].__setitem__("namespace", 7),
            "metadata.namespace",
            "must be a string",
        ),
    ],
)
def test_a_wrong_node_metric_fails_with_the_path(
    crds: CRDSet, mutate: Any, path: str, message: str
) -> None:
    obj = copy.deepcopy(NODE_METRIC)
    mutate(obj)
    errors = crds.validate(obj)
    assert paths(errors) == [path]
    assert errors[0].message.startswith(message)


def test_missing_required_fields_are_named(crds: CRDSet) -> None:
    reservation = copy.deepcopy(RESERVATION)
    del reservation["spec"]["owners"]
    assert paths(crds.validate(reservation)) == ["spec.owners"]
    device = copy.deepcopy(DEVICE)
    del device["spec"]["devices"][0]["topology"]["pcieID"]
    assert paths(crds.validate(device)) == ["spec.devices[0].topology.pcieID"]
    assert paths(crds.validate({**NODE_RESOURCE_TOPOLOGY, "zones": None})) == ["zones"]


def test_bad_nodeslo_values_are_all_reported_at_once(crds: CRDSet) -> None:
    errors_obj = node_slo(
        {
            "resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 101, "x": 1},
            "cpuBurstStrategy": {"cpuBurstPercent": -1},
            "systemStrategy": {"totalNetworkBandwidth": "10 G"},
            "hostApplications": [{"name": 3}],
        }
    )
    errors = crds.validate(errors_obj)
    assert paths(errors) == [
        "spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent",
        "spec.resourceUsedThresholdWithBE.x",
        "spec.cpuBurstStrategy.cpuBurstPercent",
        "spec.systemStrategy.totalNetworkBandwidth",
        "spec.hostApplications[0].name",
    ]
    with pytest.raises(SchemaError, match=r"^node-1: 5 schema violations: spec.resourceUsed"):
        crds.validate_or_raise(errors_obj, source="node-1")
    one = node_slo({"cpuBurstStrategy": {"cpuBurstPercent": -1}})
    with pytest.raises(SchemaError) as caught:
        validate_or_raise(one, source="node-1")
    assert (
        str(caught.value) == "node-1: spec.cpuBurstStrategy.cpuBurstPercent: must be >= 0, got -1"
    )


def test_unknown_kinds_and_versions_are_errors_on_api_version(crds: CRDSet) -> None:
    assert paths(crds.validate({"apiVersion": "slo.koordinator.sh/v1", "kind": "NodeSLO"})) == [
        "apiVersion"
    ]
    assert paths(crds.validate({"apiVersion": "v1", "kind": "Pod"})) == ["apiVersion"]
    assert crds.validate({"kind": "NodeSLO"})[0].message == "apiVersion and kind must be strings"


def test_without_strict_unknown_fields_are_pruned_not_errors(crds: CRDSet) -> None:
    obj = copy.deepcopy(NODE_METRIC)
    obj["spec"]["reportEvery"] = 5
    assert crds.validate(obj, strict=False) == []


def test_a_null_counts_as_absent_unless_nullable() -> None:
    schema = {
        "type": "object",
        "required": ["a", "b"],
        "properties": {"a": {"type": "string"}, "b": {"type": "string", "nullable": True}},
    }
    assert paths(validate_value(schema, {"a": None, "b": None})) == ["a"]
    assert validate_value({"type": "array", "items": {"type": "string"}}, [None]) == [
        Violation("[0]", "must not be null")
    ]


@pytest.mark.parametrize(
    ("schema", "value", "expected"),
    [
        ({"type": "object", "additionalProperties": False}, {"k": 1}, ["k: unknown field"]),
        ({"type": "object", "additionalProperties": True}, {"k": 1}, []),
        (
            {"type": "object", "additionalProperties": {"type": "integer"}},
            {"a.b/c": "x"},
            ["[\"a.b/c\"]: must be of type integer, got 'x'"],
        ),
        ({"type": "object", "x-kubernetes-preserve-unknown-fields": True}, {"k": {}}, []),
        ({"type": "string", "minLength": 2, "maxLength": 3}, "abcd", ["must be at most 3"]),
        ({"type": "string", "minLength": 2}, "a", ["must be at least 2 characters"]),
        ({"type": "string", "pattern": "^[a-z]+$"}, "aB", ["must match ^[a-z]+$"]),
        ({"type": "array", "minItems": 1}, [], ["must have at least 1 items"]),
        ({"type": "array", "maxItems": 1}, [1, 2], ["must have at most 1 items"]),
        ({"type": "integer", "minimum": 1, "maximum": 3}, 4, ["must be <= 3, got 4"]),
        ({"type": "number", "minimum": 0, "exclusiveMinimum": True}, 0, ["must be > 0"]),
        ({"type": "number"}, 1, []),
        ({"type": "integer"}, 1.0, ["must be of type integer, got 1.0"]),
        ({"type": "integer"}, True, ["must be of type integer, got True"]),
        ({"type": "boolean"}, "true", ["must be of type boolean"]),
        ({"type": "integer", "format": "int32"}, 2**31, ["must fit int32"]),
        ({"type": "string", "format": "int-or-string"}, 5, []),
        ({"type": "string", "format": "date-time"}, "2026-11-21", ["must be an RFC 3339"]),
        ({"type": "string", "enum": ["a", "b"]}, "c", ["must be one of 'a', 'b', got 'c'"]),
        (
            {
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "x-kubernetes-int-or-string": True,
            },
            [1],
            ["must be an integer or a string"],
        ),
        ({"anyOf": [{"minimum": 5}, {"maximum": 1}]}, 3, ["must match at least one of anyOf"]),
        ({"oneOf": [{"minimum": 0}, {"maximum": 10}]}, 5, ["must match exactly one of oneOf"]),
        ({"oneOf": [{"minimum": 0}, {"maximum": -10}]}, 5, []),
        ({"type": "object", "minProperties": 1}, {}, ["must have at least 1 properties"]),
    ],
)
def test_each_schema_keyword_is_enforced(
    schema: dict[str, Any], value: Any, expected: list[str]
) -> None:
    got = [str(e) for e in validate_value(schema, value)]
    assert len(got) == len(expected), got
    for text, prefix in zip(got, expected, strict=True):
        assert text.startswith(prefix), text


def test_a_directory_without_crds_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="no CRD files"):
        load_crds(tmp_path)
    (tmp_path / "x.yaml").write_text("kind: ConfigMap\nspec: {}\n")
    with pytest.raises(SchemaError, match=r"x.yaml: not a CustomResourceDefinition"):
        load_crds(tmp_path)
