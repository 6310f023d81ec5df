"""TLS client connections over :mod:`ssl`'s memory BIOs, holding no read buffer between reads.

The event loop's own TLS transport (uvloop's, like asyncio's) keeps a 256 KiB read buffer for
every connection for as long as the connection is open: measured 262 KiB traced and 316 KiB
resident a connection with uvloop. A koordlet in cluster mode keeps its watch connections open
for good, so that was over 1 MiB of buffers that are empty nearly all the time (issue 26,
docs/benchmarks.md). Here the plain TCP connection reads through the loop's shared buffer, the
ciphertext goes into a :class:`ssl.MemoryBIO` one TLS record's worth at a time, and what
:class:`ssl.SSLObject` decrypts goes straight to the connection's :class:`asyncio.StreamReader`.

The TLS itself (handshake, certificate and host name checks, records, alerts, TLS 1.3 tickets)
is OpenSSL's through :meth:`ssl.SSLContext.wrap_bio`, exactly as asyncio's ``sslproto`` uses it;
this module only moves bytes between the socket, the BIOs and the stream:

- the handshake runs when the TCP connection is made; :func:`open_connection` returns once it
  is done, or raises what it failed with (``ssl.SSLCertVerificationError`` for a certificate that
  does not verify, ``ConnectionResetError`` when the peer closed first);
- the peer's ``close_notify``, or the end of the TCP stream, is the end of the reader's data;
- a TLS error while reading (a bad record, an alert) is the reader's exception and closes the
  connection;
- closing sends ``close_notify`` and closes the socket without waiting for the peer's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any, cast

RECORD = 16 * 1024
"""The most plaintext one TLS record carries (RFC 8446, 5.1): what one ``SSLObject.read``
returns at most, and the ciphertext fed to the incoming BIO at a time (plus a record's
overhead), so neither BIO grows past about one record."""
_FEED = RECORD + 512


def _ascii(name: str | None) -> str | bytes | None:
    """An ASCII host name as bytes: :mod:`ssl` sends a str through the ``idna`` codec, which loads
    ``stringprep`` and ``unicodedata`` (about 0.3 MiB) to change nothing in an ASCII name."""
    if name is not None and name.isascii():
        return name.encode("ascii")
    return name


class _AppTransport(asyncio.Transport):
    """The decrypted side, handed to the stream protocol."""

    def __init__(self, tls: TlsProtocol) -> None:
        super().__init__()
        self._tls = tls

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._tls.app_write(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self._tls.app_write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self._tls.app_close()

    def abort(self) -> None:
        self._tls.abort()

    def is_closing(self) -> bool:
        return self._tls.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._tls.extra(name, default)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._tls.upper

    def is_reading(self) -> bool:
        tcp = self._tls.tcp
        return tcp is not None and tcp.is_reading()

    def pause_reading(self) -> None:
        if (tcp := self._tls.tcp) is not None:
            tcp.pause_reading()

    def resume_reading(self) -> None:
        if (tcp := self._tls.tcp) is not None:
            tcp.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if (tcp := self._tls.tcp) is not None:
            tcp.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        tcp = self._tls.tcp
        return tcp.get_write_buffer_size() if tcp is not None else 0


class TlsProtocol(asyncio.Protocol):
    """The protocol of the TCP connection: TLS between it and ``upper`` (a stream protocol)."""

    def __init__(
        self,
        context: ssl.SSLContext,
        server_hostname: str | None,
        upper: asyncio.Protocol,
        handshake: asyncio.Future[None],
    ) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(
            self._incoming,
            self._outgoing,
            server_side=False,
            server_hostname=_ascii(server_hostname),
        )
        self._context = context
        self.upper = upper
        self._handshake = handshake
        self.tcp: asyncio.Transport | None = None
        self.closing = False
        self._made = False
        """``upper.connection_made`` was called (the handshake completed)."""
        self._eof = False
        self._error: BaseException | None = None
        self.app = _AppTransport(self)
        """The decrypted side, for the stream protocol."""

    # The TCP side ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tcp = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._shake()

    def data_received(self, data: bytes) -> None:
        if self.tcp is None or self._error is not None:
            return
        view = memoryview(data)
        for at in range(0, len(view), _FEED):
            self._incoming.write(view[at : at + _FEED])
            if not self._made:
                self._shake()
            else:
                self._read()
            if self.tcp is None or self._error is not None:
                return

    def eof_received(self) -> bool:
        if not self._made:
            self._fail(ConnectionResetError("connection closed during the TLS handshake"))
            return False
        self._end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.tcp = None
        self.closing = True
        error = exc if exc is not None else self._error
        if not self._handshake.done():
            self._handshake.set_exception(
                error or ConnectionResetError("connection closed during the TLS handshake")
            )
        if self._made:
            self._made = False
            self.upper.connection_lost(error if isinstance(error, Exception) else None)

    def pause_writing(self) -> None:
        self.upper.pause_writing()

    def resume_writing(self) -> None:
        self.upper.resume_writing()

    # TLS ---------------------------------------------------------------------------------------
    def _flush(self) -> None:
        if self._outgoing.pending and self.tcp is not None:
            self.tcp.write(self._outgoing.read())

    def _shake(self) -> None:
        try:
            self._ssl.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return
        except (ssl.SSLError, ssl.CertificateError) as err:
            self._flush()  # the alert that tells the peer why
            self._fail(err)
            return
        self._flush()
        self._made = True
        self.upper.connection_made(self.app)
        if not self._handshake.done():
            self._handshake.set_result(None)
        self._read()  # what came with the handshake's last flight

    def _read(self) -> None:
        chunks: list[bytes] = []
        closed = False
        try:
            while True:
                chunk = self._ssl.read(RECORD)
                if not chunk:  # the peer's close_notify
                    closed = True
                    break
                chunks.append(chunk)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as err:
            self._deliver(chunks)
            self._fail(err)
            return
        self._deliver(chunks)
        self._flush()  # what reading made OpenSSL answer (a key update)
        if closed:
            self._end()
            self.app_close()

    def _deliver(self, chunks: list[bytes]) -> None:
        if chunks and self._made:
            self.upper.data_received(chunks[0] if len(chunks) == 1 else b"".join(chunks))

    def _end(self) -> None:
        if not self._eof and self._made:
            self._eof = True
            self.upper.eof_received()

    def _fail(self, err: BaseException) -> None:
        """Close the connection with ``err``: the handshake's exception, or the reader's."""
        if self._error is None:
            self._error = err
        if not self._handshake.done():
            self._handshake.set_exception(err)
        self.closing = True
        if self.tcp is not None:
            self.tcp.abort()

    # The application side ----------------------------------------------------------------------
    def app_write(self, data: bytes) -> None:
        if self.closing or self.tcp is None or not data:
            return
        try:
            self._ssl.write(data)
        except ssl.SSLError as err:
            self._fail(err)
            return
        self._flush()

    def app_close(self) -> None:
        if self.closing:
            return
        self.closing = True
        if self.tcp is None:
            return
        with contextlib.suppress(ssl.SSLError, ValueError):
            self._ssl.unwrap()  # writes our close_notify; the peer's is not waited for
        self._flush()
        self.tcp.close()

    def abort(self) -> None:
        self.closing = True
        if self.tcp is not None:
            self.tcp.abort()

    def extra(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self._ssl
        if name == "sslcontext":
            return self._context
        if name == "peercert":
            return self._ssl.getpeercert()
        if name == "cipher":
            return self._ssl.cipher()
        if self.tcp is None:
            return default
        return self.tcp.get_extra_info(name, default)


async def open_connection(
    host: str,
    port: int,
    *,
    context: ssl.SSLContext,
    server_hostname: str | None,
    limit: int,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TLS client connection as a reader and writer, once the handshake is done (what
    :func:`asyncio.open_connection` returns with ``ssl=context``)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    upper = asyncio.StreamReaderProtocol(reader, loop=loop)
    handshake: asyncio.Future[None] = loop.create_future()
    tls = TlsProtocol(context, server_hostname, upper, handshake)
    tcp, _ = await loop.create_connection(lambda: tls, host, port)
    try:
        await handshake
    except BaseException:
        tcp.abort()
        raise
    return reader, asyncio.StreamWriter(tls.app, upper, reader, loop)
