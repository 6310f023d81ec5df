"""The webhook's certificates without cert-manager, against the fake API server: the Secret two
replicas share, the files, the caBundle, renewal and the server picking up a new certificate.
Upstream: ``pkg/webhook/util/controller/webhook_controller.go``, ``writer/secret.go``,
``writer/certwriter.go`` (``validCert``), ``generator/selfsigned.go``."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kubeclient.backoff import Backoff
from kubeclient.client import KubeClient
from kubeclient.errors import NotFound
from manager.webhook.certs import (
    CA_CERT,
    CA_KEY,
    SERVER_CERT,
    SERVER_CERT_TLS,
    SERVER_KEY,
    SERVER_KEY_TLS,
    Artifacts,
    CertificateKeeper,
    KeeperSettings,
    generate,
    read_dir,
    serving_valid,
)
from tests.kubefake import FakeApiServer, Fault
from tests.manager.conftest import eventually
from tests.manager.webhookrig import register, serving

NS = "koordinator-system"
SERVICE = "koordinator-webhook-service"
SECRET = "koordinator-webhook-certs"
MUTATING = "koordinator-mutating-webhook-configuration"
VALIDATING = "koordinator-validating-webhook-configuration"
SVC_NAME = f"{SERVICE}.{NS}.svc"


def seed_configurations(api: FakeApiServer) -> None:
    register(api)
    for plural, name, hooks in (
        ("mutatingwebhookconfigurations", MUTATING, ["mpod-create.koordinator.sh"]),
        ("validatingwebhookconfigurations", VALIDATING, ["vpod.koordinator.sh", "v2"]),
    ):
        api.put(
            plural,
            {
                "metadata": {"name": name},
                "webhooks": [
                    {
                        "name": hook,
                        "failurePolicy": "Ignore",
                        "clientConfig": {
                            "service": {"name": SERVICE, "namespace": NS, "path": "/x"}
                        },
                    }
                    for hook in hooks
                ],
            },
        )


def keeper(
    client: KubeClient,
    cert_dir: Path,
    *,
    store: str = "secret",
    changes: list[Artifacts] | None = None,
    resync: float = 60.0,
    extra_hosts: tuple[str, ...] = ("127.0.0.1",),
) -> CertificateKeeper:
    settings = KeeperSettings(
        namespace=NS,
        service=SERVICE,
        secret=SECRET,
        cert_dir=cert_dir,
        mutating=MUTATING,
        validating=VALIDATING,
        extra_hosts=extra_hosts,
        resync_seconds=resync,
        store=store,
    )
    sink: list[Artifacts] = changes if changes is not None else []
    return CertificateKeeper(
        client, settings, on_change=sink.append, backoff=Backoff(base=0.02, cap=0.1)
    )


def secret_of(api: FakeApiServer) -> dict[str, Any]:
    found = api.get("secrets", SECRET, NS)
    assert found is not None
    return found


def ca_bundles(api: FakeApiServer) -> list[str]:
    out = []
    for plural, name in (
        ("mutatingwebhookconfigurations", MUTATING),
        ("validatingwebhookconfigurations", VALIDATING),
    ):
        cfg = api.get(plural, name)
        assert cfg is not None
        out += [h["clientConfig"].get("caBundle", "") for h in cfg["webhooks"]]
    return out


def put_secret(api: FakeApiServer, artifacts: Artifacts | None) -> None:
    body: dict[str, Any] = {"metadata": {"name": SECRET, "namespace": NS}}
    if artifacts is not None:
        body["data"] = artifacts.secret_data()
    api.put("secrets", body)


def writes_to(api: FakeApiServer, plural: str) -> list[str]:
    return [r.method for r in api.requests if r.method != "GET" and f"/{plural}" in r.path]


HOSTS = [SERVICE, f"{SERVICE}.{NS}", SVC_NAME, f"{SVC_NAME}.cluster.local", "127.0.0.1"]


@pytest.fixture
def api(kube_api: FakeApiServer) -> FakeApiServer:
    seed_configurations(kube_api)
    return kube_api


async def test_a_fresh_install_makes_the_secret_writes_the_files_and_sets_both_ca_bundles(
    api: FakeApiServer, kube_client: KubeClient, tmp_path: Path
) -> None:
    changes: list[Artifacts] = []
    cert_dir = tmp_path / "certs"
    made = await keeper(kube_client, cert_dir, changes=changes).sync()
    data = secret_of(api)["data"]
    # upstream's keys, so upstream's koord-manager and ours read each other's Secret
    assert set(data) == {CA_KEY, CA_CERT, SERVER_KEY, SERVER_KEY_TLS, SERVER_CERT, SERVER_CERT_TLS}
    assert Artifacts.from_secret(secret_of(api)) == made
    assert read_dir(cert_dir) == made
    modes = await asyncio.to_thread(lambda: {p.stat().st_mode & 0o777 for p in cert_dir.iterdir()})
    assert modes == {0o600}
    assert changes == [made]
    assert ca_bundles(api) == [base64.b64encode(made.ca_cert).decode()] * 3
    assert serving_valid(made, HOSTS, datetime.now(UTC))
    # one JSON patch a configuration, each operation guarded by a test of the webhook's name
    patches = [r for r in api.requests if r.method == "PATCH"]
    assert [r.content_type for r in patches] == ["application/json-patch+json"] * 2
    assert patches[1].body[0] == {
        "op": "test",
        "path": "/webhooks/0/name",
        "value": "vpod.koordinator.sh",
    }
    config = api.get("validatingwebhookconfigurations", VALIDATING)
    assert config is not None
    assert config["webhooks"][0]["failurePolicy"] == "Ignore"  # nothing else touched


async def test_a_second_sync_writes_nothing(
    api: FakeApiServer, kube_client: KubeClient, tmp_path: Path
) -> None:
    changes: list[Artifacts] = []
    keep = keeper(kube_client, tmp_path, changes=changes)
    await keep.sync()
    before = len(api.writes())
    await keep.sync()
    assert len(api.writes()) == before
    assert len(changes) == 1


async def test_two_replicas_starting_together_serve_one_certificate(
    api: FakeApiServer, kube_client: KubeClient, tmp_path: Path
) -> None:
    one, two = keeper(kube_client, tmp_path / "one"), keeper(kube_client, tmp_path / "two")
    await asyncio.gather(one.first_sync(), two.first_sync())
    shared = Artifacts.from_secret(secret_of(api))
    assert read_dir(tmp_path / "one") == read_dir(tmp_path / "two") == shared
    assert writes_to(api, "secrets").count("POST") >= 1
    assert "PUT" not in writes_to(api, "secrets")


async def test_an_expiring_certificate_is_renewed_once_under_the_same_ca(
    api: FakeApiServer, kube_client: KubeClient, tmp_path: Path
) -> None:
    """Renewed when it would not verify six months ahead; the CA kept while good for a year;
    two replicas renewing together end on one certificate (a 409 for the slower)."""
    long = generate(SVC_NAME, HOSTS)
    short = generate(SVC_NAME, HOSTS, (long.ca_key, long.ca_cert), days=100)
    assert not serving_valid(short, HOSTS, datetime.now(UTC))
    put_secret(api, short)
    one, two = keeper(kube_client, tmp_path / "one"), keeper(kube_client, tmp_path / "two")
    await asyncio.gather(one.first_sync(), two.first_sync())
    renewed = Artifacts.from_secret(secret_of(api))
    assert renewed is not None
    assert renewed.cert != short.cert
    assert renewed.ca_cert == long.ca_cert
    assert read_dir(tmp_path / "one") == read_dir(tmp_path / "two") == renewed
    assert serving_valid(renewed, HOSTS, datetime.now(UTC))
    rvs = {r.body["metadata"]["resourceVersion"] for r in api.requests if r.method == "PUT"}
    assert len(rvs) == 1  # every update was made against the one expiring version


@pytest.mark.parametrize(
    "stored",
    [
        pytest.param(None, id="the empty Secret the manifests ship"),
        pytest.param(generate("other.x.svc", ["other.x.svc"]), id="a certificate for another name"),
    ],
)
async def test_a_secret_without_a_usable_certificate_gets_one(
    api: FakeApiServer, kube_client: KubeClient, tmp_path: Path, stored: Artifacts | None
) -> None:
    put_secret(api, stored)
    made = await keeper(kube_client, tmp_path).sync()
    assert Artifacts.from_secret(secret_of(api)) == made
    assert serving_valid(made, HOSTS, datetime.now(UTC))
    assert writes_to(api, "secrets") == ["PUT"]


async def test_a_certificate_upstream_made_is_kept(
    api: FakeApiServer, kube_client: KubeClient, tmp_path: Path
) -> None:
    """Upstream's generator names ``localhost`` and ``<svc>.<ns>.svc`` only: valid for us too."""
    upstreams = generate(SVC_NAME, [SVC_NAME])
    put_secret(api, upstreams)
    assert await keeper(kube_client, tmp_path, extra_hosts=()).sync() == upstreams
    assert writes_to(api, "secrets") == []


async def test_a_ca_expiring_within_a_year_is_replaced_with_the_certificate_it_signed(
    api: FakeApiServer, kube_client: KubeClient, tmp_path: Path
) -> None:
    old = generate(SVC_NAME, HOSTS, days=100)
    put_secret(api, old)
    made = await keeper(kube_client, tmp_path).sync()
    assert made.ca_cert != old.ca_cert
    assert ca_bundles(api) == [base64.b64encode(made.ca_cert).decode()] * 3


async def test_a_missing_webhook_configuration_is_retried_until_it_appears(
    kube_api: FakeApiServer, kube_client: KubeClient, tmp_path: Path
) -> None:
    register(kube_api)
    keep = keeper(kube_client, tmp_path)
    with pytest.raises(NotFound):
        await keep.sync()
    first = asyncio.create_task(keep.first_sync())
    await eventually(
        lambda: len([r for r in kube_api.requests if "webhookconfigurations" in r.path]) >= 3
    )
    assert not first.done()
    seed_configurations(kube_api)
    made = await asyncio.wait_for(first, 10)
    assert made is not None
    assert ca_bundles(kube_api) == [base64.b64encode(made.ca_cert).decode()] * 3


async def test_a_first_sync_gives_up_when_asked_to_stop(
    kube_api: FakeApiServer, kube_client: KubeClient, tmp_path: Path
) -> None:
    register(kube_api)  # no configurations: it never succeeds
    stop = asyncio.Event()
    first = asyncio.create_task(keeper(kube_client, tmp_path).first_sync(stop))
    await eventually(lambda: any("webhookconfigurations" in r.path for r in kube_api.requests))
    stop.set()
    assert await asyncio.wait_for(first, 5) is None


async def test_a_server_error_is_retried(
    api: FakeApiServer, kube_client: KubeClient, tmp_path: Path
) -> None:
    api.faults.append(Fault(method="POST", path_contains="/secrets", status=500, times=1))
    made = await keeper(kube_client, tmp_path).first_sync()
    assert Artifacts.from_secret(secret_of(api)) == made


@pytest.fixture
async def running(
    api: FakeApiServer, kube_client: KubeClient, tmp_path: Path
) -> AsyncIterator[tuple[CertificateKeeper, list[Artifacts]]]:
    changes: list[Artifacts] = []
    keep = keeper(kube_client, tmp_path / "certs", changes=changes)
    await keep.first_sync()
    task = asyncio.create_task(keep.run(), name="keeper")
    try:
        yield keep, changes
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_secret_changed_by_another_replica_is_served_at_once(
    api: FakeApiServer,
    kube_client: KubeClient,
    tmp_path: Path,
    running: tuple[CertificateKeeper, list[Artifacts]],
) -> None:
    keep, changes = running
    cert_dir = keep.settings.cert_dir
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert_dir / SERVER_CERT_TLS), str(cert_dir / SERVER_KEY_TLS))
    changes.clear()
    rotated = generate(SVC_NAME, HOSTS)
    put_secret(api, rotated)  # the other replica renewed it: our watch sees it
    await eventually(lambda: read_dir(cert_dir) == rotated)
    await eventually(lambda: ca_bundles(api) == [base64.b64encode(rotated.ca_cert).decode()] * 3)
    assert changes == [rotated]


async def test_the_server_presents_a_new_certificate_to_new_connections(
    api: FakeApiServer, kube_client: KubeClient, tmp_path: Path
) -> None:
    cert_dir = tmp_path / "certs"
    first = await keeper(kube_client, cert_dir).first_sync()
    assert first is not None
    async with serving(kube_client, cert_dir) as hook:
        reloads: list[Artifacts] = []

        def reload(made: Artifacts) -> None:  # what the CLI does on a change
            hook.server_ssl.load_cert_chain(
                str(cert_dir / SERVER_CERT_TLS), str(cert_dir / SERVER_KEY_TLS)
            )
            reloads.append(made)

        keep = keeper(kube_client, cert_dir, changes=None)
        keep._on_change = reload  # the hook the CLI passes at construction
        rotated = generate(SVC_NAME, HOSTS)
        put_secret(api, rotated)
        await keep.sync()
        assert reloads == [rotated]
        trusting_new = ssl.create_default_context(cadata=rotated.ca_cert.decode())
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusting_new)) as session,
            session.get(hook.url + "/healthz") as resp,
        ):
            assert await resp.text() == "ok"
        trusting_old = ssl.create_default_context(cadata=first.ca_cert.decode())
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=trusting_old)
        ) as session:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await session.get(hook.url + "/healthz")


async def test_the_fs_writer_keeps_its_certificates_in_the_directory_alone(
    api: FakeApiServer, kube_client: KubeClient, tmp_path: Path
) -> None:
    keep = keeper(kube_client, tmp_path, store="dir")
    made = await keep.sync()
    assert read_dir(tmp_path) == made
    assert api.get("secrets", SECRET, NS) is None
    assert ca_bundles(api) == [base64.b64encode(made.ca_cert).decode()] * 3
    again = await keeper(kube_client, tmp_path, store="dir").sync()  # a restart reuses them
    assert again == made
    assert not any("/secrets" in r.path for r in api.requests)


def test_certificates_are_valid_for_upstreams_name_and_ten_years() -> None:
    made = generate(SVC_NAME, HOSTS)
    now = datetime.now(UTC)
    assert serving_valid(made, [SVC_NAME, "localhost", "127.0.0.1"], now + timedelta(days=3400))
    assert not serving_valid(made, [SVC_NAME], now + timedelta(days=3700))
    assert not serving_valid(made, ["other.svc"], now)
    swapped = Artifacts(made.ca_key, made.ca_cert, generate(SVC_NAME, HOSTS).key, made.cert)
    assert not serving_valid(swapped, [SVC_NAME], now)  # the key does not match
