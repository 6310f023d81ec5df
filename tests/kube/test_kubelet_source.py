"""The kubelet's ``/pods`` pod source against a real aiohttp server on 127.0.0.1 as the kubelet."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from koordlet.statesinformer.inventory import WorkloadInventory
from koordlet.statesinformer.kube import pod_info
from koordlet.statesinformer.kubelet import (
    KubeletPodsSource,
    KubeletResponseError,
    KubeletSourceConfig,
    KubeletUnavailable,
    parse_pod_list,
)
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from tests.fakehost import FakeHost

NODE = "node-1"
UID_BE = "11111111-2222-3333-4444-555555555555"
UID_LS = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
UID_OTHER = "00000000-0000-0000-0000-000000000000"
UID_DONE = "10000000-0000-0000-0000-000000000000"
CID = "ab" * 32
TOKEN = "token-one"


def _pods() -> list[dict[str, Any]]:
    be = {
        "metadata": {
            "name": "batch",
            "namespace": "jobs",
            "uid": UID_BE,
            "labels": {"koordinator.sh/qosClass": "BE"},
            "creationTimestamp": "2026-01-02T03:04:05Z",
        },
        "spec": {
            "nodeName": NODE,
            "priority": 5500,
            "containers": [
                {"name": "c", "resources": {"requests": {"kubernetes.io/batch-cpu": "1k"}}}
            ],
        },
        "status": {
            "phase": "Running",
            "qosClass": "BestEffort",
            "containerStatuses": [{"name": "c", "containerID": f"containerd://{CID}"}],
        },
    }
    ls = {
        "metadata": {"name": "web", "namespace": "prod", "uid": UID_LS},
        "spec": {
            "nodeName": NODE,
            "containers": [
                {
                    "name": "a",
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "1Gi"},
                        "limits": {"cpu": "1", "memory": "2Gi"},
                    },
                }
            ],
        },
        "status": {"phase": "Running"},
    }
    other = {
        "metadata": {"name": "elsewhere", "namespace": "x", "uid": UID_OTHER},
        "spec": {"nodeName": "node-2", "containers": []},
    }
    done = {
        "metadata": {"name": "done", "namespace": "x", "uid": UID_DONE},
        "spec": {"nodeName": NODE, "containers": []},
        "status": {"phase": "Succeeded"},
    }
    return [be, ls, other, done]


@dataclass
class FakeKubelet:
    """What the fake kubelet serves and what it saw."""

    pods: list[dict[str, Any]] = field(default_factory=_pods)
    token: str | None = TOKEN
    """The bearer token it accepts; None: no authentication (the read-only port)."""
    status: int = 200
    """Answer this status (with no PodList) when not 200."""
    body: bytes | None = None
    """Serve these bytes instead of the PodList."""
    authorizations: list[str | None] = field(default_factory=list)
    port: int = 0
    scheme: str = "http"

    async def handle(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization")
        self.authorizations.append(auth)
        if self.token is not None and auth != f"Bearer {self.token}":
            return web.Response(status=401, text="Unauthorized")
        if self.status != 200:
            return web.Response(status=self.status, text="kubelet trouble")
        if self.body is not None:
            return web.Response(body=self.body, content_type="application/json")
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "items": self.pods})


async def _serve(kubelet: FakeKubelet, ssl_context: Any = None) -> AsyncIterator[FakeKubelet]:
    app = web.Application()
    app.router.add_get("/pods", kubelet.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    try:
        kubelet.port = runner.addresses[0][1]
        kubelet.scheme = "https" if ssl_context is not None else "http"
        yield kubelet
    finally:
        await runner.cleanup()


@pytest.fixture
async def kubelet() -> AsyncIterator[FakeKubelet]:
    """A kubelet's read-only port: plain HTTP, no authentication."""
    async for k in _serve(FakeKubelet(token=None)):
        yield k


@dataclass(frozen=True)
class Cert:
    cert: Path
    key: Path


def _self_signed(directory: Path, name: str) -> Cert:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no self-signed certificate for the HTTPS kubelet")
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            f"/CN={name}",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return Cert(cert, key)


@pytest.fixture
async def tls_kubelet(tmp_path: Path) -> AsyncIterator[tuple[FakeKubelet, Cert]]:
    import ssl

    cert = _self_signed(tmp_path, "kubelet")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert.cert, cert.key)
    async for k in _serve(FakeKubelet(), ctx):
        yield k, cert


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "host", CgroupVersion.V1, CgroupDriver.CGROUPFS)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


async def _source(
    host: FakeHost, token_file: Path, kubelet: FakeKubelet, **cfg: Any
) -> AsyncIterator[KubeletPodsSource]:
    config = KubeletSourceConfig(
        address="127.0.0.1",
        port=kubelet.port,
        token_file=str(token_file),
        **cfg,
    )
    source = KubeletPodsSource(config, NODE, lambda: host.layout)
    try:
        yield source
    finally:
        await source.close()


@pytest.fixture
async def source(
    host: FakeHost, token_file: Path, kubelet: FakeKubelet
) -> AsyncIterator[KubeletPodsSource]:
    # the fake serves plain HTTP on its port: the read-only-port mode with the port given
    async for s in _source(
        host, token_file, kubelet, insecure_tls=True, read_only_port=kubelet.port
    ):
        yield s


async def _https_source(
    host: FakeHost, token_file: Path, kubelet: FakeKubelet, **cfg: Any
) -> AsyncIterator[KubeletPodsSource]:
    async for s in _source(host, token_file, kubelet, **cfg):
        yield s


# Mapping ---------------------------------------------------------------------------------------
async def test_pods_on_this_node_are_listed_by_uid_as_the_api_server_source_maps_them(
    host: FakeHost, token_file: Path, tls_kubelet: tuple[FakeKubelet, Cert]
) -> None:
    kubelet, _cert = tls_kubelet
    async for source in _https_source(host, token_file, kubelet):
        await source.poll()
        pods = source.list_pods()
    assert sorted(pods) == [UID_BE, UID_LS]  # the other node's pod and the finished one are out
    by_uid = {p["metadata"]["uid"]: p for p in _pods()}
    for uid, info in pods.items():
        expected = dataclasses.replace(pod_info(by_uid[uid], host.layout), source="kubelet")
        assert info == expected
    assert pods[UID_BE].cgroup_dir == f"kubepods/besteffort/pod{UID_BE}"
    assert [c.id for c in pods[UID_BE].containers] == [CID]
    assert pods[UID_LS].cpu_limit_milli == 1000
    assert source.synced
    assert source.connected


async def test_the_service_account_token_is_sent_as_a_bearer_token_over_https(
    host: FakeHost, token_file: Path, tls_kubelet: tuple[FakeKubelet, Cert]
) -> None:
    kubelet, _cert = tls_kubelet
    async for source in _https_source(host, token_file, kubelet):
        assert source.url() == f"https://127.0.0.1:{kubelet.port}/pods"
        await source.poll()
    assert kubelet.authorizations == [f"Bearer {TOKEN}"]


async def test_a_wrong_token_is_a_failed_poll_that_lists_nothing(
    host: FakeHost, tmp_path: Path, tls_kubelet: tuple[FakeKubelet, Cert]
) -> None:
    kubelet, _cert = tls_kubelet
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token")
    async for source in _https_source(host, wrong, kubelet):
        with pytest.raises(KubeletUnavailable, match="HTTP 401"):
            await source.fetch()
        await source.poll()
        assert source.list_pods() == {}
        assert not source.synced
        assert not await source.wait_synced(0.01)


async def test_the_read_only_port_is_plain_http_without_a_token(
    host: FakeHost, token_file: Path
) -> None:
    async for kubelet in _serve(FakeKubelet(token=None)):
        config = KubeletSourceConfig(
            address="127.0.0.1",
            insecure_tls=True,
            read_only_port=kubelet.port,
            token_file=str(token_file),
        )
        source = KubeletPodsSource(config, NODE, lambda: host.layout)
        try:
            assert source.url() == f"http://127.0.0.1:{kubelet.port}/pods"
            await source.poll()
        finally:
            await source.close()
        assert sorted(source.list_pods()) == [UID_BE, UID_LS]
        assert kubelet.authorizations == [None]


# TLS -------------------------------------------------------------------------------------------
async def test_a_kubelet_certificate_signed_by_the_configured_ca_is_verified(
    host: FakeHost, token_file: Path, tls_kubelet: tuple[FakeKubelet, Cert]
) -> None:
    kubelet, cert = tls_kubelet
    async for source in _https_source(host, token_file, kubelet, ca_file=str(cert.cert)):
        await source.poll()
        assert sorted(source.list_pods()) == [UID_BE, UID_LS]


async def test_a_kubelet_certificate_from_another_ca_is_refused(
    host: FakeHost, token_file: Path, tmp_path: Path, tls_kubelet: tuple[FakeKubelet, Cert]
) -> None:
    kubelet, _cert = tls_kubelet
    other = _self_signed(tmp_path, "other-ca")
    async for source in _https_source(host, token_file, kubelet, ca_file=str(other.cert)):
        with pytest.raises(KubeletUnavailable, match="certificate"):
            await source.fetch()
    assert kubelet.authorizations == []  # the token never left the client


# Failures --------------------------------------------------------------------------------------
async def test_a_failing_kubelet_keeps_the_last_good_list_and_is_logged_once_until_it_recovers(
    kubelet: FakeKubelet, source: KubeletPodsSource, caplog: pytest.LogCaptureFixture
) -> None:
    await source.poll()
    good = source.list_pods()
    assert sorted(good) == [UID_BE, UID_LS]
    kubelet.status = 500
    with caplog.at_level(logging.DEBUG, logger="koordlet.statesinformer.kubelet"):
        for _ in range(3):
            await source.poll()
        assert source.list_pods() is good
        assert not source.connected
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "HTTP 500" in warnings[0].getMessage()
        kubelet.status = 200
        kubelet.pods = _pods()[:1]
        await source.poll()
    assert sorted(source.list_pods()) == [UID_BE]
    assert source.connected
    assert (source.polls, source.failures) == (5, 3)
    assert any("available again" in r.getMessage() for r in caplog.records)


async def test_the_inventory_keeps_the_kubelets_pods_while_it_is_down(
    kubelet: FakeKubelet, source: KubeletPodsSource
) -> None:
    inventory = WorkloadInventory([source])
    await source.poll()
    first = inventory.refresh()
    assert sorted(first.added) == [UID_BE, UID_LS]
    assert {p.source for p in first.snapshot.pods.values()} == {"kubelet"}
    await kubelet_stop(kubelet)
    await source.poll()
    second = inventory.refresh()
    assert not second.removed
    assert sorted(second.snapshot.pods) == [UID_BE, UID_LS]


async def kubelet_stop(kubelet: FakeKubelet) -> None:
    """A kubelet that refuses service (503) from now on."""
    kubelet.status = 503


async def test_an_unreachable_kubelet_is_a_failed_poll(host: FakeHost, token_file: Path) -> None:
    gone = FakeKubelet()
    async for _ in _serve(gone):
        pass  # the server has stopped: its port refuses connections now
    config = KubeletSourceConfig(address="127.0.0.1", port=gone.port, token_file=str(token_file))
    source = KubeletPodsSource(config, NODE, lambda: host.layout)
    try:
        with pytest.raises(KubeletUnavailable, match=r"GET https://127\.0\.0\.1"):
            await source.fetch()
    finally:
        await source.close()


# The token file --------------------------------------------------------------------------------
async def test_a_rotated_token_file_is_picked_up_at_the_next_poll(
    host: FakeHost, token_file: Path, tls_kubelet: tuple[FakeKubelet, Cert]
) -> None:
    kubelet, _cert = tls_kubelet
    async for source in _https_source(host, token_file, kubelet):
        await source.poll()
        kubelet.token = "token-two"
        await source.poll()  # the old token: refused
        assert not source.connected
        rotated = token_file.with_name("token.new")
        rotated.write_text("token-two\n")
        os.replace(rotated, token_file)  # as the kubelet swaps a projected volume
        await source.poll()
        assert source.connected
    assert kubelet.authorizations == [f"Bearer {TOKEN}"] * 2 + ["Bearer token-two"]


# Malformed answers -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "(body)"),
        (b"[]", "(body)"),
        (b'{"kind": "NodeList", "items": []}', "kind"),
        (b'{"kind": "PodList", "items": {}}', "items"),
    ],
)
async def test_a_body_that_is_not_a_pod_list_is_refused_naming_the_field(
    kubelet: FakeKubelet, source: KubeletPodsSource, body: bytes, field: str
) -> None:
    await source.poll()
    kubelet.body = body
    with pytest.raises(KubeletResponseError) as info:
        await source.fetch()
    assert info.value.field == field
    await source.poll()
    assert sorted(source.list_pods()) == [UID_BE, UID_LS]  # the last good list stays


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("metadata", "uid"), 5, "items[1].metadata.uid"),
        (("metadata",), "x", "items[1].metadata"),
        (("metadata", "labels"), {"a": 1}, "items[1].metadata.labels[a]"),
        (("spec", "containers"), {}, "items[1].spec.containers"),
        (
            ("spec", "containers", 0, "resources", "limits", "cpu"),
            "lots",
            "items[1].spec.containers[0].resources.limits.cpu",
        ),
        (("spec", "priority"), "high", "items[1].spec.priority"),
        (("status", "containerStatuses"), [7], "items[1].status.containerStatuses[0]"),
    ],
)
async def test_a_malformed_pod_is_skipped_with_a_warning_naming_the_field(
    kubelet: FakeKubelet,
    source: KubeletPodsSource,
    caplog: pytest.LogCaptureFixture,
    path: tuple[str | int, ...],
    value: object,
    field: str,
) -> None:
    pods = _pods()
    target: Any = pods[1]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    kubelet.pods = pods
    with caplog.at_level(logging.WARNING, logger="koordlet.statesinformer.kubelet"):
        await source.poll()
    assert sorted(source.list_pods()) == [UID_BE]
    assert source.connected
    assert any(field in r.getMessage() for r in caplog.records), caplog.text


def test_a_pod_list_with_null_items_is_empty() -> None:
    assert parse_pod_list(json.dumps({"kind": "PodList", "items": None}).encode()) == []


async def test_an_empty_pod_list_from_a_restarting_kubelet_keeps_the_last_good_list(
    kubelet: FakeKubelet, source: KubeletPodsSource
) -> None:
    await source.poll()
    kubelet.pods = []
    with pytest.raises(KubeletUnavailable, match="empty PodList"):
        await source.fetch()
    await source.poll()
    assert sorted(source.list_pods()) == [UID_BE, UID_LS]
    assert not source.connected


# Address and port ------------------------------------------------------------------------------
async def test_the_address_and_port_come_from_the_node_when_not_configured(
    host: FakeHost, token_file: Path, tls_kubelet: tuple[FakeKubelet, Cert]
) -> None:
    kubelet, _cert = tls_kubelet
    node: dict[str, Any] | None = None
    config = KubeletSourceConfig(token_file=str(token_file))
    source = KubeletPodsSource(config, NODE, lambda: host.layout, node=lambda: node)
    try:
        await source.poll()  # the Node is not known yet
        assert not source.synced
        with pytest.raises(KubeletUnavailable, match="no InternalIP address"):
            source.url()
        node = {
            "status": {
                "addresses": [
                    {"type": "Hostname", "address": NODE},
                    {"type": "InternalIP", "address": "127.0.0.1"},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet.port}},
            }
        }
        await source.poll()
    finally:
        await source.close()
    assert source.synced
    assert sorted(source.list_pods()) == [UID_BE, UID_LS]


def test_an_unknown_preferred_address_type_falls_back_to_the_internal_ip() -> None:
    node = {"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.7"}]}}
    config = KubeletSourceConfig(preferred_address_type="Elsewhere")
    source = KubeletPodsSource(config, NODE, lambda: pytest.fail("no layout"), node=lambda: node)
    assert source.url() == "https://10.0.0.7:10250/pods"
    ipv6 = KubeletPodsSource(
        KubeletSourceConfig(address="fd00::1", insecure_tls=True),
        NODE,
        lambda: pytest.fail("no layout"),
    )
    assert ipv6.url() == "http://[fd00::1]:10255/pods"


@pytest.mark.parametrize(
    "bad",
    [{"port": 70000}, {"read_only_port": 0}, {"sync_interval": 0.0}, {"sync_timeout": -1.0}],
)
def test_settings_out_of_range_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        KubeletSourceConfig(**bad)


def test_the_defaults_are_koordinators() -> None:
    cfg = KubeletSourceConfig()
    assert (cfg.preferred_address_type, cfg.read_only_port, cfg.insecure_tls) == (
        "InternalIP",
        10255,
        False,
    )
    assert (cfg.sync_interval, cfg.sync_timeout, cfg.scheme) == (10.0, 3.0, "https")


async def test_a_missing_token_file_is_named_when_the_kubelet_refuses(
    host: FakeHost, tmp_path: Path, tls_kubelet: tuple[FakeKubelet, Cert]
) -> None:
    kubelet, _cert = tls_kubelet
    async for source in _https_source(host, tmp_path / "absent", kubelet):
        with pytest.raises(KubeletUnavailable, match=r"HTTP 401.*no token: .*absent"):
            await source.fetch()
    assert kubelet.authorizations == [None]


async def test_a_closed_source_opens_no_new_session_and_keeps_its_list(
    kubelet: FakeKubelet, source: KubeletPodsSource
) -> None:
    await source.poll()
    await source.close()
    await source.poll()
    assert sorted(source.list_pods()) == [UID_BE, UID_LS]
    assert kubelet.authorizations == [None]  # one request: none after the close
