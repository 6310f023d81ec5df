"""OOMScoreAdj at PreCreateContainer: the value of the pod's annotations (upstream's
``hooks/oomscoreadj`` tables: ``TestPlugin_SetContainerOOMScoreAdj``,
``Test_getOOMScoreAdjForContainer``) goes into the creation request, CRI's
``LinuxContainerResources.oom_score_adj`` through the hook server and NRI's
``LinuxContainerAdjustment.oom_score_adj`` (checked at NRI's field numbers, by hand)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from apis.cri.v1 import api_pb2 as cri
from apis.nri.v1alpha1 import api_pb2 as nriapi
from apis.pod_overrides import ANNOTATION_OOM_SCORE_ADJ, ANNOTATION_OOM_SCORE_ADJ_SPEC
from apis.runtime.v1alpha1 import api_pb2 as hookapi
from apis.slo_inforce import NodeSLOInForce
from koordlet.executor.audit import AuditLog
from koordlet.runtimehooks.framework import HookDispatcher
from koordlet.runtimehooks.hookserver import HookServer
from koordlet.runtimehooks.metrics import HookMetrics
from koordlet.runtimehooks.model import Change, ContainerRequest, HookPoint, PodMeta, Resources
from koordlet.runtimehooks.nrisession import adjustment, container_request
from koordlet.runtimehooks.oomscoreadj import OOMScoreAdj
from koordlet.runtimehooks.table import HOOKS, HookContext
from runtimeproxy.convert import merge_resources
from tests.runtimehooks.test_hookserver import call, container_hook_request

POD = PodMeta("test-pod", "test-ns", "xxxxxx")


def creq(annotations: dict[str, str] | None, name: str = "c1") -> ContainerRequest:
    return ContainerRequest(
        HookPoint.PRE_CREATE_CONTAINER, POD, name, container_id="",
        pod_annotations=annotations or {}, pod_cgroup_parent="/kubepods/besteffort/podxxxxxx",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("case", "annotations", "want"),
    [
        ("no annotation is a no-op", None, None),
        ("no oom score adj annotations", {"foo": "bar"}, None),
        ("pod-level default applied", {ANNOTATION_OOM_SCORE_ADJ: "-500"}, -500),
        ("container spec overrides pod-level default",
         {ANNOTATION_OOM_SCORE_ADJ: "-500", ANNOTATION_OOM_SCORE_ADJ_SPEC: '{"c1": 200}'}, 200),
        ("container not in spec falls back to pod-level default",
         {ANNOTATION_OOM_SCORE_ADJ: "-500", ANNOTATION_OOM_SCORE_ADJ_SPEC: '{"c2": 200}'}, -500),
        ("out-of-range value is rejected", {ANNOTATION_OOM_SCORE_ADJ: "-2000"}, None),
        ("invalid annotation is a no-op", {ANNOTATION_OOM_SCORE_ADJ_SPEC: "{invalid}"}, None),
        ("not an integer", {ANNOTATION_OOM_SCORE_ADJ: "1.5"}, None),
    ],
)  # fmt: skip
def test_the_container_starts_with_the_value_upstreams_rule_gives(
    case: str, annotations: dict[str, str] | None, want: int | None
) -> None:
    change = OOMScoreAdj().container(creq(annotations))
    got = None if change is None else change.resources.oom_score_adj
    assert got == want, case
    assert OOMScoreAdj().pod(None) is None  # type: ignore[arg-type]  # no pod-level value


def test_the_row_runs_at_pre_create_container_only_behind_its_gate() -> None:
    row = HOOKS["OOMScoreAdj"]
    assert row.gate == "OOMScoreAdj"
    assert row.points == frozenset({HookPoint.PRE_CREATE_CONTAINER})
    assert row.reconcile == frozenset()  # running processes are the oomscoreadj strategy's
    off = HookDispatcher(HOOKS, HookContext(node_slo=NodeSLOInForce),
                         enabled=lambda gate: gate != "OOMScoreAdj",
                         metrics=HookMetrics(CollectorRegistry()))  # fmt: skip
    assert "OOMScoreAdj" not in off.enabled_hooks


def varint(n: int) -> bytes:
    """Protobuf's varint of an int64 (a negative one as its two's complement, ten bytes)."""
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_nri_adjustment_carries_oom_score_adj_at_nris_field_numbers() -> None:
    # containerd/nri pkg/api/api.proto: ContainerAdjustment{linux=6},
    # LinuxContainerAdjustment{oom_score_adj=4}, OptionalInt{int64 value=1}; encoded by hand
    got = adjustment(Change(resources=Resources(oom_score_adj=-500))).SerializeToString()
    value = b"\x08" + varint(-500)
    optional = b"\x22" + bytes([len(value)]) + value
    assert got == b"\x32" + bytes([len(optional)]) + optional
    # 0 is a value NRI can carry (an OptionalInt that is present), unlike CRI's plain int64
    zero = adjustment(Change(resources=Resources(oom_score_adj=0))).SerializeToString()
    assert zero == b"\x32\x02\x22\x00"
    # and the value an NRI container arrives with is read back from the same field
    container = nriapi.Container(id="c1", name="main")
    container.linux.oom_score_adj.value = 1000
    pod = nriapi.PodSandbox(id="s", name="p", namespace="ns", uid="u")
    req = container_request(HookPoint.PRE_CREATE_CONTAINER, pod, container)
    assert req.resources.oom_score_adj == 1000


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[HookServer, AuditLog]]:
    audit = AuditLog(None)
    dispatcher = HookDispatcher(
        HOOKS, HookContext(node_slo=NodeSLOInForce), enabled=lambda gate: True,
        metrics=HookMetrics(CollectorRegistry()), audit=audit,
    )  # fmt: skip
    srv = HookServer(dispatcher, str(tmp_path / "koordlet.sock"))
    await srv.start()
    yield srv, audit
    await srv.stop()


async def test_through_the_hook_server_the_cri_request_gets_the_pods_value(
    server: tuple[HookServer, AuditLog],
) -> None:
    srv, audit = server
    req = container_hook_request({ANNOTATION_OOM_SCORE_ADJ: "-500"})  # the kubelet sent 1000
    resp = await call(srv.path, "PreCreateContainerHook", req,
                      hookapi.ContainerResourceHookResponse)  # fmt: skip
    assert isinstance(resp, hookapi.ContainerResourceHookResponse)
    assert resp.container_resources.oom_score_adj == -500
    # what the proxy then sends the runtime: the CRI request with the answer merged over it
    cri_res = cri.LinuxContainerResources(cpu_shares=2, oom_score_adj=1000)
    merge_resources(cri_res, resp.container_resources)
    assert cri_res.oom_score_adj == -500
    [entry] = [e for e in audit.recent(50) if e.knob == "oom_score_adj"]
    assert (entry.strategy, entry.old, entry.new) == ("runtimehooks/OOMScoreAdj", "1000", "-500")
