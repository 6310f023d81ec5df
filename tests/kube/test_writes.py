"""Status writes with conflict retry, merge patches, the write limiter and the error tree."""

from __future__ import annotations

import pytest

from kubeclient.client import KubeClient, Obj, PatchType
from kubeclient.errors import Conflict, NotFound, TooManyRequests, Transient
from kubeclient.resources import NODE_METRICS, PODS
from kubeclient.writes import WriteRateLimiter, apply_merge_patch, merge_patch, update_status
from tests.kubefake import FakeApiServer, Fault


async def _no_sleep(_: float) -> None:
    return None


def _nodemetric(name: str = "n1") -> Obj:
    return {"metadata": {"name": name}, "spec": {"metricCollectPolicy": {}}}


async def test_status_goes_through_the_subresource_and_spec_is_untouched(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodemetrics", _nodemetric())
    written = await update_status(
        kube_client, NODE_METRICS, "n1", lambda cur: {"updateTime": "2026-01-01T00:00:00Z"}
    )
    assert written is not None
    assert written["status"] == {"updateTime": "2026-01-01T00:00:00Z"}
    (put,) = kube_api.writes("PUT")
    assert put.path == "/apis/slo.koordinator.sh/v1alpha1/nodemetrics/n1/status"
    assert kube_api.get("nodemetrics", "n1")["spec"] == {"metricCollectPolicy": {}}  # type: ignore[index]


async def test_a_conflicting_status_write_is_read_again_and_retried(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodemetrics", _nodemetric())
    calls: list[str] = []

    def build(current: Obj) -> Obj:
        calls.append(current["metadata"]["resourceVersion"])
        if len(calls) == 1:  # someone else writes between our read and our write
            kube_api.put("nodemetrics", {**_nodemetric(), "spec": {"x": 1}})
        return {"updateTime": "t"}

    written = await update_status(kube_client, NODE_METRICS, "n1", build, sleep=_no_sleep)
    assert written is not None
    assert len(calls) == 2
    assert calls[0] != calls[1]
    puts = kube_api.writes("PUT")
    assert len(puts) == 2
    assert kube_api.get("nodemetrics", "n1")["status"] == {"updateTime": "t"}  # type: ignore[index]


async def test_persistent_conflicts_give_up_after_five_attempts(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("nodemetrics", _nodemetric())

    def build(current: Obj) -> Obj:
        kube_api.put("nodemetrics", {**_nodemetric(), "spec": {"n": current["metadata"]["name"]}})
        return {"updateTime": "t"}

    with pytest.raises(Conflict):
        await update_status(kube_client, NODE_METRICS, "n1", build, sleep=_no_sleep)
    assert len(kube_api.writes("PUT")) == 5


async def test_a_missing_object_is_not_found(kube_client: KubeClient) -> None:
    with pytest.raises(NotFound):
        await update_status(kube_client, NODE_METRICS, "absent", lambda c: {})


async def test_merge_and_strategic_patches_reach_the_server(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "default", "labels": {"a": "1", "b": "2"}},
        "spec": {"containers": [{"name": "c1", "image": "x"}, {"name": "c2", "image": "y"}]},
    }
    kube_api.put("pods", pod)
    new_labels = {"a": "1", "c": "3"}
    patch = merge_patch(pod["metadata"], {**pod["metadata"], "labels": new_labels})
    assert patch == {"labels": {"b": None, "c": "3"}}
    got = await kube_client.patch(PODS, "p", {"metadata": patch}, "default")
    assert got["metadata"]["labels"] == new_labels
    got = await kube_client.patch(
        PODS,
        "p",
        {"spec": {"containers": [{"name": "c2", "image": "z"}]}},
        "default",
        patch_type=PatchType.STRATEGIC,
    )
    assert [c["image"] for c in got["spec"]["containers"]] == ["x", "z"]
    assert kube_api.writes("PATCH")[1].content_type == "application/strategic-merge-patch+json"


def test_merge_patch_round_trips() -> None:
    old = {"a": {"b": 1, "c": [1, 2]}, "d": "x"}
    new = {"a": {"b": 2, "c": [3]}, "e": "y"}
    assert apply_merge_patch(old, merge_patch(old, new)) == new


def test_named_lists_merge_by_name_as_a_strategic_merge_patch_does() -> None:
    # Kubernetes merges containers by their ``name`` (patchMergeKey in core/v1 types.go);
    # a list without names, or a plain merge patch, replaces the list
    pod = {
        "spec": {
            "containers": [{"name": "a", "image": "x", "args": ["1"]}, {"name": "b", "image": "y"}],
            "tolerations": [{"key": "t"}],
        }
    }
    patch = {
        "spec": {
            "containers": [{"name": "b", "image": "z"}, {"name": "c", "image": "w"}],
            "tolerations": [{"key": "u"}],
        }
    }
    got = apply_merge_patch(pod, patch, merge_named_lists=True)
    assert got["spec"]["containers"] == [
        {"name": "a", "image": "x", "args": ["1"]},
        {"name": "b", "image": "z"},
        {"name": "c", "image": "w"},
    ]
    assert got["spec"]["tolerations"] == [{"key": "u"}]
    assert apply_merge_patch(pod, patch)["spec"]["containers"] == patch["spec"]["containers"]
    assert pod["spec"]["containers"][1] == {"name": "b", "image": "y"}  # inputs untouched


async def test_errors_are_translated_into_the_tree(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.faults.append(Fault(status=429, retry_after=3))
    with pytest.raises(TooManyRequests) as throttled:
        await kube_client.get(NODE_METRICS, "n1")
    assert throttled.value.retry_after == 3.0
    kube_api.faults.append(Fault(status=503))
    with pytest.raises(Transient):
        await kube_client.get(NODE_METRICS, "n1")
    kube_api.faults.append(Fault(drop=True, times=2))  # aiohttp retries a reused connection once
    with pytest.raises(Transient):
        await kube_client.get(NODE_METRICS, "n1")
    kube_api.put("nodemetrics", _nodemetric())
    with pytest.raises(Conflict):
        await kube_client.create(NODE_METRICS, _nodemetric())


async def test_eviction_carries_the_uid_and_a_budget_refusal_is_429(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    pod = kube_api.put("pods", {"metadata": {"name": "p", "namespace": "ns"}, "spec": {}})
    with pytest.raises(Conflict):
        await kube_client.evict("ns", "p", uid="another-incarnation")
    kube_api.eviction_blocked.add("p")
    with pytest.raises(TooManyRequests):
        await kube_client.evict("ns", "p", uid=pod["metadata"]["uid"])
    kube_api.eviction_blocked.clear()
    await kube_client.evict("ns", "p", uid=pod["metadata"]["uid"])
    assert kube_api.get("pods", "p", "ns") is None
    last = kube_api.writes("POST", "/eviction")[-1]
    assert last.body["deleteOptions"] == {"preconditions": {"uid": pod["metadata"]["uid"]}}


def test_the_write_limiter_allows_a_burst_then_its_rate() -> None:
    now = [0.0]
    limiter = WriteRateLimiter(0.1, 2, clock=lambda: now[0])
    assert limiter.try_acquire()
    assert limiter.try_acquire()
    assert not limiter.try_acquire()
    assert limiter.wait_time() == pytest.approx(10.0)
    now[0] = 10.0
    assert limiter.try_acquire()
    assert not limiter.try_acquire()
    assert limiter.refused == 2
