"""The connection side of the koordlet's HTTP server: an asyncio protocol over httptools' parser,
and :class:`HttpServer`, which listens and stops. The behaviour (keep-alive, pipelining, the
refusals, the timeouts, backpressure, stop) is listed in :mod:`koordlet.server.http`.

One connection answers its requests in order in one task, started when a request is parsed and
ended when none is left, so an idle connection holds no task; the task is the protocol's, and
:meth:`HttpServer.stop` waits for or cancels every one.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any, NoReturn, cast
from urllib.parse import unquote_to_bytes

import httptools

from apis.records import frozen
from koordlet.server.http import App, Headers, HttpLimits, Request, Response, encode_head

logger = logging.getLogger(__name__)

_COALESCE = 16 * 1024
"""Bodies up to this size are written in one piece with the head."""
_HEAD_SLACK = 4096
"""Bytes a head may send beyond its target and header fields: request line, separators."""


@frozen
class _Failure:
    """A refusal queued behind the requests parsed before it (answers stay in order)."""

    status: int
    text: str


class _StopParsing(Exception):
    """Raised from a parser callback to stop parsing the rest of the data."""


class HttpProtocol(asyncio.Protocol):
    """One connection: parses requests, answers them in order through the server's app."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._limits = server.limits
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._peer: Any = None
        self._parser = httptools.HttpRequestParser(self)
        self._queue: collections.deque[Request | _Failure] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._drain: asyncio.Future[None] | None = None
        self._write_paused = False
        self._read_paused = False
        self._closing = False
        """Nothing more is read: the last queued item is the connection's last answer."""
        self._stopping = False
        # the request being parsed
        self._in_head = False
        self._head_raw = 0
        self._url = bytearray()
        self._header_bytes = 0
        self._headers: list[tuple[str, str]] = []
        self._refusal: _Failure | None = None

    # asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport = cast(asyncio.Transport, transport)  # uvloop's too
        transport.set_write_buffer_limits(high=self._limits.write_high_water)
        self._peer = transport.get_extra_info("peername")
        self._server.connections.add(self)
        self._arm(self._limits.keepalive_timeout, self._idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._cancel_timer()
        self._closing = True
        self._queue.clear()
        self._wake_writer()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writer()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        # Fed in pieces of max_head bytes, so that a head that never ends is seen growing:
        # httptools keeps an unfinished header field itself.
        step = self._limits.max_head
        for start in range(0, len(data), step):
            if not self._feed(data[start : start + step] if len(data) > step else data):
                break
        if self._refusal is not None:
            refusal, self._refusal = self._refusal, None
            self._fail(refusal.status, refusal.text)
        if len(self._queue) >= self._limits.max_pipelined and not self._read_paused:
            self._pause_reading()
        self._kick()

    def _feed(self, piece: bytes) -> bool:
        """Parse ``piece``; False when nothing more is to be parsed."""
        if self._in_head:
            # what the head sent since the piece it began in: at most a piece less than its size
            self._head_raw += len(piece)
            if self._head_raw > 2 * self._limits.max_head + _HEAD_SLACK:
                self._fail(431, "request header section too large")
                return False
        try:
            self._parser.feed_data(piece)
        except _StopParsing:
            return False
        except httptools.HttpParserUpgrade:
            self._stop_reading()  # answer what came before the upgrade, then close
            return False
        except httptools.HttpParserError as err:
            if self._refusal is None:
                logger.debug("malformed request from %s: %s", self._peer, err)
                self._fail(400, "malformed request")
            return False
        return not self._closing

    # httptools callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_raw = 0
        self._url.clear()
        self._header_bytes = 0
        self._headers = []
        self._arm(self._limits.request_timeout, self._request_timeout)

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._limits.max_head:
            self._refuse(414, "request target too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > self._limits.max_head:
            self._refuse(431, "request header section too large")
        if len(self._headers) >= self._limits.max_headers:
            self._refuse(431, "too many request header fields")
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_timer()
        parser = self._parser
        headers = Headers(self._headers)
        try:
            target = httptools.parse_url(bytes(self._url))
        except httptools.HttpParserInvalidURLError:
            self._refuse(400, "malformed request target")
        path = unquote_path(target.path or b"/")
        length = headers.get("content-length", "0").strip()
        has_body = "transfer-encoding" in headers or (length.isdigit() and int(length) > 0)
        request = Request(
            method=parser.get_method().decode("latin-1"),
            path=path,
            query_string=(target.query or b"").decode("latin-1"),
            headers=headers,
            peer=self._peer,
            version=parser.get_http_version(),
            has_body=has_body,
            keep_alive=parser.should_keep_alive() and not has_body,
            _respond=self._write,
        )
        self._queue.append(request)
        if not request.keep_alive:
            self._stop_reading()
            raise _StopParsing

    # answering -----------------------------------------------------------------------------

    def _kick(self) -> None:
        if self._task is None and self._queue:
            self._task = self._loop.create_task(self._serve(), name=f"http-connection {self._peer}")

    async def _serve(self) -> None:
        try:
            while self._queue and not self._is_closed():
                item = self._queue.popleft()
                if self._read_paused and not self._closing and len(self._queue) < 2:
                    self._read_paused = False
                    if self._transport is not None:
                        self._transport.resume_reading()
                if isinstance(item, _Failure):
                    text = f"{item.status}: {item.text}"
                    await self._write(None, Response(item.status, text.encode(), dict(_TEXT)))
                    break
                await self._answer(item)
                if self._stopping:
                    self._close()
        finally:
            self._task = None
            if not self._is_closed():
                if self._stopping or (self._closing and not self._queue):
                    self._close()
                elif not self._in_head:
                    self._arm(self._limits.keepalive_timeout, self._idle_timeout)

    async def _answer(self, request: Request) -> None:
        try:
            response = await self._server.app.handle(request)
        except Exception:
            logger.exception("%s %s failed", request.method, request.path)
            if request.responded:
                self._close()
                return
            response = Response(500, b"500: Internal Server Error", dict(_TEXT))
        if not request.responded:
            request.responded = True
            await self._write(request, response)

    async def _write(self, request: Request | None, response: Response) -> None:
        """Write ``response`` (to ``request``; None: a refusal, always the last answer), then
        wait while the peer is not reading."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        last = self._closing and not self._queue
        close = request is None or response.close or not request.keep_alive or last
        close = close or self._stopping
        body = response.body
        head = encode_head(
            response,
            len(body),
            close=close,
            keep_alive_header=request is not None and request.version == "1.0",
        )
        if (request is not None and request.method == "HEAD") or not body:
            transport.write(head)
        elif len(body) <= _COALESCE:
            transport.write(head + body)
        else:
            transport.write(head)  # two writes: no copy of a large body to join them
            transport.write(body)
        if close:
            self._close()
            return
        while self._write_paused and not transport.is_closing():
            self._drain = self._loop.create_future()
            await self._drain

    # state ---------------------------------------------------------------------------------

    def _refuse(self, status: int, text: str) -> NoReturn:
        self._refusal = _Failure(status, text)
        raise _StopParsing

    def _fail(self, status: int, text: str) -> None:
        self._queue.append(_Failure(status, text))
        self._stop_reading()
        self._kick()

    def _stop_reading(self) -> None:
        self._closing = True
        self._cancel_timer()
        self._pause_reading()

    def _pause_reading(self) -> None:
        if self._transport is not None and not self._read_paused:
            self._read_paused = True
            self._transport.pause_reading()

    def _idle_timeout(self) -> None:
        self._timer = None
        if self._task is None and not self._in_head:
            self._close()

    def _request_timeout(self) -> None:
        self._timer = None
        if self._in_head:
            self._fail(408, "request head not received in time")

    def _arm(self, delay: float, callback: Any) -> None:
        self._cancel_timer()
        self._timer = self._loop.call_later(delay, callback)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake_writer(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    def _is_closed(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    def _close(self) -> None:
        self._cancel_timer()
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    def buffered(self) -> int:
        """Bytes written for the peer and not yet sent."""
        return self._transport.get_write_buffer_size() if self._transport is not None else 0

    def shutdown(self) -> asyncio.Task[None] | None:
        """The server stops: close now when idle, else after the answer in progress; the task
        to wait for, if any."""
        self._stopping = True
        self._closing = True
        self._queue.clear()
        if self._task is None:
            self._close()
        return self._task

    def abort(self) -> None:
        """Drop the connection and cancel its answer."""
        if self._task is not None:
            self._task.cancel()
        if self._transport is not None:
            self._transport.abort()


_TEXT = {"Content-Type": "text/plain; charset=utf-8"}


def unquote_path(raw: bytes) -> str:
    """The percent-decoded path (invalid UTF-8 replaced, as aiohttp's router saw it)."""
    return unquote_to_bytes(raw).decode("utf-8", "replace")


class HttpServer:
    """Listens on one address and serves ``app``; :meth:`stop` closes it."""

    def __init__(self, app: App, limits: HttpLimits | None = None) -> None:
        self.app = app
        self.limits = limits or HttpLimits()
        self.connections: set[HttpProtocol] = set()
        self._server: asyncio.Server | None = None

    async def start(self, host: str | None, port: int) -> None:
        loop = asyncio.get_running_loop()
        # An ASCII host goes as bytes (in a list, which create_server takes): uvloop encodes a
        # str host with the "idna" codec, which loads stringprep and unicodedata (0.2 MiB) for
        # an address such as 127.0.0.1; a bytes host it resolves as it is.
        hosts: Any = [host.encode("ascii")] if host and host.isascii() else host
        self._server = await loop.create_server(lambda: HttpProtocol(self), hosts, port)

    @property
    def addresses(self) -> list[Any]:
        """The bound socket addresses (``(host, port)`` for IPv4)."""
        if self._server is None:
            return []
        return [sock.getsockname() for sock in self._server.sockets]

    async def stop(self) -> None:
        """Stop accepting, close idle connections, wait up to ``shutdown_timeout`` for the
        answers in progress, abort the rest."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        tasks = [t for conn in list(self.connections) if (t := conn.shutdown()) is not None]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=self.limits.shutdown_timeout)
            if pending:
                logger.warning("%d HTTP answers still in progress at stop: aborted", len(pending))
        for conn in list(self.connections):
            conn.abort()
        for task in tasks:
            if not task.done():
                await asyncio.wait([task])
        await server.wait_closed()
