"""Kubernetes quantities as ``resource.ParseQuantity`` reads them and ``Quantity.String()`` prints
them (``k8s.io/apimachinery/pkg/api/resource/quantity.go``: the ``Quantity`` doc comment, its
``CanonicalizeBytes`` and ``NewMilliQuantity`` notes, and the cases of ``quantity_test.go``)."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from apis.quantity import (
    Format,
    Quantity,
    format_bytes,
    format_cpu,
    format_milli,
    format_quantity,
    go_identity,
    go_identity_of_int,
    go_text,
    int_value,
    milli_value,
    parse_quantity,
    resource_value,
)
from tests.freshinterp import run_json

DEC, BIN, EXP = Format.DECIMAL_SI, Format.BINARY_SI, Format.DECIMAL_EXPONENT


@pytest.mark.parametrize(
    ("text", "amount", "fmt", "canonical"),
    [
        # the Quantity doc comment's own examples
        ("1.5", Fraction(3, 2), DEC, "1500m"),
        ("1.5Gi", Fraction(3 * 2**29), BIN, "1536Mi"),
        ("0.1m", Fraction(1, 10000), DEC, "100u"),
        # decimal SI: the largest exponent that is a multiple of 3 with a whole mantissa
        ("0.5", Fraction(1, 2), DEC, "500m"),
        ("1500m", Fraction(3, 2), DEC, "1500m"),
        ("1000", Fraction(1000), DEC, "1k"),
        ("1000m", Fraction(1), DEC, "1"),
        ("100", Fraction(100), DEC, "100"),
        ("1010", Fraction(1010), DEC, "1010"),
        ("12M", Fraction(12 * 10**6), DEC, "12M"),
        ("1E", Fraction(10**18), DEC, "1E"),  # E alone is exa, not an exponent
        ("1000E", Fraction(10**21), DEC, "1e21"),  # past E: the exponent form, not "1"
        ("1n", Fraction(1, 10**9), DEC, "1n"),
        ("1u", Fraction(1, 10**6), DEC, "1u"),
        ("0.1n", Fraction(1, 10**9), DEC, "1n"),  # rounded up to the nano
        ("-0.1n", Fraction(-1, 10**9), DEC, "-1n"),  # away from zero
        ("-1.5", Fraction(-3, 2), DEC, "-1500m"),
        (".5", Fraction(1, 2), DEC, "500m"),
        ("1.", Fraction(1), DEC, "1"),
        ("+2", Fraction(2), DEC, "2"),
        ("  2  ", Fraction(2), DEC, "2"),  # UnmarshalJSON trims spaces
        ("0", Fraction(0), DEC, "0"),
        # binary SI: the largest power of 1024, DecimalSI below 1024 or when not whole
        ("100Mi", Fraction(100 * 2**20), BIN, "100Mi"),
        ("1024Mi", Fraction(2**30), BIN, "1Gi"),
        ("1000Ki", Fraction(1024000), BIN, "1000Ki"),
        ("0.5Ki", Fraction(512), BIN, "512"),
        ("1.1Ki", Fraction(5632, 5), BIN, "1126400m"),
        ("0.5Mi", Fraction(2**19), BIN, "512Ki"),
        ("0Gi", Fraction(0), BIN, "0"),
        # decimal exponent
        ("1e3", Fraction(1000), EXP, "1e3"),
        ("1E3", Fraction(1000), EXP, "1e3"),
        ("1500e-3", Fraction(3, 2), EXP, "1500e-3"),
        ("12e-10", Fraction(2, 10**9), EXP, "2e-9"),
        ("2e0", Fraction(2), EXP, "2"),
    ],
)
def test_quantities_read_and_print_as_kubernetes_does(
    text: str, amount: Fraction, fmt: Format, canonical: str
) -> None:
    q = parse_quantity(text)
    assert q.amount == amount
    assert q.format is fmt
    assert str(q) == canonical
    assert parse_quantity(canonical) == q


def test_binary_si_is_capped_at_int64_as_parse_quantity_caps_it() -> None:
    assert parse_quantity("16Ei").amount == (1 << 63) - 1


@pytest.mark.parametrize(
    "value",
    ["", ".", "+", "-", "ten", "1e", "1 Gi", "1KI", "1ki", "1Gb", "0x10", "1e99999", "٣", "1,5"],
)
def test_what_is_not_a_quantity_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(value)


@pytest.mark.parametrize("value", [True, None, float("nan"), float("inf"), [1], {"a": 1}])
def test_json_values_that_are_not_numbers_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(value)


@pytest.mark.parametrize(("value", "amount"), [(2, Fraction(2)), (0.1, Fraction(1, 10))])
def test_json_numbers_read_as_their_decimal_text(value: object, amount: Fraction) -> None:
    assert parse_quantity(value).amount == amount


@pytest.mark.parametrize(
    ("text", "milli", "whole"),
    [
        ("100m", 100, 1),
        ("0.0001", 1, 1),  # MilliValue rounds up to the milli, as Kubernetes does for CPU
        ("1.5Ki", 1536000, 1536),
        ("2", 2000, 2),
        ("250m", 250, 1),
        ("1.0001", 1001, 2),
        ("-1.5", -1500, -1),  # ceil, as ScaledValue documents
        ("0", 0, 0),
    ],
)
def test_milli_and_integer_values_round_up_as_kubernetes_does(
    text: str, milli: int, whole: int
) -> None:
    q = parse_quantity(text)
    assert (q.milli_value, q.int_value) == (milli, whole)
    assert (milli_value(text), int_value(text)) == (milli, whole)


def test_resource_values_are_in_koordinators_units() -> None:
    assert resource_value("cpu", "1500m") == 1500
    assert resource_value("memory", "1Gi") == 2**30
    assert resource_value("kubernetes.io/batch-cpu", "12000") == 12000


@pytest.mark.parametrize(
    ("milli", "text"), [(0, "0"), (1500, "1500m"), (2000, "2"), (100, "100m"), (10**6, "1k")]
)
def test_milli_cores_print_as_new_milli_quantity_does(milli: int, text: str) -> None:
    assert format_milli(milli) == text
    assert str(Quantity.from_milli(milli)) == text


@pytest.mark.parametrize(
    ("cores", "text"),
    [(0.0, "0"), (0.1234, "123m"), (1.0, "1"), (2.5, "2500m"), (12.0, "12"), (0.0009, "0")],
)
def test_cpu_usage_is_printed_in_whole_milli_cores(cores: float, text: str) -> None:
    assert format_cpu(cores) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (512, "512"),
        (1000, "1k"),  # NewQuantity(1000, BinarySI): below 1024 it prints as DecimalSI
        (1024, "1Ki"),
        (1025, "1025"),
        (1536 * 1024, "1536Ki"),
        (2**30, "1Gi"),
        (1.9, "1"),  # truncated to a whole byte first
    ],
)
def test_bytes_print_as_new_quantity_binary_si_does(value: float, text: str) -> None:
    assert format_bytes(value) == text


@given(st.integers(-(10**22), 10**22))
def test_milli_cores_and_bytes_print_as_the_exact_writer_prints_them(n: int) -> None:
    """format_milli and format_bytes write in integers: the same text as the Fraction path."""
    assert format_milli(n) == str(Quantity(Fraction(n, 1000), DEC))
    assert format_bytes(n) == str(Quantity(Fraction(n), BIN))
    assert format_bytes(n * 1024) == str(Quantity(Fraction(n * 1024), BIN))
    for fmt in Format:
        assert format_quantity(n, fmt) == str(Quantity(Fraction(n), fmt))


def test_the_writers_and_the_common_parses_need_no_fractions_module() -> None:
    """fractions brings decimal and its C library (0.4 MiB): a koordlet that reports milli-cores
    and bytes and reads plain quantities never imports it."""
    loaded = run_json(
        """
        import json, sys
        from apis.quantity import format_bytes, format_cpu, format_milli, int_value, milli_value
        from apis.quantity import format_quantity, Format
        texts = [format_milli(1500), format_cpu(0.25), format_bytes(3 * 2**30), format_bytes(1000),
                 format_quantity(2048, Format.BINARY_SI), format_quantity(5)]
        values = [milli_value("250m"), milli_value("2"), int_value("256Mi"), int_value("1024")]
        print(json.dumps([texts, values, "fractions" in sys.modules, "decimal" in sys.modules]))
        """
    )
    assert loaded == [
        ["1500m", "250m", "3Gi", "1k", "2Ki", "5"],
        [250, 2000, 256 * 2**20, 1024],
        False,
        False,
    ]


def test_format_quantity_rounds_to_the_nano_first() -> None:
    assert format_quantity(Fraction(1, 10**10)) == "1n"
    assert format_quantity(3 * 2**20, BIN) == "3Mi"
    assert format_quantity(1500, EXP) == "1500"
    assert format_quantity(Fraction(3, 2), EXP) == "1500e-3"


amounts = st.builds(
    lambda n, e: Fraction(n) * Fraction(10) ** e, st.integers(-(10**12), 10**12), st.integers(-9, 9)
)


@given(amounts, st.sampled_from(list(Format)))
def test_every_canonical_text_parses_back_to_the_same_value(amount: Fraction, fmt: Format) -> None:
    q = Quantity.of(amount, fmt)
    # Above int64 a BinarySI value does not read back: ParseQuantity caps a binary-suffixed text
    # (below), and one with no binary suffix reads as DecimalSI, uncapped, as in Go.
    assume(fmt is not Format.BINARY_SI or abs(q.amount) <= 2**63 - 1)
    assert parse_quantity(str(q)) == q


def test_a_binary_si_text_above_int64_reads_back_capped() -> None:
    # apimachinery quantity.go ParseQuantity: "The max is just a simple cap" (BinarySI only),
    # applied to the magnitude before the sign is restored.
    big = Quantity.of(10**19, Format.BINARY_SI)
    assert str(big) == "9765625000000000Ki"
    assert parse_quantity(str(big)).amount == 2**63 - 1
    assert parse_quantity("-" + str(big)).amount == -(2**63 - 1)
    assert parse_quantity("10000000000000000000").amount == 10**19  # DecimalSI: no cap


@given(st.integers(0, 2**62), st.sampled_from(["", "Ki", "Mi", "Gi", "k", "M", "m"]))
def test_the_fast_paths_agree_with_the_exact_parser(n: int, suffix: str) -> None:
    text = f"{n}{suffix}"
    q = parse_quantity(text)
    assert milli_value(text) == q.milli_value
    assert int_value(text) == q.int_value


@given(amounts)
def test_decimal_si_text_has_a_whole_mantissa_and_a_known_suffix(amount: Fraction) -> None:
    text = format_quantity(amount)
    # Past E (10^18) the suffixer has no name and Go prints the exponent instead ("1e21":
    # apimachinery suffix.go constructBytes falls back to 'e' and the exponent).
    number = re.sub(r"e\d+$", "", text).rstrip("numkMGTPE")
    assert number.lstrip("-").isdigit()
    assert text == "0" or not number.endswith("000")


# Go's parsed representation: what json.Marshal prints and reflect.DeepEqual compares ----------
@pytest.mark.parametrize(
    ("text", "printed"),
    [
        # ParseQuantity keeps a text already canonical and String() returns it as given ...
        ("1500", "1500"),
        ("500m", "500m"),
        ("4Gi", "4Gi"),
        ("1e3", "1e3"),
        ("+1", "+1"),
        ("0", "0"),
        # ... and computes the canonical form otherwise (quantity_test.go's TestQuantityString)
        ("1000", "1k"),
        ("2000m", "2"),
        ("4096Mi", "4Gi"),
        ("0.5", "500m"),
        ("1.5Gi", "1536Mi"),
        (1000, "1k"),
        (2.5, "2500m"),
    ],
)
def test_go_prints_a_parsed_quantity_as_given_only_when_it_kept_the_text(
    text: object, printed: str
) -> None:
    assert go_text(text) == printed


def test_deep_equal_tells_spellings_of_one_value_apart() -> None:
    # quantity.go ParseQuantity: int64Amount{value, scale}, the format and the kept text
    assert go_identity("1k") != go_identity("1000")
    assert go_identity("1000") == go_identity(" 1000 ")  # UnmarshalJSON trims the text
    assert go_identity(1000) == go_identity("1000")  # a JSON number reads as its text
    assert go_identity("4096Mi") == (*go_identity("4Gi")[:4], None)  # the same but the kept text
    # NewQuantity(n, DecimalSI) keeps no text: equal to a parse that kept none either
    assert go_identity_of_int(1000, Format.DECIMAL_SI) == go_identity("1000")
    assert go_identity_of_int(1500, Format.DECIMAL_SI) != go_identity("1500")


@given(st.integers(0, 10**12), st.sampled_from(["", "m", "k", "M", "Ki", "Mi", "Gi"]))
def test_what_go_prints_reads_back_to_the_same_value(n: int, suffix: str) -> None:
    text = f"{n}{suffix}"
    assert parse_quantity(go_text(text)) == parse_quantity(text)
    assert go_text(go_text(text)) == go_text(text)
