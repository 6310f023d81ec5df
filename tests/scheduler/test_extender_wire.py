"""The extender against the bodies a stock kube-scheduler v1.25 really sent (every verb, with
``nodeCacheCapable`` true and false), replayed over HTTP byte for byte as captured
(``tests/golden/captures/``), to an extender whose snapshot informers keep and whose binder
writes to the fake API server. The answers are checked against the Go types of
``k8s.io/kube-scheduler/extender/v1`` (``ExtenderFilterResult``, ``HostPriorityList``,
``ExtenderBindingResult``, ``ExtenderPreemptionResult``): Go field names, no json tags."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from scheduler_plugins.extender import Extender, KubeBinder, make_app
from scheduler_plugins.informed import InformedSnapshot
from scheduler_plugins.table import build_framework
from tests.kubefake.fixtures import eventually
from tests.scheduler.bindingfake import BindingFakeApiServer

CAPTURES = Path(__file__).resolve().parents[1] / "golden" / "captures"
FILTER_RESULT_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


@dataclass(frozen=True)
class Capture:
    path: str
    raw: bytes
    """The body's bytes exactly as the capture line holds them."""
    body: dict[str, Any]


def captures(name: str) -> list[Capture]:
    """The requests of one capture file, each body sliced out of its line unparsed."""
    out = []
    decoder = json.JSONDecoder()
    for line in (CAPTURES / f"kube-scheduler-v1.25-extender-{name}.jsonl").read_text().splitlines():
        record = json.loads(line)
        start = line.index('"body":') + len('"body":')
        while line[start] == " ":
            start += 1
        body, end = decoder.raw_decode(line, start)
        assert body == record["body"]
        out.append(Capture(record["path"], line[start:end].encode(), body))
    return out


def nodes_as_sent() -> list[dict[str, Any]]:
    """kn1 and kn2 as kube-scheduler serialized them (4 cpu, 8Gi, 110 pods each)."""
    first = captures("filter-fullnodes")[0]
    return copy.deepcopy(first.body["Nodes"]["items"])


@dataclass
class Wire:
    api: BindingFakeApiServer
    informed: InformedSnapshot
    ext: Extender
    session: aiohttp.ClientSession
    base: str

    async def send(self, capture: Capture) -> tuple[int, Any]:
        async with self.session.post(self.base + capture.path, data=capture.raw) as resp:
            assert resp.content_type == "application/json"
            return resp.status, await resp.json()

    def pod_on(self, name: str) -> str:
        obj = self.api.get("pods", name, "capture") or {}
        return str((obj.get("spec") or {}).get("nodeName") or "")


@pytest.fixture
async def wire(api) -> AsyncIterator[Wire]:
    server, client = api
    for n in nodes_as_sent():
        server.put("nodes", n)
    informed = InformedSnapshot(client)
    ext = Extender(
        build_framework(), informed.snapshot, binder=KubeBinder(client), gate=informed.not_ready
    )
    task = asyncio.create_task(informed.run(), name="t-wire-informers")
    http = TestServer(make_app(ext), host="127.0.0.1")
    await http.start_server()
    try:
        assert await informed.wait_synced(10)
        async with aiohttp.ClientSession() as session:
            yield Wire(server, informed, ext, session, str(http.make_url("")))
    finally:
        await http.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def create_pod(w: Wire, capture: Capture, node: str = "") -> None:
    """The pod of a captured request, as the API server holds it (its uid kept)."""
    obj = copy.deepcopy(capture.body["Pod"])
    if node:
        obj["spec"]["nodeName"] = node
    w.api.put("pods", obj)


def assert_filter_result(result: dict[str, Any]) -> None:
    assert set(result) == FILTER_RESULT_KEYS
    assert result["Error"] == ""
    assert isinstance(result["FailedNodes"], dict)
    assert isinstance(result["FailedAndUnresolvableNodes"], dict)


async def test_every_verb_of_the_node_cache_capable_run_answers_in_the_go_types(wire):
    w = wire
    plain, low, high = captures("filter-nodecache")
    for c in (plain, low, high):
        create_pod(w, c)
    await eventually(lambda: len(w.informed.snapshot.pending_pods) == 3)

    # plain: both nodes pass; NodeNames answered, Nodes null
    status, result = await w.send(plain)
    assert status == 200
    assert_filter_result(result)
    assert result["Nodes"] is None
    assert result["NodeNames"] == ["kn1", "kn2"]
    assert result["FailedNodes"] == {}
    (prioritize,) = captures("prioritize")
    status, scores = await w.send(prioritize)
    assert status == 200
    assert [h["Host"] for h in scores] == ["kn1", "kn2"]
    assert all(set(h) == {"Host", "Score"} and 0 <= h["Score"] <= 10 for h in scores)
    bind_plain, bind_low, bind_high = captures("bind")
    assert await w.send(bind_plain) == (200, {"Error": ""})
    assert w.pod_on("plain") == "kn2"

    # low: 3500m on kn1
    status, result = await w.send(low)
    assert (status, result["NodeNames"], result["FailedNodes"]) == (200, ["kn1"], {})
    assert await w.send(bind_low) == (200, {"Error": ""})
    assert w.pod_on("low") == "kn1"

    # high (1 cpu) does not fit beside low: kube-scheduler asks the extender to confirm the
    # victims it chose; the answer names them by UID
    (preempt,) = captures("preempt")
    status, answer = await w.send(preempt)
    assert status == 200
    low_uid = preempt.body["NodeNameToMetaVictims"]["kn1"]["Pods"][0]["UID"]
    assert low_uid == low.body["Pod"]["metadata"]["uid"]
    assert answer == {
        "NodeNameToMetaVictims": {"kn1": {"Pods": [{"UID": low_uid}], "NumPDBViolations": 0}}
    }
    assert w.pod_on("low") == "kn1"  # the extender evicts nothing itself

    # kube-scheduler deletes the victim, then filters and binds high
    w.api.remove("pods", "low", "capture")
    await eventually(lambda: all(p.name != "low" for p in w.informed.snapshot.all_pods()))
    status, result = await w.send(high)
    assert (status, result["NodeNames"], result["FailedNodes"]) == (200, ["kn1"], {})
    assert await w.send(bind_high) == (200, {"Error": ""})
    assert w.pod_on("high") == "kn1"
    # the pods' bindings went through the API server
    bindings = [r.path for r in w.api.writes("POST", "/binding")]
    assert bindings == [
        "/api/v1/namespaces/capture/pods/plain/binding",
        "/api/v1/namespaces/capture/pods/low/binding",
        "/api/v1/namespaces/capture/pods/high/binding",
    ]


async def test_every_verb_of_the_full_nodes_run_answers_with_the_node_objects_sent(wire):
    w = wire
    plain, low, high = captures("filter-fullnodes")
    for c in (plain, low, high):
        create_pod(w, c)
    await eventually(lambda: len(w.informed.snapshot.pending_pods) == 3)

    status, result = await w.send(plain)
    assert status == 200
    assert_filter_result(result)
    assert result["NodeNames"] is None
    # the NodeList echoes the request's own Node objects (kube-scheduler decodes them)
    assert result["Nodes"] == {"metadata": {}, "items": plain.body["Nodes"]["items"]}
    (prioritize,) = captures("prioritize-fullnodes")
    status, scores = await w.send(prioritize)
    assert status == 200
    assert [h["Host"] for h in scores] == ["kn1", "kn2"]

    status, result = await w.send(low)
    assert status == 200
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["kn1"]
    # kube-scheduler binds low itself in this run (no bindVerb capture here)
    w.api.remove("pods", "low", "capture")
    create_pod(w, low, node="kn1")
    kn1 = w.informed.snapshot.nodes["kn1"]
    await eventually(lambda: any(p.name == "low" for p in kn1.pods.values()))

    # the victims come as full Pods; the answer is still by UID
    (preempt,) = captures("preempt-fullnodes")
    assert preempt.body["NodeNameToMetaVictims"] is None
    status, answer = await w.send(preempt)
    low_uid = low.body["Pod"]["metadata"]["uid"]
    assert (status, answer) == (
        200,
        {"NodeNameToMetaVictims": {"kn1": {"Pods": [{"UID": low_uid}], "NumPDBViolations": 0}}},
    )
    w.api.remove("pods", "low", "capture")
    await eventually(lambda: not w.informed.snapshot.nodes["kn1"].pods)
    status, result = await w.send(high)
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["kn1"]


async def test_the_first_capture_filters_a_plain_pod_and_names_the_missing_pod_group(wire):
    w = wire
    ext_1, gang_member = captures("filter")
    status, result = await w.send(ext_1)
    assert status == 200
    assert_filter_result(result)
    assert result["NodeNames"] == ["kn1", "kn2"]
    # a member of a gang whose PodGroup does not exist: failed on both nodes, with a reason
    status, result = await w.send(gang_member)
    assert status == 200
    assert_filter_result(result)
    assert result["NodeNames"] == []
    reason = "can't find gang, gangName: colo/gang-ext, podName: colo/ext-gang-0"
    assert result["FailedNodes"] == {"kn1": reason, "kn2": reason}


async def test_a_node_the_extender_does_not_know_is_failed_as_unresolvable(wire):
    w = wire
    plain = captures("filter-nodecache")[0]
    body = copy.deepcopy(plain.body)
    body["NodeNames"] = ["kn1", "gone"]
    async with w.session.post(w.base + "/filter", json=body) as resp:
        result = await resp.json()
    assert result["NodeNames"] == ["kn1"]
    assert result["FailedNodes"] == {}
    assert result["FailedAndUnresolvableNodes"] == {"gone": "node(s) not found"}


# -- requests the types do not describe ----------------------------------------------------------


async def post_json(w: Wire, path: str, body: Any) -> tuple[int, Any]:
    async with w.session.post(w.base + path, json=body) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (
            lambda b: {"pod": b["Pod"], "nodenames": b["NodeNames"]},
            "ExtenderArgs: pod: unknown field (the extender API's keys are Go field names: 'Pod')",
        ),
        (lambda b: {"NodeNames": b["NodeNames"]}, "ExtenderArgs: Pod: missing"),
        (lambda b: {**b, "Pod": None}, "ExtenderArgs: Pod: missing"),
        (lambda b: {**b, "NodeNames": None}, "ExtenderArgs: NodeNames: missing"),
        (lambda b: {**b, "NodeNames": "kn1"}, "ExtenderArgs: NodeNames: must be an array"),
        (lambda b: {**b, "NodeNames": [1]}, "ExtenderArgs: NodeNames[0]: must be a string"),
        (lambda b: {**b, "Nodes": {"items": []}}, "both Nodes and NodeNames given"),
        (lambda b: {**b, "Extra": 1}, "ExtenderArgs: Extra: unknown field (expected Pod,"),
        (lambda b: [b], "ExtenderArgs: must be an object, got an array"),
        (
            lambda b: {**b, "Pod": {**b["Pod"], "spec": {"containers": 3}}},
            "ExtenderArgs: Pod.spec.containers",
        ),
    ],
)
async def test_a_bad_filter_request_is_answered_with_an_error_naming_the_field(wire, mutate, error):
    body = mutate(copy.deepcopy(captures("filter-nodecache")[0].body))
    status, result = await post_json(wire, "/filter", body)
    assert status == 200
    assert set(result) == FILTER_RESULT_KEYS
    assert error in result["Error"]
    assert result["NodeNames"] in (None, [])


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            {"podName": "plain", "podNamespace": "capture", "podUID": "u", "node": "kn1"},
            "ExtenderBindingArgs: podName: unknown field (the extender API's keys are Go "
            "field names: 'PodName')",
        ),
        ({"PodName": "plain", "PodNamespace": "capture", "PodUID": "u"}, "Node: missing"),
        (
            {"PodName": "plain", "PodNamespace": "capture", "PodUID": "u", "Node": 3},
            "ExtenderBindingArgs: Node: must be a non-empty string, got 3",
        ),
    ],
)
async def test_a_bad_bind_request_is_answered_with_an_error(wire, body, error):
    status, result = await post_json(wire, "/bind", body)
    assert status == 200
    assert set(result) == {"Error"}
    assert error in result["Error"]
    assert wire.api.writes("POST", "/binding") == []


async def test_a_bad_prioritize_or_preempt_request_is_a_400_with_an_error(wire):
    plain = captures("prioritize")[0].body
    status, result = await post_json(wire, "/prioritize", {"pod": plain["Pod"]})
    assert status == 400
    assert "ExtenderArgs: pod: unknown field" in result["Error"]
    preempt = copy.deepcopy(captures("preempt")[0].body)
    preempt["NodeNameToMetaVictims"]["kn1"]["Pods"] = [{"uid": "x"}]
    status, result = await post_json(wire, "/preempt", preempt)
    assert status == 400
    assert result["Error"].startswith(
        "ExtenderPreemptionArgs: NodeNameToMetaVictims[kn1].Pods[0].uid: unknown field"
    )
    async with wire.session.post(wire.base + "/filter", data=b"{not json") as resp:
        assert resp.status == 400
        assert (await resp.json())["Error"].startswith("body is not JSON")
