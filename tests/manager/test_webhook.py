"""The pod webhooks over real TLS on 127.0.0.1 with AdmissionReview requests; profiles,
namespaces and PriorityClasses come from the fake API server. Expected pods follow upstream's
``pkg/webhook/pod/mutating/cluster_colocation_profile_test.go`` and
``extended_resource_spec_test.go``."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kubeclient.client import KubeClient
from manager.webhook.certs import generate, write_dir
from tests.kubefake import FakeApiServer
from tests.manager.conftest import eventually
from tests.manager.webhookrig import Webhook, pod, register, serving

SPEC = "node.koordinator.sh/extended-resource-spec"
COLOCATE = {"koordinator.sh/enable-colocation": "true"}
BE_PROFILE = {
    "apiVersion": "config.koordinator.sh/v1alpha1",
    "kind": "ClusterColocationProfile",
    "metadata": {"name": "colocation-profile-example"},
    "spec": {
        "namespaceSelector": {"matchLabels": COLOCATE},
        "selector": {"matchLabels": COLOCATE},
        "qosClass": "BE",
        "priorityClassName": "koord-batch",
        "koordinatorPriority": 1000,
        "schedulerName": "koord-scheduler",
        "labels": {"koordinator.sh/mutated": "true"},
        "annotations": {"koordinator.sh/intercepted": "true"},
        "patch": {"spec": {"terminationGracePeriodSeconds": 30}},
    },
}


@pytest.fixture(scope="module")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    write_dir(
        directory, generate("koordinator-webhook-service.koordinator-system.svc", ["127.0.0.1"])
    )
    return directory


def seed(api: FakeApiServer) -> None:
    register(api)
    api.put("namespaces", {"metadata": {"name": "spark", "labels": COLOCATE}})
    api.put("namespaces", {"metadata": {"name": "default", "labels": {}}})
    for name, value in (("koord-batch", 5000), ("koord-mid", 7000), ("koord-prod", 9000)):
        api.put(
            "priorityclasses",
            {"metadata": {"name": name}, "value": value, "preemptionPolicy": "Never"},
        )
    api.put("clustercolocationprofiles", BE_PROFILE)


class Rolls:
    """``rand.Intn(100)`` answering the values a test queues."""

    def __init__(self) -> None:
        self.values: list[int] = []

    def __call__(self) -> int:
        return self.values.pop(0)


@pytest.fixture
def rolls() -> Rolls:
    return Rolls()


@pytest.fixture
async def webhook(
    kube_api: FakeApiServer, kube_client: KubeClient, cert_dir: Path, rolls: Rolls
) -> AsyncIterator[Webhook]:
    seed(kube_api)
    async with serving(kube_client, cert_dir, roll=rolls) as hook:
        yield hook


def add_profile(api: FakeApiServer, name: str, spec: dict[str, Any], **annotations: str) -> None:
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = {
            f"config.koordinator.sh/{k.replace('_', '-')}": v for k, v in annotations.items()
        }
    api.put("clustercolocationprofiles", {"metadata": meta, "spec": spec})


async def profiles_seen(hook: Webhook, count: int) -> None:
    await eventually(lambda: len(hook.lookups.profiles()) == count)


# ClusterColocationProfiles ------------------------------------------------------------------
async def test_a_matching_be_profile_sets_qos_priority_scheduler_and_batch_resources(
    webhook: Webhook,
) -> None:
    original = pod(
        COLOCATE,
        requests={"cpu": "1", "memory": "3456Mi"},
        limits={"cpu": "1500m", "memory": "3456Mi"},
    )
    out = await webhook.mutated(original)
    meta, spec = out["metadata"], out["spec"]
    assert meta["labels"] == {
        "koordinator.sh/enable-colocation": "true",
        "koordinator.sh/mutated": "true",
        "koordinator.sh/qosClass": "BE",
        "koordinator.sh/priority": "1000",
    }
    assert spec["priorityClassName"] == "koord-batch"
    assert spec["priority"] == 5000  # the PriorityClass's value on the API server
    assert spec["preemptionPolicy"] == "Never"  # and its preemptionPolicy
    assert spec["schedulerName"] == "koord-scheduler"
    assert spec["terminationGracePeriodSeconds"] == 30
    # cpu becomes NewQuantity(MilliValue(), DecimalSI): 1 core is "1k"; memory keeps its text
    assert spec["containers"][0]["resources"] == {
        "requests": {"kubernetes.io/batch-cpu": "1k", "kubernetes.io/batch-memory": "3456Mi"},
        "limits": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "3456Mi"},
    }
    assert meta["annotations"] == {
        "koordinator.sh/intercepted": "true",
        SPEC: '{"containers":{"app":{"limits":{"kubernetes.io/batch-cpu":"1500",'
        '"kubernetes.io/batch-memory":"3456Mi"},"requests":{"kubernetes.io/batch-cpu":"1k",'
        '"kubernetes.io/batch-memory":"3456Mi"}}}}',
    }


async def test_a_request_without_a_limit_keeps_no_limit(webhook: Webhook) -> None:
    """Upstream's "keep limit unset": only a missing request is taken from the limit."""
    out = await webhook.mutated(pod(COLOCATE, requests={"cpu": "250m", "memory": "1Gi"}))
    assert out["spec"]["containers"][0]["resources"] == {
        "requests": {"kubernetes.io/batch-cpu": "250", "kubernetes.io/batch-memory": "1Gi"},
    }
    assert json.loads(out["metadata"]["annotations"][SPEC]) == {
        "containers": {
            "app": {
                "requests": {"kubernetes.io/batch-cpu": "250", "kubernetes.io/batch-memory": "1Gi"}
            }
        }
    }


async def test_a_limit_without_a_request_becomes_the_request_too(webhook: Webhook) -> None:
    """Upstream's "set default request to the limit"."""
    out = await webhook.mutated(pod(COLOCATE, limits={"cpu": "1", "memory": "4Gi"}))
    assert out["spec"]["containers"][0]["resources"] == {
        "limits": {"kubernetes.io/batch-cpu": "1k", "kubernetes.io/batch-memory": "4Gi"},
        "requests": {"kubernetes.io/batch-cpu": "1k", "kubernetes.io/batch-memory": "4Gi"},
    }


async def test_init_containers_and_overhead_are_translated_but_left_out_of_the_annotation(
    webhook: Webhook,
) -> None:
    original = pod(COLOCATE, requests={"cpu": "1", "memory": "4Gi"})
    original["spec"]["initContainers"] = [
        {"name": "init", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}
    ]
    original["spec"]["overhead"] = {"cpu": "1", "memory": "2Gi"}
    out = await webhook.mutated(original)
    assert out["spec"]["initContainers"][0]["resources"] == {
        "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "1Gi"}
    }
    assert out["spec"]["overhead"] == {
        "kubernetes.io/batch-cpu": "1k",
        "kubernetes.io/batch-memory": "2Gi",
    }
    assert list(json.loads(out["metadata"]["annotations"][SPEC])["containers"]) == ["app"]


async def test_profiles_apply_by_name_descending_so_the_first_name_wins(
    kube_api: FakeApiServer, webhook: Webhook
) -> None:
    """Upstream sorts the matched profiles by ``spec.priority``, then by name descending."""
    for name, tier in (("a-mid", "from-a"), ("b-mid", "from-b")):
        add_profile(
            kube_api,
            name,
            {
                "selector": {"matchLabels": {"app": "mid"}},
                "qosClass": "LS",
                "priorityClassName": "koord-mid",
                "labels": {"tier": tier},
            },
        )
    await profiles_seen(webhook, 3)
    out = await webhook.mutated(
        pod({"app": "mid"}, requests={"cpu": "2", "memory": "1Gi"}), namespace="default"
    )
    assert out["metadata"]["labels"]["tier"] == "from-a"  # a-mid applied after b-mid
    assert out["spec"]["priority"] == 7000
    assert out["spec"]["containers"][0]["resources"]["requests"] == {
        "kubernetes.io/mid-cpu": "2k",
        "kubernetes.io/mid-memory": "1Gi",
    }
    assert json.loads(out["metadata"]["annotations"][SPEC]) == {
        "containers": {
            "app": {"requests": {"kubernetes.io/mid-cpu": "2k", "kubernetes.io/mid-memory": "1Gi"}}
        }
    }


async def test_a_higher_spec_priority_applies_first(
    kube_api: FakeApiServer, webhook: Webhook
) -> None:
    sel = {"matchLabels": {"app": "x"}}
    add_profile(kube_api, "a", {"selector": sel, "labels": {"won": "a"}})
    add_profile(kube_api, "z", {"selector": sel, "labels": {"won": "z"}, "priority": 10})
    await profiles_seen(webhook, 3)
    out = await webhook.mutated(pod({"app": "x"}), namespace="default")
    assert out["metadata"]["labels"]["won"] == "a"  # z (priority 10) first, then a


async def test_skip_next_profile_ends_the_walk_and_skip_update_resources_keeps_cpu(
    kube_api: FakeApiServer, webhook: Webhook
) -> None:
    sel = {"matchLabels": {"app": "x"}}
    add_profile(kube_api, "b-first", {"selector": sel, "labels": {"b": "1"}}, skip_next_profile="")
    add_profile(kube_api, "a-never", {"selector": sel, "labels": {"a": "1"}})
    add_profile(
        kube_api,
        "c-batch",
        {"selector": sel, "priorityClassName": "koord-batch", "qosClass": "BE"},
        skip_update_resources="true",
    )
    await profiles_seen(webhook, 4)
    out = await webhook.mutated(pod({"app": "x"}, requests={"cpu": "1"}), namespace="default")
    labels = out["metadata"]["labels"]
    assert labels["b"] == "1"
    assert "a" not in labels  # after b-first, which ends the walk
    assert labels["koordinator.sh/qosClass"] == "BE"  # c-batch applied before b-first
    assert out["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "1"}}
    assert SPEC not in (out["metadata"].get("annotations") or {})


@pytest.mark.parametrize(
    ("probability", "roll", "applied"),
    [(0, None, False), (100, None, True), ("50%", 50, True), ("50%", 51, False), (30, 29, True)],
)
async def test_a_profile_with_a_probability_applies_when_the_roll_is_at_most_it(
    kube_api: FakeApiServer,
    webhook: Webhook,
    rolls: Rolls,
    probability: int | str,
    roll: int | None,
    applied: bool,
) -> None:
    add_profile(
        kube_api,
        "p",
        {
            "selector": {"matchLabels": {"app": "x"}},
            "labels": {"hit": "y"},
            "probability": probability,
        },
    )
    await profiles_seen(webhook, 2)
    if roll is not None:
        rolls.values.append(roll)
    out = await webhook.mutated(pod({"app": "x"}), namespace="default")
    assert ("hit" in out["metadata"]["labels"]) is applied
    assert rolls.values == []  # drawn only between 0 and 100 exclusive


async def test_a_probability_that_is_no_percentage_denies_the_pod_naming_the_field(
    kube_api: FakeApiServer, webhook: Webhook
) -> None:
    add_profile(kube_api, "p", {"selector": {"matchLabels": {"app": "x"}}, "probability": "half"})
    await profiles_seen(webhook, 2)
    response = await webhook.call("/mutate-pod", pod({"app": "x"}), namespace="default")
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    assert "clustercolocationprofile p" in response["status"]["message"]
    assert "spec.probability" in response["status"]["message"]


async def test_label_keys_are_mapped_and_suffixes_appended(
    kube_api: FakeApiServer, webhook: Webhook
) -> None:
    add_profile(
        kube_api,
        "m",
        {
            "selector": {"matchLabels": {"app": "x"}},
            "labelKeysMapping": {"app": "koordinator.sh/app", "missing": "copied"},
            "annotationKeysMapping": {"owner": "koordinator.sh/owner"},
            "labelSuffixes": {"app": "-be", "absent": "-never"},
        },
    )
    await profiles_seen(webhook, 2)
    out = await webhook.mutated(
        pod({"app": "x"}, annotations={"owner": "team"}), namespace="default"
    )
    assert out["metadata"]["labels"] == {"app": "x-be", "koordinator.sh/app": "x", "copied": ""}
    assert out["metadata"]["annotations"] == {"owner": "team", "koordinator.sh/owner": "team"}


async def test_a_be_pod_without_a_priority_is_batch_by_default(
    kube_api: FakeApiServer, webhook: Webhook
) -> None:
    """``GetPodPriorityClassWithDefault``: no priority class label or band, QoS BE → batch."""
    add_profile(kube_api, "be", {"selector": {"matchLabels": {"app": "x"}}, "qosClass": "BE"})
    await profiles_seen(webhook, 2)
    out = await webhook.mutated(pod({"app": "x"}, requests={"cpu": "2"}), namespace="default")
    assert out["spec"]["containers"][0]["resources"] == {
        "requests": {"kubernetes.io/batch-cpu": "2k"}
    }


async def test_a_pod_no_profile_matches_is_allowed_without_a_patch(webhook: Webhook) -> None:
    response = await webhook.call(
        "/mutate-pod", pod(COLOCATE, requests={"cpu": "1"}), namespace="default"
    )
    assert response["allowed"] is True
    assert "patch" not in response


async def test_a_profile_whose_priority_class_is_missing_denies_the_pod_naming_it(
    kube_api: FakeApiServer, webhook: Webhook
) -> None:
    kube_api.remove("priorityclasses", "koord-batch")
    response = await webhook.call("/mutate-pod", pod(COLOCATE, requests={"cpu": "1"}))
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    assert "colocation-profile-example" in response["status"]["message"]
    assert "koord-batch" in response["status"]["message"]


async def test_updates_are_not_mutated(webhook: Webhook) -> None:
    p = pod(COLOCATE, requests={"cpu": "1"})
    response = await webhook.call("/mutate-pod", p, operation="UPDATE", old=p)
    assert response == {"uid": response["uid"], "allowed": True}


# The extended-resource-spec annotation ------------------------------------------------------
async def test_a_pod_asking_for_batch_resources_gets_the_annotation_without_any_profile(
    webhook: Webhook,
) -> None:
    """Upstream ``TestExtendedResourceSpecMutatingPod``: only the batch resources are copied,
    in Go's bytes (``MustParse("1000")`` marshals as ``"1k"``)."""
    original = pod(
        {"koordinator.sh/qosClass": "BE"},
        requests={"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "4Gi", "x": "1"},
        limits={"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "4Gi", "x": "1"},
        name="test-container-a",
    )
    out = await webhook.mutated(original, namespace="default")
    assert out["metadata"]["annotations"] == {
        SPEC: '{"containers":{"test-container-a":{"limits":{"kubernetes.io/batch-cpu":"1k",'
        '"kubernetes.io/batch-memory":"4Gi"},"requests":{"kubernetes.io/batch-cpu":"1k",'
        '"kubernetes.io/batch-memory":"4Gi"}}}}'
    }
    assert out["spec"] == original["spec"]  # the spec itself is left alone


async def test_an_annotation_already_equal_is_kept_byte_for_byte(webhook: Webhook) -> None:
    existing = (
        ' {"containers": {"app": {"requests": {"kubernetes.io/batch-cpu": "500"},"limits":{}}}}'
    )
    p = pod(
        {"koordinator.sh/qosClass": "BE"},
        requests={"kubernetes.io/batch-cpu": "500"},
        limits={},
        annotations={SPEC: existing},
    )
    response = await webhook.call("/mutate-pod", p, namespace="default")
    assert response == {"uid": response["uid"], "allowed": True}  # no patch


async def test_an_annotation_spelt_differently_is_rewritten_as_go_writes_it(
    webhook: Webhook,
) -> None:
    """``reflect.DeepEqual`` tells ``"1000"`` from ``"1k"``; the pod's ``"1k"`` wins."""
    existing = '{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"1000"}}}}'
    p = pod(
        {"koordinator.sh/qosClass": "BE"},
        requests={"kubernetes.io/batch-cpu": "1k"},
        annotations={SPEC: existing},
    )
    out = await webhook.mutated(p, namespace="default")
    assert out["metadata"]["annotations"][SPEC] == (
        '{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"1k"}}}}'
    )


async def test_a_pod_without_batch_resources_has_a_stale_annotation_emptied(
    webhook: Webhook,
) -> None:
    stale = '{"containers":{"app":{"requests":{"kubernetes.io/batch-cpu":"1k"}}}}'
    out = await webhook.mutated(
        pod(requests={"cpu": "1"}, annotations={SPEC: stale}), namespace="default"
    )
    assert out["metadata"]["annotations"][SPEC] == "{}"


async def test_an_annotation_go_cannot_decode_denies_the_pod_naming_the_field(
    webhook: Webhook,
) -> None:
    bad = '{"containers":{"app":{"limits":{"kubernetes.io/batch-cpu":"lots"}}}}'
    response = await webhook.call("/mutate-pod", pod(annotations={SPEC: bad}), namespace="default")
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    message = response["status"]["message"]
    assert SPEC in message
    assert "containers.app.limits.kubernetes.io/batch-cpu" in message


# The validating webhook ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("labels", "priority", "requests", "allowed", "reason"),
    [
        ({"koordinator.sh/qosClass": "BE"}, 9500, {"cpu": "1"}, False, "priorityClass=koord-prod"),
        ({"koordinator.sh/qosClass": "BE"}, None, {"cpu": "1"}, False, "priorityClass=none"),
        ({"koordinator.sh/qosClass": "BE"}, 5500, {"kubernetes.io/batch-cpu": "1000"}, True, ""),
        (
            {"koordinator.sh/qosClass": "LSR"},
            5500,
            {"cpu": "2"},
            False,
            "priorityClass=koord-batch",
        ),
        ({"koordinator.sh/qosClass": "LSR"}, 9500, {"cpu": "1500m"}, False, "must be integer"),
        (
            {"koordinator.sh/qosClass": "LSE"},
            9500,
            {"memory": "1Gi"},
            False,
            "declare the requested",
        ),
        ({"koordinator.sh/qosClass": "LSE"}, 9500, {"cpu": "2"}, True, ""),
        (
            {"koordinator.sh/qosClass": "LS"},
            9500,
            {"kubernetes.io/batch-cpu": "1"},
            False,
            "QoS BE",
        ),
        ({}, None, {"cpu": "500m"}, True, ""),
    ],
)
async def test_the_validating_webhook_enforces_upstreams_qos_and_priority_rules(
    webhook: Webhook,
    labels: dict[str, str],
    priority: int | None,
    requests: dict[str, str],
    allowed: bool,
    reason: str,
) -> None:
    response = await webhook.call(
        "/validate-pod", pod(labels, requests=requests, priority=priority)
    )
    assert response["allowed"] is allowed
    if not allowed:
        assert response["status"]["code"] == 403
        assert reason in response["status"]["message"]


async def test_an_update_may_not_change_the_qos_class(webhook: Webhook) -> None:
    old = pod({"koordinator.sh/qosClass": "LS"}, requests={"cpu": "1"}, priority=9500)
    new = pod({"koordinator.sh/qosClass": "LSR"}, requests={"cpu": "1"}, priority=9500)
    response = await webhook.call("/validate-pod", new, operation="UPDATE", old=old)
    assert response["allowed"] is False
    assert "koordinator.sh/qosClass: field is immutable" in response["status"]["message"]


async def test_an_update_may_not_change_the_priority_class_label(webhook: Webhook) -> None:
    """Upstream compares ``GetPodPriorityClassRaw``: the priority-class label counts, not only
    the band of ``spec.priority`` (which stays the same here)."""
    label = "koordinator.sh/priority-class"
    old = pod({label: "koord-prod"}, requests={"cpu": "1"}, priority=9500)
    new = pod({label: "koord-mid"}, requests={"cpu": "1"}, priority=9500)
    response = await webhook.call("/validate-pod", new, operation="UPDATE", old=old)
    assert response["allowed"] is False
    assert "spec.priority: field is immutable" in response["status"]["message"]


async def test_a_be_pod_labelled_batch_is_allowed_whatever_its_band(webhook: Webhook) -> None:
    """The label wins over the band: BE with ``koord-batch`` is a valid combination."""
    labels = {"koordinator.sh/qosClass": "BE", "koordinator.sh/priority-class": "koord-batch"}
    response = await webhook.call("/validate-pod", pod(labels, requests={}, priority=9500))
    assert response["allowed"] is True


# The server ---------------------------------------------------------------------------------
async def test_a_request_that_is_not_an_admission_review_is_a_400(webhook: Webhook) -> None:
    async with webhook.session.post(webhook.url + "/mutate-pod", json={"hello": 1}) as resp:
        assert resp.status == 400


async def test_an_untrusted_client_cannot_complete_the_handshake(
    webhook: Webhook, tmp_path: Path
) -> None:
    other = generate("other.x.svc", [])
    write_dir(tmp_path, other)
    ctx = ssl.create_default_context(cafile=str(tmp_path / "ca-cert.pem"))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.get(webhook.url + "/healthz")
