"""No decision before every informer a decision reads has listed, nor while one relists after a
410: on the fake API server, with one kind's list held back by an injected delay."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from kubeclient.client import KubeClient
from scheduler_plugins.config import SchedulerConfig
from scheduler_plugins.extender import Extender, KubeBinder, make_app
from scheduler_plugins.informed import KINDS, InformedSnapshot
from scheduler_plugins.snapshot import PodInfo
from scheduler_plugins.standalone import Scheduler, build_scheduler
from scheduler_plugins.table import build_framework
from tests.kubefake.fixtures import eventually
from tests.kubefake.server import Fault, Kind
from tests.scheduler.bindingfake import BindingFakeApiServer
from tests.scheduler.builders import node, pod, ts

QUOTA_LIST_DELAY_S = 1.0
"""How long the ElasticQuota list is held back (the scheduler must wait it out)."""


def ours(name: str, cpu: str) -> dict:
    p = pod(name, requests={"cpu": cpu})
    p["spec"]["schedulerName"] = "koord-scheduler"
    p["metadata"]["creationTimestamp"] = ts(time.time())
    return p


def quota(max_cpu: str) -> dict:
    return {
        "metadata": {"name": "team", "namespace": "default"},
        "spec": {"min": {"cpu": "0"}, "max": {"cpu": max_cpu}},
    }


def node_of(server: BindingFakeApiServer, name: str) -> str:
    obj = server.get("pods", name, "default") or {}
    return str((obj.get("spec") or {}).get("nodeName") or "")


def hold_list(server: BindingFakeApiServer, plural: str, seconds: float) -> None:
    """Delay the next list (not watch) of ``plural``."""
    server.faults.append(
        Fault(delay=seconds, method="GET", path_contains=f"/{plural}", watch=False, times=1)
    )


@dataclass
class Witness:
    """A binder that records what the informers were still missing at each bind."""

    inner: KubeBinder
    informed: InformedSnapshot
    seen: list[tuple[str, list[str]]] = field(default_factory=list)

    async def bind(self, p: PodInfo, node_name: str, annotations: Mapping[str, str]) -> None:
        self.seen.append((p.name, self.informed.not_ready()))
        await self.inner.bind(p, node_name, annotations)


@dataclass
class Term:
    """One term of the standalone scheduler (what ``leader.scheduling_term`` builds), its loop
    started at once so that only its own gate holds it back."""

    informed: InformedSnapshot
    scheduler: Scheduler
    witness: Witness
    tasks: list[asyncio.Task[None]]

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def start_term(client: KubeClient, *, gated: bool = True) -> Term:
    informed, scheduler = build_scheduler(client, SchedulerConfig())
    witness = Witness(KubeBinder(client), informed)
    scheduler.binder = witness
    if not gated:
        scheduler.gate = None
    tasks = [
        asyncio.create_task(informed.run(), name="t-informers"),
        asyncio.create_task(scheduler.run(), name="t-loop"),
    ]
    return Term(informed, scheduler, witness, tasks)


@pytest.fixture
async def cluster(api) -> tuple[BindingFakeApiServer, KubeClient]:
    server, client = api
    server.put("nodes", node("n1", cpu="8"))
    return server, client


async def test_no_pod_is_bound_before_every_kind_is_listed(cluster):
    server, client = cluster
    server.put("pods", ours("p", "1"))
    hold_list(server, "elasticquotas", QUOTA_LIST_DELAY_S)
    term = start_term(client)
    try:
        await eventually(
            lambda: term.informed.not_ready() == ["elasticquotas (not listed yet)"], within=5
        )
        await eventually(lambda: node_of(server, "p") == "n1", within=10)
        # the bind came only once nothing was missing
        assert term.witness.seen == [("p", [])]
        ready = {i.resource.plural: (i.synced, i.absent) for i in term.informed.informers}
        assert ready["elasticquotas"] == (True, False)
        # kinds this cluster does not serve (404) count as listed and empty
        assert ready["elasticquotaprofiles"] == (False, True)
        assert ready["priorityclasses"] == (False, True)
    finally:
        await term.stop()


def test_every_kind_a_decision_reads_is_informed() -> None:
    assert {k.plural for k in KINDS} == {
        "nodes",
        "pods",
        "nodemetrics",
        "noderesourcetopologies",
        "elasticquotas",
        "elasticquotaprofiles",
        "podgroups",
        "reservations",
        "devices",
        "priorityclasses",
        # kube-scheduler's in-tree plugins (namespaceSelector, VolumeBinding) and preemption
        "namespaces",
        "persistentvolumeclaims",
        "persistentvolumes",
        "poddisruptionbudgets",
    }


@pytest.mark.parametrize(
    "plural", ["namespaces", "persistentvolumeclaims", "persistentvolumes", "poddisruptionbudgets"]
)
async def test_the_in_tree_plugins_kinds_hold_decisions_until_listed(cluster, plural):
    server, client = cluster
    server.put("pods", ours("p", "1"))
    hold_list(server, plural, QUOTA_LIST_DELAY_S)
    term = start_term(client)
    try:
        await eventually(lambda: term.informed.not_ready() == [f"{plural} (not listed yet)"])
        await eventually(lambda: node_of(server, "p") == "n1", within=10)
        assert term.witness.seen == [("p", [])]
    finally:
        await term.stop()


async def test_a_cluster_not_serving_an_in_tree_kind_counts_it_listed_and_empty(cluster):
    """The 404 rule holds for the in-tree plugins' kinds as for the CRDs (an API server with
    ``policy/v1`` turned off serves no PodDisruptionBudgets)."""
    server, client = cluster
    del server.kinds[("policy", "v1", "poddisruptionbudgets")]
    server.put("pods", ours("p", "1"))
    term = start_term(client)
    try:
        await eventually(lambda: node_of(server, "p") == "n1", within=10)
        budgets = next(
            i for i in term.informed.informers if i.resource.plural == "poddisruptionbudgets"
        )
        assert (budgets.synced, budgets.absent) == (False, True)
        assert term.witness.seen == [("p", [])]
    finally:
        await term.stop()


@pytest.mark.parametrize("gated", [True, False])
async def test_an_elastic_quota_listed_late_is_never_exceeded(cluster, gated):
    """The reported incident: two 600m pods against max cpu 1, ElasticQuotas not listed yet
    when the term began. Ungated (as before) both are bound; gated, one is."""
    server, client = cluster
    server.put("elasticquotas", quota("1"))
    server.put("pods", ours("a", "600m"))
    server.put("pods", ours("b", "600m"))
    hold_list(server, "elasticquotas", QUOTA_LIST_DELAY_S)
    term = start_term(client, gated=gated)
    try:
        if not gated:
            await eventually(lambda: bool(node_of(server, "a") and node_of(server, "b")))
            # both were bound while the quota was still on its way
            assert len(term.witness.seen) == 2
            assert all("elasticquotas (not listed yet)" in m for _, m in term.witness.seen)
            assert await term.informed.wait_synced(10)
            return
        await eventually(lambda: bool(node_of(server, "a") or node_of(server, "b")), within=10)
        await eventually(lambda: term.scheduler.queue.attempts != {})  # the other one was tried
        assert sum(1 for n in ("a", "b") if node_of(server, n)) == 1
        loser = "b" if node_of(server, "a") else "a"

        def loser_events() -> list[dict]:
            return [
                o
                for (plural, _, _), o in server.objects.items()
                if plural == "events" and o["regarding"]["name"] == loser
            ]

        # the Event is posted after the attempt is recorded (its own write): wait for it
        await eventually(lambda: bool(loser_events()), within=10)
        events = loser_events()
        assert [e["reason"] for e in events] == ["FailedScheduling"]
        assert "Insufficient quotas, quotaName: team" in events[0]["note"]
    finally:
        await term.stop()


async def test_a_restarted_term_does_not_exceed_the_quota_before_it_has_listed_quotas(cluster):
    server, client = cluster
    server.put("elasticquotas", quota("1"))
    server.put("pods", ours("a", "600m"))
    first = start_term(client)
    try:
        await eventually(lambda: node_of(server, "a") == "n1", within=10)
    finally:
        await first.stop()
    # a restart (or a new leader's term): quotas come in late, the second pod is waiting
    server.put("pods", ours("b", "600m"))
    hold_list(server, "elasticquotas", QUOTA_LIST_DELAY_S)
    second = start_term(client)
    try:
        await eventually(lambda: second.scheduler.queue.attempts != {}, within=10)
        assert node_of(server, "b") == ""
        assert second.witness.seen == []
    finally:
        await second.stop()


async def test_a_watch_that_fell_behind_holds_decisions_until_relisted(cluster):
    server, client = cluster
    term = start_term(client)
    try:
        assert await term.informed.wait_synced(10)
        # every watch loses its place (history compacted, streams cut): 410 on resume, then a
        # relist; the ElasticQuota relist is slow
        hold_list(server, "elasticquotas", QUOTA_LIST_DELAY_S)
        server.compact()
        server.drop_watches()
        await eventually(
            lambda: "elasticquotas (relisting after 410 Gone)" in term.informed.not_ready(),
            within=5,
        )
        server.put("pods", ours("late", "1"))
        await eventually(lambda: node_of(server, "late") == "n1", within=10)
        assert term.witness.seen == [("late", [])]
        quotas = next(i for i in term.informed.informers if i.resource.plural == "elasticquotas")
        assert quotas.stats.gone >= 1
        assert quotas.stats.lists == 2
    finally:
        await term.stop()


async def test_a_kind_the_scheduler_may_not_list_keeps_it_unready_naming_the_error(cluster):
    server, client = cluster
    server.register(Kind("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False))
    server.faults.append(
        Fault(status=403, method="GET", path_contains="/priorityclasses", watch=False, times=3)
    )
    informed = InformedSnapshot(client)
    task = asyncio.create_task(informed.run(), name="t-informers")
    try:
        assert not await informed.wait_synced(0.3)
        assert informed.not_ready() == [
            "priorityclasses (not listed yet: 403 Injected: injected fault)"
        ]
        # once allowed (the faults used up), it lists
        await eventually(lambda: informed.not_ready() == [], within=10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_extender_answers_not_ready_until_every_kind_is_listed(cluster):
    server, client = cluster
    hold_list(server, "reservations", QUOTA_LIST_DELAY_S)
    informed = InformedSnapshot(client)
    ext = Extender(build_framework(), informed.snapshot, gate=informed.not_ready)
    task = asyncio.create_task(informed.run(), name="t-informers")
    http = TestServer(make_app(ext), host="127.0.0.1")
    await http.start_server()
    body = {"Pod": pod("p", requests={"cpu": "1"}), "Nodes": None, "NodeNames": ["n1"]}
    try:
        async with aiohttp.ClientSession() as session:
            base = str(http.make_url(""))
            await eventually(lambda: informed.not_ready() == ["reservations (not listed yet)"])
            async with session.post(base + "/filter", json=body) as resp:
                result = await resp.json()
            assert result["Error"] == "not ready: waiting for reservations (not listed yet)"
            assert result["NodeNames"] == []
            async with session.post(base + "/prioritize", json=body) as resp:
                assert resp.status == 503
            async with session.get(base + "/readyz") as resp:
                assert (resp.status, await resp.text()) == (
                    503,
                    "not ready: waiting for reservations (not listed yet)",
                )
            assert await informed.wait_synced(10)
            async with session.get(base + "/readyz") as resp:
                assert resp.status == 200
            async with session.post(base + "/filter", json=body) as resp:
                assert (await resp.json())["NodeNames"] == ["n1"]
    finally:
        await http.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
