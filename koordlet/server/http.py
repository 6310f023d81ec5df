"""A small HTTP/1.1 server for the koordlet's read-only routes: requests, answers, routes.

The koordlet serves a handful of GET routes on its own port; aiohttp's server (and what importing
it pulls in: email, http.cookies, attrs, TLS contexts) cost 12 MiB of RSS for that, so this
package speaks the protocol itself over httptools' llhttp parser; the connection side is
:mod:`koordlet.server.connection` (docs/architecture.md, "The HTTP server"). What it does:

- **Routes**: an exact-path table of GET handlers; HEAD is answered as GET without the body
  (same ``Content-Length``); another method on a known path is ``405`` with ``Allow``, an
  unknown path ``404``. Middlewares wrap every routed answer, the ``404``/``405`` included.
- **Connections**: HTTP/1.1 keep-alive unless ``Connection: close``; HTTP/1.0 closes unless
  it asked for keep-alive. Pipelined requests are answered in order, one at a time.
- **Refusals** (answered with ``Connection: close``, then the connection is closed): a request
  with a body ``413`` (no route takes one), a malformed request ``400``, a request target over
  ``max_head`` bytes ``414``, a header section over ``max_head`` bytes or ``max_headers``
  fields ``431``, a head not complete within ``request_timeout`` ``408``.
- **Bounds**: a connection idle for ``keepalive_timeout`` is closed; a handler's exception is
  logged once and answered ``500``; while the peer does not read (the transport's buffer is past
  ``write_high_water``) the connection neither answers nor reads, so memory stays bounded.
- **Stop**: stop accepting, close idle connections, let in-flight answers finish (then close
  their connections) for up to ``shutdown_timeout`` seconds, abort what is left.
"""

from __future__ import annotations

import http
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import parse_qsl

from apis.records import frozen

T = TypeVar("T")

_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@frozen
class HttpLimits:
    """The protocol's bounds and timeouts."""

    max_head: int = 8192
    """Bytes of the request target, and separately of the header section (names and values)."""
    max_headers: int = 100
    """Header fields a request may carry."""
    keepalive_timeout: float = 75.0
    """Seconds an idle connection (no request begun) is kept open (aiohttp's default)."""
    request_timeout: float = 10.0
    """Seconds a request's head (request line and headers) may take to arrive once begun."""
    write_high_water: int = 64 * 1024
    """Bytes buffered for a peer above which the connection stops answering and reading."""
    max_pipelined: int = 16
    """Parsed requests queued on one connection above which it stops reading."""
    shutdown_timeout: float = 5.0
    """Seconds :meth:`HttpServer.stop` waits for in-flight answers before aborting them."""


class Headers(Mapping[str, str]):
    """Request headers, looked up case-insensitively; repeated fields joined with ``", "``."""

    __slots__ = ("_items",)

    def __init__(self, pairs: Sequence[tuple[str, str]] = ()) -> None:
        items: dict[str, str] = {}
        for name, value in pairs:
            key = name.lower()
            items[key] = f"{items[key]}, {value}" if key in items else value
        self._items = items

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._items


@dataclass(slots=True)
class Response:
    """An answer: status, headers (``Content-Length`` and ``Connection`` are the server's) and
    the body's bytes."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False
    """Close the connection once this answer is written."""


def text_response(text: str, status: int = 200, **headers: str) -> Response:
    """A ``text/plain; charset=utf-8`` answer."""
    return Response(status, text.encode(), {"Content-Type": "text/plain; charset=utf-8", **headers})


@dataclass(slots=True, eq=False)
class Request:
    """One parsed request. A body is never read: a request announcing one is answered (``413``
    past routing) and its connection closed."""

    method: str
    """``GET``, ``HEAD``, ... as sent."""
    path: str
    """The target's path, percent-decoded (``/debug/query``)."""
    query_string: str
    """The target's query, undecoded (``metric=x&entity=node``)."""
    headers: Headers
    peer: Any
    """The socket's peer address (``transport.get_extra_info("peername")``)."""
    version: str = "1.1"
    has_body: bool = False
    """It announced a body (``Content-Length`` above 0, or ``Transfer-Encoding``)."""
    keep_alive: bool = True
    """The connection stays open after the answer (HTTP/1.1 without ``Connection: close``,
    HTTP/1.0 with ``Connection: keep-alive``)."""
    _respond: Callable[[Request, Response], Awaitable[None]] | None = None
    responded: bool = False

    @property
    def query(self) -> list[tuple[str, str]]:
        """The query's ``(name, value)`` pairs, decoded, repeats and empty values kept."""
        return parse_qsl(self.query_string, keep_blank_values=True)

    def param(self, name: str) -> str | None:
        """The first value of query parameter ``name``; None when absent."""
        return next((v for k, v in self.query if k == name), None)

    async def respond(self, response: Response) -> None:
        """Write ``response`` now (a middleware that wants the write inside its span calls
        this); the server writes it otherwise. Waits while the peer is not reading."""
        if self.responded or self._respond is None:
            raise RuntimeError(f"{self.method} {self.path} was already answered")
        self.responded = True
        await self._respond(self, response)


Handler = Callable[[Request], Awaitable[Response]]
Middleware = Callable[[Request, Handler], Awaitable[Response]]


class AppKey(Generic[T]):
    """A typed key of :class:`App`'s state (``app[KEY]``)."""

    __slots__ = ("name",)

    def __init__(self, name: str, _type: type[T]) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<AppKey {self.name}>"


class App:
    """The route table (GET handlers by exact path), the middlewares wrapping every routed
    answer (the first outermost) and typed state."""

    def __init__(self, middlewares: Sequence[Middleware] = ()) -> None:
        self._routes: dict[str, Handler] = {}
        self._middlewares = tuple(middlewares)
        self._state: dict[AppKey[Any], Any] = {}

    def __setitem__(self, key: AppKey[T], value: T) -> None:
        self._state[key] = value

    def __getitem__(self, key: AppKey[T]) -> T:
        value: T = self._state[key]
        return value

    def add_get(self, path: str, handler: Handler) -> None:
        """Serve GET (and HEAD) on ``path``."""
        if path in self._routes:
            raise ValueError(f"route {path} is already served")
        self._routes[path] = handler

    @property
    def paths(self) -> list[str]:
        return list(self._routes)

    async def handle(self, request: Request) -> Response:
        """Route ``request`` through the middlewares."""
        handler: Handler = self._route
        for middleware in reversed(self._middlewares):
            handler = _wrap(middleware, handler)
        return await handler(request)

    async def _route(self, request: Request) -> Response:
        handler = self._routes.get(request.path)
        if handler is None:
            return text_response("404: Not Found", 404)
        if request.method not in ("GET", "HEAD"):
            return text_response("405: Method Not Allowed", 405, Allow="GET,HEAD")
        if request.has_body:
            return text_response("413: Request bodies are not accepted", 413)
        return await handler(request)


def _wrap(middleware: Middleware, handler: Handler) -> Handler:
    async def wrapped(request: Request) -> Response:
        return await middleware(request, handler)

    return wrapped


def http_date(now: float) -> str:
    """An IMF-fixdate (RFC 9110 5.6.7), independent of the locale."""
    t = time.gmtime(now)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def encode_head(response: Response, length: int, close: bool, keep_alive_header: bool) -> bytes:
    """The status line and headers of ``response`` with a body of ``length`` bytes."""
    lines = [f"HTTP/1.1 {response.status} {_reason(response.status)}"]
    lines.extend(f"{k}: {v}" for k, v in response.headers.items())
    lines.append(f"Content-Length: {length}")
    lines.append(f"Date: {http_date(time.time())}")
    lines.append("Server: koordlet")
    if close:
        lines.append("Connection: close")
    elif keep_alive_header:
        lines.append("Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
