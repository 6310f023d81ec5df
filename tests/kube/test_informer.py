"""The list-then-watch informer against the fake API server, through the real client."""

from __future__ import annotations

import random

from kubeclient.backoff import Backoff
from kubeclient.client import KubeClient, Obj
from kubeclient.informer import (
    Informer,
    name_of,
    namespaced_name,
    strip_managed_fields,
    waiting_for,
)
from kubeclient.resources import ELASTIC_QUOTAS, NODE_METRICS, PODS
from tests.kube.conftest import eventually, running
from tests.kubefake import FakeApiServer, Fault
from tests.kubefake.server import Kind


def _pod(name: str, node: str, labels: dict[str, str] | None = None) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
    }


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def add(self, obj: Obj) -> None:
        self.events.append(("add", obj["metadata"]["name"]))

    def update(self, old: Obj, new: Obj) -> None:
        self.events.append(("update", new["metadata"]["name"]))

    def delete(self, obj: Obj) -> None:
        self.events.append(("delete", obj["metadata"]["name"]))


def _informer(client: KubeClient, delays: list[float] | None = None, **kw: object) -> Informer:
    async def sleep(seconds: float) -> None:
        if delays is not None:
            delays.append(seconds)

    backoff = Backoff(base=0.01, cap=0.05, rng=random.Random(7))
    return Informer(client, PODS, backoff=backoff, sleep=sleep, **kw)  # type: ignore[arg-type]


async def test_the_store_follows_adds_updates_and_deletes_with_callbacks(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("pods", _pod("a", "n1"))
    informer = _informer(kube_client, field_selector="spec.nodeName=n1")
    rec = _Recorder()
    informer.add_handler(rec.add, rec.update, rec.delete)
    async with running(informer):
        assert await informer.wait_synced(5.0)
        kube_api.put("pods", _pod("b", "n1"))
        kube_api.put("pods", _pod("elsewhere", "n2"))
        kube_api.put("pods", _pod("a", "n1", {"x": "1"}))
        kube_api.remove("pods", "b", "default")
        await eventually(lambda: len(rec.events) == 4)
    assert rec.events == [("add", "a"), ("add", "b"), ("update", "a"), ("delete", "b")]
    assert [o["metadata"]["name"] for o in informer.list()] == ["a"]
    assert informer.get("a", "default")["metadata"]["labels"] == {"x": "1"}  # type: ignore[index]
    watches = [r for r in kube_api.requests if r.query.get("watch") == "true"]
    assert watches[0].query["fieldSelector"] == "spec.nodeName=n1"
    assert watches[0].query["allowWatchBookmarks"] == "true"


async def test_a_410_gone_on_the_watch_relists_and_reports_what_changed_meanwhile(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("pods", _pod("a", "n1"))
    kube_api.put("pods", _pod("b", "n1"))
    informer = _informer(kube_client)
    rec = _Recorder()
    informer.add_handler(rec.add, rec.update, rec.delete)
    async with running(informer):
        assert await informer.wait_synced(5.0)
        await eventually(lambda: kube_api.open_watches == 1)
        # Changes the informer misses: its stream is cut and the history compacted.
        kube_api.drop_watches()
        kube_api.remove("pods", "b", "default")
        kube_api.put("pods", _pod("c", "n1"))
        kube_api.compact()
        await eventually(lambda: informer.stats.gone >= 1 and informer.stats.lists >= 2)
        await eventually(lambda: ("add", "c") in rec.events)
    names = sorted(o["metadata"]["name"] for o in informer.list())
    assert names == ["a", "c"]
    assert ("delete", "b") in rec.events


async def test_transform_and_keep_narrow_what_the_handlers_see_and_what_the_store_holds(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("pods", _pod("a", "n1", {"x": "1"}))
    kube_api.put("pods", _pod("b", "n1"))
    seen: list[tuple[str, Obj, Obj | None]] = []

    def view(obj: Obj) -> Obj:
        return {"metadata": obj["metadata"], "spec": {"nodeName": obj["spec"]["nodeName"]}}

    def key(obj: Obj) -> Obj:
        meta = obj["metadata"]
        return {"metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion")}}

    informer = _informer(kube_client, transform=view, keep=key, page_size=1)
    informer.add_handler(
        lambda o: seen.append(("add", o, None)),
        lambda old, new: seen.append(("update", new, old)),
        lambda o: seen.append(("delete", o, None)),
    )
    async with running(informer):
        assert await informer.wait_synced(5.0)
        await eventually(lambda: kube_api.open_watches == 1)
        kube_api.put("pods", _pod("a", "n1", {"x": "2"}))
        kube_api.remove("pods", "b", "default")
        await eventually(lambda: len(seen) == 4)
        # a relist (410) compares resourceVersions of the kept views: nothing changed, no call
        kube_api.drop_watches()
        kube_api.compact()
        await eventually(lambda: informer.stats.lists >= 2)

    assert [(kind, o["metadata"]["name"]) for kind, o, _ in seen] == [
        ("add", "a"), ("add", "b"), ("update", "a"), ("delete", "b"),
    ]  # fmt: skip
    assert seen[2][1] == view(kube_api.get("pods", "a", "default"))  # the handler's full view
    first_rv = seen[0][1]["metadata"]["resourceVersion"]
    assert seen[2][2] == {
        "metadata": {"name": "a", "namespace": "default", "resourceVersion": first_rv}
    }
    assert informer.list() == [key(kube_api.get("pods", "a", "default"))]
    lists = [r for r in kube_api.requests if r.query.get("watch") != "true"]
    assert [r.query.get("limit") for r in lists[:3]] == ["1", "1", "1"]  # pages of one


async def test_an_http_410_on_the_watch_also_relists(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.gone_as_http = True
    kube_api.put("pods", _pod("a", "n1"))
    informer = _informer(kube_client)
    async with running(informer):
        assert await informer.wait_synced(5.0)
        kube_api.compact()
        kube_api.drop_watches()
        await eventually(lambda: informer.stats.lists >= 2)
    assert informer.stats.gone >= 1


async def test_bookmarks_move_the_resource_version_without_touching_the_store(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("pods", _pod("a", "n1"))
    kube_api.put("pods", _pod("other", "n2"))
    informer = _informer(kube_client, field_selector="spec.nodeName=n1")
    rec = _Recorder()
    informer.add_handler(rec.add, rec.update, rec.delete)
    async with running(informer):
        assert await informer.wait_synced(5.0)
        listed_rv = int(informer.resource_version)
        kube_api.put("pods", _pod("other", "n2", {"v": "2"}))  # filtered out, moves rv on
        await eventually(lambda: int(informer.resource_version) > listed_rv)
    assert rec.events == [("add", "a")]
    assert int(informer.resource_version) == kube_api.rv


async def test_server_errors_back_off_exponentially_with_jitter_then_recover(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("pods", _pod("a", "n1"))
    kube_api.faults.append(Fault(status=500, method="GET", times=4))
    delays: list[float] = []
    informer = _informer(kube_client, delays)
    async with running(informer):
        assert await informer.wait_synced(5.0)
    assert informer.stats.errors == 4
    assert len(delays) >= 4
    steps = [0.01, 0.02, 0.04, 0.05]  # base 0.01 doubling, capped at 0.05
    for delay, step in zip(delays[:4], steps, strict=True):
        assert step / 2 <= delay <= step


async def test_a_429_waits_at_least_its_retry_after(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.faults.append(Fault(status=429, retry_after=7, method="GET"))
    delays: list[float] = []
    informer = _informer(kube_client, delays)
    async with running(informer):
        assert await informer.wait_synced(5.0)
    assert delays[0] == 7.0


async def test_dropped_connections_are_retried_and_the_store_kept(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("pods", _pod("a", "n1"))
    informer = _informer(kube_client)
    async with running(informer):
        assert await informer.wait_synced(5.0)
        await eventually(lambda: kube_api.open_watches == 1)
        kube_api.faults.append(Fault(drop=True, watch=True, times=2))
        kube_api.drop_watches()
        await eventually(lambda: informer.stats.errors >= 2)
        assert [o["metadata"]["name"] for o in informer.list()] == ["a"]
        kube_api.put("pods", _pod("b", "n1"))
        await eventually(lambda: informer.get("b", "default") is not None)
    assert informer.stats.lists == 1  # resumed from its resourceVersion, no relist


async def test_wait_synced_gives_up_after_its_timeout_when_the_server_fails(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.faults.append(Fault(status=503, times=1000))
    informer = Informer(kube_client, NODE_METRICS, backoff=Backoff(base=0.01, cap=0.02))
    async with running(informer):
        assert not await informer.wait_synced(0.2)
    assert not informer.synced
    assert informer.stats.errors >= 1


async def test_a_resource_the_server_does_not_serve_is_absent_until_it_lists(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    # the fake serves no ElasticQuotas until the CRD is "installed"
    informer = Informer(kube_client, ELASTIC_QUOTAS, backoff=Backoff(base=0.01, cap=0.02))
    async with running(informer):
        assert await informer.wait_settled(5.0)
        assert (informer.synced, informer.absent) == (False, True)
        assert informer.last_error.startswith("404")
        kube_api.register(Kind("scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas", "EQ", True))
        assert await informer.wait_synced(5.0)
        assert (informer.absent, informer.last_error) == (False, "")


async def test_relisting_is_true_from_a_410_until_the_relist_is_applied(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    kube_api.put("pods", _pod("a", "n1"))
    informer = _informer(kube_client)
    seen: list[bool] = []
    informer.add_handler(on_add=lambda obj: seen.append(informer.relisting))
    async with running(informer):
        assert await informer.wait_synced(5.0)
        await eventually(lambda: kube_api.open_watches == 1)
        kube_api.faults.append(Fault(delay=0.3, method="GET", watch=False))
        kube_api.compact()
        kube_api.drop_watches()
        await eventually(lambda: informer.relisting)
        kube_api.put("pods", _pod("b", "n1"))  # during the (slow) relist
        await eventually(lambda: informer.get("b", "default") is not None)
        assert not informer.relisting
    # the relist's callbacks ran while the store was still marked stale
    assert seen == [False, True]
    assert (informer.stats.gone, informer.stats.lists) == (1, 2)


async def test_waiting_for_names_each_informer_not_current_with_its_last_error(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    """What a reader of several informers reports while not ready: a kind not listed yet (with
    the last error), nothing for one listed or one the server does not serve."""
    kube_api.put("pods", _pod("a", "n1"))
    kube_api.faults.append(Fault(path_contains="nodemetrics", status=500, times=1000))
    pods = _informer(kube_client)
    metrics = Informer(kube_client, NODE_METRICS, backoff=Backoff(base=0.01, cap=0.02))
    quotas = Informer(kube_client, ELASTIC_QUOTAS, backoff=Backoff(base=0.01, cap=0.02))
    async with running(pods), running(metrics), running(quotas):
        assert await pods.wait_synced(5.0)
        assert await quotas.wait_settled(5.0)
        await eventually(lambda: bool(metrics.last_error))
        waiting = waiting_for([pods, metrics, quotas])
    assert len(waiting) == 1
    assert waiting[0].startswith(f"{metrics.name} (not listed yet: 500")


def test_object_names_as_the_informers_key_them() -> None:
    pod = _pod("a", "n1")
    assert name_of(pod) == "a"
    assert namespaced_name(pod) == "default/a"
    assert namespaced_name({"metadata": {"name": "x", "namespace": "kube-system"}}) == (
        "kube-system/x"
    )
    assert (name_of({}), namespaced_name({})) == ("", "default/")


async def test_a_transform_strips_managed_fields_from_listed_and_watched_objects(
    kube_api: FakeApiServer, kube_client: KubeClient
) -> None:
    managed = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
    first = _pod("a", "n1")
    first["metadata"]["managedFields"] = managed
    kube_api.put("pods", first)
    informer = _informer(kube_client, transform=strip_managed_fields)
    seen: list[Obj] = []
    informer.add_handler(seen.append, lambda _old, new: seen.append(new))
    async with running(informer):
        assert await informer.wait_synced(5.0)
        second = _pod("b", "n1")
        second["metadata"]["managedFields"] = managed
        kube_api.put("pods", second)
        await eventually(lambda: len(seen) == 2)
    assert [o["metadata"]["name"] for o in seen] == ["a", "b"]
    assert all("managedFields" not in o["metadata"] for o in seen)
    assert all("managedFields" not in o["metadata"] for o in informer.list())
