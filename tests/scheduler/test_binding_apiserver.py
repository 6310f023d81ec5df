"""The standalone scheduler's binding cycle against a real kube-apiserver (v1.25 from
``../shared/k8s`` through :mod:`envtest`: etcd and the API server, no kubelet, no controller
manager): what the fake API server cannot show. Concurrent bindings fill nodes exactly as the
real server records them; the real server refuses a binding for a pod bound meanwhile, and the
assumption gives way to the server's copy without a retry or a report; it binds a pod recreated
under the same name by name; it accepts the Events, their series patches and the PodScheduled
condition as written. Skips with one line naming what is missing where the binaries are
absent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from envtest import assets
from envtest.cluster import Cluster
from kubeclient.client import KubeClient
from kubeclient.resources import EVENTS_V1, NODES, PODS
from scheduler_plugins.config import SchedulerConfig
from scheduler_plugins.extender import KubeBinder
from scheduler_plugins.informed import InformedSnapshot
from scheduler_plugins.reporting import EventRecorder
from scheduler_plugins.snapshot import PodInfo
from scheduler_plugins.standalone import Scheduler, build_scheduler
from tests.kubefake.fixtures import eventually

_WHY = assets.why_not(node=False)
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"real API server: {_WHY}")

CRDS = Path(__file__).resolve().parents[2] / "packaging" / "kubernetes" / "crds"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(nodes=0, controller_manager=False, scheduler=False)
    try:
        c.start()
        c.kubectl("apply", "--server-side", "-f", str(CRDS))
        yield c
    finally:
        c.close()


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[tuple[KubeClient, str]]:
    """An admin client and a namespace of the test's own (with its default ServiceAccount:
    no controller manager makes one)."""
    ns = f"t{time.monotonic_ns() % 10**9}"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("create", "serviceaccount", "default", "-n", ns)
    async with await KubeClient.connect(str(cluster.kubeconfig())) as c:
        yield c, ns


async def make_nodes(client: KubeClient, prefix: str, count: int, cpu: str) -> list[str]:
    names = [f"{prefix}-{i}" for i in range(count)]
    for name in names:
        alloc = {"cpu": cpu, "memory": "4Gi", "pods": "110"}
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test"}
        await client.create(
            NODES,
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"pool": prefix}},
                "status": {"capacity": alloc, "allocatable": alloc, "conditions": [ready]},
            },
        )
        # the admission taints a new Node not-ready; no node lifecycle controller lifts it here
        await client.patch(NODES, name, {"spec": {"taints": None}})
    return names


def pod_object(name: str, ns: str, pool: str, cpu: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "schedulerName": "koord-scheduler",
            "nodeSelector": {"pool": pool},
            "containers": [
                {"name": "c", "image": "127.0.0.1:5999/pause:test", "imagePullPolicy": "Never",
                 "resources": {"requests": {"cpu": cpu}}}
            ],
        },
    }  # fmt: skip


async def pods_of(client: KubeClient, ns: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in (await client.list(PODS, ns)).items}


async def events_of(client: KubeClient, ns: str, name: str) -> list[dict[str, Any]]:
    return [e for e in (await client.list(EVENTS_V1, ns)).items if e["regarding"]["name"] == name]


async def polled(read: Callable[[], Awaitable[int]], at_least: int, within: float = 30.0) -> None:
    """Wait until ``read()`` (state of the API server, which has no event to wait on: it is
    polled) says at least ``at_least``; the caller asserts what it says then."""
    deadline = time.monotonic() + within
    while await read() < at_least and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.1)


async def test_concurrent_bindings_fill_each_node_exactly_and_the_rest_is_reported(client):
    c, ns = client
    nodes = await make_nodes(c, ns, 6, "1")
    informed, sched = build_scheduler(c, SchedulerConfig())
    tasks = [asyncio.create_task(informed.run(), name="t-informers")]
    try:
        assert await informed.wait_synced(20)
        tasks.append(asyncio.create_task(sched.run(), name="t-scheduler"))
        for i in range(7):
            await c.create(PODS, pod_object(f"p{i}", ns, ns))

        async def bound() -> int:
            return sum(1 for p in (await pods_of(c, ns)).values() if p["spec"].get("nodeName"))

        await polled(lambda: bound(), 6)
        pods = await pods_of(c, ns)
        placed = [p["spec"].get("nodeName") for p in pods.values()]
        assert sorted(n for n in placed if n) == nodes  # one 1-core pod on each 1-core node
        (left,) = [name for name, p in pods.items() if not p["spec"].get("nodeName")]
        # the real server holds what kube-scheduler would have written: a Scheduled Event per
        # bound pod, the unschedulable pod's Event and PodScheduled condition, and once it has
        # failed again at the same resourceVersion, the series patch the server accepted
        for name, p in pods.items():
            if name != left:
                notes = [e["note"] for e in await events_of(c, ns, name)]
                assert notes == [f"Successfully assigned {ns}/{name} to {p['spec']['nodeName']}"]

        async def series() -> int:
            return max(
                (e.get("series", {}).get("count", 1) for e in await events_of(c, ns, left)),
                default=0,
            )

        await polled(lambda: series(), 2)
        failed = await events_of(c, ns, left)
        total = len(informed.snapshot.nodes)  # other tests' nodes too: their selector says no
        (note,) = {e["note"] for e in failed}
        assert note.startswith(f"0/{total} nodes are available: ")
        assert "6 Insufficient cpu" in note
        assert note.endswith(f"preemption: 0/{total} nodes are available: {total} No preemption "
                             "victims found for incoming pod..")  # fmt: skip
        assert await series() >= 2
        cond = next(
            x for x in (await pods_of(c, ns))[left]["status"]["conditions"]
            if x["type"] == "PodScheduled"
        )  # fmt: skip
        assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Notes(EventRecorder):
    """Keeps what it would record: (regarding name, reason, note)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.notes: list[tuple[str, str, str]] = []

    def record(self, regarding: Mapping[str, str], type_: str, reason: str, action: str,
               note: str, *, namespace: str = "", related: Mapping[str, str] | None = None,
               ) -> None:  # fmt: skip
        self.notes.append((regarding["name"], reason, note))


class GatedBinder(KubeBinder):
    """The real binder, each binding held until the test releases it."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.release = asyncio.Event()

    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        await self.release.wait()
        await super().bind(pod, node, annotations)


async def test_a_binding_the_real_server_refuses_leaves_the_pod_where_the_server_has_it(client):
    c, ns = client
    nodes = await make_nodes(c, ns, 2, "2")
    informed = InformedSnapshot(c)
    binder, notes = GatedBinder(c), Notes()
    sched = Scheduler(SchedulerConfig().framework(), informed.snapshot, binder, notes)
    snap = informed.snapshot
    task = asyncio.create_task(informed.run(), name="t-informers")
    try:
        assert await informed.wait_synced(20)
        created = await c.create(PODS, pod_object("p", ns, ns))
        uid = created["metadata"]["uid"]
        await eventually(lambda: uid in snap.pending_pods, within=10)
        ours = await sched.schedule_one(snap.pending_pods[uid])
        assert ours in nodes
        # another scheduler binds it elsewhere first; the informers bring that
        (other,) = [n for n in nodes if n != ours]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "p", "namespace": ns},
            "target": {"apiVersion": "v1", "kind": "Node", "name": other},
        }
        await c.request("POST", PODS.path(ns, "p", "binding"), body=binding)
        await eventually(lambda: uid in snap.nodes[other].pods, within=10)
        assert not snap.is_assumed(uid)
        assert uid not in snap.nodes[ours].pods  # the assumption gave way to the server's copy
        binder.release.set()
        await sched.wait_bindings()
        # the real server refused ours (409: already assigned): nothing to undo, retry or report
        assert (sched.binding_failures, sched.bound) == (1, 0)
        assert uid not in snap.pending_pods
        assert set(snap.nodes[other].pods) == {uid}
        assert snap.nodes[ours].pods == {}
        assert notes.notes == []
        assert sched._pop_ready() == (None, None)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sched.close()


async def test_a_pod_recreated_before_its_binding_is_bound_by_name_as_the_server_does(client):
    c, ns = client
    (node,) = await make_nodes(c, ns, 1, "2")
    informed = InformedSnapshot(c)
    binder, notes = GatedBinder(c), Notes()
    sched = Scheduler(SchedulerConfig().framework(), informed.snapshot, binder, notes)
    snap = informed.snapshot
    task = asyncio.create_task(informed.run(), name="t-informers")
    try:
        assert await informed.wait_synced(20)
        first = await c.create(PODS, pod_object("p", ns, ns))
        old_uid = first["metadata"]["uid"]
        await eventually(lambda: old_uid in snap.pending_pods, within=10)
        assert await sched.schedule_one(snap.pending_pods[old_uid]) == node
        await c.delete(PODS, "p", ns, options={"gracePeriodSeconds": 0})
        second = await c.create(PODS, pod_object("p", ns, ns))
        new_uid = second["metadata"]["uid"]
        await eventually(lambda: new_uid in snap.pending_pods, within=10)
        assert not snap.is_assumed(old_uid)  # deleted: its assumption went with it
        binder.release.set()
        await sched.wait_bindings()
        # the v1.25 server binds by name (the Binding's uid is not a precondition there), as it
        # does kube-scheduler's: the new pod is bound, and the snapshot follows the server
        assert (sched.binding_failures, sched.bound) == (0, 1)
        await eventually(lambda: new_uid in snap.nodes[node].pods, within=10)
        assert old_uid not in snap.nodes[node].pods
        assert new_uid not in snap.pending_pods
        assert (await pods_of(c, ns))["p"]["metadata"]["uid"] == new_uid
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sched.close()
