"""The typed NodeSLO strategies: Koordinator's defaults, field-by-field merge, JSON round trip and
errors that name the field."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apis.crdschema import load_crds
from apis.slo import SchemaError, parse_node_slo
from apis.slo_qos import (
    DEFAULT_RESOURCE_QOS_STRATEGY,
    Bool,
    BoolMap,
    CPUQOSConfig,
    CPUQOSPolicy,
    Enum,
    Int,
    IntOrString,
    ListOf,
    MemoryQOSConfig,
    Nested,
    NetQOSPolicy,
    ResctrlQOSConfig,
    ResourceQOSStrategy,
    Str,
    parse_resource_qos_strategy,
)
from apis.slo_strategies import (
    DEFAULT_CPU_BURST_STRATEGY,
    DEFAULT_RESOURCE_THRESHOLD_STRATEGY,
    DEFAULT_SYSTEM_STRATEGY,
    CPUBurstPolicy,
    CPUBurstStrategy,
    CPUEvictPolicy,
    CPUSuppressPolicy,
    NodeSLOStrategies,
    ResourceThresholdStrategy,
    SystemStrategy,
    parse_cpu_burst_strategy,
    parse_resource_threshold_strategy,
    parse_system_strategy,
    spec_json,
    strategies_of,
    to_json,
)


def test_threshold_defaults_are_koordinators() -> None:
    assert to_json(DEFAULT_RESOURCE_THRESHOLD_STRATEGY) == {
        "enable": False,
        "cpuSuppressThresholdPercent": 65,
        "cpuSuppressPolicy": "cpuset",
        "memoryEvictThresholdPercent": 70,
        "cpuEvictPolicy": "evictByRealLimit",
    }
    assert DEFAULT_RESOURCE_THRESHOLD_STRATEGY.memory_evict_lower_effective == 68


def test_cpu_burst_and_system_defaults_are_koordinators() -> None:
    # DefaultCPUBurstConfig (pkg/util/sloconfig): CPUBurstPercent 1000, as the CRD says
    assert to_json(DEFAULT_CPU_BURST_STRATEGY) == {
        "policy": "none",
        "cpuBurstPercent": 1000,
        "cfsQuotaBurstPercent": 300,
        "cfsQuotaBurstPeriodSeconds": -1,
        "sharePoolThresholdPercent": 50,
    }
    assert to_json(DEFAULT_SYSTEM_STRATEGY) == {"totalNetworkBandwidth": "0"}


def test_the_system_defaults_are_what_the_crd_of_the_contract_documents() -> None:
    """The NodeSLO CRD we ship (upstream's, commit a7a1b76) says of each kernel knob of
    ``systemStrategy`` "Unset by default" (minFreeKbytesFactor and watermarkScaleFactor adding
    "Recommended = 100" and "= 150"): at that version ``DefaultSystemStrategy`` sets only
    ``totalNetworkBandwidth``. Older upstream releases set 100, 150 and 0; see
    ``apis.slo_strategies.SystemStrategy``."""
    schema = load_crds().version_for("NodeSLO").schema
    props = schema["properties"]["spec"]["properties"]["systemStrategy"]["properties"]
    for field in dataclasses.fields(SystemStrategy):
        name = field.metadata["json"]
        if name == "totalNetworkBandwidth":
            continue
        assert getattr(DEFAULT_SYSTEM_STRATEGY, field.name) is None, name
        if name in ("minFreeKbytesFactor", "watermarkScaleFactor", "memcgReapBackGround"):
            assert "Unset by default" in props[name]["description"], name
    assert "Recommended = 100" in props["minFreeKbytesFactor"]["description"]
    assert "Recommended = 150" in props["watermarkScaleFactor"]["description"]


def test_resource_qos_defaults_are_koordinators_per_class() -> None:
    qos = DEFAULT_RESOURCE_QOS_STRATEGY
    assert (qos.policies.cpu_policy, qos.policies.net_qos_policy) == (
        CPUQOSPolicy.GROUP_IDENTITY,
        NetQOSPolicy.TC,
    )
    every_class = (qos.lsr_class, qos.ls_class, qos.be_class, qos.system_class, qos.cgroup_root)
    for cls in every_class:
        assert not any(
            part.enable
            for part in (
                cls.cpu_qos,
                cls.memory_qos,
                cls.resctrl_qos,
                cls.blkio_qos,
                cls.network_qos,
            )
        )
    for cls in (qos.lsr_class, qos.ls_class):
        assert cls.cpu_qos == CPUQOSConfig(group_identity=2, sched_idle=0, core_expeller=True)
        assert (cls.memory_qos.wmark_ratio, cls.memory_qos.wmark_scale_permill) == (95, 20)
        assert cls.memory_qos.wmark_min_adj == -25
        assert cls.resctrl_qos == ResctrlQOSConfig(
            cat_range_start_percent=0, cat_range_end_percent=100, mba_percent=100
        )
    assert qos.be_class.cpu_qos == CPUQOSConfig(group_identity=-1, core_expeller=False)
    assert qos.be_class.memory_qos.wmark_min_adj == 50
    assert qos.be_class.resctrl_qos.cat_range_end_percent == 30
    assert qos.system_class.memory_qos == MemoryQOSConfig(wmark_ratio=0, wmark_scale_permill=50)
    assert qos.system_class.cpu_qos.group_identity == 0


def test_an_absent_section_is_entirely_the_default() -> None:
    assert strategies_of(parse_node_slo({}, "node")) == NodeSLOStrategies(
        resource_qos_strategy=DEFAULT_RESOURCE_QOS_STRATEGY.with_disabled_parts_cleared()
    )


def test_a_section_merges_field_by_field_and_null_takes_the_default() -> None:
    merged = parse_resource_threshold_strategy(
        {"enable": True, "cpuSuppressThresholdPercent": None, "memoryEvictThresholdPercent": 80}
    )
    assert merged == dataclasses.replace(
        DEFAULT_RESOURCE_THRESHOLD_STRATEGY, enable=True, memory_evict_threshold_percent=80
    )


def test_a_nested_qos_field_keeps_its_siblings_defaults() -> None:
    merged = parse_resource_qos_strategy({"beClass": {"memoryQOS": {"wmarkRatio": 90}}})
    be_memory = merged.be_class.memory_qos
    assert (be_memory.wmark_ratio, be_memory.wmark_scale_permill, be_memory.wmark_min_adj) == (
        90,
        20,
        50,
    )
    assert merged.ls_class == DEFAULT_RESOURCE_QOS_STRATEGY.ls_class


def test_the_koordlet_view_clears_disabled_qos_of_lsr_ls_and_be() -> None:
    spec = parse_node_slo(
        {
            "resourceQOSStrategy": {
                "lsClass": {"cpuQOS": {"enable": True}},
                "beClass": {"memoryQOS": {"enable": True}, "resctrlQOS": {"enable": False}},
            }
        },
        "node",
    )
    qos = strategies_of(spec).resource_qos_strategy
    assert qos.ls_class.cpu_qos == CPUQOSConfig(enable=True, group_identity=2, core_expeller=True)
    assert qos.lsr_class.cpu_qos == CPUQOSConfig()
    assert qos.be_class.memory_qos.wmark_min_adj == 50
    assert qos.be_class.resctrl_qos == ResctrlQOSConfig()
    assert qos.ls_class.memory_qos == MemoryQOSConfig()
    raw = strategies_of(spec, clear_disabled=False).resource_qos_strategy
    assert raw.be_class.resctrl_qos.cat_range_end_percent == 30


def test_network_qos_given_takes_the_crds_limits_for_omitted_fields() -> None:
    merged = parse_resource_qos_strategy({"beClass": {"networkQOS": {"enable": True}}})
    net = merged.be_class.network_qos
    assert (net.ingress_request, net.ingress_limit, net.egress_request, net.egress_limit) == (
        0,
        100,
        0,
        100,
    )
    assert merged.ls_class.network_qos.ingress_limit == 0


def test_lists_replace_and_sched_features_merge_key_by_key() -> None:
    base = parse_resource_qos_strategy(
        {"cgroupRoot": {"blkioQOS": {"blocks": [{"name": "sda", "type": "device"}] * 2}}}
    )
    merged = parse_resource_qos_strategy(
        {"cgroupRoot": {"blkioQOS": {"blocks": [{"name": "vg0", "type": "volumegroup"}]}}},
        base=base,
    )
    assert [b.name for b in merged.cgroup_root.blkio_qos.blocks] == ["vg0"]
    system = parse_system_strategy({"schedFeatures": {"A": True}})
    system = parse_system_strategy({"schedFeatures": {"B": False}}, base=system)
    assert dict(system.sched_features or {}) == {"A": True, "B": False}


@pytest.mark.parametrize(
    ("parse", "raw", "message"),
    [
        (
            parse_resource_threshold_strategy,
            {"cpuSuppressThresholdPercent": "x"},
            "spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent: "
            "must be an integer 0..100, got 'x'",
        ),
        (
            parse_resource_threshold_strategy,
            {"memoryEvictThresholdPercent": 101},
            "spec.resourceUsedThresholdWithBE.memoryEvictThresholdPercent: "
            "must be an integer 0..100, got 101",
        ),
        (
            parse_resource_threshold_strategy,
            {"cpuSuppressPolicy": "quota"},
            "spec.resourceUsedThresholdWithBE.cpuSuppressPolicy: "
            "must be one of cpuset, cfsQuota, got 'quota'",
        ),
        (
            parse_resource_threshold_strategy,
            {"memoryEvictLowerPercent": 70},
            "spec.resourceUsedThresholdWithBE.memoryEvictLowerPercent: "
            "must be less than memoryEvictThresholdPercent (70), got 70",
        ),
        (
            parse_resource_threshold_strategy,
            {"enable": "true"},
            "spec.resourceUsedThresholdWithBE.enable: must be a boolean, got 'true'",
        ),
        (
            parse_cpu_burst_strategy,
            {"cfsQuotaBurstPercent": 99},
            "spec.cpuBurstStrategy.cfsQuotaBurstPercent: must be an integer 100.., got 99",
        ),
        (
            parse_cpu_burst_strategy,
            {"cpuBurstPercent": True},
            "spec.cpuBurstStrategy.cpuBurstPercent: must be an integer 1..10000, got True",
        ),
        (
            parse_system_strategy,
            {"watermarkScaleFactor": 401},
            "spec.systemStrategy.watermarkScaleFactor: must be an integer 1..400, got 401",
        ),
        (
            parse_system_strategy,
            {"totalNetworkBandwidth": "fast"},
            "spec.systemStrategy.totalNetworkBandwidth: must be an integer or a quantity",
        ),
        (
            parse_resource_qos_strategy,
            {"beClass": {"resctrlQOS": {"catRangeStartPercent": 40}}},
            "spec.resourceQOSStrategy.beClass.resctrlQOS.catRangeStartPercent: "
            "must be less than catRangeEndPercent (30), got 40",
        ),
        (
            parse_resource_qos_strategy,
            {"lsClass": {"cpuQOS": {"groupIdentity": 3}}},
            "spec.resourceQOSStrategy.lsClass.cpuQOS.groupIdentity: must be an integer -1..2",
        ),
        (
            parse_resource_qos_strategy,
            {"cgroupRoot": {"blkioQOS": {"blocks": [{"ioCfg": {"ioWeightPercent": 0}}]}}},
            "spec.resourceQOSStrategy.cgroupRoot.blkioQOS.blocks[0].ioCfg.ioWeightPercent: "
            "must be an integer 1..100, got 0",
        ),
        (
            parse_resource_qos_strategy,
            {"lsrClass": {"memoryQOS": {"wmarkMinAdj": -26}}},
            "spec.resourceQOSStrategy.lsrClass.memoryQOS.wmarkMinAdj: must be an integer -25..50",
        ),
        (
            parse_resource_qos_strategy,
            {"policies": {"cpuPolicy": "bvt"}},
            "spec.resourceQOSStrategy.policies.cpuPolicy: must be one of groupIdentity, coreSched",
        ),
        (
            parse_resource_qos_strategy,
            {"beClass": {"cpuQos": {}}},
            "spec.resourceQOSStrategy.beClass.cpuQos: unknown field",
        ),
        (
            parse_resource_qos_strategy,
            {"beClass": []},
            "spec.resourceQOSStrategy.beClass: must be an object, got []",
        ),
    ],
)
def test_bad_input_is_an_error_naming_the_full_field_path(
    parse: Any, raw: dict[str, Any], message: str
) -> None:
    with pytest.raises(SchemaError) as caught:
        parse(raw)
    assert str(caught.value).startswith(message)


def test_unknown_fields_are_ignored_when_not_strict(caplog: pytest.LogCaptureFixture) -> None:
    spec = parse_node_slo(
        {"cpuBurstStrategy": {"policy": "auto", "newerField": 1}}, "api", strict=False
    )
    strategies = strategies_of(spec, source="api", strict=False)
    assert strategies.cpu_burst_strategy.policy is CPUBurstPolicy.AUTO
    assert "newerField" in caplog.text


def test_errors_from_a_nodeslo_name_the_source() -> None:
    spec = parse_node_slo({"systemStrategy": {"memcgReapBackGround": 2}}, "nodeslo.yaml")
    with pytest.raises(
        SchemaError, match=r"^nodeslo.yaml: spec.systemStrategy.memcgReapBackGround"
    ):
        strategies_of(spec, source="nodeslo.yaml")


def test_spec_json_renders_all_groups_and_keeps_host_applications() -> None:
    spec = parse_node_slo({"hostApplications": [{"name": "nginx", "qos": "LS"}]}, "node")
    rendered = spec_json(NodeSLOStrategies(), spec)
    assert rendered["hostApplications"][0]["name"] == "nginx"
    again = strategies_of(parse_node_slo(json.loads(json.dumps(rendered)), "rendered"))
    assert again == strategies_of(spec)


# Round trip, property-tested -------------------------------------------------------------------
def _values(codec: Any) -> st.SearchStrategy[Any]:
    if isinstance(codec, Int):
        lo = -(2**40) if codec.lo is None else codec.lo
        hi = 2**40 if codec.hi is None else codec.hi
        return st.integers(lo, hi)
    if isinstance(codec, Bool):
        return st.booleans()
    if isinstance(codec, Str):
        return st.text(max_size=8)
    if isinstance(codec, Enum):
        return st.sampled_from(list(codec.enum))
    if isinstance(codec, IntOrString):
        return st.one_of(st.integers(0, 100), st.sampled_from(["50M", "1Gi", "0", "1.5k"]))
    if isinstance(codec, BoolMap):
        return st.dictionaries(st.sampled_from(["A", "B", "C"]), st.booleans(), max_size=3)
    if isinstance(codec, Nested):
        return _instances(codec.cls)
    if isinstance(codec, ListOf):
        return st.lists(_instances(codec.cls), max_size=2).map(tuple)
    raise AssertionError(codec)


def _instances(cls: type[Any]) -> st.SearchStrategy[Any]:
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for f in dataclasses.fields(cls):
        values = _values(f.metadata["codec"])
        optional = f.default is None
        parts[f.name] = st.one_of(st.none(), values) if optional else values
    return st.fixed_dictionaries(parts).map(lambda kw: _ordered(cls(**kw)))


def _ordered(obj: Any) -> Any:
    """``obj`` with each ``(lower, upper)`` pair strictly increasing (all such pairs are 0..100)."""
    for lower, upper in getattr(type(obj), "_ORDER", ()):
        lo, hi = getattr(obj, lower), getattr(obj, upper)
        if lo is not None and hi is not None and lo >= hi:
            lo, hi = (hi, lo) if lo > hi else ((lo - 1, hi) if lo > 0 else (lo, hi + 1))
            obj = dataclasses.replace(obj, **{lower: lo, upper: hi})
    return obj


@settings(max_examples=60, deadline=None)
@given(
    threshold=_instances(ResourceThresholdStrategy),
    qos=_instances(ResourceQOSStrategy),
    burst=_instances(CPUBurstStrategy),
    system=_instances(SystemStrategy),
)
def test_every_valid_strategy_survives_a_json_round_trip(
    threshold: ResourceThresholdStrategy,
    qos: ResourceQOSStrategy,
    burst: CPUBurstStrategy,
    system: SystemStrategy,
) -> None:
    strategies = NodeSLOStrategies(threshold, qos, burst, system)
    wire = json.loads(json.dumps(to_json(strategies)))
    assert parse_resource_threshold_strategy(wire["resourceUsedThresholdWithBE"]) == threshold
    assert parse_resource_qos_strategy(wire["resourceQOSStrategy"]) == qos
    assert parse_cpu_burst_strategy(wire["cpuBurstStrategy"]) == burst
    assert parse_system_strategy(wire["systemStrategy"]) == system
    spec = parse_node_slo(wire, "round-trip")
    assert strategies_of(spec, clear_disabled=False) == strategies


def test_enums_carry_upstreams_names() -> None:
    assert [p.value for p in CPUBurstPolicy] == [
        "none",
        "cpuBurstOnly",
        "cfsQuotaBurstOnly",
        "auto",
    ]
    assert [p.value for p in CPUSuppressPolicy] == ["cpuset", "cfsQuota"]
    assert [p.value for p in CPUEvictPolicy] == ["evictByRealLimit", "evictByAllocatable"]
