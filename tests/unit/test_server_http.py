"""The koordlet's own HTTP/1.1 server (koordlet.server.http, .connection) on real sockets on
127.0.0.1, spoken to byte by byte: keep-alive, pipelining, HEAD, the refusals, the timeouts
(made short), a failing handler, a peer that does not read, and stop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest

from koordlet.server.connection import HttpServer
from koordlet.server.http import App, HttpLimits, Request, Response, http_date, text_response

DEADLINE = 5.0
"""Seconds any wait in these tests may take before it fails."""


@dataclass
class Fixture:
    """An app with a few routes, served on 127.0.0.1."""

    app: App
    server: HttpServer
    port: int
    calls: dict[str, int] = field(default_factory=dict)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    """Lets ``/slow`` answer."""
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by each call of ``/slow`` and ``/big``."""

    async def handler_entered(self) -> None:
        async with asyncio.timeout(DEADLINE):
            await self.entered.wait()


def make_app(
    calls: dict[str, int], release: asyncio.Event, entered: asyncio.Event, big: bytes
) -> App:
    app = App()

    async def echo(request: Request) -> Response:
        calls["echo"] = calls.get("echo", 0) + 1
        data = {
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "x": request.headers.get("X-Thing"),
            "peer": request.peer[0],
            "version": request.version,
        }
        return Response(200, json.dumps(data).encode(), {"Content-Type": "application/json"})

    async def slow(request: Request) -> Response:
        calls["slow"] = calls.get("slow", 0) + 1
        entered.set()
        await release.wait()
        return text_response("slow")

    async def fast(request: Request) -> Response:
        return text_response("fast")

    async def boom(request: Request) -> Response:
        calls["boom"] = calls.get("boom", 0) + 1
        raise RuntimeError("the handler broke")

    async def large(request: Request) -> Response:
        calls["big"] = calls.get("big", 0) + 1
        entered.set()
        return Response(200, big, {"Content-Type": "application/octet-stream"})

    for path, handler in [
        ("/echo", echo),
        ("/slow", slow),
        ("/fast", fast),
        ("/boom", boom),
        ("/big", large),
    ]:
        app.add_get(path, handler)
    return app


BIG = b"x" * (4 << 20)


@contextlib.asynccontextmanager
async def serving(limits: HttpLimits | None = None) -> AsyncIterator[Fixture]:
    calls: dict[str, int] = {}
    release, entered = asyncio.Event(), asyncio.Event()
    app = make_app(calls, release, entered, BIG)
    server = HttpServer(app, limits or HttpLimits(shutdown_timeout=1.0))
    await server.start("127.0.0.1", 0)
    fx = Fixture(app, server, server.addresses[0][1], calls, release, entered)
    try:
        yield fx
    finally:
        release.set()
        await server.stop()


@pytest.fixture
async def srv() -> AsyncIterator[Fixture]:
    async with serving() as fx:
        yield fx


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    status_line: str


async def read_answer(reader: asyncio.StreamReader, *, head: bool = False) -> Answer:
    async with asyncio.timeout(DEADLINE):
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        body = b"" if head else await reader.readexactly(length)
        return Answer(int(lines[0].split()[1]), headers, body, lines[0])


async def at_eof(reader: asyncio.StreamReader) -> bool:
    """True when the server closed the connection (within the deadline)."""
    async with asyncio.timeout(DEADLINE):
        try:
            rest = await reader.read()
        except ConnectionResetError:
            return True
        return rest == b""


@contextlib.asynccontextmanager
async def connect(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def get(path: str, *extra: str, method: str = "GET", version: str = "1.1") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: koordlet", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# requests and answers -------------------------------------------------------------------------


async def test_a_request_is_parsed_into_method_decoded_path_query_headers_and_peer(
    srv: Fixture,
) -> None:
    async with connect(srv.port) as (reader, writer):
        writer.write(get("/%65cho?a=1&b=x+y&a=&c=%2F", "x-THING: yes"))
        answer = await read_answer(reader)
    assert answer.status == 200
    assert json.loads(answer.body) == {
        "method": "GET",
        "path": "/echo",
        "query": [["a", "1"], ["b", "x y"], ["a", ""], ["c", "/"]],
        "x": "yes",
        "peer": "127.0.0.1",
        "version": "1.1",
    }
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["server"] == "koordlet"
    assert re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", answer.headers["date"])


def test_the_date_header_is_an_imf_fixdate_whatever_the_locale() -> None:
    assert http_date(0.0) == "Thu, 01 Jan 1970 00:00:00 GMT"
    assert http_date(1_700_000_000.0) == "Tue, 14 Nov 2023 22:13:20 GMT"


async def test_head_answers_gets_headers_and_length_without_the_body(srv: Fixture) -> None:
    async with connect(srv.port) as (reader, writer):
        writer.write(get("/big"))
        full = await read_answer(reader)
        writer.write(get("/big", method="HEAD"))
        head = await read_answer(reader, head=True)
        # the next answer starts right after the head: no body bytes were sent
        writer.write(get("/fast"))
        after = await read_answer(reader)
    assert head.status == 200
    assert head.headers["content-length"] == str(len(full.body)) == str(len(BIG))
    assert head.headers["content-type"] == full.headers["content-type"]
    assert after.body == b"fast"


async def test_http11_keeps_the_connection_open_until_connection_close(srv: Fixture) -> None:
    async with connect(srv.port) as (reader, writer):
        for _ in range(3):
            writer.write(get("/fast"))
            answer = await read_answer(reader)
            assert (answer.status, answer.body) == (200, b"fast")
            assert "connection" not in answer.headers
        writer.write(get("/fast", "Connection: close"))
        last = await read_answer(reader)
        assert last.headers["connection"] == "close"
        assert await at_eof(reader)


async def test_http10_closes_unless_it_asks_for_keep_alive(srv: Fixture) -> None:
    async with connect(srv.port) as (reader, writer):
        writer.write(get("/fast", version="1.0"))
        answer = await read_answer(reader)
        assert (answer.status, answer.headers["connection"]) == (200, "close")
        assert await at_eof(reader)
    async with connect(srv.port) as (reader, writer):
        writer.write(get("/fast", "Connection: keep-alive", version="1.0"))
        answer = await read_answer(reader)
        assert answer.headers["connection"] == "keep-alive"
        writer.write(get("/fast", "Connection: keep-alive", version="1.0"))
        assert (await read_answer(reader)).body == b"fast"


async def test_pipelined_requests_are_answered_in_order(srv: Fixture) -> None:
    async with connect(srv.port) as (reader, writer):
        writer.write(get("/slow") + get("/echo?n=2") + get("/fast") + get("/nope"))
        await srv.handler_entered()
        assert srv.calls.get("echo", 0) == 0  # the second waits for the first
        srv.release.set()
        answers = [await read_answer(reader) for _ in range(4)]
    assert [a.status for a in answers] == [200, 200, 200, 404]
    assert answers[0].body == b"slow"
    assert json.loads(answers[1].body)["query"] == [["n", "2"]]
    assert answers[2].body == b"fast"


async def test_an_unknown_path_is_404_and_another_method_405_with_allow(srv: Fixture) -> None:
    async with connect(srv.port) as (reader, writer):
        writer.write(get("/nope"))
        missing = await read_answer(reader)
        writer.write(get("/echo", "Content-Length: 0", method="POST"))
        post = await read_answer(reader)
        writer.write(get("/echo", method="DELETE"))
        delete = await read_answer(reader)
        writer.write(get("/fast"))
        assert (await read_answer(reader)).body == b"fast"  # still open
    assert (missing.status, missing.body) == (404, b"404: Not Found")
    assert (post.status, post.headers["allow"], post.body) == (
        405,
        "GET,HEAD",
        b"405: Method Not Allowed",
    )
    assert delete.status == 405
    assert srv.calls.get("echo", 0) == 0


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (get("/echo", "Content-Length: 5") + b"hello", 413),
        (get("/echo", "Transfer-Encoding: chunked") + b"5\r\nhello\r\n0\r\n\r\n", 413),
        (get("/echo", "Content-Length: 5", method="POST") + b"hello", 405),
    ],
    ids=["length", "chunked", "post"],
)
async def test_a_request_with_a_body_is_refused_and_the_connection_closed(
    srv: Fixture, request_bytes: bytes, status: int
) -> None:
    async with connect(srv.port) as (reader, writer):
        writer.write(request_bytes + get("/fast"))
        answer = await read_answer(reader)
        assert (answer.status, answer.headers["connection"]) == (status, "close")
        assert await at_eof(reader)  # the pipelined /fast is not answered
    assert srv.calls.get("echo", 0) == 0


@pytest.mark.parametrize(
    "garbage",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /fast HTTP/1.1\r\nHost koordlet\r\n\r\n",
        b"GET /fast HTTP/9.9\r\n\r\n",
        b"GET /fast HTTP/1.1\r\nContent-Length: x\r\n\r\n",
    ],
    ids=["no-version", "header-without-colon", "version", "bad-length"],
)
async def test_a_malformed_request_is_400_and_the_connection_closed(
    srv: Fixture, garbage: bytes
) -> None:
    async with connect(srv.port) as (reader, writer):
        writer.write(garbage)
        answer = await read_answer(reader)
        assert (answer.status, answer.headers["connection"]) == (400, "close")
        assert await at_eof(reader)


async def test_a_malformed_request_after_a_good_one_is_answered_after_it(srv: Fixture) -> None:
    async with connect(srv.port) as (reader, writer):
        writer.write(get("/fast") + b"GARBAGE\r\n\r\n")
        first = await read_answer(reader)
        second = await read_answer(reader)
        assert (first.status, first.body, second.status) == (200, b"fast", 400)
        assert await at_eof(reader)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (get("/fast?" + "q" * 9000), 414),
        (get("/fast", "X-Big: " + "v" * 9000), 431),
        (get("/fast", *(f"X-{i}: v" for i in range(101))), 431),
        # a header that never ends: the server stops reading it
        (b"GET /fast HTTP/1.1\r\nX-Endless: " + b"v" * (64 << 10), 431),
    ],
    ids=["target", "header", "count", "endless"],
)
async def test_an_oversize_head_is_refused_and_the_connection_closed(
    srv: Fixture, request_bytes: bytes, status: int
) -> None:
    async with connect(srv.port) as (reader, writer):
        writer.write(request_bytes)
        answer = await read_answer(reader)
        assert (answer.status, answer.headers["connection"]) == (status, "close")
        assert await at_eof(reader)


async def test_a_head_just_under_the_limits_is_served(srv: Fixture) -> None:
    async with connect(srv.port) as (reader, writer):
        writer.write(get("/echo?" + "q" * 8000, "X-Big: " + "v" * 8000))
        assert (await read_answer(reader)).status == 200


# timeouts -------------------------------------------------------------------------------------


async def test_an_idle_keep_alive_connection_is_closed_after_the_keepalive_timeout() -> None:
    async with serving(HttpLimits(keepalive_timeout=0.2)) as fx:
        async with connect(fx.port) as (reader, writer):
            writer.write(get("/fast"))
            assert (await read_answer(reader)).status == 200
            assert await at_eof(reader)
        async with connect(fx.port) as (reader, _writer):
            assert await at_eof(reader)  # one that never sent a byte too


async def test_a_head_not_complete_in_time_is_408_and_closed() -> None:
    limits = HttpLimits(request_timeout=0.2, keepalive_timeout=60)
    async with serving(limits) as fx, connect(fx.port) as (reader, writer):
        writer.write(b"GET /fast HTTP/1.1\r\nHost: koord")
        answer = await read_answer(reader)
        assert (answer.status, answer.headers["connection"]) == (408, "close")
        assert await at_eof(reader)


# failures, backpressure, stop -----------------------------------------------------------------


async def test_a_failing_handler_is_500_logged_once_and_the_server_keeps_serving(
    srv: Fixture, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="koordlet.server.connection")
    async with connect(srv.port) as (reader, writer):
        writer.write(get("/boom"))
        answer = await read_answer(reader)
        writer.write(get("/fast"))
        after = await read_answer(reader)
    assert (answer.status, answer.body) == (500, b"500: Internal Server Error")
    assert after.body == b"fast"
    failures = [r for r in caplog.records if "GET /boom failed" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].exc_info is not None


async def test_a_peer_that_does_not_read_stops_the_answers_until_it_reads(srv: Fixture) -> None:
    """50 pipelined requests for 4 MiB each: while the peer reads nothing, the server answers
    only what the socket buffers hold, then stops (200 MiB were asked for)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", srv.port))
    await loop.sock_sendall(sock, get("/big") * 50)
    try:
        await srv.handler_entered()
        # settled: no further call for 0.3 s
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DEADLINE):
                while True:
                    srv.entered.clear()
                    await asyncio.wait_for(srv.entered.wait(), 0.3)
        assert srv.calls["big"] <= 3
        (conn,) = srv.server.connections
        assert conn.buffered() <= len(BIG) + (64 << 10)
        reader, writer = await asyncio.open_connection(sock=sock, limit=8 << 20)
        sizes = [len((await read_answer(reader)).body) for _ in range(50)]
        assert sizes == [len(BIG)] * 50
        assert srv.calls["big"] == 50
        writer.close()
    finally:
        sock.close()


async def test_stop_closes_idle_connections_finishes_the_answer_in_progress_then_closes() -> None:
    async with (
        serving(HttpLimits(shutdown_timeout=DEADLINE)) as fx,
        connect(fx.port) as (idle_r, idle_w),
        connect(fx.port) as (busy_r, busy_w),
    ):
        idle_w.write(get("/fast"))
        assert (await read_answer(idle_r)).status == 200
        busy_w.write(get("/slow"))
        await fx.handler_entered()
        stopping = asyncio.create_task(fx.server.stop(), name="test-stop")
        assert await at_eof(idle_r)
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", fx.port)
        assert not stopping.done()
        fx.release.set()
        answer = await read_answer(busy_r)
        assert (answer.body, answer.headers["connection"]) == (b"slow", "close")
        assert await at_eof(busy_r)
        async with asyncio.timeout(DEADLINE):
            await stopping


async def test_stop_aborts_an_answer_that_outlasts_the_shutdown_timeout() -> None:
    async with (
        serving(HttpLimits(shutdown_timeout=0.2)) as fx,
        connect(fx.port) as (reader, writer),
    ):
        writer.write(get("/slow"))
        await fx.handler_entered()
        async with asyncio.timeout(DEADLINE):
            await fx.server.stop()
        assert await at_eof(reader)
        assert fx.server.connections == set()


async def test_an_http_client_library_talks_to_it_with_keep_alive(srv: Fixture) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            async with session.get(f"http://127.0.0.1:{srv.port}/echo?k=v") as resp:
                assert resp.status == 200
                assert (await resp.json())["query"] == [["k", "v"]]
        async with session.head(f"http://127.0.0.1:{srv.port}/fast") as resp:
            assert (resp.status, resp.headers["Content-Length"]) == (200, "4")
    assert srv.calls["echo"] == 3
