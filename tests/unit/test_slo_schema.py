"""NodeSLO parsing: host applications as Koordinator defines them, raw sections kept and checked."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from apis.crdschema import DEFAULT_CRD_DIR
from apis.extension import QoSClass
from apis.slo import (
    API_VERSION,
    CgroupBaseType,
    HostCgroupPath,
    NodeSLOSpec,
    PriorityClass,
    SchemaError,
    parse_node_slo,
)
from apis.slo_inforce import DEFAULTS, NodeSLOInForce, read_node_slo_file
from apis.slo_strategies import to_json

CRD = DEFAULT_CRD_DIR / "slo.koordinator.sh_nodeslos.yaml"

SAMPLE = """
apiVersion: slo.koordinator.sh/v1alpha1
kind: NodeSLO
metadata:
  name: node-1
spec:
  hostApplications:
  - name: nginx
    qos: LS
    priority: koord-prod
    cgroupPath:
      base: CgroupRoot
      parentDir: host-latency-sensitive/
      relativePath: nginx/
  - name: backup
    qos: BE
    priority: koord-batch
  - name: agent
  - name: spark-shuffle
    qos: BE
    cgroupPath:
      base: KubepodsBesteffort
      relativePath: spark
  resourceUsedThresholdWithBE:
    enable: true
    cpuSuppressThresholdPercent: 60
  cpuBurstStrategy:
    policy: auto
"""


def sample() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(SAMPLE)
    return doc


def with_apps(*apps: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "NodeSLO", "spec": {"hostApplications": list(apps)}}


def test_host_applications_are_parsed_from_a_nodeslo_object() -> None:
    spec = parse_node_slo(sample(), "node-1")
    nginx, backup, agent, spark = spec.host_applications
    assert (nginx.name, nginx.qos, nginx.priority) == ("nginx", QoSClass.LS, PriorityClass.PROD)
    assert nginx.cgroup_path == HostCgroupPath(
        CgroupBaseType.ROOT, "host-latency-sensitive", "nginx"
    )
    assert (backup.qos, backup.priority) == (QoSClass.BE, PriorityClass.BATCH)
    assert (agent.qos, agent.priority) == (QoSClass.NONE, PriorityClass.NONE)
    assert spark.cgroup_path == HostCgroupPath(CgroupBaseType.KUBEPODS_BESTEFFORT, "", "spark")


def test_without_cgroup_path_koordinators_default_dir_follows_the_qos() -> None:
    apps = parse_node_slo(sample(), "node-1").host_applications
    by_name = {a.name: a.cgroup_path.under("") for a in apps}
    assert by_name["backup"] == "host-best-effort/backup"
    assert by_name["agent"] == "agent"
    lsr = parse_node_slo(with_apps({"name": "db", "qos": "LSR"}), "x").host_applications[0]
    assert lsr.cgroup_path.under("") == "host-latency-sensitive/db"


def test_a_cgroup_path_is_joined_below_the_directory_of_its_base() -> None:
    spark = parse_node_slo(sample(), "node-1").host_applications[3]
    assert spark.cgroup_path.under("kubepods/besteffort") == "kubepods/besteffort/spark"
    path = (
        parse_node_slo(
            with_apps({"name": "a", "cgroupPath": {"parentDir": "/x/./y/", "relativePath": "z"}}),
            "s",
        )
        .host_applications[0]
        .cgroup_path
    )
    assert path == HostCgroupPath(CgroupBaseType.ROOT, "x/y", "z")  # empty base: the root


@pytest.mark.parametrize(
    ("app", "field", "message"),
    [
        ({"name": "a", "qos": "XX"}, "spec.hostApplications[1].qos", "unknown QoS 'XX'"),
        ({"name": "a", "priority": "prod"}, "spec.hostApplications[1].priority", "unknown prio"),
        ({"name": "a", "qos": 3}, "spec.hostApplications[1].qos", "must be a string"),
        ({"qos": "LS"}, "spec.hostApplications[1].name", "is required"),
        ({"name": "a/b"}, "spec.hostApplications[1].name", "must be a single path"),
        ({"name": "agent"}, "spec.hostApplications[1].name", "duplicate name 'agent'"),
        (
            {"name": "a", "cgroupPath": {"base": "Kubepods-Besteffort", "relativePath": "a"}},
            "spec.hostApplications[1].cgroupPath.base",
            "unknown cgroup base 'Kubepods-Besteffort'",
        ),
        (
            {"name": "a", "cgroupPath": {"parentDir": "../../etc", "relativePath": "a"}},
            "spec.hostApplications[1].cgroupPath.parentDir",
            "must stay below its base",
        ),
        (
            {"name": "a", "cgroupPath": {"base": "Kubepods"}},
            "spec.hostApplications[1].cgroupPath",
            "parentDir or relativePath must name a cgroup",
        ),
        ({"name": "a", "cgroupPath": "a/b"}, "spec.hostApplications[1].cgroupPath", "must be an"),
        ({"name": "a", "qoss": "LS"}, "spec.hostApplications[1].qoss", "unknown field"),
    ],
)
def test_a_bad_host_application_is_rejected_naming_the_field_path(
    app: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(
        SchemaError, match="^" + re.escape(f"nodeslo.yaml: {field}: {message}")
    ) as err:
        parse_node_slo(with_apps({"name": "agent"}, app), "nodeslo.yaml")
    assert (err.value.source, err.value.field) == ("nodeslo.yaml", field)


def test_a_bare_spec_is_accepted_and_its_field_paths_have_no_spec_prefix() -> None:
    spec = parse_node_slo({"hostApplications": [{"name": "a", "qos": "BE"}]}, "f")
    assert [a.name for a in spec.host_applications] == ["a"]
    with pytest.raises(SchemaError, match=r"^f: hostApplications\[0\]\.qos: unknown QoS"):
        parse_node_slo({"hostApplications": [{"name": "a", "qos": "be"}]}, "f")


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"kind": "NodeMetric", "spec": {}}, "kind: must be 'NodeSLO'"),
        ({"apiVersion": "slo.koordinator.sh/v1", "spec": {}}, "apiVersion: must be"),
        ({"kind": "NodeSLO", "spec": []}, "spec: must be an object"),
        ({"kind": "NodeSLO", "spec": {"hostApplications": {}}}, "spec.hostApplications: must be a"),
        ({"kind": "NodeSLO", "spec": {"cpuBurstStrategy": 1}}, "spec.cpuBurstStrategy: must be an"),
        ({"kind": "NodeSLO", "spec": {"hostApps": []}}, "spec.hostApps: unknown field"),
        (
            {"kind": "NodeSLO", "spec": {"systemStrategy": {"minFreeKbyteFactor": 100}}},
            "spec.systemStrategy.minFreeKbyteFactor: unknown field",
        ),
    ],
)
def test_a_malformed_nodeslo_is_rejected_naming_the_field(
    obj: dict[str, Any], message: str
) -> None:
    with pytest.raises(SchemaError, match=f"^src: {message}"):
        parse_node_slo(obj, "src")


def test_without_strict_unknown_fields_are_logged_and_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    obj = sample()
    obj["spec"]["futureStrategy"] = {"on": True}
    obj["spec"]["hostApplications"][0]["futureField"] = 1
    with caplog.at_level(logging.WARNING, logger="apis.slo"):
        spec = parse_node_slo(obj, "api:node-1", strict=False)
    assert len(spec.host_applications) == 4
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "spec.futureStrategy" in logged
    assert "spec.hostApplications[0].futureField" in logged


def test_raw_sections_are_kept_read_only_and_absent_ones_are_none() -> None:
    spec = parse_node_slo(sample(), "node-1")
    threshold = spec.resource_used_threshold_with_be
    assert threshold is not None
    assert dict(threshold) == {"enable": True, "cpuSuppressThresholdPercent": 60}
    with pytest.raises(TypeError):
        threshold["enable"] = False  # type: ignore[index]
    assert spec.cpu_burst_strategy is not None
    assert spec.cpu_burst_strategy["policy"] == "auto"
    assert spec.system_strategy is None
    assert spec.resource_qos_strategy is None


def test_the_spec_written_back_as_json_parses_to_the_same_spec() -> None:
    spec = parse_node_slo(sample(), "node-1")
    again = parse_node_slo(json.loads(json.dumps(spec.to_json())), "again")
    assert again == spec


def test_every_field_the_crd_allows_is_accepted_and_others_are_not() -> None:
    crd = yaml.safe_load(CRD.read_text())
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for section, schema in props["properties"].items():
        if section == "hostApplications":
            fields = schema["items"]["properties"]
            parse_node_slo({section: [dict.fromkeys(fields) | {"name": "a"}]}, "crd", strict=True)
            continue
        parse_node_slo({section: dict.fromkeys(schema.get("properties", {}), 1)}, "crd")
        if schema.get("properties"):
            with pytest.raises(SchemaError, match="unknown field"):
                parse_node_slo({section: {"notInTheCRD": 1}}, "crd")


def test_koordinators_defaults_are_the_defaults_in_force() -> None:
    threshold = DEFAULTS.resource_used_threshold_with_be
    assert to_json(threshold) == {
        "enable": False,
        "cpuSuppressThresholdPercent": 65,
        "cpuSuppressPolicy": "cpuset",
        "memoryEvictThresholdPercent": 70,
        "cpuEvictPolicy": "evictByRealLimit",
    }
    burst = to_json(DEFAULTS.cpu_burst_strategy)
    assert (burst["policy"], burst["cfsQuotaBurstPercent"]) == ("none", 300)
    assert burst["sharePoolThresholdPercent"] == 50
    assert to_json(DEFAULTS.system_strategy) == {"totalNetworkBandwidth": "0"}
    assert NodeSLOSpec().host_applications == ()


def load_node_slo_file(path: str) -> NodeSLOInForce:
    """The strict read at start: a rejected section is an error as well."""
    in_force = read_node_slo_file(path, now=0.0)
    for rejection in in_force.rejected.values():
        raise rejection.error
    return in_force


def test_a_nodeslo_file_may_be_yaml_or_json_and_a_whole_object_or_a_spec(tmp_path: Path) -> None:
    as_yaml = tmp_path / "nodeslo.yaml"
    as_yaml.write_text(SAMPLE)
    as_json = tmp_path / "spec.json"
    as_json.write_text(json.dumps(sample()["spec"]))
    from_yaml, from_json = load_node_slo_file(str(as_yaml)), load_node_slo_file(str(as_json))
    assert from_yaml.strategies == from_json.strategies
    assert from_yaml.host_applications == from_json.host_applications != ()
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    assert load_node_slo_file(str(empty)).strategies == DEFAULTS


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.yaml", "spec:\n  hostApplications: [\n", r"invalid YAML: line \d+, column \d+"),
        ("dup.yaml", "spec: {}\nspec: {}\n", "duplicate key 'spec'"),
        ("dup.json", '{"hostApplications": [], "hostApplications": []}', "duplicate key"),
        ("list.yaml", "- name: a\n", "must be an object, got a list"),
        ("qos.yaml", "hostApplications:\n- name: a\n  qos: XX\n", r"hostApplications\[0\]\.qos"),
    ],
)
def test_a_bad_nodeslo_file_is_an_error_naming_the_file(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(SchemaError, match=f"^{path}: .*{message}"):
        load_node_slo_file(str(path))


def test_a_missing_nodeslo_file_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SchemaError, match=f"^{missing}: cannot read"):
        load_node_slo_file(str(missing))
