"""Label selectors read from raw custom objects (an ElasticQuotaProfile's ``nodeSelector``, a
Reservation owner's ``labelSelector``): ``metav1.LabelSelector`` semantics as the API server
documents them (an empty selector matches everything; ``NotIn`` matches a label set without the
key), matched without parsing, so an unknown operator rejects nothing."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugins.selectors import parse_label_selector, raw_label_selector_matches

LABELS = {"pool": "a", "zone": "z1"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ({}, True),
        ({"matchLabels": {"pool": "a"}}, True),
        ({"matchLabels": {"pool": "b"}}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1", "z2"]}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z2"]}]}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z1"]}]}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["x"]}]}, True),
        ({"matchExpressions": [{"key": "pool", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, False),
        ({"matchExpressions": [{"key": "pool", "operator": "DoesNotExist"}]}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, True),
    ],
)
def test_a_raw_selector_matches_as_the_parsed_one_does(
    selector: dict[str, Any], matches: bool
) -> None:
    assert raw_label_selector_matches(selector, LABELS) is matches
    assert parse_label_selector(selector, "test", "selector").matches(LABELS) is matches


def test_an_unknown_operator_in_a_raw_selector_rejects_nothing() -> None:
    selector = {"matchExpressions": [{"key": "pool", "operator": "Near", "values": ["b"]}]}
    assert raw_label_selector_matches(selector, LABELS)
