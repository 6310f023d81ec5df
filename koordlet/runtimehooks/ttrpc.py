"""ttrpc over NRI's multiplexed socket, written from the published protocols, on asyncio.

The multiplexer (containerd/nri ``pkg/net/multiplex``): one unix socket carries several logical
byte streams; each frame is a 4-byte big-endian connection ID, a 4-byte big-endian payload length
and the payload. NRI uses connection 1 for the plugin's service (the runtime calls the plugin) and
connection 2 for the runtime's (the plugin calls the runtime).

ttrpc (containerd/ttrpc ``PROTOCOL.md``) on each logical stream: a 10-byte header (4-byte data
length, 4-byte stream ID, both big-endian, a type byte: 1 request, 2 response, 3 data, a flags
byte) and the data, at most 4 MiB. A request carries ``ttrpc.Request`` (service, method, payload,
timeout), a response ``ttrpc.Response`` (a ``google.rpc.Status`` and the payload). Clients use
odd stream IDs. Only unary calls are needed and implemented; a data frame is a protocol error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable, Mapping

from apis.ttrpc import request_pb2 as ttrpcpb
from koordlet.runtimehooks.errors import ProtocolError, TtrpcError

logger = logging.getLogger(__name__)

PLUGIN_SERVICE_CONN = 1
"""NRI's connection for the plugin's ttrpc service (the runtime is the client)."""
RUNTIME_SERVICE_CONN = 2
"""NRI's connection for the runtime's ttrpc service (the plugin is the client)."""
MAX_DATA = 4 << 20
"""ttrpc's largest message."""
HEADER = struct.Struct(">IIBB")
"""ttrpc message header: length, stream ID, type, flags."""
MUX_HEADER = struct.Struct(">II")
"""Multiplexer frame header: connection ID, payload length."""
MSG_REQUEST, MSG_RESPONSE, MSG_DATA = 1, 2, 3
CODE_UNIMPLEMENTED, CODE_INTERNAL, CODE_DEADLINE = 12, 13, 4
"""gRPC status codes ttrpc reuses."""

Handler = Callable[[bytes], Awaitable[bytes]]
"""A unary method: request payload in, response payload out."""


class MuxConn:
    """One logical byte stream of a :class:`Mux`."""

    def __init__(self, mux: Mux, conn_id: int) -> None:
        self._mux = mux
        self.conn_id = conn_id
        self._buf = bytearray()
        self._cond = asyncio.Condition()
        self._closed = False

    async def _feed(self, data: bytes) -> None:
        async with self._cond:
            self._buf += data
            self._cond.notify_all()

    async def _close(self) -> None:
        async with self._cond:
            self._closed = True
            self._cond.notify_all()

    async def read_exactly(self, n: int) -> bytes:
        """``n`` bytes; raises ConnectionError once the mux is closed."""
        async with self._cond:
            await self._cond.wait_for(lambda: len(self._buf) >= n or self._closed)
            if len(self._buf) < n:
                raise ConnectionError(f"mux connection {self.conn_id} closed")
            out = bytes(self._buf[:n])
            del self._buf[:n]
            return out

    async def write(self, data: bytes) -> None:
        """Send ``data`` on this connection."""
        await self._mux.send(self.conn_id, data)


class Mux:
    """NRI's multiplexer over an asyncio stream pair; :meth:`run` demultiplexes until EOF."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._conns: dict[int, MuxConn] = {}
        self._lock = asyncio.Lock()
        self.closed = asyncio.Event()

    def open(self, conn_id: int) -> MuxConn:
        """The logical connection ``conn_id`` (opening is local, as in NRI)."""
        if conn_id == 0:
            raise ValueError("connection ID 0 is reserved")
        return self._conns.setdefault(conn_id, MuxConn(self, conn_id))

    async def send(self, conn_id: int, data: bytes) -> None:
        if self.closed.is_set():
            raise ConnectionError("mux closed")
        if len(data) > MAX_DATA + HEADER.size:
            raise ProtocolError(f"oversized message ({len(data)} bytes)")
        async with self._lock:
            self._writer.write(MUX_HEADER.pack(conn_id, len(data)) + data)
            await self._writer.drain()

    async def run(self) -> None:
        """Read frames until the peer closes; then every connection reads EOF."""
        try:
            while True:
                head = await self._reader.readexactly(MUX_HEADER.size)
                conn_id, size = MUX_HEADER.unpack(head)
                if size > MAX_DATA + HEADER.size:
                    raise ProtocolError(f"mux frame of {size} bytes")
                data = await self._reader.readexactly(size)
                conn = self._conns.get(conn_id)
                if conn is not None:
                    await conn._feed(data)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            await self.close()

    async def close(self) -> None:
        """Close the socket and wake every reader."""
        if self.closed.is_set():
            return
        self.closed.set()
        for conn in self._conns.values():
            await conn._close()
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()


async def _read_message(conn: MuxConn) -> tuple[int, int, int, bytes]:
    length, stream, kind, flags = HEADER.unpack(await conn.read_exactly(HEADER.size))
    if length > MAX_DATA:
        raise ProtocolError(f"ttrpc message of {length} bytes")
    return stream, kind, flags, await conn.read_exactly(length)


async def _write_message(conn: MuxConn, stream: int, kind: int, data: bytes) -> None:
    if len(data) > MAX_DATA:
        raise ProtocolError(f"ttrpc message of {len(data)} bytes")
    await conn.write(HEADER.pack(len(data), stream, kind, 0) + data)


class TtrpcServer:
    """Serves unary ttrpc methods on a connection; ``handlers`` maps (service, method)."""

    def __init__(self, conn: MuxConn, handlers: Mapping[tuple[str, str], Handler]) -> None:
        self._conn = conn
        self._handlers = handlers
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Answer requests until the connection closes; each request runs in its own task."""
        try:
            while True:
                stream, kind, _flags, data = await _read_message(self._conn)
                if kind != MSG_REQUEST:
                    raise ProtocolError(f"unexpected ttrpc message type {kind} on a server")
                task = asyncio.get_running_loop().create_task(
                    self._answer(stream, data), name=f"ttrpc-request-{stream}"
                )
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except ConnectionError:
            pass
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _answer(self, stream: int, data: bytes) -> None:
        req = ttrpcpb.Request.FromString(data)
        handler = self._handlers.get((req.service, req.method))
        resp = ttrpcpb.Response()
        if handler is None:
            resp.status.code = CODE_UNIMPLEMENTED
            resp.status.message = f"{req.service}/{req.method} not implemented"
        else:
            try:
                resp.payload = await handler(req.payload)
            except Exception as err:  # the task guard: the peer gets an error status
                logger.exception("ttrpc %s/%s failed", req.service, req.method)
                resp.status.code = CODE_INTERNAL
                resp.status.message = str(err)
        with contextlib.suppress(ConnectionError):
            await _write_message(self._conn, stream, MSG_RESPONSE, resp.SerializeToString())


class TtrpcClient:
    """Unary ttrpc calls on a connection; :meth:`run` reads the responses."""

    def __init__(self, conn: MuxConn) -> None:
        self._conn = conn
        self._next = 1
        self._pending: dict[int, asyncio.Future[ttrpcpb.Response]] = {}

    async def run(self) -> None:
        """Deliver responses until the connection closes; then fail what is pending."""
        try:
            while True:
                stream, kind, _flags, data = await _read_message(self._conn)
                if kind != MSG_RESPONSE:
                    raise ProtocolError(f"unexpected ttrpc message type {kind} on a client")
                future = self._pending.pop(stream, None)
                if future is not None and not future.done():
                    future.set_result(ttrpcpb.Response.FromString(data))
        except ConnectionError:
            pass
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError("ttrpc connection closed"))
            self._pending.clear()

    async def call(self, service: str, method: str, payload: bytes, budget: float) -> bytes:
        """The response payload within ``budget`` seconds (also sent as the request's timeout);
        raises TtrpcError, TimeoutError or ConnectionError."""
        stream = self._next
        self._next += 2
        future: asyncio.Future[ttrpcpb.Response] = asyncio.get_running_loop().create_future()
        self._pending[stream] = future
        req = ttrpcpb.Request(
            service=service, method=method, payload=payload, timeout_nano=int(budget * 1e9)
        )
        try:
            await _write_message(self._conn, stream, MSG_REQUEST, req.SerializeToString())
            async with asyncio.timeout(budget):
                resp = await future
        finally:
            self._pending.pop(stream, None)
        if resp.status.code != 0:
            raise TtrpcError(resp.status.code, resp.status.message)
        return resp.payload
