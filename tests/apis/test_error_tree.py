"""Every validator's error is an ``apis.errors.FieldError``: source, field path, message.

Each case feeds one validator a bad document and checks the three parts the error carries, so a
caller (the CLI's one-line error, a Warning Event, ``explain``) can name the field whichever
package found it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from apis.errors import FieldError
from apis.manager_keys import ANNOTATION_NODE_BANDWIDTH
from apis.netqos import ANNOTATION_NODE_NETWORK_BANDWIDTH, bandwidth_bps, node_bandwidth_bps
from apis.nodetopo import parse_cpu_basic_info
from kubeclient.config import load_configuration
from kubeclient.errors import ConfigError, KubeError
from manager.errors import ManagerError
from manager.slo.config import node_bandwidth
from manager.webhook.profiles import ProfileError, mutate, parse_profile, parse_profiles, plan


def _profile(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "colo"}, "spec": spec}


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"qosClass": "XX"}, "spec.qosClass", "unknown QoS class 'XX'"),
        ({"koordinatorPriority": "high"}, "spec.koordinatorPriority", "must be an integer"),
        ({"patch": [1]}, "spec.patch", "must be an object"),
        ({"selector": "app=x"}, "spec.selector", "must be an object"),
        (
            {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}},
            "spec.namespaceSelector.matchExpressions[0].operator",
            "unknown 'Is'",
        ),
        ({"labels": {"a": 1}}, "spec.labels", "must be a map of strings"),
        ({"annotations": []}, "spec.annotations", "must be a map of strings"),
    ],
)
def test_a_bad_profile_is_a_field_error_naming_the_profile_and_field(
    spec: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_profile(_profile(**spec))
    err = caught.value
    assert isinstance(err, FieldError)
    assert isinstance(err, ManagerError)
    assert isinstance(err, ValueError)  # what the webhook server already catches
    assert (err.source, err.field, err.message) == ("clustercolocationprofile colo", field, message)
    assert str(err) == f"clustercolocationprofile colo: {field}: {message}"


def test_a_bad_profile_is_left_out_with_a_warning_naming_the_field(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = {"metadata": {"name": "good"}, "spec": {"qosClass": "BE"}}
    assert [p.name for p in parse_profiles([_profile(qosClass="XX"), good])] == ["good"]
    assert "clustercolocationprofile colo: spec.qosClass: unknown QoS class" in caplog.text


def test_a_missing_priority_class_is_a_field_error_of_the_profile() -> None:
    profile = parse_profile(_profile(priorityClassName="koord-batch"))
    pod = {"metadata": {"name": "p"}, "spec": {"containers": []}}
    with pytest.raises(ProfileError) as caught:
        mutate(pod, plan([profile], {}, None), priority_classes={})
    assert caught.value.field == "spec.priorityClassName"
    assert caught.value.source == "clustercolocationprofile colo"


def test_a_kubeconfig_that_does_not_load_is_a_field_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: 3\n")
    with pytest.raises(ConfigError) as caught:
        asyncio.run(load_configuration(str(bad)))
    err = caught.value
    assert isinstance(err, FieldError)
    assert isinstance(err, KubeError)
    assert err.source == f"kubeconfig {bad}"
    assert err.message
    assert str(err).startswith(f"kubeconfig {bad}: ")


def test_no_kubeconfig_outside_a_cluster_is_a_field_error_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError) as caught:
        asyncio.run(load_configuration(None))
    assert caught.value.source == "--kubeconfig"
    assert caught.value.message.startswith("not given, and not in a cluster")


ANNOTATION_CASES: list[tuple[Callable[[], object], str, str]] = [
    (lambda: parse_cpu_basic_info("[]"), "node.koordinator.sh/cpu-basic-info", ""),
    (
        lambda: bandwidth_bps(101, 1000, field="beClass.networkQOS.egressLimit"),
        "",
        "beClass.networkQOS.egressLimit",
    ),
    (
        lambda: parse_cpu_basic_info('{"turboEnabled": "yes"}'),
        "node.koordinator.sh/cpu-basic-info",
        "turboEnabled",
    ),
    (
        lambda: node_bandwidth_bps({ANNOTATION_NODE_NETWORK_BANDWIDTH: "ten"}),
        f"annotation {ANNOTATION_NODE_NETWORK_BANDWIDTH}='ten'",
        "",
    ),
    (
        lambda: node_bandwidth({ANNOTATION_NODE_BANDWIDTH: "wrong-format"}),
        f"annotation {ANNOTATION_NODE_BANDWIDTH}='wrong-format'",
        "",
    ),
]


@pytest.mark.parametrize(("call", "source", "field"), ANNOTATION_CASES)
def test_annotation_parsers_raise_field_errors_that_are_still_value_errors(
    call: Callable[[], object], source: str, field: str
) -> None:
    with pytest.raises(ValueError) as caught:
        call()
    assert isinstance(caught.value, FieldError)
    assert (caught.value.source, caught.value.field) == (source, field)
