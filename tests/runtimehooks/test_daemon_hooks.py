"""The daemon's runtimehooks stage: the hook server answers on its socket once the koordlet is
ready, koordlet.json is written for the proxy, /debug/capabilities says why what cannot run does
not, and the socket is gone after stop."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import grpc

from apis.runtime.v1alpha1 import api_pb2 as hookapi
from koordlet.config import RuntimeHooksConfig
from koordlet.features import FeatureGates
from koordlet.runtimehooks import cookies
from tests.daemon import one_value
from tests.daemon.test_daemon_inprocess import fake as fake  # the fixture
from tests.daemon.test_daemon_inprocess import make_config, running
from tests.fakehost import FakeHost
from tests.runtimehooks.helpers import BE_LABELS, batch, spec_annotation


async def test_the_daemon_serves_the_hook_socket_and_registers_for_the_proxy(
    fake: FakeHost,
    tmp_path: Path,
) -> None:
    sock = tmp_path / "run" / "koordlet.sock"
    sock.parent.mkdir()
    hookserver_d = tmp_path / "hookserver.d"
    hookserver_d.mkdir()
    hooks = RuntimeHooksConfig(
        addr=str(sock),
        host_endpoint="/var/run/koordlet/koordlet.sock",
        config_path=str(hookserver_d),
        nri=True,
        var_run_root=str(tmp_path / "no-runtime"),
    )
    async with running(make_config(fake, runtime_hooks=hooks)) as run:
        registered = json.loads((hookserver_d / "koordlet.json").read_text())
        assert registered["remote-endpoint"] == "/var/run/koordlet/koordlet.sock"
        assert "PreCreateContainer" in registered["runtime-hooks"]
        req = hookapi.ContainerResourceHookRequest(
            pod_meta=hookapi.PodSandboxMetadata(name="be-1", namespace="default", uid="u1"),
            container_mata=hookapi.ContainerMetadata(name="main"),
            pod_labels=BE_LABELS,
            pod_annotations=spec_annotation({"main": batch("500", "1000", "1Gi")}),
        )
        async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
            call = channel.unary_unary(
                "/runtime.v1alpha1.RuntimeHookService/PreCreateContainerHook",
                request_serializer=hookapi.ContainerResourceHookRequest.SerializeToString,
                response_deserializer=hookapi.ContainerResourceHookResponse.FromString,
            )
            resp = await call(req, timeout=5)
        assert resp.container_resources.cpu_shares == 512
        assert resp.container_resources.cpu_quota == 100_000
        samples = await run.samples()
        requests = one_value(
            samples,
            "koordlet_runtime_hook_requests_total",
            mode="proxy",
            stage="PreCreateContainer",
        )
        assert requests == 1
    assert not sock.exists()


async def test_a_missing_socket_folder_is_reported_not_created(
    fake: FakeHost,
    tmp_path: Path,
) -> None:
    hooks = RuntimeHooksConfig(addr=str(tmp_path / "absent" / "koordlet.sock"), nri=False)
    async with running(make_config(fake, runtime_hooks=hooks)) as run:
        caps = await run.json("/debug/capabilities")
        assert caps["runtimehooks/hookserver"]["supported"] is False
        assert "absent" in caps["runtimehooks/hookserver"]["reason"]
        assert "disabled" in caps["runtimehooks/nri"]["reason"]
    assert not (tmp_path / "absent").exists()


async def test_what_this_host_cannot_do_for_the_hooks_is_in_debug_capabilities(
    fake: FakeHost,
) -> None:
    """CoreSched and Resctrl on: the fake node has no resctrl mount, and this kernel (the real
    prctl is asked) no core scheduling; both are reported with the reason, the reconciler runs."""
    gates = FeatureGates({"CoreSched": True, "Resctrl": True, "TCNetworkQoS": True})
    cfg = replace(make_config(fake), feature_gates=gates)
    async with running(cfg) as run:
        caps = await run.json("/debug/capabilities")
        assert "not mounted" in caps["runtimehooks/resctrl"]["reason"]
        why = cookies.probe()
        if why:  # a kernel without CONFIG_SCHED_CORE, as this machine's
            assert caps["runtimehooks/coresched"] == {"supported": False, "reason": why}
        else:
            assert "runtimehooks/coresched" not in caps
        # v1 without a net_cls mount, or v2: the tc class id knob names its reason
        assert caps["net_cls_classid"]["supported"] is False
        tasks = await run.json("/debug/tasks")
        assert "runtimehooks-reconciler" in json.dumps(tasks)
