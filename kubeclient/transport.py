"""A small HTTP/1.1 client on asyncio streams: what the API server and the kubelet need, no more.

kubernetes-asyncio and aiohttp cost the koordlet about 57 MiB of resident memory for a handful of
JSON requests and four watch streams (docs/benchmarks.md, issue 26), so the client speaks the
protocol itself, over the ``ssl`` module the interpreter already has (through
:mod:`kubeclient.tls`, which keeps no read buffer for a connection between reads):

- **requests**: one method, target and optional body with ``Content-Length``; the answer framed
  by ``Content-Length``, ``Transfer-Encoding: chunked`` or the end of the connection;
- **streams** (watches): the answer's body read piece by piece (:meth:`Stream.readline`), so an
  event is handled as it arrives;
- **connections**: kept alive and reused (at most ``max_idle`` idle ones, each closed after
  ``idle_timeout`` seconds unused), closed after ``Connection: close``, an HTTP/1.0 answer, a body
  read only in part, or any error. A request that finds its reused connection closed by the
  server before any byte of the answer is sent again once on a new connection when its method
  is idempotent (GET, HEAD, PUT, DELETE, as RFC 9110 defines them);
- **timeouts**: a whole request within its ``timeout``; a stream's head within
  ``connect_timeout`` and each read of its body within ``read_timeout``.

No redirects, no compression (``Accept-Encoding`` is not sent), no proxies, no HTTP/2 (ALPN
offers ``http/1.1``). Failures raise :class:`TransportError` (malformed or cut answers),
``OSError`` (the connection) or ``TimeoutError``; :mod:`kubeclient.client` translates them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType

from kubeclient import tls

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
"""Methods sent again when a reused connection turns out closed (RFC 9110, 9.2.2)."""
MAX_HEAD = 64 * 1024
"""Bytes a response's status line and headers may take."""


class TransportError(Exception):
    """The peer answered something that is not HTTP/1.1, or cut the answer short."""


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0
    reused: bool = False

    def usable(self, now: float, idle_timeout: float) -> bool:
        return (
            not self.writer.is_closing()
            and not self.reader.at_eof()
            and now - self.idle_since < idle_timeout
        )

    def close(self) -> None:
        self.writer.close()


@dataclass
class Response:
    """A whole answer."""

    status: int
    headers: dict[str, str]
    """Lower-cased names; a repeated field's values joined with ``, ``."""
    body: bytes


@dataclass
class _Head:
    status: int
    headers: dict[str, str]
    keep_alive: bool
    chunked: bool
    length: int | None
    """``Content-Length``; None when chunked or read to the end of the connection."""


def _parse_head(raw: bytes) -> _Head:
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise TransportError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            raise TransportError(f"malformed header line: {line[:80]!r}")
        key = name.strip().lower().decode("latin-1")
        text = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    keep_alive = parts[0] == b"HTTP/1.1" and "close" not in headers.get("connection", "").lower()
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length: int | None = None
    if not chunked and "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError as err:
            raise TransportError(f"bad Content-Length {headers['content-length']!r}") from err
        if length < 0:
            raise TransportError(f"bad Content-Length {length}")
    if status in (204, 304) or 100 <= status < 200:
        length = 0
        chunked = False
    if not chunked and length is None:
        keep_alive = False  # the body ends with the connection
    return _Head(status, headers, keep_alive, chunked, length)


class _Body:
    """Reads one answer's body off its connection."""

    def __init__(self, reader: asyncio.StreamReader, head: _Head) -> None:
        self._reader = reader
        self._head = head
        self._left = head.length
        self.done = head.length == 0
        """The whole body was read (the connection may serve another request)."""

    async def chunk(self) -> bytes:
        """The next piece of the body; ``b""`` at its end."""
        if self.done:
            return b""
        reader = self._reader
        try:
            if self._head.chunked:
                line = await reader.readuntil(b"\r\n")
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError as err:
                    raise TransportError(f"bad chunk size line {line[:40]!r}") from err
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields
                        pass
                    self.done = True
                    return b""
                data = await reader.readexactly(size + 2)
                if data[-2:] != b"\r\n":
                    raise TransportError("chunk not followed by CRLF")
                return data[:-2]
            if self._left is None:
                data = await reader.read(256 * 1024)
                if not data:
                    self.done = True
                return data
            data = await reader.read(min(self._left, 256 * 1024))
            if not data:
                raise TransportError(f"connection closed with {self._left} bytes of body unread")
            self._left -= len(data)
            self.done = self._left == 0
        except asyncio.IncompleteReadError as err:
            raise TransportError("connection closed in the middle of a chunk") from err
        except asyncio.LimitOverrunError as err:
            raise TransportError("chunk size line too long") from err
        return data

    async def read_all(self) -> bytes:
        parts = []
        while piece := await self.chunk():
            parts.append(piece)
        return b"".join(parts)


class Stream:
    """An answer whose body is read as it comes (a watch); use as ``async with``."""

    def __init__(self, transport: Transport, conn: _Conn, head: _Head, read_timeout: float):
        self._transport = transport
        self._conn: _Conn | None = conn
        self._body = _Body(conn.reader, head)
        self._read_timeout = read_timeout
        self._buf = bytearray()
        self._scanned = 0
        self.status = head.status
        self.headers = head.headers
        self._keep_alive = head.keep_alive

    async def _more(self) -> bytes:
        async with asyncio.timeout(self._read_timeout):
            return await self._body.chunk()

    async def read(self) -> bytes:
        """The rest of the body."""
        parts = [bytes(self._buf)]
        self._buf.clear()
        self._scanned = 0
        while piece := await self._more():
            parts.append(piece)
        return b"".join(parts)

    async def readline(self) -> bytes:
        """The next line with its ``\\n``; at the end of the body what is left (without one),
        then ``b""``."""
        while True:
            at = self._buf.find(b"\n", self._scanned)
            if at >= 0:
                line = bytes(self._buf[: at + 1])
                del self._buf[: at + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buf)
            piece = await self._more()
            if not piece:
                line = bytes(self._buf)
                self._buf.clear()
                self._scanned = 0
                return line
            self._buf += piece

    def release(self) -> None:
        """Give the connection back (reused when the body was read to its end)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._transport._release(conn, self._keep_alive and self._body.done)

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


@dataclass
class Transport:
    """Requests to one ``host:port`` (TLS when ``ssl`` is given)."""

    host: str
    port: int
    ssl: ssl.SSLContext | None = None
    server_hostname: str | None = None
    """The name TLS checks the certificate against, when not ``host``."""
    headers: Callable[[], Mapping[str, str]] | None = None
    """Extra headers of every request, asked for each one (a bearer token that rotates)."""
    max_idle: int = 4
    idle_timeout: float = 15.0
    """Seconds an idle connection is kept for reuse (aiohttp's default keep-alive)."""
    user_agent: str = "koordinator-py"
    clock: Callable[[], float] = time.monotonic
    _idle: list[_Conn] = field(default_factory=list)
    _closed: bool = False
    _expiry: asyncio.TimerHandle | None = None

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.ssl is not None else 80
        return host if self.port == default else f"{host}:{self.port}"

    # Connections ------------------------------------------------------------------------------
    async def _acquire(self) -> _Conn:
        if self._closed:
            raise OSError("transport closed")
        now = self.clock()
        while self._idle:
            conn = self._idle.pop()
            if conn.usable(now, self.idle_timeout):
                conn.reused = True
                return conn
            conn.close()
        host = self.host.strip("[]")
        if self.ssl is None:
            reader, writer = await asyncio.open_connection(host, self.port, limit=MAX_HEAD)
        else:
            reader, writer = await tls.open_connection(
                host,
                self.port,
                context=self.ssl,
                server_hostname=self.server_hostname or host,
                limit=MAX_HEAD,
            )
        return _Conn(reader, writer)

    def _release(self, conn: _Conn, reusable: bool) -> None:
        if reusable and not self._closed and len(self._idle) < self.max_idle:
            conn.idle_since = self.clock()
            conn.reused = False
            self._idle.append(conn)
            if self._expiry is None:
                loop = asyncio.get_running_loop()
                self._expiry = loop.call_later(self.idle_timeout, self._expire)
        else:
            conn.close()

    def _expire(self) -> None:
        """Close the connections idle for ``idle_timeout`` (each holds a socket and, over
        TLS, OpenSSL's state), and look again when the next one would be."""
        self._expiry = None
        now = self.clock()
        keep = []
        for conn in self._idle:
            if conn.usable(now, self.idle_timeout):
                keep.append(conn)
            else:
                conn.close()
        self._idle = keep
        if keep:
            wait = max(keep[0].idle_since + self.idle_timeout - now, 0.01)
            self._expiry = asyncio.get_running_loop().call_later(wait, self._expire)

    async def close(self) -> None:
        """Close the idle connections; later requests fail. Connections in use close when
        released."""
        self._closed = True
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        for conn in idle:
            with contextlib.suppress(OSError, ssl.SSLError):
                await conn.writer.wait_closed()

    # Requests ---------------------------------------------------------------------------------
    def _head_bytes(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None
    ) -> bytes:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host_header}"]
        lines.append(f"User-Agent: {self.user_agent}")
        if self.headers is not None:
            lines.extend(f"{k}: {v}" for k, v in self.headers().items())
        lines.extend(f"{k}: {v}" for k, v in headers.items())
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _send(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None
    ) -> tuple[_Conn, _Head]:
        """Send the request and read the answer's head, on a reused connection when there is
        one (sent again on a new connection, idempotent methods only, if the reused one turns
        out closed before the answer began)."""
        data = self._head_bytes(method, target, headers, body)
        if body:
            data += body
        while True:
            conn = await self._acquire()
            try:
                conn.writer.write(data)
                await conn.writer.drain()
                raw = await conn.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as err:
                conn.close()
                if conn.reused and not err.partial and method in IDEMPOTENT:
                    continue
                raise TransportError("connection closed before the answer's head") from err
            except asyncio.LimitOverrunError as err:
                conn.close()
                raise TransportError(f"answer's head over {MAX_HEAD} bytes") from err
            except (OSError, ssl.SSLError) as err:
                conn.close()
                if conn.reused and method in IDEMPOTENT and isinstance(err, ConnectionError):
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            try:
                return conn, _parse_head(raw[:-4])
            except TransportError:
                conn.close()
                raise

    async def request(
        self,
        method: str,
        target: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        timeout: float = 30.0,  # noqa: ASYNC109 - a per-request bound is the API
    ) -> Response:
        """One request and its whole answer within ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            conn, head = await self._send(method, target, headers or {}, body)
            reusable = False
            try:
                reader = _Body(conn.reader, head)
                data = await reader.read_all() if method != "HEAD" else b""
                reusable = head.keep_alive and (reader.done or method == "HEAD")
            finally:
                self._release(conn, reusable)
        return Response(head.status, head.headers, data)

    async def stream(
        self,
        method: str,
        target: str,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float = 30.0,
        read_timeout: float = 330.0,
    ) -> Stream:
        """Send a request; its answer as a :class:`Stream` once the head is in (within
        ``connect_timeout``), each later read of the body within ``read_timeout``."""
        async with asyncio.timeout(connect_timeout):
            conn, head = await self._send(method, target, headers or {}, None)
        return Stream(self, conn, head, read_timeout)
