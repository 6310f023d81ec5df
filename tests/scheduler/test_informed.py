"""The extender over a snapshot that informers keep current, against the fake API server."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import yaml

from kubeclient.resources import RESERVATIONS
from scheduler_plugins.extender import Extender
from scheduler_plugins.informed import KINDS, InformedSnapshot
from scheduler_plugins.table import build_framework
from tests.kubefake.fixtures import eventually
from tests.kubefake.server import FakeApiServer, Kind
from tests.scheduler.builders import node, node_metric, pod, ts

CRDS = (
    Kind("scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas", "ElasticQuota", True),
    Kind("scheduling.sigs.k8s.io", "v1alpha1", "podgroups", "PodGroup", True),
    Kind("scheduling.koordinator.sh", "v1alpha1", "reservations", "Reservation", False),
    Kind("scheduling.koordinator.sh", "v1alpha1", "devices", "Device", False),
)


def fresh_metric(name: str, cpu: str) -> dict:
    m = node_metric(name, cpu=cpu)
    m["status"]["updateTime"] = ts(time.time() - 5)
    return m


@pytest.fixture
async def cluster(kube_api: FakeApiServer, kube_client):
    for kind in CRDS:
        kube_api.register(kind)
    for name, cpu in (("hot", "24"), ("cool", "4")):
        kube_api.put("nodes", node(name))
        kube_api.put("nodemetrics", fresh_metric(name, cpu))
    informed = InformedSnapshot(kube_client)
    task = asyncio.create_task(informed.run(), name="test-informers")
    try:
        assert await informed.wait_synced(10)
        yield kube_api, informed, Extender(build_framework(), informed.snapshot)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def filter_names(ext: Extender, p: dict) -> tuple[list[str], dict[str, str]]:
    result = ext.filter({"Pod": p, "NodeNames": ["hot", "cool"]})
    return result["NodeNames"], result["FailedNodes"] | result["FailedAndUnresolvableNodes"]


async def test_informer_events_change_the_verdicts(cluster):
    api, informed, ext = cluster
    p = pod("p", requests={"cpu": "2"})
    await eventually(lambda: "hot" in informed.snapshot.node_metrics)
    assert filter_names(ext, p) == (
        ["cool"],
        {"hot": "node(s) cpu usage exceed threshold, cpu usage 80% > threshold 65%"},
    )
    # the koordlet reports the hot node cooled down
    api.put("nodemetrics", fresh_metric("hot", "2"))
    await eventually(lambda: filter_names(ext, p)[0] == ["hot", "cool"])
    # a pod bound to cool takes 31 of its 32 cores
    api.put("pods", pod("big", node_name="cool", requests={"cpu": "31"}))
    await eventually(lambda: filter_names(ext, p)[1].get("cool") == "Insufficient cpu")
    # the node goes away
    api.remove("nodes", "cool")
    await eventually(lambda: filter_names(ext, p)[1].get("cool") == "node(s) not found")


async def test_finished_and_deleted_pods_free_their_node(cluster):
    api, informed, ext = cluster
    api.put("pods", pod("big", node_name="cool", requests={"cpu": "31"}))
    p = pod("p", requests={"cpu": "2"})
    await eventually(lambda: "cool" in filter_names(ext, p)[1])
    done = pod("big", node_name="cool", requests={"cpu": "31"})
    done["status"]["phase"] = "Succeeded"
    api.put("pods", done)
    await eventually(lambda: "cool" not in filter_names(ext, p)[1])
    assert informed.snapshot.nodes["cool"].pods == {}


# -- ElasticQuotaProfiles -----------------------------------------------------------------------

PROFILE_KIND = Kind(
    "quota.koordinator.sh", "v1alpha1", "elasticquotaprofiles", "ElasticQuotaProfile", True
)
POOL = "node-pool"
TREE = "quota.scheduling.koordinator.sh/name"
OUTSIDE_POOL = "node(s) didn't match Pod's node affinity/selector"


def profile(pool: str, *, ratio: str | None = None, quota_name: str = "root") -> dict:
    spec: dict = {"quotaName": quota_name, "nodeSelector": {"matchLabels": {POOL: pool}}}
    if ratio is not None:
        spec["resourceRatio"] = ratio
    return {
        "apiVersion": "quota.koordinator.sh/v1alpha1",
        "kind": "ElasticQuotaProfile",
        "metadata": {"name": "pool-profile", "namespace": "kube-system"},
        "spec": spec,
    }


def child_quota() -> dict:
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "ElasticQuota",
        "metadata": {
            "name": "team",
            "namespace": "default",
            "labels": {"quota.scheduling.koordinator.sh/parent": "root"},
        },
        "spec": {"min": {"cpu": "1"}, "max": {"cpu": "100"}},
    }


async def informed_pools(kube_api: FakeApiServer, kube_client, *, with_profiles: bool):
    for kind in CRDS:
        kube_api.register(kind)
    if with_profiles:
        kube_api.register(PROFILE_KIND)
    kube_api.put("nodes", node("a1", cpu="4", labels={POOL: "a"}))
    kube_api.put("nodes", node("b1", cpu="2", labels={POOL: "b"}))
    kube_api.put("elasticquotas", child_quota())
    informed = InformedSnapshot(kube_client)
    task = asyncio.create_task(informed.run(), name="test-informers")
    assert await informed.wait_synced(10)
    await eventually(lambda: "team" in informed.snapshot.quotas)
    return informed, task


def pool_verdicts(ext: Extender, cpu: str) -> dict[str, str]:
    """Node name to failure reason ("" when it passes) for a pod of the quota ``team``."""
    p = pod("p", requests={"cpu": cpu}, labels={TREE: "team"})
    result = ext.filter({"Pod": p, "NodeNames": ["a1", "b1"]})
    return {n: result["FailedNodes"].get(n, "") for n in ("a1", "b1")}


async def test_a_profile_created_changed_and_deleted_through_the_api_moves_its_trees_pool(
    kube_api, kube_client
):
    informed, task = await informed_pools(kube_api, kube_client, with_profiles=True)
    try:
        ext = Extender(build_framework(), informed.snapshot)
        assert pool_verdicts(ext, "1") == {"a1": "", "b1": ""}  # no profile: one cluster tree
        kube_api.put("elasticquotaprofiles", profile("b"))
        await eventually(lambda: pool_verdicts(ext, "1") == {"a1": OUTSIDE_POOL, "b1": ""})
        kube_api.put("elasticquotaprofiles", profile("a"))
        await eventually(lambda: pool_verdicts(ext, "1") == {"a1": "", "b1": OUTSIDE_POOL})
        # the pool's 4 cores times 0.25: the tree holds one core, a 2-core pod exceeds it
        kube_api.put("elasticquotaprofiles", profile("a", ratio="0.25"))
        await eventually(lambda: pool_verdicts(ext, "2")["a1"].startswith("Insufficient quotas"))
        assert pool_verdicts(ext, "2")["a1"].startswith(
            "Insufficient quotas, quotaName: team, runtime: {cpu: 1000}"
        )
        assert pool_verdicts(ext, "1")["a1"] == ""
        kube_api.remove("elasticquotaprofiles", "pool-profile", "kube-system")
        await eventually(lambda: pool_verdicts(ext, "2") == {"a1": "", "b1": ""})
        assert informed.snapshot.quota_profiles == {}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_an_unreadable_profile_is_skipped_and_the_last_good_one_stays_in_force(
    kube_api, kube_client
):
    informed, task = await informed_pools(kube_api, kube_client, with_profiles=True)
    try:
        ext = Extender(build_framework(), informed.snapshot)
        kube_api.put("elasticquotaprofiles", profile("b"))
        await eventually(lambda: pool_verdicts(ext, "1") == {"a1": OUTSIDE_POOL, "b1": ""})
        kube_api.put("elasticquotaprofiles", profile("a", quota_name=""))
        await eventually(lambda: informed.rejected == 1)
        assert pool_verdicts(ext, "1") == {"a1": OUTSIDE_POOL, "b1": ""}
        stored = informed.snapshot.quota_profiles["kube-system/pool-profile"]
        assert stored["spec"]["quotaName"] == "root"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_without_the_profile_crd_the_informers_sync_and_quotas_still_apply(
    kube_api, kube_client
):
    informed, task = await informed_pools(kube_api, kube_client, with_profiles=False)
    try:
        ext = Extender(build_framework(), informed.snapshot)
        assert pool_verdicts(ext, "1") == {"a1": "", "b1": ""}
        # team's max is 100 cores but the cluster holds 6: the tree is capped by the cluster
        assert pool_verdicts(ext, "7")["a1"].startswith("Insufficient quotas, quotaName: team")
        profiles = next(
            i for i in informed.informers if i.resource.plural == "elasticquotaprofiles"
        )
        await eventually(lambda: any("elasticquotaprofiles" in r.path for r in kube_api.requests))
        assert not profiles.synced
        assert informed.snapshot.quota_profiles == {}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_every_kind_the_informers_watch_is_readable_by_both_packaged_scheduler_roles():
    rbac = Path(__file__).resolve().parents[2] / "packaging/kubernetes/scheduler/rbac.yaml"
    roles = [d for d in yaml.safe_load_all(rbac.read_text()) if d["kind"] == "ClusterRole"]
    assert {r["metadata"]["name"] for r in roles} == {"koord-scheduler", "koord-scheduler-extender"}
    for role in roles:
        readable = {
            (group, res)
            for rule in role["rules"]
            if {"list", "watch"} <= set(rule["verbs"])
            for group in rule["apiGroups"]
            for res in rule["resources"]
        }
        missing = [k.plural for k in KINDS if (k.group, k.plural) not in readable]
        assert missing == [], role["metadata"]["name"]


def test_the_standalone_role_may_do_every_write_the_standalone_scheduler_makes() -> None:
    # Writes of `koord-scheduler run`: pod patches (reserve annotations), bindings, Events
    # (events.k8s.io/v1: created, then patched with their series), the PodScheduled condition
    # and the preemptor's nominatedNodeName (pods/status patch), Reservation status (placed,
    # Unschedulable, currentOwners) through the status subresource (PUT: update), and
    # preemption's evictions.
    rbac = Path(__file__).resolve().parents[2] / "packaging/kubernetes/scheduler/rbac.yaml"
    (role,) = [
        d
        for d in yaml.safe_load_all(rbac.read_text())
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "koord-scheduler"
    ]
    allowed = {
        (group, res, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }
    needed = {
        ("", "pods", "patch"),
        ("", "pods/binding", "create"),
        ("", "pods/status", "patch"),
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "patch"),
        (RESERVATIONS.group, f"{RESERVATIONS.plural}/status", "update"),
        ("", "pods/eviction", "create"),  # preemption's victims
    }
    assert needed <= allowed


async def test_a_node_metric_update_re_indexes_its_node_alone(cluster):
    api, informed, ext = cluster
    p = pod("p", requests={"cpu": "2"})
    snap = informed.snapshot
    await eventually(lambda: "hot" in snap.node_metrics)
    assert filter_names(ext, p)[0] == ["cool"]
    before = snap.generation
    api.put("nodemetrics", fresh_metric("hot", "2"))
    await eventually(lambda: snap.generation != before)
    # the plugins re-index the one node (a rebuild of every node at each of the koordlets'
    # reports would cost a 5,000-node cluster most of its scheduling time), and decide on it
    assert snap.changed_since(before) == {"hot"}
    assert filter_names(ext, p)[0] == ["hot", "cool"]
