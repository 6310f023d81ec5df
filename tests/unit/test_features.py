"""Feature gates: Koordinator's names and defaults, Kubernetes' ``--feature-gates`` syntax."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from koordlet.errors import ConfigError
from koordlet.features import (
    DEFAULTS,
    KOORDLET_FEATURES,
    FeatureGates,
    Stage,
    describe,
    help_lines,
    parse_feature_gates,
    parse_overrides,
)

# Koordinator's koordlet gates that are beta, hence on by default (pkg/features upstream, and the
# runtime hooks' pkg/koordlet/runtimehooks/config.go).
KOORDINATOR_BETA_ON = {
    "BECPUSuppress",
    "CPUBurst",
    "RdtResctrl",
    "NodeTopologyReport",
    "GroupIdentity",
    "CPUSetAllocator",
    "BatchResource",
}


def test_the_table_has_koordinators_gates_with_their_stages_and_defaults() -> None:
    for name, spec in KOORDLET_FEATURES.items():
        expect_beta = name in KOORDINATOR_BETA_ON
        assert spec.stage is (Stage.BETA if expect_beta else Stage.ALPHA), name
        assert spec.default is expect_beta, name
    assert {"AuditEvents", "BECPUEvict", "BEMemoryEvict", "PSICollector", "CPICollector"} <= set(
        KOORDLET_FEATURES
    )
    assert dict(FeatureGates()) == dict(DEFAULTS)


def test_a_gate_string_sets_each_named_gate() -> None:
    gates = parse_feature_gates("PSICollector=true,CPUBurst=false")
    assert gates.enabled("PSICollector") is True
    assert gates.enabled("CPUBurst") is False
    assert gates.enabled("RdtResctrl") is True  # untouched default


@pytest.mark.parametrize(
    ("text", "value"),
    [(t, True) for t in ("1", "t", "T", "TRUE", "True", "true")]
    + [(f, False) for f in ("0", "f", "F", "FALSE", "False", "false")],
)
def test_booleans_are_read_as_go_reads_them(text: str, value: bool) -> None:
    assert parse_overrides(f"BECPUEvict={text}") == {"BECPUEvict": value}


def test_blanks_and_empty_items_are_ignored_and_a_later_item_wins() -> None:
    assert parse_overrides(" CPUBurst = false , ,CPUBurst=true,") == {"CPUBurst": True}
    assert parse_overrides("") == {}


def test_an_unknown_gate_is_an_error_naming_the_flag_and_the_gate() -> None:
    with pytest.raises(ConfigError, match=r"^--feature-gates: CPUBrust: unknown feature gate") as e:
        parse_feature_gates("CPUBurst=true,CPUBrust=true")
    assert e.value.field == "CPUBrust"


def test_a_bad_bool_is_an_error_naming_the_gate() -> None:
    with pytest.raises(ConfigError, match=r"^--feature-gates: CPUBurst: invalid bool value 'yes'"):
        parse_feature_gates("CPUBurst=yes")


def test_a_gate_without_a_value_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"^src: CPUBurst: missing bool value"):
        parse_overrides("CPUBurst", source="src")


def test_all_alpha_turns_on_every_alpha_gate_that_is_not_set_explicitly() -> None:
    gates = parse_feature_gates("BECPUEvict=false,AllAlpha=true")
    alpha = [n for n, s in KOORDLET_FEATURES.items() if s.stage is Stage.ALPHA]
    assert all(gates.enabled(n) for n in alpha if n != "BECPUEvict")
    assert gates.enabled("BECPUEvict") is False
    assert gates.enabled("CPUBurst") is True  # beta: untouched


def test_all_beta_false_turns_off_the_beta_gates_that_are_on_by_default() -> None:
    gates = parse_feature_gates("AllBeta=false,CPUBurst=true")
    assert gates.enabled("CPUBurst") is True
    assert not any(gates.enabled(n) for n in KOORDINATOR_BETA_ON - {"CPUBurst"})


def test_merging_applies_new_overrides_over_the_earlier_ones() -> None:
    gates = FeatureGates({"AllAlpha": True, "PSICollector": False}).merged({"PSICollector": True})
    assert gates.enabled("PSICollector") is True
    assert gates.enabled("BECPUEvict") is True
    assert dict(gates.overrides) == {"AllAlpha": True, "PSICollector": True}


def test_gates_compare_by_effective_value_and_cannot_be_changed() -> None:
    assert FeatureGates({"CPUBurst": True}) == FeatureGates()
    assert hash(FeatureGates({"CPUBurst": True})) == hash(FeatureGates())
    assert FeatureGates({"CPUBurst": False}) != FeatureGates()
    gates = FeatureGates()
    with pytest.raises(AttributeError):
        gates._values = {}
    with pytest.raises(TypeError):
        gates["CPUBurst"] = False  # type: ignore[index]


def test_asking_for_a_gate_that_does_not_exist_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        FeatureGates().enabled("NoSuchGate")


def test_describe_marks_explicit_and_not_implemented_gates() -> None:
    rows = {r["name"]: r for r in describe(parse_feature_gates("AllAlpha=true,CPUBurst=false"))}
    assert set(rows) == set(KOORDLET_FEATURES)
    assert rows["CPUBurst"] | {"summary": ""} == {
        "name": "CPUBurst",
        "enabled": False,
        "default": True,
        "stage": "BETA",
        "explicit": True,
        "implemented": KOORDLET_FEATURES["CPUBurst"].implemented,
        "summary": "",
    }
    assert rows["PSICollector"]["explicit"] is True  # by AllAlpha
    assert rows["RdtResctrl"]["explicit"] is False


def test_help_lists_every_accepted_name_with_its_stage_and_default() -> None:
    text = "\n".join(help_lines())
    for name, spec in KOORDLET_FEATURES.items():
        assert (
            f"{name}=true|false ({spec.stage.value} - default={str(spec.default).lower()}" in text
        )
    assert "AllAlpha=true|false" in text
    assert "AllBeta=true|false" in text


REPO = Path(__file__).resolve().parents[2]


def _named_in_code(gate: str) -> bool:
    pattern = re.compile(rf"[\"']{re.escape(gate)}[\"']")
    return any(
        pattern.search(path.read_text(encoding="utf-8"))
        for path in (REPO / "koordlet").rglob("*.py")
        if path.name != "features.py"
    )


@pytest.mark.parametrize("gate", sorted(KOORDLET_FEATURES))
def test_a_gate_is_marked_implemented_exactly_when_the_code_reads_it(gate: str) -> None:
    """``--help``, ``/debug/config`` and docs/configuration.md say whether a gate is acted on;
    that must be true: a gate marked implemented is read somewhere in ``koordlet/``, and a gate
    the code reads is marked implemented."""
    assert KOORDLET_FEATURES[gate].implemented == _named_in_code(gate), gate


def test_the_configuration_doc_lists_every_gate_as_the_table_has_it() -> None:
    doc = (REPO / "docs/configuration.md").read_text(encoding="utf-8")
    rows = {
        m[1]: (m[2], m[3], m[4])
        for m in re.finditer(
            r"^\| `(\w+)` \| (alpha|beta) \| (true|false) \| (yes|not yet) \|", doc, re.M
        )
    }
    want = {
        name: (
            spec.stage.lower(),
            str(spec.default).lower(),
            "yes" if spec.implemented else "not yet",
        )
        for name, spec in KOORDLET_FEATURES.items()
    }
    assert rows == want
