"""Booleans as Go's ``strconv.ParseBool`` reads them (``src/strconv/atob.go``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.gobool import GO_FALSE, GO_TRUE, format_go_bool, parse_go_bool


@pytest.mark.parametrize("text", ["1", "t", "T", "TRUE", "true", "True"])
def test_gos_true_spellings_read_true(text: str) -> None:
    assert parse_go_bool(text) is True


@pytest.mark.parametrize("text", ["0", "f", "F", "FALSE", "false", "False"])
def test_gos_false_spellings_read_false(text: str) -> None:
    assert parse_go_bool(text) is False


@pytest.mark.parametrize("text", ["", "yes", "no", "on", "tRUE", "fAlse", " true", "true\n", "2"])
def test_anything_else_is_refused_naming_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="invalid bool value"):
        parse_go_bool(text)


@given(st.text(max_size=6))
def test_a_text_reads_only_when_go_would_read_it(text: str) -> None:
    if text in GO_TRUE | GO_FALSE:
        assert parse_go_bool(text) is (text in GO_TRUE)
    else:
        with pytest.raises(ValueError):
            parse_go_bool(text)


@given(st.booleans())
def test_format_bool_reads_back(value: bool) -> None:
    assert parse_go_bool(format_go_bool(value)) is value
