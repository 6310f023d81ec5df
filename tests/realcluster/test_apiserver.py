"""What the client layer relies on, against the real kube-apiserver (v1.25) rather than our fake
(tests/kubefake): a watch from a resourceVersion older than the API server's history answers
410 and the informer relists without losing or duplicating objects; a stale resourceVersion on
update is a Conflict; the status subresource writes status only and the object's PUT leaves
status alone; the CRDs' validation agrees with ours (apis/crdschema.py) on valid and invalid
NodeSLOs; and the shipped RBAC lets each component's ServiceAccount do what its code does and
no more (``kubectl auth can-i`` against the real authorizer)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import pytest

from apis.crdschema import load_crds
from envtest.cluster import Cluster
from envtest.koordinator import MANIFESTS, NAMESPACE, Koordinator
from kubeclient.client import KubeClient
from kubeclient.errors import ApiError, Conflict, Gone
from kubeclient.informer import Informer
from kubeclient.resources import CONFIGMAPS, NODE_METRICS, NODE_SLOS
from tests.kube.test_manifests import USED as KOORDLET_USED

pytestmark = pytest.mark.timeout(120)
NS = "apiserver-tests"


@pytest.fixture
async def client(cluster: Cluster, koordinator: Koordinator) -> Any:
    cluster.kubectl("create", "namespace", NS, check=False)
    c = await KubeClient.connect(str(cluster.kubeconfig()))
    try:
        yield c
    finally:
        await c.close()


def _configmap(name: str, value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS},
        "data": {"v": value},
    }


@pytest.fixture(scope="module")
def own_apiserver() -> Iterator[Cluster]:
    """A control plane of its own, with the CRDs and no controller (restarting the shared one
    would disturb the other tests, and its manager removes a NodeMetric without a Node)."""
    c = Cluster(nodes=0, controller_manager=False, scheduler=False)
    try:
        c.start()
        c.kubectl("create", "namespace", NS)
        c.kubectl("apply", "--server-side", "-f", str(MANIFESTS / "crds"))
        c.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        yield c
    finally:
        c.close()


async def test_after_an_api_server_restart_a_watch_from_before_it_is_gone(
    own_apiserver: Cluster,
) -> None:
    async with await KubeClient.connect(str(own_apiserver.kubeconfig())) as client:
        created = await client.create(CONFIGMAPS, _configmap("gone-probe", "1"))
        rv = created["metadata"]["resourceVersion"]
    # the restarted API server's watch cache begins at the revision it lists at (past ``rv``:
    # the server writes its own objects as it starts); a watch from ``rv`` is answered 410
    own_apiserver.control.restart_apiserver()  # type: ignore[union-attr]
    errors = []
    async with await KubeClient.connect(str(own_apiserver.kubeconfig())) as client:
        try:
            errors += [
                event.object
                async for event in client.watch(CONFIGMAPS, rv, NS, timeout_seconds=5)
                if event.type == "ERROR"
            ]
        except Gone:  # a 410 answer to the request itself
            errors.append({"code": 410})
    # the watch cache answers in the stream: one ERROR event carrying a 410 Expired Status
    # (the informer's relist follows it: the next test)
    assert [e.get("code") for e in errors] == [410], errors


async def test_an_informer_comes_through_an_api_server_restart_and_loses_nothing(
    own_apiserver: Cluster,
) -> None:
    async with await KubeClient.connect(str(own_apiserver.kubeconfig())) as client:
        for i in range(3):
            await client.create(CONFIGMAPS, _configmap(f"inf-{i}", "a"))
        informer = Informer(client, CONFIGMAPS, namespace=NS, watch_timeout_seconds=30)
        added: list[str] = []
        informer.add_handler(on_add=lambda o: added.append(o["metadata"]["name"]))
        task = asyncio.create_task(informer.run(), name="t-real-informer")
        try:
            assert await informer.wait_synced(30)
            await asyncio.to_thread(own_apiserver.control.restart_apiserver)  # type: ignore[union-attr]
            await client.create(CONFIGMAPS, _configmap("inf-3", "b"))
            for _ in range(300):
                if informer.get("inf-3", NS) is not None:
                    break
                await asyncio.sleep(0.1)
            names = sorted(o["metadata"]["name"] for o in informer.list())
            assert [n for n in names if n.startswith("inf-")] == [f"inf-{i}" for i in range(4)]
            # it watched again after the restart: from where it was when the new server's
            # watch cache covers that, else after a 410 and a relist (the test above)
            assert informer.stats.watches >= 2, informer.stats
            assert sorted(set(added)) == sorted(added)  # no object added twice
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_an_update_with_a_stale_resource_version_is_a_conflict(client: KubeClient) -> None:
    created = await client.create(CONFIGMAPS, _configmap("cas", "1"))
    first = copy.deepcopy(created)
    first["data"]["v"] = "2"
    await client.replace(CONFIGMAPS, first)
    stale = copy.deepcopy(created)
    stale["data"]["v"] = "3"
    with pytest.raises(Conflict):
        await client.replace(CONFIGMAPS, stale)


async def test_the_status_subresource_writes_status_only(own_apiserver: Cluster) -> None:
    cluster = own_apiserver
    client = await KubeClient.connect(str(cluster.kubeconfig()))
    name = "status-probe"
    obj = {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeMetric",
        "metadata": {"name": name},
        "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 60}},
    }
    created = await client.create(NODE_METRICS, obj)
    try:
        with_status = copy.deepcopy(created)
        with_status["status"] = {"updateTime": "2026-12-07T00:00:00Z"}
        with_status["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] = 90
        written = await client.replace(NODE_METRICS, with_status, sub="status")
        assert written["status"]["updateTime"] == "2026-12-07T00:00:00Z"
        assert written["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] == 60
        spec_change = copy.deepcopy(written)
        spec_change["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] = 90
        spec_change["status"] = {"updateTime": "2026-12-07T01:00:00Z"}
        after = await client.replace(NODE_METRICS, spec_change)
        assert after["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] == 90
        assert after["status"]["updateTime"] == "2026-12-07T00:00:00Z"
        assert after["metadata"]["generation"] == created["metadata"]["generation"] + 1
    finally:
        await client.close()


NODESLOS = [
    ({"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 65}}, True),
    ({"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": "65"}}, False),
    ({"resourceUsedThresholdWithBE": {"cpuSuppressPolicy": 3}}, False),
    ({"cpuBurstStrategy": {"cpuBurstPercent": 1000, "policy": "auto"}}, True),
    ({"systemStrategy": {"minFreeKbytesFactor": "x"}}, False),
]


@pytest.mark.parametrize(("spec", "valid"), NODESLOS, ids=[str(i) for i in range(len(NODESLOS))])
async def test_our_crd_validation_agrees_with_the_api_servers(
    cluster: Cluster, client: KubeClient, spec: dict[str, Any], valid: bool
) -> None:
    name = f"validation-{NODESLOS.index((spec, valid))}"
    obj = {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeSLO",
        "metadata": {"name": name},
        "spec": spec,
    }
    ours = load_crds().validate(obj)
    try:
        await client.create(NODE_SLOS, obj)
        accepted = True
    except ApiError as err:  # the API server's 422 Invalid
        accepted = False
        refusal = str(err)
    else:
        refusal = ""
    finally:
        cluster.kubectl("delete", "nodeslo", name, "--ignore-not-found", check=False)
    assert accepted == valid, refusal
    assert (ours == []) == valid, ours
    if not valid:
        assert "422" in refusal or "Invalid" in refusal, refusal


def _can(cluster: Cluster, account: str, verb: str, group: str, resource: str) -> bool:
    target = f"{resource}.{group}" if group else resource
    if "/" in resource:  # a subresource: RESOURCE --subresource=SUB
        base, sub = resource.split("/", 1)
        target = f"{base}.{group}" if group else base
        args = [target, f"--subresource={sub}"]
    else:
        args = [target]
    out = cluster.kubectl(
        "auth", "can-i", verb, *args, "--all-namespaces",
        f"--as=system:serviceaccount:{NAMESPACE}:{account}", check=False,
    )  # fmt: skip
    return out.strip() == "yes"


def test_the_koordlets_account_may_do_what_its_code_does_and_not_more(
    cluster: Cluster, koordinator: Koordinator
) -> None:
    denied = [t for t in sorted(KOORDLET_USED) if not _can(cluster, "koordlet", t[2], t[0], t[1])]
    assert denied == []
    for verb, group, resource in (
        ("delete", "", "pods"),
        ("update", "", "nodes"),
        ("create", "slo.koordinator.sh", "nodeslos"),
        ("get", "", "secrets"),
    ):
        assert not _can(cluster, "koordlet", verb, group, resource), (verb, resource)


def test_the_webhooks_account_may_keep_its_certificate_and_patch_only_its_configurations(
    cluster: Cluster, koordinator: Koordinator
) -> None:
    for verb, resource in (("get", "secrets"), ("update", "secrets")):
        out = cluster.kubectl(
            "auth", "can-i", verb, f"{resource}/koordinator-webhook-certs", "-n", NAMESPACE,
            f"--as=system:serviceaccount:{NAMESPACE}:koord-manager", check=False,
        )  # fmt: skip
        assert out.strip() == "yes", (verb, resource)
    hooks = "mutatingwebhookconfigurations.admissionregistration.k8s.io"
    mine = cluster.kubectl(
        "auth", "can-i", "patch", f"{hooks}/koordinator-mutating-webhook-configuration",
        f"--as=system:serviceaccount:{NAMESPACE}:koord-manager", check=False,
    )  # fmt: skip
    other = cluster.kubectl(
        "auth", "can-i", "patch", f"{hooks}/someone-elses",
        f"--as=system:serviceaccount:{NAMESPACE}:koord-manager", check=False,
    )  # fmt: skip
    assert mine.strip() == "yes"
    assert other.strip() == "no"
