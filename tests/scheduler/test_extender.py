"""The extender over real HTTP on 127.0.0.1: filter, prioritize, bind, preempt."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer

from kubeclient.errors import Conflict
from scheduler_plugins.extender import Extender, SnapshotFile, make_app
from scheduler_plugins.snapshot import PodInfo
from scheduler_plugins.table import EXTENDER_PLUGINS, build_framework
from tests.scheduler.builders import as_list, node, node_metric, nrt, pod, ts

STATUS = "scheduling.koordinator.sh/resource-status"


def cluster(hot_cpu: str = "24") -> list[dict]:
    # NodeMetrics updated "now" (the extender runs on the wall clock)
    import time

    fresh = time.time() - 5
    metrics = [
        node_metric("hot", cpu=hot_cpu),
        node_metric("cool", cpu="12"),
        node_metric("numa", cpu="1"),
    ]
    for m in metrics:
        m["status"]["updateTime"] = ts(fresh)
    return [node("hot"), node("cool"), node("numa", cpu="16"), nrt("numa"), *metrics]


def lsr(name: str, cpus: int = 2) -> dict:
    return pod(
        name,
        requests={"cpu": str(cpus), "memory": "1Gi"},
        limits={"cpu": str(cpus), "memory": "1Gi"},
        labels={"koordinator.sh/qosClass": "LSR"},
        priority=9500,
    )


class RecordingBinder:
    """A fake API server's view: what was bound where, with which annotations."""

    def __init__(self, fail: bool = False) -> None:
        self.bound: list[tuple[str, str, dict[str, str]]] = []
        self.fail = fail

    async def bind(self, p: PodInfo, node_name: str, annotations: Mapping[str, str]) -> None:
        if self.fail:
            raise Conflict(409, "already bound")
        self.bound.append((p.key, node_name, dict(annotations)))


@pytest.fixture
def snapshot_file(tmp_path: Path) -> Path:
    path = tmp_path / "snapshot.yaml"
    path.write_text(yaml.safe_dump(as_list(*cluster())))
    return path


@pytest.fixture
def binder() -> RecordingBinder:
    return RecordingBinder()


@pytest.fixture
async def http(
    snapshot_file: Path, binder: RecordingBinder
) -> AsyncIterator[tuple[aiohttp.ClientSession, str, Extender]]:
    source = SnapshotFile(snapshot_file)
    ext = Extender(build_framework(EXTENDER_PLUGINS), source.load(), source=source, binder=binder)
    server = TestServer(make_app(ext), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            yield session, str(server.make_url("")), ext
    finally:
        await server.close()


async def post(session: aiohttp.ClientSession, url: str, body: object) -> object:
    async with session.post(url, data=json.dumps(body)) as resp:
        assert resp.status == 200
        return await resp.json()


async def test_filter_by_node_names_fails_hot_nodes_with_koordinators_reason(http):
    session, base, _ = http
    result = await post(
        session,
        base + "/filter",
        {"Pod": pod("p", requests={"cpu": "1"}), "NodeNames": ["hot", "cool", "numa"]},
    )
    assert result["NodeNames"] == ["cool", "numa"]
    assert result["FailedNodes"] == {
        "hot": "node(s) cpu usage exceed threshold, cpu usage 78% > threshold 65%"
    }
    assert result["Error"] == ""


async def test_filter_with_full_node_objects_echoes_the_passing_nodes(http):
    session, base, _ = http
    nodes = {"items": [node("hot"), node("cool"), node("new-node")]}
    result = await post(
        session, base + "/filter", {"Pod": pod("p", requests={"cpu": "1"}), "Nodes": nodes}
    )
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["cool", "new-node"]
    assert list(result["FailedNodes"]) == ["hot"]


async def test_prioritize_scores_on_the_extender_scale_preferring_the_least_used_node(http):
    session, base, _ = http
    body = {"Pod": pod("p", requests={"cpu": "1"}), "NodeNames": ["cool", "numa"]}
    await post(session, base + "/filter", body)
    scores = {h["Host"]: h["Score"] for h in await post(session, base + "/prioritize", body)}
    assert set(scores) == {"cool", "numa"}
    assert all(0 <= s <= 10 for s in scores.values())
    # cpu: numa (16 - 1 - 0.85) / 16 = 88 %, cool (32 - 12 - 0.85) / 32 = 59 %; memory 99 % free
    assert scores == {"numa": (88 + 99) // 2 // 10, "cool": (59 + 99) // 2 // 10}


async def test_bind_writes_the_cpuset_and_assumes_the_pod_for_the_next_one(http, binder):
    session, base, ext = http
    for name in ("a", "b"):
        p = lsr(name)
        result = await post(
            session, base + "/filter", {"Pod": p, "NodeNames": ["hot", "cool", "numa"]}
        )
        assert result["NodeNames"] == ["numa"]  # only numa has a CPU topology
        bound = await post(
            session,
            base + "/bind",
            {
                "PodName": name,
                "PodNamespace": "default",
                "PodUID": p["metadata"]["uid"],
                "Node": "numa",
            },
        )
        assert bound == {"Error": ""}
    cpusets = [json.loads(ann[STATUS])["cpuset"] for _, _, ann in binder.bound]
    assert [(k, n) for k, n, _ in binder.bound] == [("default/a", "numa"), ("default/b", "numa")]
    assert cpusets == ["0,8", "1,9"]
    assert {p.key for p in ext.snapshot.nodes["numa"].pods.values()} == {"default/a", "default/b"}


async def test_a_failed_bind_is_reported_and_unreserved(snapshot_file):
    source = SnapshotFile(snapshot_file)
    ext = Extender(
        build_framework(EXTENDER_PLUGINS), source.load(), binder=RecordingBinder(fail=True)
    )
    p = lsr("a")
    ext.filter({"Pod": p, "NodeNames": ["numa"]})
    result = await ext.bind(
        {"PodName": "a", "PodNamespace": "default", "PodUID": p["metadata"]["uid"], "Node": "numa"}
    )
    assert "already bound" in result["Error"]
    assert ext.snapshot.nodes["numa"].pods == {}


async def test_bind_of_a_pod_never_filtered_is_an_error(http):
    session, base, _ = http
    result = await post(
        session,
        base + "/bind",
        {"PodName": "x", "PodNamespace": "default", "PodUID": "u", "Node": "cool"},
    )
    assert "was not filtered here" in result["Error"]


async def test_preempt_keeps_nodes_where_the_victims_make_room(tmp_path):
    objects = [
        node("small", cpu="4"),
        pod("victim", node_name="small", requests={"cpu": "3"}),
        node("tiny", cpu="2"),
        pod("other", node_name="tiny", requests={"cpu": "1"}),
    ]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(as_list(*objects)))
    ext = Extender(build_framework(EXTENDER_PLUGINS), SnapshotFile(path).load())
    body = {
        "Pod": pod("big", requests={"cpu": "3"}),
        "NodeNameToMetaVictims": {
            "small": {"Pods": [{"UID": "uid-default-victim"}], "NumPDBViolations": 0},
            "tiny": {"Pods": [{"UID": "uid-default-other"}], "NumPDBViolations": 1},
        },
    }
    result = ext.preempt(body)
    assert result == {
        "NodeNameToMetaVictims": {
            "small": {"Pods": [{"UID": "uid-default-victim"}], "NumPDBViolations": 0}
        }
    }
    assert {p.name for p in ext.snapshot.nodes["small"].pods.values()} == {
        "victim"
    }  # nothing evicted


async def test_the_snapshot_file_is_reread_when_it_changes(http, snapshot_file):
    session, base, _ = http
    body = {"Pod": pod("p", requests={"cpu": "1"}), "NodeNames": ["hot"]}
    assert (await post(session, base + "/filter", body))["NodeNames"] == []
    snapshot_file.write_text(yaml.safe_dump(as_list(*cluster(hot_cpu="2"))))
    assert (await post(session, base + "/filter", body))["NodeNames"] == ["hot"]


async def test_bad_json_is_a_400(http):
    session, base, _ = http
    async with session.post(base + "/filter", data="{nope") as resp:
        assert resp.status == 400
    async with session.get(base + "/healthz") as resp:
        assert resp.status == 200


def test_a_pod_sent_again_with_other_requests_is_scored_on_its_new_requests(
    snapshot_file: Path,
) -> None:
    # The cycle a pod's filter made is reused by prioritize while nothing changed; a pod object
    # that changed (same UID, other requests) must not be scored on the old one's estimates.
    def extender() -> Extender:
        source = SnapshotFile(snapshot_file)
        return Extender(build_framework(EXTENDER_PLUGINS), source.load(), source=source)

    small = {"Pod": pod("p", requests={"cpu": "1"}), "NodeNames": ["cool", "numa"]}
    large = {"Pod": pod("p", requests={"cpu": "8"}), "NodeNames": ["cool", "numa"]}
    seen_small = extender()
    seen_small.filter(small)
    only_large = extender()
    only_large.filter(large)

    rescored = seen_small.prioritize(large)

    assert rescored == only_large.prioritize(large)
    assert rescored != seen_small.prioritize(small)  # the requests do move the scores
