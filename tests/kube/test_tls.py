"""kubeclient.tls against real TLS peers on loopback (the standard library's server side, OpenSSL
underneath), on asyncio's loop and on uvloop's (the daemons' loop): the handshake and its
failures, data in both directions across many records and under flow control, the ends of a
connection, a broken record, and what a connection keeps between reads."""

from __future__ import annotations

import asyncio
import gc
import ssl
import subprocess
import sys
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvloop

from kubeclient import tls
from tests.freshinterp import run_json
from tests.kube.test_transport import Pki, openssl, pki, server_tls

__all__ = ["pki"]  # the module-scoped CA fixture, shared with test_transport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


Run = Callable[[Coroutine[Any, Any, None]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    """Runs a test's coroutine on a fresh loop of that kind."""

    def on_loop(coro: Coroutine[Any, Any, None]) -> None:
        if request.param == "uvloop":
            uvloop.run(coro)
        else:
            asyncio.run(coro)

    return on_loop


def client_tls(pki: Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.path("ca.crt")))


@asynccontextmanager
async def serving(handler: Handler, context: ssl.SSLContext | None) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), 5)


async def connect(
    port: int, pki: Pki, name: str = "api.test", limit: int = 64 * 1024
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(
        tls.open_connection(
            "127.0.0.1", port, context=client_tls(pki), server_hostname=name, limit=limit
        ),
        10,
    )


def test_an_echo_across_many_records_both_ways_with_the_servers_identity_checked(
    pki: Pki, run: Run
) -> None:
    async def body() -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(50_000):
                writer.write(data)
                await writer.drain()
            writer.close()

        payload = bytes(range(256)) * 4096  # 1 MiB: 64 records each way
        async with serving(echo, server_tls(pki, require_client=False)) as port:
            reader, writer = await connect(port, pki, limit=16 * 1024)  # the reader pauses often
            peer = writer.get_extra_info("ssl_object")
            assert isinstance(peer, ssl.SSLObject)
            assert peer.server_hostname == "api.test"
            assert writer.get_extra_info("peercert")["subject"] == ((("commonName", "server"),),)
            assert writer.get_extra_info("peername")[0] == "127.0.0.1"

            async def send() -> None:
                for at in range(0, len(payload), 100_000):
                    writer.write(payload[at : at + 100_000])
                    await writer.drain()

            sending = asyncio.create_task(send())
            back = await asyncio.wait_for(reader.readexactly(len(payload)), 20)
            await sending
            writer.close()
            await asyncio.wait_for(writer.wait_closed(), 5)

        assert back == payload

    run(body())


def test_a_certificate_for_another_name_or_from_another_ca_fails_the_handshake(
    pki: Pki, tmp_path_factory: pytest.TempPathFactory, run: Run
) -> None:
    async def body() -> None:
        async def idle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()
            writer.close()

        async with serving(idle, server_tls(pki, require_client=False)) as port:
            with pytest.raises(ssl.SSLCertVerificationError, match=r"api\.other"):
                await connect(port, pki, name="api.other")
            other = tmp_path_factory.mktemp("other")
            openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", "o.key", "-subj", "/CN=other", "-days", "1",
                    "-out", "o.crt", cwd=other)  # fmt: skip
            ctx = ssl.create_default_context(cafile=str(other / "o.crt"))
            with pytest.raises(ssl.SSLCertVerificationError, match="CERTIFICATE_VERIFY_FAILED"):
                await tls.open_connection(
                    "127.0.0.1", port, context=ctx, server_hostname="api.test", limit=1024
                )

    run(body())


def test_a_peer_that_closes_before_the_handshake_completes_is_a_connection_reset(
    pki: Pki, run: Run
) -> None:
    async def body() -> None:
        async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(10)  # the ClientHello's first bytes, then the end
            writer.close()

        async with serving(hang_up, None) as port:
            with pytest.raises(ConnectionResetError, match="TLS handshake"):
                await connect(port, pki)

    run(body())


def test_the_peers_close_notify_and_a_bare_tcp_end_are_both_the_end_of_the_data(
    pki: Pki, run: Run
) -> None:
    async def body() -> None:
        async def say_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"last words\n")
            await writer.drain()
            writer.close()  # the standard library sends close_notify

        async with serving(say_and_close, server_tls(pki, require_client=False)) as port:
            reader, writer = await connect(port, pki)
            assert await asyncio.wait_for(reader.read(), 5) == b"last words\n"
            await asyncio.wait_for(writer.wait_closed(), 5)
            assert writer.is_closing()
            writer.write(b"after the end")  # dropped, as on a closed transport; no error

        # a TLS server that ends the TCP stream without close_notify (a killed process)
        sockets: list[asyncio.StreamWriter] = []

        async def vanish(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"partial")
            await writer.drain()
            sockets.append(writer)
            writer.transport.abort()

        async with serving(vanish, server_tls(pki, require_client=False)) as port:
            reader, writer = await connect(port, pki)
            data = await asyncio.wait_for(reader.read(), 5)
            assert data in (b"", b"partial")
            writer.close()

    run(body())


def test_a_broken_record_after_the_handshake_is_the_readers_error_and_closes_it(
    pki: Pki, run: Run
) -> None:
    """A middlebox's garbage where a TLS record should be: OpenSSL's error reaches the reader."""

    async def body() -> None:
        got: list[tls.TlsProtocol] = []
        loop = asyncio.get_running_loop()

        async def hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"hello\n")
            await writer.drain()
            await reader.read()

        async with serving(hello, server_tls(pki, require_client=False)) as port:
            reader = asyncio.StreamReader(limit=1024, loop=loop)
            upper = asyncio.StreamReaderProtocol(reader, loop=loop)
            done: asyncio.Future[None] = loop.create_future()
            proto = tls.TlsProtocol(client_tls(pki), "api.test", upper, done)
            got.append(proto)
            await loop.create_connection(lambda: proto, "127.0.0.1", port)
            await asyncio.wait_for(done, 10)
            assert await asyncio.wait_for(reader.readline(), 5) == b"hello\n"
            # a record header for application data with a body that does not decrypt
            proto.data_received(b"\x17\x03\x03\x00\x20" + b"\x00" * 32)
            with pytest.raises(ssl.SSLError):
                await asyncio.wait_for(reader.read(), 5)
            assert proto.closing

    run(body())


BIG_SERVER = """
import asyncio, ssl, sys
async def main():
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[1], sys.argv[2])
    async def big(reader, writer):
        writer.write(b"x" * 1_000_000)
        await writer.drain()
        await reader.read()
    server = await asyncio.start_server(big, "127.0.0.1", 0, ssl=ctx)
    print(server.sockets[0].getsockname()[1], flush=True)
    await reader_of_stdin()
async def reader_of_stdin():
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
asyncio.run(main())
"""


def test_a_connection_keeps_no_read_buffer_between_reads(pki: Pki, run: Run) -> None:
    """The loop's own TLS transport keeps 256 KiB a connection for its whole life (its read
    buffer); ours keeps only OpenSSL's state, outside Python's heap. The server is another
    process, so only the client side is counted."""
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            BIG_SERVER,
            str(pki.path("server.crt")),
            str(pki.path("server.key")),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as server:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        sizes: list[float] = []

        async def body() -> None:
            first = await connect(port, pki)  # lazily made module state is not counted
            await asyncio.wait_for(first[0].readexactly(1_000_000), 10)
            gc.collect()
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                conns = []
                for _ in range(4):
                    reader, writer = await connect(port, pki)
                    await asyncio.wait_for(reader.readexactly(1_000_000), 10)
                    conns.append((reader, writer))
                gc.collect()
                sizes.append((tracemalloc.get_traced_memory()[0] - base) / 4)
            finally:
                tracemalloc.stop()
            for _, writer in [first, *conns]:
                writer.close()

        try:
            run(body())
        finally:
            server.kill()

    assert sizes[0] < 32 * 1024, sizes


def test_an_ascii_server_name_does_not_load_the_idna_codec() -> None:
    """ssl sends a str host name through the idna codec (stringprep, unicodedata: about 0.3 MiB
    of a koordlet); an ASCII name is handed over as bytes, and checked all the same."""
    loaded = run_json(
        """
        import asyncio, json, ssl, sys
        from kubeclient import tls
        loop = asyncio.new_event_loop()
        proto = tls.TlsProtocol(
            ssl.create_default_context(), "api.test", asyncio.Protocol(), loop.create_future()
        )
        name = proto.extra("ssl_object").server_hostname
        print(json.dumps([name, "encodings.idna" in sys.modules, "stringprep" in sys.modules]))
        """
    )
    assert loaded == ["api.test", False, False]
