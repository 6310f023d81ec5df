"""The kubeconfig reader of ``kubeclient.config``: static credentials read as client-go's
``clientcmd`` reads them (the current context's cluster and user, ``*-data`` in base64, paths
against the file's folder, a token file read again after a minute), a credential plugin through
kubernetes-asyncio's loader; over a real TLS server with certificates made by openssl."""

from __future__ import annotations

import base64
import ssl
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from envtest import pki
from kubeclient.client import KubeClient
from kubeclient.config import TOKEN_REREAD_S, load_configuration
from kubeclient.errors import ConfigError


def kubeconfig(path: Path, cluster: dict, user: dict) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "other", "cluster": {"server": "https://192.0.2.1"}},
                     {"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }  # fmt: skip
    path.write_text(yaml.safe_dump(doc))
    return path


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[str, pki.PKI, list[str]]]:
    """An HTTPS server on 127.0.0.1 with a certificate of a fresh CA; it records the
    ``Authorization`` headers it gets."""
    certs = pki.make(tmp_path / "pki", ips=["127.0.0.1"], dns=["localhost"])
    seen: list[str] = []

    async def nodes(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"kind": "NodeList", "items": [], "metadata": {}})

    app = web.Application()
    app.router.add_get("/api/v1/nodes", nodes)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs.apiserver_crt, certs.apiserver_key)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"https://127.0.0.1:{port}", certs, seen
    finally:
        await runner.cleanup()


async def test_ca_and_client_certificate_data_and_a_token_reach_a_tls_server(tls_server, tmp_path):
    url, certs, seen = tls_server
    path = kubeconfig(
        tmp_path / "kc",
        {"server": url, "certificate-authority-data": b64(certs.ca_crt)},
        {
            "token": "t0ken",
            "client-certificate-data": b64(certs.apiserver_crt),
            "client-key-data": b64(certs.apiserver_key),
        },
    )
    async with await KubeClient.connect(str(path)) as client:
        assert client.host == url
        listed = await client.request("GET", "/api/v1/nodes")
    assert listed["kind"] == "NodeList"
    assert seen == ["Bearer t0ken"]


async def test_a_relative_ca_file_and_a_token_file_read_again_after_a_minute(tls_server, tmp_path):
    url, certs, seen = tls_server
    (tmp_path / "ca.crt").write_bytes(certs.ca_crt.read_bytes())
    (tmp_path / "token").write_text("first\n")
    path = kubeconfig(
        tmp_path / "kc", {"server": url, "certificate-authority": "ca.crt"}, {"tokenFile": "token"}
    )
    conn = await load_configuration(str(path))
    assert await conn.authorization() == "Bearer first"
    (tmp_path / "token").write_text("second\n")
    assert await conn.authorization() == "Bearer first"  # read less than a minute ago
    conn._read_at -= TOKEN_REREAD_S
    assert await conn.authorization() == "Bearer second"
    async with KubeClient(conn) as client:
        await client.request("GET", "/api/v1/nodes")
    assert seen == ["Bearer second"]


async def test_a_user_name_and_password_are_basic_auth_and_plain_http_has_no_tls(tmp_path):
    path = kubeconfig(
        tmp_path / "kc", {"server": "http://127.0.0.1:1"}, {"username": "a", "password": "b"}
    )
    conn = await load_configuration(str(path))
    assert conn.ssl is False
    assert await conn.authorization() == "Basic " + base64.b64encode(b"a:b").decode()


async def test_a_credential_plugin_goes_through_kubernetes_asyncios_loader(tls_server, tmp_path):
    url, certs, seen = tls_server
    plugin = tmp_path / "plugin"
    plugin.write_text(
        f"#!{sys.executable}\n"
        "import json\n"
        'print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1",'
        ' "kind": "ExecCredential", "status": {"token": "from-plugin"}}))\n'
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    exec_user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": str(plugin),
            "interactiveMode": "Never",
        }
    }
    path = kubeconfig(
        tmp_path / "kc", {"server": url, "certificate-authority": str(certs.ca_crt)}, exec_user
    )
    conn = await load_configuration(str(path))
    assert conn.refresh is not None
    async with KubeClient(conn) as client:
        await client.request("GET", "/api/v1/nodes")
    assert seen == ["Bearer from-plugin"]


@pytest.mark.parametrize(
    ("cluster", "user", "why"),
    [
        ({"server": "https://127.0.0.1:1", "certificate-authority-data": "%%"}, {}, "base64"),
        ({"server": "ftp://x"}, {}, "not an http(s) URL"),
        ({"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True},
         {"client-key-data": "eA=="}, "needs its key"),
        ({"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True},
         {"tokenFile": "/nonexistent/token"}, "No such file"),
    ],
)  # fmt: skip
async def test_a_kubeconfig_that_cannot_be_used_names_the_file_and_why(
    tmp_path: Path, cluster: dict, user: dict, why: str
):
    path = kubeconfig(tmp_path / "kc", cluster, user)
    with pytest.raises(ConfigError) as caught:
        await load_configuration(str(path))
    assert caught.value.source == f"kubeconfig {path}"
    assert why in caught.value.message
