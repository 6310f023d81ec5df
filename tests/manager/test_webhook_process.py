"""``koord-manager webhook`` as the Deployment runs it, against the fake API server: two
replicas started with the manifests' flags make one certificate in the Secret, set the
caBundle, serve the same certificate over TLS, answer a review, and stop on SIGTERM."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from tests.kubefake import FakeApiServer
from tests.manager.conftest import eventually
from tests.manager.test_manager_process import ROOT, command
from tests.manager.test_webhook_certs import NS, SECRET, ca_bundles, seed_configurations
from tests.manager.webhookrig import admission_review

SPEC = "node.koordinator.sh/extended-resource-spec"


class Replica:
    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log

    def port(self) -> int | None:
        found = re.search(r"webhook serving on port (\d+)", self.log.read_text())
        return int(found.group(1)) if found else None


@asynccontextmanager
async def replica(kubeconfig: Path, workdir: Path, *extra: str) -> AsyncIterator[Replica]:
    await asyncio.to_thread(workdir.mkdir)
    log = workdir / "webhook.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *command(),
            "webhook",
            f"--kubeconfig={kubeconfig}",
            "--webhook-host=127.0.0.1",
            "--webhook-port=0",
            f"--webhook-cert-dir={workdir / 'certs'}",
            "--webhook-cert-host=127.0.0.1",
            *extra,
            stdout=out,
            stderr=out,
            env={**os.environ, "POD_NAMESPACE": NS},
            cwd=ROOT,
        )
    try:
        yield Replica(proc, log)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def served_certificate(port: int, ca: bytes) -> bytes:
    """The certificate the server presents, checked against ``ca`` for 127.0.0.1."""
    ctx = ssl.create_default_context(cadata=ca.decode())
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        sslobj = writer.get_extra_info("ssl_object")
        return bytes(sslobj.getpeercert(binary_form=True))
    finally:
        writer.close()
        await writer.wait_closed()


async def review(port: int, ca: bytes, pod: dict[str, Any]) -> dict[str, Any]:
    ctx = ssl.create_default_context(cadata=ca.decode())
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session,
        session.post(
            f"https://127.0.0.1:{port}/mutate-pod", json=admission_review(pod, namespace="default")
        ) as resp,
    ):
        body = await resp.json()
    return dict(body["response"])


async def test_two_replicas_share_one_certificate_set_the_ca_bundle_and_answer(
    kube_api: FakeApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    seed_configurations(kube_api)
    kube_api.put("namespaces", {"metadata": {"name": "default"}})
    async with (
        replica(kubeconfig, tmp_path / "a") as one,
        replica(kubeconfig, tmp_path / "b") as two,
    ):
        await eventually(lambda: one.port() is not None and two.port() is not None, within=60)
        secret = kube_api.get("secrets", SECRET, NS)
        assert secret is not None
        ca = base64.b64decode(secret["data"]["ca-cert.pem"])
        assert set(ca_bundles(kube_api)) == {base64.b64encode(ca).decode()}
        port_one, port_two = one.port(), two.port()
        assert port_one is not None
        assert port_two is not None
        assert await served_certificate(port_one, ca) == await served_certificate(port_two, ca)
        pod = {
            "metadata": {"name": "be", "namespace": "default", "labels": {}},
            "spec": {
                "containers": [
                    {"name": "c", "resources": {"limits": {"kubernetes.io/batch-cpu": "1000"}}}
                ]
            },
        }
        response = await review(port_two, ca, pod)
        assert response["allowed"] is True
        ops = json.loads(base64.b64decode(response["patch"]))
        assert ops == [
            {
                "op": "add",
                "path": "/metadata/annotations",
                "value": {SPEC: '{"containers":{"c":{"limits":{"kubernetes.io/batch-cpu":"1k"}}}}'},
            }
        ]
        for proc in (one.proc, two.proc):
            proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(one.proc.wait(), 15) == 0, one.log.read_text()
        assert await asyncio.wait_for(two.proc.wait(), 15) == 0, two.log.read_text()


async def test_without_its_files_the_none_writer_exits_naming_them(
    kube_api: FakeApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    async with replica(kubeconfig, tmp_path / "a", "--webhook-cert-writer=none") as one:
        assert await asyncio.wait_for(one.proc.wait(), 30) == 1
        assert "tls.crt" in one.log.read_text()
