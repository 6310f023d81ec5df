"""The node-topology annotations against upstream's JSON: what Go's ``json.Marshal`` writes for
``CPUBasicInfo``, ``NodeReservation`` and ``SystemQOSResource`` (``apis/extension``), and what its
``json.Unmarshal`` accepts; the manager's reader takes what the koordlet writes."""

from __future__ import annotations

import json

import pytest

from apis.errors import FieldError
from apis.manager_keys import ANNOTATION_NODE_RESERVATION
from apis.nodetopo import (
    CPUBasicInfo,
    NodeReservation,
    SystemQOSResource,
    go_marshal,
    parse_cpu_basic_info,
    parse_node_reservation,
    parse_system_qos_resource,
    reservation_json,
)
from apis.slo import SchemaError


@pytest.mark.parametrize(
    ("info", "text"),
    [
        # every field set: declaration order cpuModel, hyperThreadEnabled, turboEnabled,
        # catL3CbmMask, vendorID (CPUBasicInfo in apis/extension/cpu_normalization.go)
        (
            CPUBasicInfo(
                "Intel(R) Xeon(R) Platinum 8269CY CPU @ 2.50GHz", True, True, "7ff", "GenuineIntel"
            ),
            '{"cpuModel":"Intel(R) Xeon(R) Platinum 8269CY CPU @ 2.50GHz",'
            '"hyperThreadEnabled":true,"turboEnabled":true,"catL3CbmMask":"7ff",'
            '"vendorID":"GenuineIntel"}',
        ),
        # omitempty: false booleans and empty strings are left out
        (
            CPUBasicInfo("AMD EPYC", False, False, "", "AuthenticAMD"),
            '{"cpuModel":"AMD EPYC","vendorID":"AuthenticAMD"}',
        ),
        (CPUBasicInfo(), "{}"),
    ],
)
def test_cpu_basic_info_is_written_as_go_marshals_it(info: CPUBasicInfo, text: str) -> None:
    assert info.to_json() == text
    assert parse_cpu_basic_info(text) == info


def test_cpu_basic_info_parses_upstreams_test_value() -> None:
    # extension.GetCPUBasicInfo's test case (cpu_normalization_test.go), indented JSON and all
    raw = (
        '{\n    "cpuModel": "CPU A 2.50GHz",\n    "hyperThreadEnabled": true,\n'
        '    "turboEnabled": false,\n    "vendorID": "unknown"\n}'
    )
    info = parse_cpu_basic_info(raw)
    assert info == CPUBasicInfo("CPU A 2.50GHz", True, False, "", "unknown")
    assert info.key == "CPU A 2.50GHz_true_false"
    with pytest.raises(ValueError, match="cpu-basic-info: not JSON"):
        parse_cpu_basic_info("invalidValue")
    with pytest.raises(ValueError, match="hyperThreadEnabled: must be a bool"):
        parse_cpu_basic_info('{"hyperThreadEnabled": "yes"}')


@pytest.mark.parametrize(
    "info",
    [
        CPUBasicInfo("Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz", True, False, "", "GenuineIntel"),
        CPUBasicInfo("AMD EPYC 7B13", False, True, "", "AuthenticAMD"),
        CPUBasicInfo("XXX", True, True),
    ],
)
def test_the_reader_the_manager_uses_accepts_what_the_koordlet_writes(info: CPUBasicInfo) -> None:
    assert parse_cpu_basic_info(info.to_json()) == info


def test_go_marshal_escapes_html_characters_as_go_does() -> None:
    assert go_marshal({"cpuModel": "A<B>&C"}) == '{"cpuModel":"A\\u003cB\\u003e\\u0026C"}'
    assert json.loads(go_marshal({"cpuModel": "A<B>&C"})) == {"cpuModel": "A<B>&C"}
    assert go_marshal({"cpuModel": "Kunpeng-920 ✓"}) == '{"cpuModel":"Kunpeng-920 ✓"}'


@pytest.mark.parametrize(
    ("raw", "cpus", "count"),
    [
        # GetReservedCPUs: reservedCPUs wins over resources.cpu and the count is then 0
        ('{"resources": {"cpu": "2"}, "reservedCPUs": "0-1"}', {0, 1}, 0),
        ('{"reservedCPUs": "0,2,4"}', {0, 2, 4}, 0),
        # a count is ceil(milli / 1000)
        ('{"resources": {"cpu": "1500m"}}', set(), 2),
        ('{"resources": {"cpu": 3}}', set(), 3),
        ('{"resources": {"memory": "1Gi"}}', set(), 0),
        ("{}", set(), 0),
        (None, set(), 0),
        # an unknown apply policy reserves no CPU; ReservedCPUsOnly does
        ('{"reservedCPUs": "0-1", "applyPolicy": "Other"}', set(), 0),
        ('{"reservedCPUs": "0-1", "applyPolicy": "ReservedCPUsOnly"}', {0, 1}, 0),
    ],
)
def test_node_reservation_cpus(raw: str | None, cpus: set[int], count: int) -> None:
    assert parse_node_reservation(raw).reserved_cpus_and_count() == (frozenset(cpus), count)


def test_node_reservation_rejects_what_unmarshal_rejects_naming_the_field() -> None:
    for raw, field, message in [
        ("[1]", "", "must be a JSON object"),
        ('{"reservedCPUs": 1}', "reservedCPUs", "must be a str"),
        ('{"reservedCPUs": "0-x"}', "reservedCPUs", "0-x"),
        ('{"resources": {"cpu": "lots"}}', "resources.cpu", "lots"),
        ('{"resources": []}', "resources", "must be an object"),
    ]:
        with pytest.raises(SchemaError, match=message) as caught:
            parse_node_reservation(raw)
        assert isinstance(caught.value, FieldError)
        assert isinstance(caught.value, ValueError)
        assert (caught.value.source, caught.value.field) == (ANNOTATION_NODE_RESERVATION, field)
    assert parse_node_reservation('{"reservedCPUs": ""}') == NodeReservation()


def test_reservation_json_is_the_nrt_value() -> None:
    assert reservation_json(frozenset({0, 1, 4})) == '{"reservedCPUs":"0-1,4"}'
    assert reservation_json(frozenset()) == "{}"


@pytest.mark.parametrize(
    ("raw", "exclusive", "written"),
    [
        ('{"cpuset": "0-3"}', {0, 1, 2, 3}, '{"cpuset":"0-3"}'),  # exclusive by default
        (
            '{"cpuset": "0-3", "cpusetExclusive": true}',
            {0, 1, 2, 3},
            '{"cpuset":"0-3","cpusetExclusive":true}',
        ),
        (
            '{"cpuset": "0-3", "cpusetExclusive": false}',
            set(),
            '{"cpuset":"0-3","cpusetExclusive":false}',
        ),
        ("{}", set(), "{}"),
        (None, set(), "{}"),
    ],
)
def test_system_qos_resource(raw: str | None, exclusive: set[int], written: str) -> None:
    res = parse_system_qos_resource(raw)
    assert res.exclusive_cpus == frozenset(exclusive)
    assert res.to_json() == written
    assert parse_system_qos_resource(res.to_json()) == res


def test_system_qos_resource_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="cpusetExclusive: must be a bool"):
        parse_system_qos_resource('{"cpuset": "0", "cpusetExclusive": "yes"}')
    with pytest.raises(ValueError, match="cpuset: must be a str"):
        parse_system_qos_resource('{"cpuset": 3}')
    with pytest.raises(SchemaError, match="system-qos-resource: cpuset: ") as caught:
        parse_system_qos_resource('{"cpuset": "3-x"}')
    assert caught.value.field == "cpuset"
    assert SystemQOSResource("0-1", None).exclusive_cpus == frozenset({0, 1})
