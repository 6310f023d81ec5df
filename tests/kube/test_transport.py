"""The HTTP/1.1 client of kubeclient.transport on a raw asyncio server that writes exactly the
bytes each test gives it (framing, keep-alive, a connection closed under a request), and over
TLS with a CA, a server certificate and a client certificate made by openssl."""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kubeclient.auth import BearerToken
from kubeclient.client import KubeClient
from kubeclient.config import ClusterConfig, parse_kubeconfig
from kubeclient.errors import ConfigError, Transient
from kubeclient.resources import PODS
from kubeclient.transport import Transport, TransportError
from tests.kube.test_kubeconfig import kubeconfig
from tests.kubefake.fixtures import eventually

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]
"""Given a request's head, write the answer; whether to keep the connection."""


@dataclass
class RawServer:
    """Answers each request with ``answer``; records heads and connections."""

    answer: Answer
    tls: ssl.SSLContext | None = None
    heads: list[bytes] = field(default_factory=list)
    connections: int = 0
    open_writers: list[asyncio.StreamWriter] = field(default_factory=list)
    port: int = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_writers.append(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length) if length else b""
                self.heads.append(head + body)
                if not await self.answer(head, writer):
                    return
                await writer.drain()
        finally:
            writer.close()
            self.open_writers.remove(writer)

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for writer in list(self.open_writers):
            writer.close()
        await self._server.wait_closed()


def ok(body: bytes, *, extra: bytes = b"") -> Answer:
    async def answer(head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + extra
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        return True

    return answer


@pytest.fixture
async def transport() -> AsyncIterator[Callable[[int], Transport]]:
    made: list[Transport] = []

    def make(port: int, **kw: object) -> Transport:
        t = Transport("127.0.0.1", port, **kw)  # type: ignore[arg-type]
        made.append(t)
        return t

    yield make
    for t in made:
        await t.close()


async def test_two_requests_share_one_kept_alive_connection(transport: Callable) -> None:
    async with RawServer(ok(b'{"a": 1}')) as server:
        t = transport(server.port)
        first = await t.request("GET", "/x")
        second = await t.request("POST", "/y", body=b"{}", headers={"X-Test": "1"})

    assert (first.status, first.body, second.body) == (200, b'{"a": 1}', b'{"a": 1}')
    assert server.connections == 1
    assert server.heads[0].startswith(b"GET /x HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"X-Test: 1\r\n" in server.heads[1]
    assert server.heads[1].endswith(b"Content-Length: 2\r\n\r\n{}")


async def test_a_chunked_stream_is_read_line_by_line_across_chunk_boundaries(
    transport: Callable,
) -> None:
    async def answer(head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in (b'{"type":"ADD', b'ED"}\n{"type":"BOOK', b'MARK"}\n', b"tail"):
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        return True

    async with RawServer(answer) as server:
        t = transport(server.port)
        stream = await t.stream("GET", "/watch")
        async with stream:
            lines = [await stream.readline() for _ in range(4)]
        again = await t.request("GET", "/after")

    assert lines == [b'{"type":"ADDED"}\n', b'{"type":"BOOKMARK"}\n', b"tail", b""]
    assert again.status == 200
    assert server.connections == 1  # the stream ended cleanly: its connection was reused


async def test_a_reused_connection_closed_under_a_get_is_retried_and_a_post_is_not(
    transport: Callable,
) -> None:
    answered: list[int] = []

    async def answer(head: bytes, writer: asyncio.StreamWriter) -> bool:
        if answered:  # the second request on any connection: closed without an answer
            answered.clear()
            return False
        answered.append(1)
        await ok(b"{}")(head, writer)
        return True

    async with RawServer(answer) as server:
        t = transport(server.port)
        await t.request("GET", "/a")
        retried = await t.request("GET", "/b")  # closed on the reused one, sent again
        await t.request("GET", "/c")  # the same again
        with pytest.raises(TransportError, match="before the answer"):
            await t.request("POST", "/d", body=b"{}")

    assert retried.status == 200
    assert [h.split(b" ")[1] for h in server.heads] == [b"/a", b"/b", b"/b", b"/c", b"/c", b"/d"]


async def test_a_body_cut_short_is_a_transport_error(transport: Callable) -> None:
    async def answer(head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345")
        return False

    async with RawServer(answer) as server:
        with pytest.raises(TransportError, match="5 bytes of body unread"):
            await transport(server.port).request("GET", "/")


async def test_a_body_without_length_ends_with_the_connection(transport: Callable) -> None:
    async def answer(head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nall of it")
        return False

    async with RawServer(answer) as server:
        resp = await transport(server.port).request("GET", "/")

    assert resp.body == b"all of it"


async def test_a_stream_that_stays_silent_past_its_read_timeout_raises(
    transport: Callable,
) -> None:
    async def answer(head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        return True

    async with RawServer(answer) as server:
        stream = await transport(server.port).stream("GET", "/w", read_timeout=0.05)
        async with stream:
            with pytest.raises(TimeoutError):
                await stream.readline()


async def test_something_that_is_not_http_is_a_transport_error(transport: Callable) -> None:
    async def answer(head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        return False

    async with RawServer(answer) as server:
        with pytest.raises(TransportError, match=r"not an HTTP/1\.x status line"):
            await transport(server.port).request("GET", "/")


async def test_an_idle_connection_is_closed_after_the_idle_timeout(transport: Callable) -> None:
    async with RawServer(ok(b"{}")) as server:
        t = transport(server.port, idle_timeout=0.05)
        await t.request("GET", "/")
        assert len(server.open_writers) == 1
        await eventually(lambda: not server.open_writers, within=5)
        await t.request("GET", "/")

    assert server.connections == 2


def test_a_token_file_is_read_again_a_minute_later_when_it_changed(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    now = [0.0]
    bearer = BearerToken(ClusterConfig("https://h", token_file=str(token)), clock=lambda: now[0])
    token.write_text("two, longer\n")

    assert bearer.headers() == {"Authorization": "Bearer one"}
    now[0] = 61.0
    assert bearer.headers() == {"Authorization": "Bearer two, longer"}
    token.unlink()
    now[0] = 130.0
    assert bearer.token == "two, longer"  # the last good token stays when the file is gone


# TLS -------------------------------------------------------------------------------------------
def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@dataclass(frozen=True)
class Pki:
    dir: Path

    def path(self, name: str) -> Path:
        return self.dir / name

    def b64(self, name: str) -> str:
        return base64.b64encode(self.path(name).read_bytes()).decode()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a server certificate for 127.0.0.1 and ``api.test``, a client certificate."""
    d = tmp_path_factory.mktemp("pki")
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=d)
    openssl("req", "-x509", "-new", "-key", "ca.key", "-days", "2", "-subj", "/CN=test-ca",
            "-out", "ca.crt", cwd=d)  # fmt: skip
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:api.test\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ):
        openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key",
                cwd=d)  # fmt: skip
        openssl("req", "-new", "-key", f"{name}.key", "-subj", f"/CN={name}",
                "-out", f"{name}.csr", cwd=d)  # fmt: skip
        (d / f"{name}.ext").write_text(ext)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                "-out", f"{name}.crt", cwd=d)  # fmt: skip
    return Pki(d)


def kubeclient_temp_files() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("kubeclient-")}


def server_tls(pki: Pki, *, require_client: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.path("server.crt"), pki.path("server.key"))
    if require_client:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(pki.path("ca.crt"))
    return ctx


async def test_a_client_certificate_from_inline_data_is_presented_and_the_server_verified(
    pki: Pki, tmp_path: Path
) -> None:
    before = kubeclient_temp_files()
    async with RawServer(ok(b'{"kind":"Pod"}'), tls=server_tls(pki, require_client=True)) as srv:
        path = kubeconfig(
            tmp_path / "kc",
            cluster={
                "server": f"https://127.0.0.1:{srv.port}/",
                "certificate-authority-data": pki.b64("ca.crt"),
                "tls-server-name": "api.test",
            },
            user={
                "client-certificate-data": pki.b64("client.crt"),
                "client-key-data": pki.b64("client.key"),
            },
        )
        async with await KubeClient.connect(str(path)) as client:
            pod = await client.get(PODS, "p", "ns")

    assert pod == {"kind": "Pod"}
    assert srv.heads[0].startswith(b"GET /api/v1/namespaces/ns/pods/p HTTP/1.1\r\n")
    assert b"Authorization" not in srv.heads[0]
    assert kubeclient_temp_files() == before  # the key's temporary files are gone


async def test_a_server_certificate_from_another_ca_is_refused_unless_verification_is_skipped(
    pki: Pki, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", "o.key", "-subj", "/CN=other", "-days", "1", "-out", "o.crt",
            cwd=other)  # fmt: skip
    async with RawServer(ok(b"{}"), tls=server_tls(pki, require_client=False)) as srv:
        server = f"https://127.0.0.1:{srv.port}"
        strict = kubeconfig(
            tmp_path / "strict",
            cluster={"server": server, "certificate-authority": str(other / "o.crt")},
        )
        skip = kubeconfig(
            tmp_path / "skip", cluster={"server": server, "insecure-skip-tls-verify": True}
        )
        async with await KubeClient.connect(str(strict), request_timeout=5) as client:
            with pytest.raises(Transient, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get(PODS, "p", "ns")
        async with await KubeClient.connect(str(skip), request_timeout=5) as client:
            assert await client.get(PODS, "p", "ns") == {}

    assert b"Authorization: Bearer t0k\r\n" in srv.heads[-1]


async def test_a_ca_file_that_does_not_load_is_a_config_error_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "ca.crt"
    bad.write_text("not a certificate")
    path = kubeconfig(
        tmp_path / "kc", cluster={"server": "https://h", "certificate-authority": str(bad)}
    )

    with pytest.raises(ConfigError) as caught:
        await KubeClient.connect(str(path))

    assert caught.value.field == str(bad)
    assert parse_kubeconfig(str(path)).ca_file == str(bad)
